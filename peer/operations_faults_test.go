package peer

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// The operations besides a single-policy check (internal/partition) under
// faults: a check of several policies one of which is unlimited, a refund
// or reset reordered in a replication batch, and a refund its backup does
// not confirm, retried by its caller.

// TestMultiPauseUnlimitedSync: a check of two policies of one
// subject, "a" (sync, but unlimited for this tenant by an override) and
// "b" (async or off, limit 5), pauses on its holder n0 between the lease
// check and the decision, and n0 crashes meanwhile. Its backup n1 takes
// the partition over and admits b's whole limit. The paused check then
// resumes and admits on b. Nothing fences it: a, the only synchronous
// policy, is not copied (an unlimited key records nothing), and b's copy
// is not waited for. It used to be confirmed anyway, the lease not being
// checked again because one of the policies was synchronous: 6
// admissions of b in one window of 5.
func TestMultiPauseUnlimitedSync(t *testing.T) {
	t.Parallel()
	for _, mode := range []Replication{ReplicateAsync, ReplicateOff} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			const limit = 5
			tenant := "ho-multi-unlimited-" + mode.String()
			c := startCluster(t, 3, Config{
				Gossip:         hoGossip,
				ForwardTimeout: time.Second,
				Policies: map[string]PolicyConfig{
					"a": {Limit: limit, Window: time.Hour, Replication: ReplicateSync, Overrides: []Override{{Tenant: tenant, Unlimited: true}}},
					"b": {Limit: limit, Window: time.Hour, Replication: mode},
				},
			})
			n0, n1 := c.nodes[0], c.nodes[1]
			key, pid := keyHeldWithBackup(t, n0, n1, "multi-unlimited-"+mode.String(), "b")
			multi := Request{Key: Key{Tenant: key.Tenant, Subject: key.Subject}, Policies: []string{"a", "b"}}
			pausedDecisionAfterTakeover(t, n0, n1, pid, limit, func(ctx context.Context, nd *Node) (Decision, error) {
				return nd.Allow(ctx, multi)
			})
		})
	}
}

