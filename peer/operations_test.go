package peer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// TestMultiPolicyAtomic decides two policies of one subject as one, through
// every node of a cluster, concurrently: no policy's window may ever hold
// more than its limit, and each policy's log must hold exactly the admitted
// requests (none admitted by one policy's log but refused overall).
func TestMultiPolicyAtomic(t *testing.T) {
	const perSecond, perMinute = 5, 12
	clk := &hoClock{}
	c := startCluster(t, 3, Config{
		Clock:  clk.Now,
		Gossip: hoGossip,
		Policies: map[string]PolicyConfig{
			"sec": {Limit: perSecond, Window: time.Second},
			"min": {Limit: perMinute, Window: time.Minute},
		},
	})
	key := Key{Tenant: "acme", Subject: "user-multi"}
	var mu sync.Mutex
	var times []time.Time
	var wg sync.WaitGroup
	for g := range 6 {
		nd := c.nodes[g%3]
		wg.Go(func() {
			for i := range 40 {
				clk.freeze.RLock()
				at := clk.Now()
				d, err := nd.Allow(context.Background(), Request{Key: key, Policies: []string{"sec", "min"}})
				clk.freeze.RUnlock()
				if err != nil {
					t.Errorf("Allow: %v", err)
					return
				}
				if len(d.Limits) != 2 || d.Limits[0].Policy != "sec" || d.Limits[1].Policy != "min" {
					t.Errorf("Limits = %+v, want sec then min", d.Limits)
					return
				}
				if d.Allowed {
					mu.Lock()
					times = append(times, at)
					mu.Unlock()
				} else if d.RefusedBy == "" || d.Reason != ReasonOverLimit {
					t.Errorf("refused without RefusedBy/over_limit: %+v", d)
				}
				if i%5 == 4 {
					clk.Advance(100 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	check := func(limit int, w time.Duration) {
		t.Helper()
		for i, ti := range times {
			n := 0
			for _, tj := range times {
				if tj.After(ti.Add(-w)) && !tj.After(ti) {
					n++
				}
			}
			if n > limit {
				t.Fatalf("%d admissions in the window (%v, %v], limit %d", n, ti.Add(-w).Sub(hoT0), ti.Sub(hoT0), limit)
			}
			_ = i
		}
	}
	check(perSecond, time.Second)
	check(perMinute, time.Minute)
	if len(times) != perMinute {
		t.Fatalf("%d multi-policy admissions, want exactly the per-minute limit %d over this run", len(times), perMinute)
	}
	// Each policy's own log holds exactly the admitted requests.
	for _, tc := range []struct {
		policy string
		limit  int64
	}{{"min", perMinute}} {
		d, err := c.nodes[0].Peek(context.Background(), Request{Key: Key{Tenant: key.Tenant, Subject: key.Subject, Policy: tc.policy}})
		if err != nil || d.Reason != ReasonPeek || d.Remaining != tc.limit-int64(len(times)) {
			t.Fatalf("peek %s: %+v, %v; want %d remaining", tc.policy, d, err, tc.limit-int64(len(times)))
		}
	}
}

// TestOperations checks peek, refund and reset end to end, through a node
// that forwards and through the holder, and that a refused multi-policy
// request records nothing in the policy that admitted.
func TestOperations(t *testing.T) {
	clk := &hoClock{}
	c := startCluster(t, 3, Config{
		Clock: clk.Now,
		Policies: map[string]PolicyConfig{
			"a": {Limit: 5, Window: time.Minute},
			"b": {Limit: 2, Window: time.Minute},
		},
	})
	ctx := context.Background()
	k := Key{Tenant: "acme", Subject: "ops", Policy: "a"}
	owner, _ := c.nodes[0].Owner(k)
	var via, holder *Node
	for _, nd := range c.nodes {
		if nd.Name() == owner {
			holder = nd
		} else {
			via = nd
		}
	}
	for _, nd := range []*Node{via, holder} {
		t.Run("via="+nd.Name(), func(t *testing.T) {
			if _, err := nd.Reset(ctx, k); err != nil {
				t.Fatalf("Reset: %v", err)
			}
			for range 3 {
				clk.Advance(time.Millisecond)
				if d, err := nd.Allow(ctx, Request{Key: k}); err != nil || !d.Allowed {
					t.Fatalf("Allow: %+v, %v", d, err)
				}
			}
			// Peek consumes nothing.
			for range 3 {
				d, err := nd.Peek(ctx, Request{Key: k, Hits: 2})
				if err != nil || !d.Allowed || d.Reason != ReasonPeek || d.Remaining != 0 || d.Owner != owner {
					t.Fatalf("Peek: %+v, %v; want would-admit with 0 remaining after it, by %s", d, err, owner)
				}
			}
			if d, _ := nd.Peek(ctx, Request{Key: k, Hits: 3}); d.Allowed || d.RetryAfter <= 0 {
				t.Fatalf("Peek of 3 with 2 left: %+v; want refused with RetryAfter", d)
			}
			// Refund 2 of 3: Remaining goes from 2 to 4; never below empty.
			d, err := nd.Refund(ctx, Request{Key: k, Hits: 2})
			if err != nil || !d.Allowed || d.Reason != ReasonRefunded || d.Remaining != 4 {
				t.Fatalf("Refund 2: %+v, %v; want 4 remaining", d, err)
			}
			d, err = nd.Refund(ctx, Request{Key: k, Hits: 5})
			if err != nil || d.Remaining != 5 {
				t.Fatalf("Refund 5 of 1: %+v, %v; want 5 remaining (never below empty)", d, err)
			}
			if _, err := nd.Refund(ctx, Request{Key: k, Hits: -1}); !errors.Is(err, ErrInvalidHits) {
				t.Fatalf("Refund -1: %v, want ErrInvalidHits", err)
			}
			// A multi-policy request refused by b records nothing in a.
			kb := Key{Tenant: k.Tenant, Subject: k.Subject, Policy: "b"}
			if _, err := nd.Reset(ctx, kb); err != nil {
				t.Fatal(err)
			}
			multi := Request{Key: Key{Tenant: k.Tenant, Subject: k.Subject}, Policies: []string{"a", "b"}}
			for i := range 3 {
				d, err := nd.Allow(ctx, multi)
				if err != nil || d.Allowed != (i < 2) {
					t.Fatalf("multi %d: %+v, %v", i, d, err)
				}
				if i == 2 && (d.RefusedBy != "b" || !d.Limits[0].Allowed || d.Limits[1].Allowed) {
					t.Fatalf("multi refused: %+v; want refused by b with a admitting", d)
				}
			}
			if d, _ := nd.Peek(ctx, Request{Key: k}); d.Remaining != 5-2-1 {
				t.Fatalf("a after 2 admitted and 1 refused multi requests: %+v; want %d remaining", d, 5-2-1)
			}
			// Reset empties the key.
			if d, err := nd.Reset(ctx, k); err != nil || d.Reason != ReasonReset {
				t.Fatalf("Reset: %+v, %v", d, err)
			}
			if d, _ := nd.Peek(ctx, Request{Key: k}); d.Remaining != 4 {
				t.Fatalf("after reset: %+v; want a full limit (peek of 1 leaves 4)", d)
			}
		})
	}
	for _, tc := range []struct {
		name string
		req  Request
		want error
	}{
		{"policy and policies", Request{Key: k, Policies: []string{"a"}}, ErrInvalidKey},
		{"duplicate policy", Request{Key: Key{Tenant: "t", Subject: "s"}, Policies: []string{"a", "a"}}, ErrInvalidKey},
		{"unknown policy", Request{Key: Key{Tenant: "t", Subject: "s"}, Policies: []string{"a", "zz"}}, ErrUnknownPolicy},
		{"hits over a limit", Request{Key: Key{Tenant: "t", Subject: "s"}, Policies: []string{"a", "b"}, Hits: 3}, ErrInvalidHits},
		{"too many", Request{Key: Key{Tenant: "t", Subject: "s"}, Policies: manyPolicies(17)}, ErrInvalidKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := c.nodes[0].Allow(ctx, tc.req); !errors.Is(err, tc.want) {
				t.Fatalf("Allow(%+v) = %v, want %v", tc.req, err, tc.want)
			}
		})
	}
}

func manyPolicies(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("p%d", i)
	}
	return out
}

// TestRefundReplicated crashes the holder right after a refund: the backup
// continues from a copy that has the refund (and a reset) applied.
func TestRefundReplicated(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 3, Config{
		Gossip:   hoGossip,
		Policies: map[string]PolicyConfig{"p": {Limit: 5, Window: time.Hour}},
	})
	ctx := context.Background()
	victim := c.nodes[2]
	k := pmKeyOwnedBy(t, c.nodes[0], "p", victim.Name())
	k2 := pmKeyOwnedBy2(t, c.nodes[0], "p", victim.Name(), k)
	for range 5 {
		if d, err := c.nodes[0].Allow(ctx, Request{Key: k}); err != nil || !d.Allowed {
			t.Fatalf("fill: %+v, %v", d, err)
		}
		if d, err := c.nodes[0].Allow(ctx, Request{Key: k2}); err != nil || !d.Allowed {
			t.Fatalf("fill: %+v, %v", d, err)
		}
	}
	if d, err := c.nodes[1].Refund(ctx, Request{Key: k, Hits: 2}); err != nil || d.Remaining != 2 {
		t.Fatalf("Refund: %+v, %v", d, err)
	}
	if _, err := c.nodes[1].Reset(ctx, k2); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	victim.KillForTest()
	c.waitMembers(2)
	var d Decision
	waitFor(t, 15*time.Second, "a decision after the takeover", func() bool {
		var err error
		d, err = c.nodes[0].Peek(ctx, Request{Key: k})
		return err == nil
	})
	if d.Remaining != 1 || !d.Allowed {
		t.Fatalf("after the crash, peek of %v: %+v; want the refunded state (2 free, 1 left after this request)", k, d)
	}
	if d, err := c.nodes[0].Peek(ctx, Request{Key: k2}); err != nil || d.Remaining != 4 {
		t.Fatalf("after the crash, peek of the reset key: %+v, %v; want a full limit", d, err)
	}
}

// TestRefundNotResentAfterUnknownOutcome: a forwarded refund or reset
// whose answer never comes, from a holder whose port then looks dead, may
// have been decided there and copied to the backup, which would decide it
// again after a takeover (two units given back for one). The node must not
// send it to another member: it answers unavailable after one forward. An
// admission in the same scene is sent on, which shows the scene reaches
// the resend, and is counted as resent (Forward outcome "resent": it may
// count twice).
func TestRefundNotResentAfterUnknownOutcome(t *testing.T) {
	t.Parallel()
	m := newHoMetrics()
	c := startCluster(t, 3, Config{
		Metrics:        m,
		ForwardTimeout: 200 * time.Millisecond,
		Policies:       map[string]PolicyConfig{"p": {Limit: 5, Window: time.Hour}},
	})
	via, holder, other := c.nodes[0], c.nodes[1], c.nodes[2]
	k := pmKeyOwnedBy(t, via, "p", holder.Name())
	// Fill the key to its limit. A loaded machine may not answer a
	// forward within the 200 ms: such a try is retried (it may have been
	// admitted all the same, so a refusal at the limit ends the fill too).
	deadline := time.Now().Add(20 * time.Second)
	for admitted := 0; admitted < 5; {
		if time.Now().After(deadline) {
			t.Fatalf("fill: %d of 5 admitted within 20 s", admitted)
		}
		d, err := via.Allow(context.Background(), Request{Key: k})
		switch {
		case errors.Is(err, ErrUnavailable):
		case err != nil:
			t.Fatalf("fill: %v", err)
		case d.Allowed:
			admitted++
		default:
			admitted = 5 // at the limit: a try whose answer was lost was admitted
		}
	}
	// Every forward that reaches a member is counted there, before it is
	// decided: the holder's never answer.
	var received atomic.Int64
	release := make(chan struct{})
	defer close(release)
	holder.setCheckHookForTest(func(ctx context.Context) {
		received.Add(1)
		select {
		case <-ctx.Done():
		case <-release:
		}
	})
	other.setCheckHookForTest(func(context.Context) { received.Add(1) })
	via.setPortDeadForTest(func(m string) bool { return m == holder.Name() })
	for _, tc := range []struct {
		name     string
		call     func(ctx context.Context) (Decision, error)
		resendOK bool
	}{
		{"refund", func(ctx context.Context) (Decision, error) { return via.Refund(ctx, Request{Key: k}) }, false},
		{"reset", func(ctx context.Context) (Decision, error) { return via.Reset(ctx, k) }, false},
		{"admission", func(ctx context.Context) (Decision, error) { return via.Allow(ctx, Request{Key: k}) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			via.reach.clear(holder.Name()) // each case from the same start
			before, resentBefore := received.Load(), m.resent.Load()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			d, err := tc.call(ctx)
			got, resent := received.Load()-before, m.resent.Load()-resentBefore
			if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("%s = %+v, %v; want an error wrapping ErrUnavailable (the holder never answers)", tc.name, d, err)
			}
			if tc.resendOK && got < 2 {
				t.Fatalf("%s reached members %d time(s); want it sent on after the dead port (the scene must reach the resend)", tc.name, got)
			}
			if !tc.resendOK && got != 1 {
				t.Fatalf("%s reached members %d times; want exactly once (an outcome unknown must not be decided a second time elsewhere)", tc.name, got)
			}
			if tc.resendOK != (resent > 0) || resent >= got {
				t.Fatalf("%s reached members %d times and counted %d resends; want resends only for an admission, fewer than the members reached", tc.name, got, resent)
			}
			if !via.reach.is(holder.Name(), via.mono()) {
				t.Fatalf("after %s, %s has not marked the holder with the dead port unreachable", tc.name, via.Name())
			}
		})
	}
}

// pmKeyOwnedBy2 is pmKeyOwnedBy returning a key other than not.
func pmKeyOwnedBy2(t *testing.T, nd *Node, policy, owner string, not Key) Key {
	t.Helper()
	for i := range 10000 {
		k := Key{Tenant: "acme2", Subject: fmt.Sprintf("subject-%05d", i), Policy: policy}
		if o, err := nd.Owner(k); err == nil && o == owner && k != not {
			return k
		}
	}
	t.Fatalf("no second key owned by %s", owner)
	return Key{}
}

// TestPublicAllowAllocs: the public API's unary Allow, decided on this
// node, allocates only its response (it went through the general path,
// which moves the key's encoding to the heap: 2 allocations).
func TestPublicAllowAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	c := startCluster(t, 1, Config{Policies: map[string]PolicyConfig{"p": {Limit: 1 << 40, Window: time.Second}}})
	s := &publicService{n: c.nodes[0]}
	ctx := context.Background()
	req := &peerpb.AllowRequest{Key: &peerpb.Key{Tenant: "t", Subject: "s", Policy: "p"}}
	if resp, err := s.Allow(ctx, req); err != nil || !resp.GetAllowed() {
		t.Fatalf("Allow = %v, %v", resp, err)
	}
	if a := testing.AllocsPerRun(1000, func() {
		if _, err := s.Allow(ctx, req); err != nil {
			t.Fatal(err)
		}
	}); a > 1 {
		t.Fatalf("a unary Allow decided here allocates %.1f times, want 1 (its response)", a)
	}
}

// BenchmarkPublicAllowLocal measures the public API's unary Allow handler
// deciding on this node (no gRPC transport): what a sidecar client's call
// costs the node past the transport.
func BenchmarkPublicAllowLocal(b *testing.B) {
	c := startCluster(b, 1, Config{Policies: map[string]PolicyConfig{"p": {Limit: 1 << 50, Window: time.Second}}})
	s := &publicService{n: c.nodes[0]}
	ctx := context.Background()
	req := &peerpb.AllowRequest{Key: &peerpb.Key{Tenant: "t", Subject: "s", Policy: "p"}}
	b.ReportAllocs()
	var resp *peerpb.AllowResponse
	for b.Loop() {
		var err error
		if resp, err = s.Allow(ctx, req); err != nil || !resp.GetAllowed() {
			b.Fatalf("Allow = %v, %v", resp, err)
		}
	}
	_ = resp
}

// TestLocalPathAllocs pins the local decision path at zero allocations: a
// single node (it holds every partition, no backup) deciding one key.
func TestLocalPathAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	c := startCluster(t, 1, Config{Policies: map[string]PolicyConfig{"p": {Limit: 1 << 40, Window: time.Second}}})
	nd := c.nodes[0]
	ctx := context.Background()
	req := Request{Key: Key{Tenant: "t", Subject: "s", Policy: "p"}}
	if _, err := nd.Allow(ctx, req); err != nil {
		t.Fatal(err)
	}
	if a := testing.AllocsPerRun(1000, func() {
		if _, err := nd.Allow(ctx, req); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Fatalf("Node.Allow on the local path allocates %.1f times per call, want 0", a)
	}
}

// TestMultiPolicyAllocs bounds a local two-policy check's allocations: the
// first policy's key encoding (the placement the request keeps), the
// request's policy list, and the answer's Limits. The store's items and
// their index stay on the stack.
func TestMultiPolicyAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	c := startCluster(t, 1, Config{Policies: map[string]PolicyConfig{
		"p": {Limit: 1 << 40, Window: time.Second},
		"q": {Limit: 1 << 40, Window: time.Minute},
	}})
	nd := c.nodes[0]
	ctx := context.Background()
	req := Request{Key: Key{Tenant: "t", Subject: "s"}, Policies: []string{"p", "q"}}
	if d, err := nd.Allow(ctx, req); err != nil || !d.Allowed || len(d.Limits) != 2 {
		t.Fatalf("Allow = %+v, %v", d, err)
	}
	if a := testing.AllocsPerRun(1000, func() {
		if _, err := nd.Allow(ctx, req); err != nil {
			t.Fatal(err)
		}
	}); a > 3 {
		t.Fatalf("a local two-policy check allocates %.1f times per call, want at most 3", a)
	}
}
