package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer"
)

func TestParsePolicies(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		in      string
		want    map[string]peer.PolicyConfig
		wantErr []string // substrings of the error, all required
		notErr  []string // substrings the error must not have
	}{
		{
			name: "yaml, every field",
			in: `
policies:
  - name: api
    limit: 100
    window: 1m
  - name: search
    limit: 600
    window: 1m30s
    algorithm: token_bucket
    on_unavailable: fallback
    fallback_limit: 200
  - name: login
    limit: 5
    window: 10s
    algorithm: fixed_window
    on_unavailable: fail_open
    resolution: 10ms
    shadow: true
    replication: off
`,
			want: map[string]peer.PolicyConfig{
				"api":    {Limit: 100, Window: time.Minute},
				"search": {Limit: 600, Window: 90 * time.Second, Algorithm: peer.TokenBucket, OnUnavailable: peer.Fallback, FallbackLimit: 200},
				"login":  {Limit: 5, Window: 10 * time.Second, Algorithm: peer.FixedWindow, OnUnavailable: peer.FailOpen, Resolution: 10 * time.Millisecond, Shadow: true, Replication: peer.ReplicateOff},
			},
		},
		{
			name: "spread",
			in: `
policies:
  - name: org
    limit: 100000
    window: 1m
    spread: auto
    spread_threshold: 500
    spread_lease: 2s
  - name: quiet
    limit: 10
    window: 1s
    spread: off
`,
			want: map[string]peer.PolicyConfig{
				"org":   {Limit: 100000, Window: time.Minute, Spread: peer.SpreadAuto, SpreadThreshold: 500, SpreadLease: 2 * time.Second},
				"quiet": {Limit: 10, Window: time.Second},
			},
		},
		{
			name: "durability",
			in: `
policies:
  - name: monthly
    limit: 1000
    window: calendar_month
    durability: disk
  - name: api
    limit: 10
    window: 1m
    durability: disk_async
  - name: quick
    limit: 10
    window: 1s
    durability: memory
`,
			want: map[string]peer.PolicyConfig{
				"monthly": {Limit: 1000, Algorithm: peer.Calendar, Period: peer.CalendarMonth, Durability: peer.DurabilityDisk},
				"api":     {Limit: 10, Window: time.Minute, Durability: peer.DurabilityDiskAsync},
				"quick":   {Limit: 10, Window: time.Second},
			},
		},
		{
			name: "bad durability",
			in: `
policies:
  - name: api
    limit: 10
    window: 1m
    durability: fsync
`,
			wantErr: []string{`durability "fsync": want memory, disk or disk_async`},
		},
		{
			name: "bad spread",
			in: `
policies:
  - name: org
    limit: 100
    window: 1m
    spread: always
    spread_threshold: -3
    spread_lease: soon
`,
			wantErr: []string{`spread "always": want off or auto`, `spread_threshold -3 must not be negative`, `spread_lease "soon": want a positive duration`},
		},
		{
			name: "json",
			in:   `{"policies": [{"name": "api", "limit": 100, "window": "1m", "algorithm": "sliding_log", "on_unavailable": "fail_closed"}]}`,
			want: map[string]peer.PolicyConfig{"api": {Limit: 100, Window: time.Minute}},
		},
		{
			name: "overrides",
			in: `
policies:
  - name: api
    limit: 100
    window: 1m
    overrides:
      - {tenant: bigco, limit: 10000}
      - tenant: acme
        subject: internal
        unlimited: true
`,
			want: map[string]peer.PolicyConfig{"api": {Limit: 100, Window: time.Minute, Overrides: []peer.Override{
				{Tenant: "bigco", Limit: 10000}, {Tenant: "acme", Subject: "internal", Unlimited: true},
			}}},
		},
		{
			name: "bad overrides",
			in: `
policies:
  - name: api
    limit: 100
    window: 1m
    overrides:
      - {tenant: bigco, limit: 0}
      - {subject: x, limit: 5}
      - {tenant: acme, limit: 5, unlimited: true}
      - {tenant: bigco, limit: 7}
      - {tenant: "a b", limit: 1}
      - {subject: "x y"}
`,
			wantErr: []string{
				`overrides[0] (tenant "bigco", subject ""): limit 0 must be positive (or set unlimited)`,
				`overrides[1] (tenant "", subject "x"): tenant is missing`,
				`overrides[2] (tenant "acme", subject ""): give a limit or unlimited, not both`,
				`overrides[3] (tenant "bigco", subject ""): given twice`,
				`overrides[4] (tenant "a b", subject ""): tenant must be 1 to 128 bytes of visible ASCII`,
				// Every problem of one override is reported, each with
				// where the override stands.
				`overrides[5] (tenant "", subject "x y"): tenant is missing`,
				`overrides[5] (tenant "", subject "x y"): subject must be empty (every subject) or 1 to 128 bytes of visible ASCII`,
				`overrides[5] (tenant "", subject "x y"): limit 0 must be positive (or set unlimited)`,
			},
		},
		{
			name: "overrides of the wrong shape",
			in: `
policies:
  - name: api
    limit: 100
    window: 1m
    overrides:
      - {tenant: bigco, limit: 1, burst: 2}
      - 5
  - name: other
    limit: 1
    window: 1m
    overrides: {tenant: x}
`,
			wantErr: []string{
				`policies[0]: overrides[0]: unknown field "burst" at line 7 (want tenant, subject, limit, unlimited)`,
				`policies[0]: overrides[1]: must be a map of {tenant, subject, limit, unlimited}, got the number 5 at line 8`,
				`policies[1]: overrides must be a list of {tenant, subject, limit, unlimited} entries, got a map at line 12`,
			},
		},
		{
			name:    "unknown field in an entry",
			in:      "policies:\n  - name: api\n    limit: 1\n    window: 1s\n    burst: 5\n",
			wantErr: []string{`policies[0]: unknown field "burst" at line 5 (want name, limit, window, algorithm, zone, on_unavailable, fallback_limit, resolution, shadow, replication, durability, spread, spread_threshold, spread_lease, overrides)`},
		},
		{
			// A reload rejection used to name only the unknown field:
			// the entry's values went unchecked.
			name: "an unknown field does not hide the entry's bad values",
			in:   "policies:\n  - name: api\n    limit: 0\n    window: 1x\n    burst: 5\n",
			wantErr: []string{`policies[0]: unknown field "burst" at line 5`, `policies[0] ("api"): window "1x" must be a positive Go duration`,
				`policies[0] ("api"): limit 0 must be positive`},
		},
		{
			name:    "unknown top-level field",
			in:      `{"policies": [{"name": "api", "limit": 1, "window": "1s"}], "version": 2}`,
			wantErr: []string{`unknown top-level field "version" at line 1: the file holds only "policies"`},
		},
		{
			name:    "bad values are all reported",
			in:      "policies:\n  - name: api\n    limit: 0\n    window: 5x\n    algorithm: leaky\n    on_unavailable: maybe\n",
			wantErr: []string{`policies[0] ("api"): limit 0 must be positive`, `window "5x" must be a positive Go duration`, `algorithm "leaky"`, `on_unavailable "maybe"`},
		},
		{
			name:    "window without a unit",
			in:      "policies:\n  - name: api\n    limit: 1\n    window: 60\n",
			wantErr: []string{`window "60" must be a positive Go duration`},
		},
		{
			name:    "missing window and name",
			in:      "policies:\n  - limit: 1\n",
			wantErr: []string{"name is missing", "window is missing"},
		},
		{
			name:    "duplicate name",
			in:      "policies:\n  - {name: api, limit: 1, window: 1s}\n  - {name: api, limit: 2, window: 1s}\n",
			wantErr: []string{`policies[1] ("api"): duplicate name`},
		},
		{
			name:    "name with a space",
			in:      "policies:\n  - {name: my api, limit: 1, window: 1s}\n",
			wantErr: []string{"name must be 1 to 128 bytes of visible ASCII"},
		},
		{
			name:    "negative fallback limit and resolution",
			in:      "policies:\n  - {name: api, limit: 1, window: 1s, fallback_limit: -1, resolution: -1ms}\n",
			wantErr: []string{"fallback_limit -1 must not be negative", `resolution "-1ms"`},
		},
		{name: "empty", in: "", wantErr: []string{"empty"}},
		{name: "no policies", in: "policies: []\n", wantErr: []string{"no policies"}},
		{name: "two documents", in: "policies:\n  - {name: a, limit: 1, window: 1s}\n---\npolicies: []\n", wantErr: []string{"more than one document"}},
		{name: "not a mapping", in: "- a\n- b\n", wantErr: []string{`the file must be a map with a "policies" list, got a list at line 1`}},
		{
			name:    "policies is a map, not a list",
			in:      "policies:\n  api:\n    limit: 1\n    window: 1s\n",
			wantErr: []string{`"policies" must be a list of {name, limit, window, algorithm, zone, on_unavailable, fallback_limit, resolution, shadow, replication, durability, spread, spread_threshold, spread_lease, overrides} entries, got a map at line 2`},
		},
		{
			name:    "an entry is not a map",
			in:      "policies:\n  - api\n  - {name: b, limit: 1, window: 1s}\n",
			wantErr: []string{`policies[0] must be a map of {name, limit, window`, `got the string "api" at line 2`},
		},
		{
			name: "values of the wrong kind are all reported",
			in:   "policies:\n  - name: [a, b]\n    limit: lots\n    window: 1s\n    shadow: maybe\n    fallback_limit: {x: 1}\n",
			wantErr: []string{`policies[0]: name must be a string, got a list at line 2`, `limit must be a whole number, got the string "lots" at line 3`,
				`shadow must be true or false, got the string "maybe" at line 5`, `fallback_limit must be a whole number, got a map at line 6`},
			// Each field once: its shape, not again its (zero) value.
			notErr: []string{"name is missing", "limit 0 must be positive"},
		},
		{
			name:    "a field given twice",
			in:      "policies:\n  - name: api\n    limit: 1\n    window: 1s\n    limit: 2\n",
			wantErr: []string{`policies[0]: field "limit" given twice (lines 3 and 5)`},
		},
		{name: "policies given but empty", in: "policies:\n", wantErr: []string{"no policies"}},
		{name: "not YAML", in: "policies: [\n", wantErr: []string{"not valid YAML or JSON", "line"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parsePolicies([]byte(tc.in))
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("parsePolicies(%q) = %v, want an error containing %q", tc.in, got, tc.wantErr)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("parsePolicies(%q) error\n%v\nlacks %q", tc.in, err, w)
					}
				}
				for _, w := range tc.notErr {
					if strings.Contains(err.Error(), w) {
						t.Errorf("parsePolicies(%q) error\n%v\nhas %q", tc.in, err, w)
					}
				}
				// The user wrote YAML or JSON: Go type names and YAML
				// tags mean nothing to them.
				for _, leak := range []string{"main.", "!!", "[]", "int64", "unmarshal"} {
					if strings.Contains(err.Error(), leak) {
						t.Errorf("parsePolicies(%q) error leaks %q:\n%v", tc.in, leak, err)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("parsePolicies(%q): %v", tc.in, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("parsePolicies(%q)\n got %+v\nwant %+v", tc.in, got, tc.want)
			}
		})
	}
}