// TestMultiUnavailableUnlimited: the holder n0 of a subject's
// partition stops answering checks (a wedged server: every forward times
// out). A check of policies "a" (unlimited for this tenant by an
// override) and "b" (limit 5, fail closed, already full) through n1 must
// be refused as unavailable: b fails closed. The failure policy of a
// multi-policy check used to be the first fail-closed policy's, a here,
// and an unlimited key is admitted when its holder cannot be reached:
// every check was admitted, b's limit and its failure policy ignored.
func TestMultiUnavailableUnlimited(t *testing.T) {
	t.Parallel()
	const limit = 5
	tenant := "ho-multi-unavailable"
	c := startCluster(t, 2, Config{
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
		// The caller's deadline ends the wait for the wedged holder (as
		// ForwardTimeout would): the failure policy answers either way.
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		d, err := n1.Allow(ctx, multi)
		cancel()
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

// holdReplication makes backup's replication receiver stop, before
// applying it, at the first request from sender once armed, until the
// returned release is called (at the latest when t ends). entered is
// closed when it stops. With MaxInFlight 1 the sender then sends nothing
// more to backup: what it queues meanwhile leaves in one batch.
func holdReplication(t *testing.T, backup *Node, sender string) (arm func(), entered <-chan struct{}, release func()) {
	in, out := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	armed, held := false, false
	backup.setReplDropForTest(func(req *peerpb.ReplicateRequest) bool {
		mu.Lock()
		stop := armed && !held && req.GetSender() == sender && !isCopy(req)
		if stop {
			held = true
		}
		mu.Unlock()
		if stop {
			close(in)
			<-out
		}
		return false
	})
	var once sync.Once
	release = func() { once.Do(func() { close(out) }) }
	t.Cleanup(release)
	arm = func() {
		mu.Lock()
		armed = true
		mu.Unlock()
	}
	return arm, in, release
}

// heldUnits returns the units key holds in nd's store, once every
// decision in progress on its partition has finished (and queued its
// copy).
func heldUnits(nd *Node, key Key) int64 {
	pt := nd.partOfForTest(key)
	pt.Mu.Lock() // a barrier: decisions hold the gate until they have queued their copy
	pt.Mu.Unlock()
	runs, _ := nd.ExportForTest(key)
	var sum int64
	for _, r := range runs {
		sum += r.Count
	}
	return sum
}

// TestRefundReorderedInBatch: a refund replicates the key's whole
// new state (REPLACE), an admission only the admission (ADMIT). A
// replication batch grouped every admission of a partition into the
// batch's first admission operation, ahead of a REPLACE queued before some
// of them: the backup applied [admission of another policy of the
// subject, refund's state, admission after the refund] as [both
// admissions, refund's state], and the state erased the admission made
// after the refund, although the backup had confirmed it (sync). After a
// crash of the holder, the backup took over with fewer admissions than
// were confirmed and admitted again: 7 net admissions (8 admitted, 1
// refunded) in one window of 5.
func TestRefundReorderedInBatch(t *testing.T) {
	t.Parallel()
	for _, op := range []string{"refund", "reset"} {
		t.Run(op, func(t *testing.T) {
			t.Parallel()
			const limit = 5
			c := startCluster(t, 3, Config{
				Gossip:         hoGossip,
				LeaseDuration:  time.Second,
				ForwardTimeout: crashForwardTimeout,
				MaxInFlight:    1,
				Policies: map[string]PolicyConfig{
					"s": {Limit: limit, Window: time.Hour, Replication: ReplicateSync},
					"a": {Limit: 1 << 20, Window: time.Hour, Replication: ReplicateAsync},
				},
			})
			n0, n1, n2 := c.nodes[0], c.nodes[1], c.nodes[2]
			key, pid := keyHeldWithBackup(t, n0, n1, "refund-batch-"+op, "s")
			other := Key{Tenant: key.Tenant, Subject: key.Subject, Policy: "a"} // same partition
			waitFor(t, 10*time.Second, "n0's replication pipe to n1", func() bool {
				admitN(t, n0, other, 1)
				return n0.replPipeForTest("n1") != ""
			})
			ctx := context.Background()
			net := 0 // units admitted minus units given back, all in one window
			before := 4
			if op == "reset" {
				before = limit
			}
			net += admitN(t, n0, key, before)
			arm, entered, release := holdReplication(t, n1, "n0")
			arm()
			admitN(t, n0, other, 1) // the batch that stops at n1
			select {
			case <-entered:
			case <-time.After(5 * time.Second):
				t.Fatal("n1 never received n0's replication")
			}
			// Queued behind it, in this order: an admission of the
			// subject's other policy, the refund (or reset), and two
			// admissions of key.
			admitN(t, n0, other, 1)
			type result struct {
				d   Decision
				err error
			}
			results := make(chan result, 3)
			want := heldUnits(n0, key)
			go func() {
				var d Decision
				var err error
				if op == "refund" {
					d, err = n0.Refund(ctx, Request{Key: key})
				} else {
					d, err = n0.Reset(ctx, key)
				}
				results <- result{d, err}
			}()
			if op == "refund" {
				want--
			} else {
				want = 0
			}
			waitFor(t, 5*time.Second, "the "+op+" to be decided", func() bool { return heldUnits(n0, key) == want })
			for range 2 {
				go func() {
					d, err := n0.Allow(ctx, Request{Key: key})
					results <- result{d, err}
				}()
				want++
				waitFor(t, 5*time.Second, "an admission to be decided", func() bool { return heldUnits(n0, key) == want })
			}
			release()
			for range 3 {
				r := <-results
				switch {
				case r.err != nil:
					t.Fatalf("operation failed: %v", r.err)
				case r.d.Reason == ReasonRefunded && r.d.Allowed:
					net--
				case r.d.Reason == ReasonReset:
					net -= before // everything admitted before it
				case r.d.Reason == ReasonAdmitted && r.d.Allowed:
					net++
				default:
					t.Fatalf("unexpected answer %+v", r.d)
				}
			}
			held := heldUnits(n0, key)
			var copied int64 = -1
			if st := n1.copyForTest(pid, "n0"); st != nil {
				if ks, ok := st.Export(key, n1.clock()); ok {
					copied = 0
					for _, r := range ks.Runs {
						copied += r.Count
					}
				} else {
					copied = 0
				}
			}
			after, _ := admittedAfterCrash(t, n0, []*Node{n1, n2}, key, limit)
			net += after
			if net > limit {
				t.Fatalf("%d net admissions (admitted minus refunded) confirmed in one window of limit %d; the holder had %d units of the key, its backup's copy %d",
					net, limit, held, copied)
			}
			t.Logf("%d net admissions; holder had %d, copy %d", net, held, copied)
		})
	}
}

// TestRefundUnconfirmedRetried: n0 holds a key (sync, limit 5)
// with n1 as its backup and has admitted the whole limit. n1 loses its
// copy (a restart, say: it answers NEED_SYNC until n0 copies again). A
// refund of one unit is decided at n0, whose copy to n1 is refused, and
// the caller used to be told unavailable — although the refund had taken
// effect at n0. A call answered unavailable is retried (nothing was
// decided for it, as far as its caller can tell); the retry, once n0 had
// copied the partition to n1 again, gave back a second unit: two
// admissions then fit where one refunded unit left room for one (6 net
// admissions in a window of 5).
func TestRefundUnconfirmedRetried(t *testing.T) {
	t.Parallel()
	const limit = 5
	c := startCluster(t, 2, Config{
		LeaseDuration:  attackLease,
		ForwardTimeout: time.Second,
		Policies:       map[string]PolicyConfig{"p": {Limit: limit, Window: time.Hour, Replication: ReplicateSync}},
	})
	n0, n1 := c.nodes[0], c.nodes[1]
	key, pid := keyHeldWithBackup(t, n0, n1, "refund-unconfirmed", "p")
	net := admitN(t, n0, key, limit)
	n1.dropCopyForTest(pid)
	calls := 0
	waitFor(t, 20*time.Second, "the refund to be answered", func() bool {
		calls++
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		d, err := n0.Refund(ctx, Request{Key: key})
		if err != nil {
			t.Logf("refund call %d: %v", calls, err)
			return false
		}
		if d.Allowed {
			net--
		}
		return true
	})
	admitted := 0
	waitFor(t, 20*time.Second, "the key to refuse", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		d, err := n0.Allow(ctx, Request{Key: key})
		if err == nil && d.Allowed {
			admitted++
		}
		return err == nil && !d.Allowed
	})
	net += admitted
	if net > limit {
		t.Fatalf("%d net admissions (admitted minus refunded) in one window of limit %d: one unit refunded (in %d calls), %d admitted after it",
			net, limit, calls, admitted)
	}
	t.Logf("one unit refunded in %d calls, %d admitted after it", calls, admitted)
}
