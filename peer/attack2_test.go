package peer

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// A second round of attacks on the ownership protocol, on the operations
// besides plain admissions (refunds, resets, leases), epochs, leaving and
// clocks: sequences under which the cluster admitted more than the limit
// in one window.

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
		stop := armed && !held && req.GetSender() == sender
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
	pt.mu.Lock() // a barrier: decisions hold the gate until they have queued their copy
	pt.mu.Unlock()
	runs, _ := nd.ExportForTest(key)
	var sum int64
	for _, r := range runs {
		sum += r.Count
	}
	return sum
}

// TestAttack2RefundReorderedInBatch: a refund replicates the key's whole
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
func TestAttack2RefundReorderedInBatch(t *testing.T) {
	t.Parallel()
	for _, op := range []string{"refund", "reset"} {
		t.Run(op, func(t *testing.T) {
			t.Parallel()
			const limit = 5
			c := startCluster(t, 3, Config{
				Gossip:         hoCrashGossip,
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
			net += admittedAfterCrash(t, n0, []*Node{n1, n2}, key, limit)
			if net > limit {
				t.Fatalf("%d net admissions (admitted minus refunded) confirmed in one window of limit %d; the holder had %d units of the key, its backup's copy %d",
					net, limit, held, copied)
			}
			t.Logf("%d net admissions; holder had %d, copy %d", net, held, copied)
		})
	}
}

// TestAttack2StallMidCopy: a holder (n0) stops reaching its backup (n1)
// over gRPC for a moment and marks it unreachable, so it copies the
// partition to another member (pick). Its lease from n1 still runs, so it
// asks nobody whether it still holds the partition; then, between that
// check and the copy's last request, it stalls with its gossip silent. n1
// sees n0 fail, waits out the lease it granted, finds no newer copy
// anywhere (pick has none yet) and takes the partition over at the next
// epoch, confirming the rest of the limit. When n0 resumes, pick, which
// has heard of no takeover, completes the copy and grants n0 a lease: n0
// decided again from its state of before the stall, at the very epoch n1
// holds the partition at (the copy's), so that neither yields to the
// other.
func TestAttack2StallMidCopy(t *testing.T) {
	t.Parallel()
	const limit = 5
	s := startStallScene(t, PolicyConfig{Limit: limit, Window: time.Hour}, "stall-mid-copy")
	confirmed := admitN(t, s.n0, s.key, 2)
	// A probe of n1 failed: n0 copies the partition elsewhere, and stalls.
	s.stall(t)
	s.fillAtN1(t, &confirmed, limit)
	s.wake()
	by := map[string]int{"n0": 2, "n1": limit - 2}
	countAdmissions(s.c, s.key, 2*attackLease, limit, &confirmed, by)
	if confirmed > limit {
		t.Fatalf("%d admissions confirmed in one window of limit %d (by decider: %v; n0's new backup %s):\n%s", confirmed, limit, by, s.pick, s.parts())
	}
	t.Logf("confirmed %d (by decider: %v):\n%s", confirmed, by, s.parts())
}
