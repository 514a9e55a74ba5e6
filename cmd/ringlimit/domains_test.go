package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/ringlimit/ringlimit/cmd/ringlimit/envoyrls"
	"github.com/ringlimit/ringlimit/peer"
)

// TestEnvoyDomainsConfig parses the policy file's "domains" section: the
// generated policies, and errors that name the path and line.
func TestEnvoyDomainsConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		in      string
		want    map[string]time.Duration // generated policy -> window
		limits  map[string]int64
		repl    map[string]peer.Replication
		wantErr []string
	}{
		{
			name: "both rate_limit forms, nesting, unlimited, shadow",
			in: `domains:
  - domain: edge
    descriptors:
      - key: remote_address
        rate_limit: {unit: second, requests_per_unit: 10}
      - key: path
        value: /login
        descriptors:
          - key: remote_address
            rate_limit: {window: 1m30s, requests: 5}
            shadow_mode: true
      - key: client
        value: internal
        rate_limit: {unlimited: true}
      - key: day
        rate_limit: {unit: day, requests_per_unit: 1000, unit_multiplier: 7}
`,
			want: map[string]time.Duration{
				"envoy:edge:remote_address":               time.Second,
				"envoy:edge:path=%2Flogin/remote_address": 90 * time.Second,
				"envoy:edge:day":                          7 * 24 * time.Hour,
			},
			limits: map[string]int64{"envoy:edge:remote_address": 10, "envoy:edge:path=%2Flogin/remote_address": 5, "envoy:edge:day": 1000},
		},
		{
			name: "policies and domains together, JSON",
			in:   `{"policies": [{"name": "api", "limit": 1, "window": "1s"}], "domains": [{"domain": "d", "descriptors": [{"key": "k", "rate_limit": {"window": "1m", "requests": 3}}]}]}`,
			want: map[string]time.Duration{"api": time.Second, "envoy:d:k": time.Minute},
		},
		{
			name: "a domain's replication reaches each of its limits",
			in:   "domains:\n  - domain: a\n    replication: async\n    descriptors:\n      - key: k\n        rate_limit: {unit: second, requests_per_unit: 1}\n        descriptors:\n          - key: j\n            rate_limit: {unit: second, requests_per_unit: 2}\n  - domain: s\n    descriptors:\n      - key: k\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
			want: map[string]time.Duration{"envoy:a:k": time.Second, "envoy:a:k/j": time.Second, "envoy:s:k": time.Second},
			repl: map[string]peer.Replication{"envoy:a:k": peer.ReplicateAsync, "envoy:a:k/j": peer.ReplicateAsync, "envoy:s:k": peer.ReplicateSync},
		},
		{
			name:    "bad replication",
			in:      "domains:\n  - domain: d\n    replication: eventually\n    descriptors:\n      - key: k\n        rate_limit: {unit: second, requests_per_unit: 1}\n",
			wantErr: []string{`domains[0]: replication "eventually" at line 3: want sync, async or off`},
		},
		{
			name:    "unknown unit",
			in:      "domains:\n  - domain: d\n    descriptors:\n      - key: k\n        rate_limit: {unit: month, requests_per_unit: 1}\n",
			wantErr: []string{`domains[0].descriptors[0].rate_limit at line 5: unit "month": want second, minute, hour or day (for longer windows write window: 720h)`},
		},
		{
			name:    "bad window and missing requests",
			in:      "domains:\n  - domain: d\n    descriptors:\n      - key: k\n        rate_limit:\n          window: 5x\n",
			wantErr: []string{`domains[0].descriptors[0].rate_limit at line 6: window "5x" must be a positive Go duration`, "requests is missing"},
		},
		{
			name:    "both forms",
			in:      "domains:\n  - domain: d\n    descriptors:\n      - key: k\n        rate_limit: {unit: second, requests_per_unit: 1, window: 1s}\n",
			wantErr: []string{"give either unit and requests_per_unit, or window and requests, not both"},
		},
		{
			name:    "unsupported and unknown fields",
			in:      "domains:\n  - domain: d\n    descriptors:\n      - key: k\n        detailed_metric: true\n        burst: 3\n        rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: x}]}\n",
			wantErr: []string{`domains[0].descriptors[0]: field "detailed_metric" at line 5 is not supported by ringlimit`, `domains[0].descriptors[0]: unknown field "burst" at line 6 (want key, value, rate_limit, shadow_mode, descriptors)`, `field "replaces" at line 7 is not supported`},
		},
		{
			name:    "missing key, duplicate sibling, duplicate domain",
			in:      "domains:\n  - domain: d\n    descriptors:\n      - value: v\n      - key: k\n        value: v\n      - key: k\n        value: v\n  - domain: d\n",
			wantErr: []string{"domains[0].descriptors[0] at line 4: key is missing", `domains[0].descriptors[2]: key "k" with value "v" given twice (lines 5 and 7)`, `domains[1]: domain "d" given twice (lines 2 and 9)`},
		},
		{
			name:    "wrong kinds",
			in:      "domains:\n  - domain: d\n    response_headers: yes please\n    descriptors:\n      - key: k\n        rate_limit: {unit: second, requests_per_unit: ten}\n",
			wantErr: []string{`domains[0]: response_headers must be true or false, got the string "yes please" at line 3`, `requests_per_unit must be a whole number, got the string "ten" at line 6`},
		},
		{
			name:    "reserved policy name",
			in:      "policies:\n  - name: envoy:x\n    limit: 1\n    window: 1s\n",
			wantErr: []string{`names starting with "envoy:" are reserved`},
		},
		{
			name:    "items not maps",
			in:      "domains:\n  - d\n  - domain: e\n    descriptors:\n      - k\n",
			wantErr: []string{`domains[0] must be a map of {domain, descriptors, response_headers, replication}, got the string "d" at line 2`, `domains[1].descriptors[0] must be a map of {key, value, rate_limit, shadow_mode, descriptors}, got the string "k" at line 5`},
		},
		{
			name:    "domains not a list",
			in:      "domains: {domain: d}\n",
			wantErr: []string{`"domains" must be a list of {domain, descriptors, response_headers, replication} entries, got a map at line 1`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, err := parsePolicyFile([]byte(tc.in))
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("parsePolicyFile(%q) = %v, want an error containing %q", tc.in, got, tc.wantErr)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("parsePolicyFile(%q) error\n%v\nlacks %q", tc.in, err, w)
					}
				}
				if strings.Contains(err.Error(), "envoyrls.") || strings.Contains(err.Error(), "!!") {
					t.Errorf("error leaks Go or YAML internals:\n%v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("parsePolicyFile(%q): %v", tc.in, err)
			}
			if len(got) != len(tc.want) {
				t.Errorf("got policies %v, want %v", got, tc.want)
			}
			for name, w := range tc.want {
				if got[name].Window != w {
					t.Errorf("policy %q window %v, want %v (table %v)", name, got[name].Window, w, got)
				}
				if r, ok := tc.repl[name]; ok && got[name].Replication != r {
					t.Errorf("policy %q replication %v, want %v", name, got[name].Replication, r)
				}
				if l, ok := tc.limits[name]; ok && got[name].Limit != l {
					t.Errorf("policy %q limit %d, want %d", name, got[name].Limit, l)
				}
			}
			if p := got["envoy:edge:path=%2Flogin/remote_address"]; tc.limits != nil && !p.Shadow {
				t.Errorf("shadow_mode not carried into the policy: %+v", p)
			}
		})
	}
}

