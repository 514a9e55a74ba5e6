package peer

import (
	"testing"
	"time"
)

// TestFingerprint checks that the fingerprint changes with everything that
// changes an owner's decision and with nothing else.
func TestFingerprint(t *testing.T) {
	base := func() PolicyConfig { return PolicyConfig{Limit: 10, Window: time.Second} }
	fp := func(edit func(*PolicyConfig)) uint64 {
		p := base()
		edit(&p)
		return Config{Policies: map[string]PolicyConfig{"api": p, "other": {Limit: 1, Window: time.Minute}}}.fingerprint()
	}
	want := fp(func(*PolicyConfig) {})
	cases := []struct {
		name string
		edit func(*PolicyConfig)
		same bool
	}{
		{"resolution 0 is 1ms", func(p *PolicyConfig) { p.Resolution = time.Millisecond }, true},
		{"on_unavailable is the caller's", func(p *PolicyConfig) { p.OnUnavailable = FailOpen }, true},
		{"fallback limit is the caller's", func(p *PolicyConfig) { p.FallbackLimit = 3 }, true},
		{"shadow", func(p *PolicyConfig) { p.Shadow = true }, false},
		{"resolution 7ms", func(p *PolicyConfig) { p.Resolution = 7 * time.Millisecond }, false},
		{"limit", func(p *PolicyConfig) { p.Limit = 11 }, false},
		{"window", func(p *PolicyConfig) { p.Window = 2 * time.Second }, false},
		{"algorithm", func(p *PolicyConfig) { p.Algorithm = TokenBucket }, false},
	}
	for _, tc := range cases {
		if got := fp(tc.edit); (got == want) != tc.same {
			t.Errorf("%s: fingerprint %x vs base %x, want same=%v", tc.name, got, want, tc.same)
		}
	}
	// Resolution is read by the sliding log only.
	tb := func(res time.Duration) uint64 {
		return fp(func(p *PolicyConfig) { p.Algorithm, p.Resolution = TokenBucket, res })
	}
	if tb(0) != tb(5*time.Millisecond) {
		t.Error("token_bucket fingerprint depends on the resolution it never reads")
	}
	// A renamed policy is another table.
	renamed := Config{Policies: map[string]PolicyConfig{"api2": base(), "other": {Limit: 1, Window: time.Minute}}}.fingerprint()
	if renamed == want {
		t.Error("renaming a policy kept the fingerprint")
	}
}
