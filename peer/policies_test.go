package peer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/policy"
)

// policyMetrics records Metrics.PolicyTable calls.
type policyMetrics struct {
	nopMetrics
	mu    sync.Mutex
	calls []string // "<version>/<ok>"
}

func (m *policyMetrics) PolicyTable(v uint64, ok bool) {
	m.mu.Lock()
	m.calls = append(m.calls, fmt.Sprintf("%d/%t", v, ok))
	m.mu.Unlock()
}

func (m *policyMetrics) last() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.calls) == 0 {
		return ""
	}
	return m.calls[len(m.calls)-1]
}

// TestPolicySetPolicies replaces a node's table: a bad table is refused
// (every problem named, metric "not ok" with the old version) and the old
// one keeps deciding; a good one applies to the next request, to the log a
// key already has; an algorithm change starts the key fresh.
func TestPolicySetPolicies(t *testing.T) {
	m := &policyMetrics{}
	c := startCluster(t, 1, Config{Policies: map[string]PolicyConfig{"p": {Limit: 3, Window: time.Minute}}, Metrics: m})
	n := c.nodes[0]
	ctx := context.Background()
	key := Key{Tenant: "t", Subject: "s", Policy: "p"}
	allow := func(want bool, wantLimit int64) {
		t.Helper()
		d, err := n.Allow(ctx, Request{Key: key})
		if err != nil || d.Allowed != want || d.Limit != wantLimit {
			t.Fatalf("Allow = %+v, %v; want allowed=%v limit=%d", d, err, want, wantLimit)
		}
	}
	v0 := n.PolicyVersion()
	if got := m.last(); got != fmt.Sprintf("%d/true", v0) {
		t.Fatalf("metric after New = %q, want %d/true", got, v0)
	}
	for range 3 {
		allow(true, 3)
	}
	allow(false, 3)

	bad := map[string]PolicyConfig{"p": {Limit: 0, Window: time.Minute}, "q": {Limit: 1}}
	err := n.SetPolicies(bad)
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), `policy "p"`) || !strings.Contains(err.Error(), `policy "q"`) {
		t.Fatalf("SetPolicies(bad) = %v; want ErrInvalidConfig naming p and q", err)
	}
	if err := n.SetPolicies(nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("SetPolicies(nil) = %v; want ErrInvalidConfig", err)
	}
	if got := m.last(); got != fmt.Sprintf("%d/false", v0) || n.PolicyVersion() != v0 {
		t.Fatalf("after a refused table: metric %q, version %d; want %d/false and version %d", got, n.PolicyVersion(), v0, v0)
	}
	allow(false, 3) // the old table still decides

	// Raise the limit: the three logged admissions count against it.
	if err := n.SetPolicies(map[string]PolicyConfig{"p": {Limit: 5, Window: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	if n.PolicyVersion() == v0 || m.last() != fmt.Sprintf("%d/true", n.PolicyVersion()) {
		t.Fatalf("after a new table: version %d (old %d), metric %q", n.PolicyVersion(), v0, m.last())
	}
	if pc, ok := n.Policy("p"); !ok || pc.Limit != 5 {
		t.Fatalf("Policy(p) = %+v, %v; want limit 5", pc, ok)
	}
	allow(true, 5)
	allow(true, 5)
	allow(false, 5)
	// Lower it: five logged admissions are above 2, so it refuses.
	if err := n.SetPolicies(map[string]PolicyConfig{"p": {Limit: 2, Window: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	allow(false, 2)
	// Another algorithm: the key starts fresh.
	if err := n.SetPolicies(map[string]PolicyConfig{"p": {Limit: 2, Window: time.Minute, Algorithm: FixedWindow}}); err != nil {
		t.Fatal(err)
	}
	allow(true, 2)
	// A removed policy is unknown from then on.
	if err := n.SetPolicies(map[string]PolicyConfig{"q": {Limit: 2, Window: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Allow(ctx, Request{Key: key}); !errors.Is(err, ErrUnknownPolicy) {
		t.Fatalf("Allow on a removed policy = %v, want ErrUnknownPolicy", err)
	}
}

// TestPolicyReadLockFree checks that the decision path reads the table
// without allocating, and, under -race, that swaps during decisions are
// safe: every decision carries one of the tables' limits.
func TestPolicyReadLockFree(t *testing.T) {
	c := startCluster(t, 1, Config{Policies: map[string]PolicyConfig{"p": {Limit: 1 << 40, Window: time.Minute, Replication: ReplicateOff}}})
	n := c.nodes[0]
	ctx := context.Background()
	req := Request{Key: Key{Tenant: "t", Subject: "s", Policy: "p"}}
	if _, err := n.Allow(ctx, req); err != nil {
		t.Fatal(err)
	}
	if a := testing.AllocsPerRun(200, func() { _, _ = n.Allow(ctx, req) }); a != 0 {
		t.Fatalf("Allow allocates %.1f times per call, want 0", a)
	}
	limits := []int64{1 << 40, 1 << 41}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_ = n.SetPolicies(map[string]PolicyConfig{"p": {Limit: limits[i%2], Window: time.Minute, Replication: ReplicateOff}})
		}
	}()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				d, err := n.Allow(ctx, req)
				if err != nil || (d.Limit != limits[0] && d.Limit != limits[1]) {
					t.Errorf("Allow during swaps = %+v, %v; want a limit of %v", d, err, limits)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-done
}

// TestPolicyRolling runs two members with different tables: neither
// ignores the other, each gossips its version, and each key is decided
// with its holder's table, overrides included (n1's table has one for
// tenant "t" that n0's lacks).
func TestPolicyRolling(t *testing.T) {
	old := map[string]PolicyConfig{"p": {Limit: 3, Window: time.Minute}}
	c := startCluster(t, 2, Config{Policies: old})
	n0, n1 := c.nodes[0], c.nodes[1]
	if err := n1.SetPolicies(map[string]PolicyConfig{"p": {Limit: 7, Window: time.Minute, Overrides: []Override{{Tenant: "t", Limit: 9}}}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for n0.MemberPolicyVersions()["n1"] != n1.PolicyVersion() {
		if time.Now().After(deadline) {
			t.Fatalf("n0 sees n1's policy version %d, want %d", n0.MemberPolicyVersions()["n1"], n1.PolicyVersion())
		}
		<-time.After(20 * time.Millisecond)
	}
	if n0.PolicyVersion() == n1.PolicyVersion() {
		t.Fatal("both members report one version for different tables")
	}
	for _, nd := range c.nodes {
		if got := nd.Members(); len(got) != 2 {
			t.Fatalf("%s ring = %v, want both members (another table is no reason to ignore one)", nd.Name(), got)
		}
		if ok, reason := nd.Ready(); !ok {
			t.Fatalf("%s not ready with a rolling table change: %s", nd.Name(), reason)
		}
	}
	want := map[string]int64{"n0": 3, "n1": 9}
	seen := map[string]bool{}
	ctx := context.Background()
	for i := 0; i < 64 && len(seen) < 2; i++ {
		for _, via := range c.nodes {
			key := Key{Tenant: "t", Subject: fmt.Sprint("s", i), Policy: "p"}
			d, err := via.Allow(ctx, Request{Key: key})
			if err != nil {
				t.Fatalf("Allow(%v) via %s: %v", key, via.Name(), err)
			}
			if d.Limit != want[d.Owner] {
				t.Fatalf("Allow(%v) via %s decided by %s with limit %d; want the holder's %d", key, via.Name(), d.Owner, d.Limit, want[d.Owner])
			}
			seen[d.Owner] = true
		}
	}
	if len(seen) < 2 {
		t.Fatalf("holders seen %v, want both", seen)
	}
}

// TestOverrides checks which entry each key gets, the limit decisions
// report, the unlimited exemption, validation, and that overrides are part
// of the version.
func TestOverrides(t *testing.T) {
	api := PolicyConfig{Limit: 2, Window: time.Minute, Overrides: []Override{
		{Tenant: "bigco", Limit: 4},
		{Tenant: "bigco", Subject: "vip", Limit: 6},
		{Tenant: "acme", Subject: "internal", Unlimited: true},
	}}
	c := startCluster(t, 1, Config{Policies: map[string]PolicyConfig{"api": api, "other": {Limit: 1, Window: time.Minute}}})
	n := c.nodes[0]
	ctx := context.Background()
	cases := []struct {
		name            string
		tenant, subject string
		admits          int   // admissions before the first refusal (-1: never refused)
		limit           int64 // every decision's Limit
		reason          Reason
	}{
		{"no override", "acme", "alice", 2, 2, ReasonAdmitted},
		{"tenant override", "bigco", "bob", 4, 4, ReasonAdmitted},
		{"subject override wins", "bigco", "vip", 6, 6, ReasonAdmitted},
		{"unlimited subject", "acme", "internal", -1, 0, ReasonUnlimited},
		{"other tenant's subject name", "other", "internal", 2, 2, ReasonAdmitted},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := Key{Tenant: tc.tenant, Subject: tc.subject, Policy: "api"}
			for i := range 8 {
				d, err := n.Allow(ctx, Request{Key: key})
				if err != nil {
					t.Fatalf("Allow #%d (%v) = %v", i, key, err)
				}
				wantAllowed := tc.admits < 0 || i < tc.admits
				if d.Allowed != wantAllowed || d.Limit != tc.limit {
					t.Fatalf("Allow #%d (%v) = %+v; want allowed=%v limit=%d", i, key, d, wantAllowed, tc.limit)
				}
				if wantAllowed && d.Reason != tc.reason {
					t.Fatalf("Allow #%d (%v) reason %v, want %v", i, key, d.Reason, tc.reason)
				}
			}
		})
	}
	// Hits are checked against the key's own limit.
	if _, err := n.Allow(ctx, Request{Key: Key{Tenant: "bigco", Subject: "new", Policy: "api"}, Hits: 4}); err != nil {
		t.Errorf("hits 4 under bigco's limit 4: %v", err)
	}
	if _, err := n.Allow(ctx, Request{Key: Key{Tenant: "acme", Subject: "new", Policy: "api"}, Hits: 4}); !errors.Is(err, ErrInvalidHits) {
		t.Errorf("hits 4 above the policy's limit 2: %v, want ErrInvalidHits", err)
	}
	// A multi-policy check: the exempt policy takes no part.
	d, err := n.Allow(ctx, Request{Key: Key{Tenant: "acme", Subject: "internal"}, Policies: []string{"api", "other"}})
	if err != nil || !d.Allowed || d.Limit != 1 || len(d.Limits) != 2 || d.Limits[0].Limit != 0 || !d.Limits[0].Allowed {
		t.Fatalf("multi check with an unlimited policy = %+v, %v; want admitted by other (limit 1), api exempt", d, err)
	}
	d, err = n.Allow(ctx, Request{Key: Key{Tenant: "acme", Subject: "internal"}, Policies: []string{"api", "other"}})
	if err != nil || d.Allowed || d.RefusedBy != "other" {
		t.Fatalf("second multi check = %+v, %v; want refused by other", d, err)
	}

	// Overrides are part of the version, in any order.
	v := n.PolicyVersion()
	rev := api
	rev.Overrides = []Override{api.Overrides[2], api.Overrides[0], api.Overrides[1]}
	if got := policy.New(map[string]PolicyConfig{"api": rev, "other": {Limit: 1, Window: time.Minute}}).Version(); got != v {
		t.Errorf("reordered overrides changed the version: %d vs %d", got, v)
	}
	less := api
	less.Overrides = api.Overrides[:2]
	if got := policy.New(map[string]PolicyConfig{"api": less, "other": {Limit: 1, Window: time.Minute}}).Version(); got == v {
		t.Error("dropping an override kept the version")
	}

	for _, tc := range []struct {
		name string
		o    Override
		want string
	}{
		{"no tenant", Override{Limit: 1}, "tenant is missing"},
		{"bad tenant", Override{Tenant: "a b", Limit: 1}, "tenant must be"},
		{"bad subject", Override{Tenant: "t", Subject: "a b", Limit: 1}, "subject must be"},
		{"no limit", Override{Tenant: "t"}, "must be positive"},
		{"both", Override{Tenant: "t", Limit: 3, Unlimited: true}, "not both"},
	} {
		p := PolicyConfig{Limit: 2, Window: time.Minute, Overrides: []Override{tc.o}}
		if err := n.SetPolicies(map[string]PolicyConfig{"api": p}); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: SetPolicies = %v; want ErrInvalidConfig containing %q", tc.name, err, tc.want)
		}
	}
	dup := PolicyConfig{Limit: 2, Window: time.Minute, Overrides: []Override{{Tenant: "t", Limit: 1}, {Tenant: "t", Limit: 2}}}
	if err := n.SetPolicies(map[string]PolicyConfig{"api": dup}); err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Errorf("duplicate override: %v, want given twice", err)
	}
	if n.PolicyVersion() != v {
		t.Error("a refused table changed the version")
	}
}