// TestEnvoySeveralLimitsOnOneSubject runs envoyrls/README.md's "Several
// limits on one subject" as written: two descriptors with the same value
// under different keys are decided as one. Once the per-second limit is
// spent, a request carrying both is refused and spends nothing of the
// daily limit (decided one by one, it would have spent one).
func TestEnvoySeveralLimitsOnOneSubject(t *testing.T) {
	t.Parallel()
	pols, tab, err := parsePolicyFile([]byte(readmeBlocksOf(t, "envoyrls/README.md", "several-limits", "yaml")))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// The clock stands still: every request falls in one second.
	at := time.Unix(1_800_000_000, 0)
	nd, err := peer.New(ctx, peer.Config{Name: "solo", Policies: pols, GossipProfile: peer.GossipFast, Clock: func() time.Time { return at },
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer nd.Close(ctx)
	s := envoyrls.New(nd, tab, nil)
	desc := func(key string) *ratelimitv3.RateLimitDescriptor {
		return &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: "alice"}}}
	}
	ask := func(ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		r, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ds})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	const ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for i := range 10 {
		if r := ask(desc("user_second"), desc("user_day")); r.OverallCode != ok {
			t.Fatalf("request %d of 10 within a second: %v, want OK", i+1, r)
		}
	}
	r := ask(desc("user_second"), desc("user_day"))
	if r.OverallCode != over || r.Statuses[0].Code != over {
		t.Fatalf("11th request: %v, want OVER_LIMIT on user_second", r)
	}
	if r := ask(desc("user_day")); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 10000-10-1 {
		t.Errorf("user_day after the refused pair: %v, want OK with %d remaining (the refused pair spent nothing of it)", r, 10000-10-1)
	}
}

