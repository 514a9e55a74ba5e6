package peer

import (
	"context"
	"testing"
	"time"
)

// TestRefundNothingToGiveBack: a refund of a key that holds no admissions
// answers Allowed false (nothing was given back) with the key's unchanged,
// full state, and does not create the key; a refund that gives units back
// answers Allowed true. Both carry ReasonRefunded; Allowed is what tells
// them apart (the HTTP API names the first "nothing_to_refund").
func TestRefundNothingToGiveBack(t *testing.T) {
	clk := &hoClock{}
	c := startCluster(t, 1, Config{
		Clock:    clk.Now,
		Policies: map[string]PolicyConfig{"a": {Limit: 5, Window: time.Minute}},
	})
	nd := c.nodes[0]
	ctx := context.Background()
	k := Key{Tenant: "acme", Subject: "never-used", Policy: "a"}
	d, err := nd.Refund(ctx, Request{Key: k, Hits: 2})
	if err != nil || d.Allowed || d.Reason != ReasonRefunded || d.Limit != 5 || d.Remaining != 5 || d.RetryAfter != 0 {
		t.Fatalf("Refund of an empty key = %+v, %v; want not allowed (nothing given back), 5 of 5 remaining", d, err)
	}
	if d, err := nd.Peek(ctx, Request{Key: k}); err != nil || d.Remaining != 4 {
		t.Fatalf("Peek after an empty refund = %+v, %v; want the full limit (4 left after the peeked 1)", d, err)
	}
	// A real refund is unchanged: Allowed, the new state.
	clk.Advance(time.Millisecond)
	if d, err := nd.Allow(ctx, Request{Key: k, Hits: 3}); err != nil || !d.Allowed || d.Remaining != 2 {
		t.Fatalf("Allow 3: %+v, %v", d, err)
	}
	if d, err := nd.Refund(ctx, Request{Key: k, Hits: 2}); err != nil || !d.Allowed || d.Reason != ReasonRefunded || d.Remaining != 4 {
		t.Fatalf("Refund 2 of 3 = %+v, %v; want allowed, 4 remaining", d, err)
	}
	// Once the window has passed, nothing counts any more: nothing to give back.
	clk.Advance(2 * time.Minute)
	if d, err := nd.Refund(ctx, Request{Key: k}); err != nil || d.Allowed || d.Remaining != 5 {
		t.Fatalf("Refund after the window = %+v, %v; want not allowed, 5 remaining", d, err)
	}
}
