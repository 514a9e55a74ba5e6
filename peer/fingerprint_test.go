package peer

import (
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/ring"
)

// TestPolicyVersion checks that the policy table's version changes with
// everything that changes a holder's decision and with nothing else.
func TestPolicyVersion(t *testing.T) {
	base := func() PolicyConfig { return PolicyConfig{Limit: 10, Window: time.Second} }
	pv := func(edit func(*PolicyConfig)) uint64 {
		p := base()
		edit(&p)
		return policyVersion(map[string]PolicyConfig{"api": p, "other": {Limit: 1, Window: time.Minute}})
	}
	want := pv(func(*PolicyConfig) {})
	cases := []struct {
		name string
		edit func(*PolicyConfig)
		same bool
	}{
		{"resolution 0 is 1ms", func(p *PolicyConfig) { p.Resolution = time.Millisecond }, true},
		{"on_unavailable is the caller's", func(p *PolicyConfig) { p.OnUnavailable = FailOpen }, true},
		{"fallback limit is the caller's", func(p *PolicyConfig) { p.FallbackLimit = 3 }, true},
		{"replication is how, not what", func(p *PolicyConfig) { p.Replication = ReplicateAsync }, true},
		{"shadow", func(p *PolicyConfig) { p.Shadow = true }, false},
		{"resolution 7ms", func(p *PolicyConfig) { p.Resolution = 7 * time.Millisecond }, false},
		{"limit", func(p *PolicyConfig) { p.Limit = 11 }, false},
		{"window", func(p *PolicyConfig) { p.Window = 2 * time.Second }, false},
		{"algorithm", func(p *PolicyConfig) { p.Algorithm = TokenBucket }, false},
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
		return pv(func(p *PolicyConfig) { p.Algorithm, p.Resolution = TokenBucket, res })
	}
	if tb(0) != tb(5*time.Millisecond) {
		t.Error("token_bucket version depends on the resolution it never reads")
	}
	renamed := policyVersion(map[string]PolicyConfig{"api2": base(), "other": {Limit: 1, Window: time.Minute}})
	if renamed == want {
		t.Error("renaming a policy kept the version")
	}
}

// TestFingerprintPlacementOnly checks that the gossiped fingerprint, which
// members must share, covers placement and not the policy table.
func TestFingerprintPlacementOnly(t *testing.T) {
	a := Config{Policies: map[string]PolicyConfig{"api": {Limit: 10, Window: time.Second}}}.withDefaults()
	b := Config{Policies: map[string]PolicyConfig{"api": {Limit: 99, Window: time.Hour}}}.withDefaults()
	if a.fingerprint() != b.fingerprint() {
		t.Error("fingerprint depends on the policy table")
	}
	c := Config{Ring: ring.Config{PartitionCount: 97}}.withDefaults()
	if c.fingerprint() == a.fingerprint() {
		t.Error("fingerprint ignores the partition count")
	}
}