// TestEnvoyUnknownDomainConfig parses the policy file's top-level
// "unknown_domain": absent is an error answer (the default), each name
// sets its answer with or without domains, and a wrong value or kind is
// an error naming the choices and the line.
func TestEnvoyUnknownDomainConfig(t *testing.T) {
	t.Parallel()
	const pol = "policies:\n  - name: p\n    limit: 1\n    window: 1s\n"
	const dom = "domains:\n  - domain: edge\n    descriptors:\n      - key: k\n        rate_limit: {unit: second, requests_per_unit: 1}\n"
	for _, tc := range []struct {
		name    string
		in      string
		want    envoyrls.UnknownDomain
		noTable bool // the file defines no Envoy table (serve answers with the default)
		wantErr string
	}{
		{name: "absent, domains", in: dom, want: envoyrls.UnknownError},
		{name: "absent, no domains", in: pol, noTable: true},
		{name: "error", in: "unknown_domain: error\n" + dom, want: envoyrls.UnknownError},
		{name: "deny", in: dom + "unknown_domain: deny\n", want: envoyrls.UnknownDeny},
		{name: "allow without domains", in: "unknown_domain: allow\n" + pol, want: envoyrls.UnknownAllow},
		{name: "wrong value", in: "unknown_domain: ok\n" + dom, wantErr: `unknown_domain "ok": want error (the default), deny or allow (line 1)`},
		{name: "wrong kind", in: pol + "unknown_domain: [deny]\n", wantErr: `"unknown_domain" must be error, deny or allow, got a list at line 5`},
		{name: "twice", in: "unknown_domain: deny\nunknown_domain: allow\n" + pol, wantErr: `"unknown_domain" given twice (lines 1 and 2)`},
		{name: "alone", in: "unknown_domain: deny\n", wantErr: "no policies"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, tab, err := parsePolicyFile([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parsePolicyFile(%q) = %v, want an error containing %q", tc.in, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parsePolicyFile(%q): %v", tc.in, err)
			}
			if tc.noTable {
				if tab != nil {
					t.Fatalf("parsePolicyFile(%q) returned an Envoy table; want none", tc.in)
				}
				return
			}
			if tab == nil || tab.UnknownDomainAnswer() != tc.want {
				t.Fatalf("parsePolicyFile(%q): unknown domains answered %v, want %v", tc.in, tab, tc.want)
			}
		})
	}
}
