package peer

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// TestReserveSettle: a reservation through a forwarding node and through
// the holder, settled to less (the difference comes back), settled again
// (nothing changes), settled to more (overage, recorded beyond the
// limit), expired unsettled (the estimate stands, a late settle changes
// nothing), and the bad inputs.
func TestReserveSettle(t *testing.T) {
	clk := &hoClock{}
	c := startCluster(t, 3, Config{
		Clock: clk.Now,
		Policies: map[string]PolicyConfig{
			"tokens": {Limit: 100, Window: time.Minute, Replication: ReplicateSync},
			"conc":   {Limit: 2, Window: time.Minute, Algorithm: Concurrency},
			"bucket": {Limit: 2, Window: time.Minute, Algorithm: TokenBucket},
		},
	})
	ctx := context.Background()
	n0, n1, n2 := c.nodes[0], c.nodes[1], c.nodes[2]
	key := pmKeyOwnedBy(t, n0, "tokens", n1.Name())

	r1, err := n0.Reserve(ctx, Request{Key: key, Hits: 60}) // forwarded
	if err != nil || !r1.Allowed || r1.ID == 0 || r1.TTL != time.Minute || r1.Owner != n1.Name() || r1.Remaining != 40 {
		t.Fatalf("forwarded Reserve(60) = %+v, %v; want a reservation from %s, 40 left", r1, err, n1.Name())
	}
	if r, err := n1.Reserve(ctx, Request{Key: key, Hits: 50}); err != nil || r.Allowed || r.ID != 0 || r.Reason != ReasonOverLimit {
		t.Fatalf("Reserve(50) with 40 left = %+v, %v; want over limit, no id", r, err)
	}
	s, err := n2.Settle(ctx, key, r1.ID, 20)
	if err != nil || !s.Allowed || s.Reason != ReasonSettled || s.Estimate != 60 || s.Overage != 0 || s.Remaining != 80 {
		t.Fatalf("Settle(60 → 20) = %+v, %v; want settled, 80 left", s, err)
	}
	for _, id := range []uint64{r1.ID, 12345, 0} {
		if s, err := n0.Settle(ctx, key, id, 5); err != nil || s.Allowed || s.Estimate != 0 || s.Remaining != 80 {
			t.Fatalf("Settle(%d) again/unknown = %+v, %v; want nothing pending, nothing changed", id, s, err)
		}
	}
	r3, err := n1.Reserve(ctx, Request{Key: key, Hits: 70}) // local
	if err != nil || !r3.Allowed || r3.Remaining != 10 {
		t.Fatalf("Reserve(70) = %+v, %v; want admitted, 10 left", r3, err)
	}
	if s, err := n0.Settle(ctx, key, r3.ID, 90); err != nil || !s.Allowed || s.Estimate != 70 || s.Overage != 20 || s.Remaining != 0 {
		t.Fatalf("Settle(70 → 90) = %+v, %v; want settled with overage 20, 0 left", s, err)
	}
	if d, err := n2.Peek(ctx, Request{Key: key}); err != nil || d.Allowed {
		t.Fatalf("Peek after the overage = %+v, %v; want refused (110 of 100 spent)", d, err)
	}

	// Unsettled for a window: charged its estimate until it expires, and
	// a settle after that changes nothing.
	other := pmKeyOwnedBy2(t, n0, "tokens", n2.Name(), key)
	r4, err := n0.Reserve(ctx, Request{Key: other, Hits: 30})
	if err != nil || !r4.Allowed {
		t.Fatalf("Reserve(30) = %+v, %v", r4, err)
	}
	clk.Advance(time.Minute - 1)
	if d, _ := n1.Peek(ctx, Request{Key: other, Hits: 71}); d.Allowed {
		t.Fatalf("a nanosecond before the TTL: Peek(71) = %+v; want refused (the estimate still counts)", d)
	}
	clk.Advance(1)
	if s, err := n1.Settle(ctx, other, r4.ID, 1000); err != nil || s.Allowed || s.Remaining != 100 {
		t.Fatalf("Settle at the TTL = %+v, %v; want nothing pending, nothing recorded", s, err)
	}

	rateKey := Key{Tenant: key.Tenant, Subject: key.Subject, Policy: "conc"}
	bucketKey := Key{Tenant: key.Tenant, Subject: key.Subject, Policy: "bucket"}
	for name, call := range map[string]func() error{
		"Reserve on conc":  func() error { _, err := n0.Reserve(ctx, Request{Key: rateKey}); return err },
		"Settle on bucket": func() error { _, err := n0.Settle(ctx, bucketKey, 1, 1); return err },
		"Reserve over L":   func() error { _, err := n0.Reserve(ctx, Request{Key: other, Hits: 101}); return err },
		"Settle negative":  func() error { _, err := n0.Settle(ctx, other, 1, -1); return err },
		"Reserve multi": func() error {
			_, err := n0.Reserve(ctx, Request{Key: Key{Tenant: "t", Subject: "s"}, Policies: []string{"tokens"}})
			return err
		},
		"Reserve no policy": func() error {
			_, err := n0.Reserve(ctx, Request{Key: Key{Tenant: "t", Subject: "s", Policy: "nope"}})
			return err
		},
	} {
		if err := call(); err == nil || errors.Is(err, ErrUnavailable) {
			t.Errorf("%s: %v, want a bad-input error", name, err)
		}
	}
}

