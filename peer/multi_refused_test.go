package peer

import (
	"context"
	"testing"
	"time"
)

// TestMultiRefusedRemainingIsPeek: in a refused multi-policy check, the
// entry of a policy that admits reports what a peek of the same request
// reports (its hits counted as taken, as an admitted check's are), not the
// state with the hits given back; nothing is recorded.
func TestMultiRefusedRemainingIsPeek(t *testing.T) {
	clk := &hoClock{}
	c := startCluster(t, 1, Config{
		Clock: clk.Now,
		Policies: map[string]PolicyConfig{
			"big":   {Limit: 100, Window: time.Minute},
			"small": {Limit: 2, Window: time.Minute},
		},
	})
	nd := c.nodes[0]
	ctx := context.Background()
	subj := Key{Tenant: "acme", Subject: "multi-refused"}
	multi := Request{Key: subj, Policies: []string{"big", "small"}}
	for i := range 2 {
		clk.Advance(time.Millisecond)
		d, err := nd.Allow(ctx, multi)
		if err != nil || !d.Allowed || d.Limits[0].Remaining != 99-int64(i) {
			t.Fatalf("multi %d: %+v, %v; want admitted, big %d remaining", i, d, err, 99-i)
		}
	}
	for _, hits := range []int64{1, 2} {
		multi.Hits = hits
		peek, err := nd.Peek(ctx, multi)
		if err != nil || peek.Allowed || len(peek.Limits) != 2 {
			t.Fatalf("multi peek of %d: %+v, %v; want would-refuse", hits, peek, err)
		}
		single, err := nd.Peek(ctx, Request{Key: Key{Tenant: subj.Tenant, Subject: subj.Subject, Policy: "big"}, Hits: hits})
		if err != nil || !single.Allowed {
			t.Fatalf("peek big of %d: %+v, %v", hits, single, err)
		}
		d, err := nd.Allow(ctx, multi)
		if err != nil || d.Allowed || d.RefusedBy != "small" || len(d.Limits) != 2 {
			t.Fatalf("multi of %d with small spent: %+v, %v; want refused by small", hits, d, err)
		}
		big := d.Limits[0]
		if !big.Allowed || big.Remaining != 98-hits || big.Remaining != peek.Limits[0].Remaining || big.Remaining != single.Remaining {
			t.Fatalf("refused multi of %d: big = %+v; want allowed with %d remaining, as the multi peek (%+v) and the peek of big (%+v) say",
				hits, big, 98-hits, peek.Limits[0], single)
		}
		if d.Limits[1] != peek.Limits[1] {
			t.Fatalf("refused multi of %d: small = %+v, multi peek says %+v", hits, d.Limits[1], peek.Limits[1])
		}
	}
	// Nothing was recorded by the refused checks.
	if d, err := nd.Peek(ctx, Request{Key: Key{Tenant: subj.Tenant, Subject: subj.Subject, Policy: "big"}}); err != nil || d.Remaining != 97 {
		t.Fatalf("peek big after: %+v, %v; want 97 (2 admitted, the peeked 1 counted)", d, err)
	}
}
