package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/shard"
)

// TestVersion checks that the policy table's version changes with
// everything that changes a holder's decision and with nothing else.
func TestVersion(t *testing.T) {
	base := func() Config { return Config{Limit: 10, Window: time.Second} }
	pv := func(edit func(*Config)) uint64 {
		p := base()
		edit(&p)
		return New(map[string]Config{"api": p, "other": {Limit: 1, Window: time.Minute}}).Version()
	}
	want := pv(func(*Config) {})
	cases := []struct {
		name string
		edit func(*Config)
		same bool
	}{
		{"resolution 0 is 1ms", func(p *Config) { p.Resolution = time.Millisecond }, true},
		{"on_unavailable is the caller's", func(p *Config) { p.OnUnavailable = FailOpen }, true},
		{"fallback limit is the caller's", func(p *Config) { p.FallbackLimit = 3 }, true},
		{"replication is how, not what", func(p *Config) { p.Replication = ReplicateAsync }, true},
		{"shadow", func(p *Config) { p.Shadow = true }, false},
		{"resolution 7ms", func(p *Config) { p.Resolution = 7 * time.Millisecond }, false},
		{"limit", func(p *Config) { p.Limit = 11 }, false},
		{"window", func(p *Config) { p.Window = 2 * time.Second }, false},
		{"algorithm", func(p *Config) { p.Algorithm = shard.TokenBucket }, false},
	}
	for _, tc := range cases {
		if got := pv(tc.edit); (got == want) != tc.same {
			t.Errorf("%s: version %x vs base %x, want same=%v", tc.name, got, want, tc.same)
		}
	}
	if want == 0 || want >= 1<<53 {
		t.Errorf("version %x: want 1 to 2^53-1", want)
	}
	// Resolution is read by the sliding log only.
	tb := func(res time.Duration) uint64 {
		return pv(func(p *Config) { p.Algorithm, p.Resolution = shard.TokenBucket, res })
	}
	if tb(0) != tb(5*time.Millisecond) {
		t.Error("token_bucket version depends on the resolution it never reads")
	}
	renamed := New(map[string]Config{"api2": base(), "other": {Limit: 1, Window: time.Minute}}).Version()
	if renamed == want {
		t.Error("renaming a policy kept the version")
	}
}

var overridden = Config{Limit: 2, Window: time.Minute, FallbackLimit: 1, Overrides: []Override{
	{Tenant: "bigco", Limit: 4},
	{Tenant: "bigco", Subject: "vip", Limit: 6},
	{Tenant: "acme", Subject: "internal", Unlimited: true},
}}

// TestVersionOverrides checks that overrides are part of the version, in
// any order.
func TestVersionOverrides(t *testing.T) {
	v := New(map[string]Config{"api": overridden}).Version()
	rev := overridden
	rev.Overrides = []Override{overridden.Overrides[2], overridden.Overrides[0], overridden.Overrides[1]}
	if got := New(map[string]Config{"api": rev}).Version(); got != v {
		t.Errorf("reordered overrides changed the version: %d vs %d", got, v)
	}
	less := overridden
	less.Overrides = overridden.Overrides[:2]
	if got := New(map[string]Config{"api": less}).Version(); got == v {
		t.Error("dropping an override kept the version")
	}
}

// TestForKey checks which entry each key gets from the compiled table.
func TestForKey(t *testing.T) {
	tab := New(map[string]Config{"api": overridden})
	p := tab.Lookup("api")
	if p == nil || tab.Lookup("nope") != nil || tab.Len() != 1 {
		t.Fatalf("Lookup(api) = %v, Lookup(nope) = %v, Len = %d; want an entry, nil, 1", p, tab.Lookup("nope"), tab.Len())
	}
	for _, tc := range []struct {
		name            string
		tenant, subject string
		limit           int64 // Shard.Limit and Config.Limit
		fallback        int64
		unlimited       bool
	}{
		{"no override", "acme", "alice", 2, 1, false},
		{"tenant override", "bigco", "bob", 4, 2, false},
		{"subject override wins", "bigco", "vip", 6, 3, false},
		{"unlimited subject keeps the policy's shard form", "acme", "internal", 2, 1, true},
		{"other tenant's subject name", "other", "internal", 2, 1, false},
	} {
		q := p.ForKey(tc.tenant, tc.subject)
		if q.Name != "api" || q.Shard.Limit != tc.limit || q.Config.Limit != tc.limit || q.Config.FallbackLimit != tc.fallback || q.Unlimited != tc.unlimited || q.Shard.Window != time.Minute {
			t.Errorf("%s: ForKey(%q, %q) = %+v; want limit %d, fallback %d, unlimited %v", tc.name, tc.tenant, tc.subject, q, tc.limit, tc.fallback, tc.unlimited)
		}
	}
	if got := tab.Configs(); len(got) != 1 || len(got["api"].Overrides) != 3 {
		t.Errorf("Configs() = %+v; want the configured api", got)
	}
}

