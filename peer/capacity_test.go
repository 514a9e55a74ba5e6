package peer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// reasonCounts counts Metrics.Decision calls by reason.
type reasonCounts struct {
	nopMetrics
	mu sync.Mutex
	m  map[Reason]int
}

func (r *reasonCounts) Decision(_ string, reason Reason, _ Path) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[Reason]int{}
	}
	r.m[reason]++
}

func (r *reasonCounts) count(reason Reason) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[reason]
}

// TestKeyCapacity fills one partition to its share of Store.MaxKeys (64
// keys, the least a partition gets): a new key of it is then refused with
// ErrCapacity (which is also ErrUnavailable, never over limit) on its
// holder and through a node that forwards to it, ResourceExhausted over
// gRPC, counted as reason capacity; a fail-open policy admits it as
// failed open; and the keys held are still decided.
func TestKeyCapacity(t *testing.T) {
	t.Parallel()
	var holderMetrics reasonCounts
	c := startClusterWith(t, 2, Config{
		Policies: map[string]PolicyConfig{
			"p":    {Limit: 5, Window: time.Hour},
			"open": {Limit: 5, Window: time.Hour, OnUnavailable: FailOpen},
		},
		Store: shard.Config{MaxKeys: 1}, // 64 keys a partition
	}, func(i int, cfg *Config) {
		if i == 0 {
			cfg.Metrics = &holderMetrics
		}
	})
	holder, via := c.nodes[0], c.nodes[1]
	ctx := context.Background()
	// 65 subjects of one partition held by n0.
	var keys []Key
	pid := -1
	for i := 0; len(keys) < 65 && i < 1<<20; i++ {
		k := Key{Tenant: "cap", Subject: fmt.Sprintf("s%06d", i), Policy: "p"}
		if pid < 0 {
			if o, _ := holder.Owner(k); o != holder.Name() {
				continue
			}
			pid = holder.partIDForTest(k)
		}
		if holder.partIDForTest(k) == pid {
			keys = append(keys, k)
		}
	}
	if len(keys) < 65 {
		t.Fatalf("found %d keys of partition %d, want 65", len(keys), pid)
	}
	for i, k := range keys[:64] {
		if d, err := c.nodes[i%2].Allow(ctx, Request{Key: k}); err != nil || !d.Allowed {
			t.Fatalf("key %d of 64: %+v, %v; want admitted", i+1, d, err)
		}
	}
	full := keys[64]
	for _, nd := range []*Node{holder, via} {
		d, err := nd.Allow(ctx, Request{Key: full})
		if !errors.Is(err, ErrCapacity) || !errors.Is(err, ErrUnavailable) {
			t.Fatalf("a 65th key via %s: %+v, %v; want ErrCapacity (and ErrUnavailable)", nd.Name(), d, err)
		}
		t.Logf("via %s: %v", nd.Name(), err)
	}
	if n := holderMetrics.count(ReasonCapacity); n != 1 {
		t.Errorf("the holder counted %d decisions of reason capacity, want 1 (its own; the forward is counted by its sender)", n)
	}
	_, err := peerpb.NewRateLimiterClient(dialTest(t, via.RPCAddr())).Allow(ctx, &peerpb.AllowRequest{Key: &peerpb.Key{Tenant: full.Tenant, Subject: full.Subject, Policy: full.Policy}})
	if status.Code(err) != codes.ResourceExhausted || !errors.Is(FromStatus(err), ErrCapacity) {
		t.Fatalf("gRPC Allow of a 65th key: %v; want ResourceExhausted, ErrCapacity once converted back", err)
	}
	open := full
	open.Policy = "open"
	if d, err := holder.Allow(ctx, Request{Key: open}); err != nil || !d.Allowed || d.Reason != ReasonFailedOpen {
		t.Fatalf("a new key of a fail-open policy in the full partition: %+v, %v; want admitted, failed open", d, err)
	}
	for i, nd := range []*Node{holder, via} {
		if d, err := nd.Allow(ctx, Request{Key: keys[0]}); err != nil || !d.Allowed || d.Remaining != int64(3-i) {
			t.Fatalf("a held key via %s: %+v, %v; want decided (admitted, %d remaining)", nd.Name(), d, err, 3-i)
		}
	}
}