// TestReservationSurvivesTakeover: a reservation answered under sync
// replication is pending on the backup too, so after its holder is killed
// the new holder settles it, exactly once, and counts its estimate until
// then.
func TestReservationSurvivesTakeover(t *testing.T) {
	t.Parallel()
	cfg := logConfig(100, time.Minute)
	cfg.Policies = map[string]PolicyConfig{"tokens": {Limit: 100, Window: time.Minute, Replication: ReplicateSync}}
	c := startCluster(t, 3, cfg)
	ctx := context.Background()
	via := c.nodes[0]
	key := pmKeyOwnedBy(t, via, "tokens", c.nodes[1].Name())
	r, err := via.Reserve(ctx, Request{Key: key, Hits: 80})
	if err != nil || !r.Allowed || r.Owner != c.nodes[1].Name() {
		t.Fatalf("Reserve(80) = %+v, %v", r, err)
	}
	c.nodes[1].KillForTest()
	rest := []*Node{c.nodes[0], c.nodes[2]}
	var d Decision
	waitFor(t, 20*time.Second, "a decision after the takeover", func() bool {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		d, err = rest[0].Peek(cctx, Request{Key: key, Hits: 21})
		return err == nil
	})
	if d.Allowed {
		t.Fatalf("Peek(21) after the takeover = %+v; want refused (the 80 reserved still count)", d)
	}
	var s Settlement
	waitFor(t, 10*time.Second, "a settlement after the takeover", func() bool {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		s, err = rest[1].Settle(cctx, key, r.ID, 30)
		return err == nil
	})
	if !s.Allowed || s.Estimate != 80 || s.Remaining != 70 {
		t.Fatalf("Settle(80 → 30) on the new holder = %+v; want settled, 70 left", s)
	}
	if s, err := rest[0].Settle(ctx, key, r.ID, 30); err != nil || s.Allowed || s.Remaining != 70 {
		t.Fatalf("second Settle = %+v, %v; want nothing pending, 70 left", s, err)
	}
}