// TestForKeyAllocs checks that resolving an override allocates nothing on
// the decision path.
func TestForKeyAllocs(t *testing.T) {
	tab := New(map[string]Config{"api": {Limit: 2, Window: time.Minute, Overrides: []Override{
		{Tenant: "bigco", Limit: 4}, {Tenant: "bigco", Subject: "vip", Limit: 6},
	}}})
	var sink *Entry
	if a := testing.AllocsPerRun(100, func() {
		p := tab.Lookup("api")
		sink = p.ForKey("bigco", "vip")
		sink = p.ForKey("bigco", "x")
		sink = p.ForKey("acme", "x")
	}); a != 0 {
		t.Fatalf("ForKey allocates %.1f times, want 0", a)
	}
	_ = sink
}

// TestConfigFor checks the exported override resolution used by error and
// unavailability answers.
func TestConfigFor(t *testing.T) {
	pc := Config{Limit: 2, Window: time.Minute, Overrides: []Override{
		{Tenant: "bigco", Subject: "vip", Limit: 6}, {Tenant: "bigco", Limit: 4}, {Tenant: "acme", Subject: "internal", Unlimited: true},
	}}
	for _, tc := range []struct {
		tenant, subject string
		want            int64
	}{
		{"bigco", "vip", 6}, {"bigco", "x", 4}, {"acme", "internal", 0}, {"acme", "x", 2}, {"other", "vip", 2},
	} {
		got := pc.For(tc.tenant, tc.subject)
		if got.Limit != tc.want || got.Overrides != nil || got.Window != pc.Window {
			t.Errorf("For(%q, %q) = %+v; want limit %d, no overrides, the policy's window", tc.tenant, tc.subject, got, tc.want)
		}
	}
}

// TestValidate checks that every problem of a table is reported, each
// naming where it is, and that a good table has none.
func TestValidate(t *testing.T) {
	ok := Config{Limit: 2, Window: time.Minute}
	for _, tc := range []struct {
		name string
		pols map[string]Config
		want []string // substrings, one per expected error
	}{
		{"good", map[string]Config{"api": overridden, "other": ok}, nil},
		{"empty", nil, []string{"the policy table is empty"}},
		{"bad name", map[string]Config{"a b": ok}, []string{`policy name "a b": must be 1 to`}},
		{"no limit", map[string]Config{"p": {Window: time.Minute}}, []string{`policy "p": `}},
		{"on_unavailable", map[string]Config{"p": {Limit: 1, Window: time.Minute, OnUnavailable: 9}}, []string{`policy "p": unknown on_unavailable 9`}},
		{"replication", map[string]Config{"p": {Limit: 1, Window: time.Minute, Replication: 9}}, []string{`policy "p": unknown replication 9`}},
		{"durability", map[string]Config{"p": {Limit: 1, Window: time.Minute, Durability: 3}}, []string{`policy "p": unknown durability 3`}},
		{"fallback", map[string]Config{"p": {Limit: 1, Window: time.Minute, FallbackLimit: -1}}, []string{`policy "p": fallback limit -1 must not be negative`}},
		{"override fields", map[string]Config{"p": {Limit: 1, Window: time.Minute, Overrides: []Override{{Subject: "a b"}}}},
			[]string{"override 0 (tenant \"\", subject \"a b\"): tenant is missing", "subject must be", "must be positive"}},
		{"override twice", map[string]Config{"p": {Limit: 1, Window: time.Minute, Overrides: []Override{{Tenant: "t", Limit: 1}, {Tenant: "t", Limit: 2}}}},
			[]string{"override 1 (tenant \"t\", subject \"\"): given twice"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := Validate(tc.pols)
			if len(errs) != len(tc.want) {
				t.Fatalf("Validate = %v; want %d errors containing %q", errs, len(tc.want), tc.want)
			}
			for i, e := range errs {
				if !strings.Contains(e.Error(), tc.want[i]) {
					t.Errorf("error %d = %q; want it to contain %q", i, e, tc.want[i])
				}
			}
		})
	}
}

// TestStrings pins the names cmd and the HTTP API read and write.
func TestStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{FailClosed.String(), "fail_closed"}, {FailOpen.String(), "fail_open"}, {Fallback.String(), "fallback"}, {OnUnavailable(7).String(), "on_unavailable(7)"},
		{ReplicateSync.String(), "sync"}, {ReplicateAsync.String(), "async"}, {ReplicateOff.String(), "off"}, {Replication(7).String(), "Replication(7)"},
	} {
		if tc.got != tc.want {
			t.Errorf("String() = %q, want %q", tc.got, tc.want)
		}
	}
}