func TestFormatPoliciesRoundTrip(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		table map[string]peer.PolicyConfig
	}{
		{"demo", demoPolicies()},
		{"default", defaultPolicies()},
		{"every field", map[string]peer.PolicyConfig{
			"x": {Limit: 7, Window: 1500 * time.Millisecond, Algorithm: peer.FixedWindow, Resolution: 5 * time.Millisecond, OnUnavailable: peer.Fallback, FallbackLimit: 3, Shadow: true, Replication: peer.ReplicateAsync,
				Overrides: []peer.Override{{Tenant: "t", Limit: 9}, {Tenant: "t", Subject: "s", Unlimited: true}}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := formatPolicies(tc.table)
			if err != nil {
				t.Fatal(err)
			}
			got, err := parsePolicies(data)
			if err != nil {
				t.Fatalf("parse formatted table: %v\n%s", err, data)
			}
			if !reflect.DeepEqual(got, tc.table) {
				t.Errorf("round trip\n got %+v\nwant %+v\nfile:\n%s", got, tc.table, data)
			}
		})
	}
}

func TestLoadPolicies(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	if err := os.WriteFile(good, []byte(`{"policies":[{"name":"api","limit":10,"window":"1s"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := loadPolicies(good)
	if err != nil || got["api"].Limit != 10 {
		t.Fatalf("loadPolicies(%s) = %v, %v; want api limit 10", good, got, err)
	}
	if _, err := loadPolicies(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("loadPolicies(missing) error %v, want one naming the file", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("policies:\n  - {name: api, limit: 1, window: 1s, typo: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadPolicies(bad); err == nil || !strings.Contains(err.Error(), "bad.yaml") || !strings.Contains(err.Error(), "typo") {
		t.Errorf("loadPolicies(bad) error %v, want one naming the file and the field", err)
	}
}