// TestClientReserveSettle: the routed client reserves and settles at the
// key's holder, and a repeated settle is harmless; the overage is counted
// in the node's metrics.
func TestClientReserveSettle(t *testing.T) {
	t.Parallel()
	metrics := newSinkRecorder()
	c := startCluster(t, 3, Config{Metrics: metrics, Policies: map[string]PolicyConfig{"tokens": {Limit: 100, Window: time.Minute}}})
	cl := dialForTest(t, c.nodes[2])
	ctx := context.Background()
	key := Key{Tenant: "acme", Subject: "alice", Policy: "tokens"}
	r, err := cl.Reserve(ctx, Request{Key: key, Hits: 40})
	if err != nil || !r.Allowed || r.ID == 0 || r.TTL != time.Minute || r.Remaining != 60 {
		t.Fatalf("Client.Reserve(40) = %+v, %v", r, err)
	}
	s, err := cl.Settle(ctx, key, r.ID, 55)
	if err != nil || !s.Allowed || s.Reason != ReasonSettled || s.Estimate != 40 || s.Overage != 15 || s.Remaining != 45 {
		t.Fatalf("Client.Settle(40 → 55) = %+v, %v; want settled, overage 15, 45 left", s, err)
	}
	if s, err := cl.Settle(ctx, key, r.ID, 55); err != nil || s.Allowed || s.Remaining != 45 {
		t.Fatalf("second Client.Settle = %+v, %v; want nothing pending, 45 left", s, err)
	}
	if _, err := cl.Settle(ctx, key, r.ID, -1); !errors.Is(err, ErrInvalidHits) {
		t.Fatalf("Client.Settle(-1): %v, want ErrInvalidHits", err)
	}
	// The nodes share one Metrics; the settlement's node counted its
	// overage once.
	if got := metrics.overageUnits("tokens"); got != 15 {
		t.Fatalf("ringlimit_overage_units_total{policy=tokens} = %v, want 15", got)
	}
}

// TestClientResetAndBatch: the routed client resets a key at its holder,
// through the node's AuthorizeReset, and decides a batch of independent
// requests, one bad request failing alone.
func TestClientResetAndBatch(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 3, Config{
		Policies: map[string]PolicyConfig{"q": {Limit: 2, Window: time.Minute}},
		AuthorizeReset: func(ctx context.Context) error {
			if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("authorization")) == 0 || md.Get("authorization")[0] != "Bearer ok" {
				return status.Error(codes.Unauthenticated, "no admin token")
			}
			return nil
		},
	})
	cl := dialForTest(t, c.nodes[1])
	ctx := context.Background()
	key := Key{Tenant: "acme", Subject: "bob", Policy: "q"}
	var reqs []Request
	for range 3 {
		reqs = append(reqs, Request{Key: key})
	}
	reqs = append(reqs, Request{Key: Key{Tenant: "acme", Subject: "bob", Policy: "nope"}}, Request{Key: Key{Tenant: "acme", Subject: "carol", Policy: "q"}})
	res := cl.AllowBatch(ctx, reqs)
	admitted := 0
	for _, r := range res[:3] {
		if r.Err != nil {
			t.Fatalf("batch item: %v", r.Err)
		}
		if r.Allowed {
			admitted++
		}
	}
	if admitted != 2 || !errors.Is(res[3].Err, ErrUnknownPolicy) || res[4].Err != nil || !res[4].Allowed {
		t.Fatalf("batch: %d of 3 admitted (want 2), unknown policy %v, other key %+v", admitted, res[3].Err, res[4])
	}
	if _, err := cl.Reset(ctx, key); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("Reset without the token: %v, want Unauthenticated", err)
	}
	if d, _ := cl.Peek(ctx, Request{Key: key}); d.Allowed {
		t.Fatalf("after a refused reset: %+v; want the key still full", d)
	}
	d, err := cl.Reset(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer ok"), key)
	if err != nil || d.Reason != ReasonReset || d.Remaining != 2 {
		t.Fatalf("Reset with the token = %+v, %v", d, err)
	}
	if d, err := cl.Allow(ctx, Request{Key: key}); err != nil || !d.Allowed {
		t.Fatalf("Allow after the reset = %+v, %v; want admitted", d, err)
	}
}
