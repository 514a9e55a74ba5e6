package peer

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A fifth round of attacks on the ownership protocol: operations other
// than a single-policy check (several policies at once, leases, refunds)
// across takeovers and moves.

// TestAttack5MultiUnavailableUnlimited: the holder n0 of a subject's
// partition stops answering checks (a wedged server: every forward times
// out). A check of policies "a" (unlimited for this tenant by an
// override) and "b" (limit 5, fail closed, already full) through n1 must
// be refused as unavailable: b fails closed. The failure policy of a
// multi-policy check used to be the first fail-closed policy's, a here,
// and an unlimited key is admitted when its holder cannot be reached:
// every check was admitted, b's limit and its failure policy ignored.
func TestAttack5MultiUnavailableUnlimited(t *testing.T) {
	t.Parallel()
	const limit = 5
	tenant := "ho-multi-unavailable"
	c := startCluster(t, 2, Config{
		ForwardTimeout: 300 * time.Millisecond,
		Policies: map[string]PolicyConfig{
			"a": {Limit: limit, Window: time.Hour, Overrides: []Override{{Tenant: tenant, Unlimited: true}}},
			"b": {Limit: limit, Window: time.Hour},
		},
	})
	n0, n1 := c.nodes[0], c.nodes[1]
	key, _ := keyHeldWithBackup(t, n0, n1, "multi-unavailable", "b")
	multi := Request{Key: Key{Tenant: key.Tenant, Subject: key.Subject}, Policies: []string{"a", "b"}}
	admitted := 0
	for range limit {
		if d, err := n1.Allow(context.Background(), multi); err != nil || !d.Allowed {
			t.Fatalf("check %d through n1 while n0 answers: %+v, %v", admitted+1, d, err)
		}
		admitted++
	}
	n0.setCheckHookForTest(func(ctx context.Context) { <-ctx.Done() })
	for range 3 {
		d, err := n1.Allow(context.Background(), multi)
		if err == nil && d.Allowed {
			admitted++
			t.Errorf("check through n1 while n0 does not answer = %+v: %d admissions of b in one window of limit %d", d, admitted, limit)
			continue
		}
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("check through n1 while n0 does not answer = %+v, %v; want unavailable (b fails closed)", d, err)
		}
	}
}
