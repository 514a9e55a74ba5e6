package peer

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// A fourth round of attacks on the ownership protocol: the moments between
// a step's look at the cluster and its commit.

// TestAttack4ProbeDuringTakeover: TestAttack2StallMidCopy's scene, with n1
// held between its takeover's probe and its commit. n0 resumes, completes
// its copy to pick and, its lease from n1 having ended, asks every member
// whether anyone took the partition over (confirmHolding): n1, not yet
// committed, answers that it keeps a copy of n0's holding, so n0 uses its
// copy's lease and decides; n1 then commits and decides too (n0's release
// of n1's copy, which would have stopped it, is lost).
func TestAttack4ProbeDuringTakeover(t *testing.T) {
	t.Parallel()
	for _, mode := range []Replication{ReplicateAsync, ReplicateSync} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			const limit = 5
			s := startStallScene(t, PolicyConfig{Limit: limit, Window: time.Hour, Replication: mode}, "probe-during-takeover-"+mode.String())
			n0, n1 := s.n0, s.n1
			confirmed := admitN(t, n0, s.key, 2)
			probed, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			free := func() { once.Do(func() { close(release) }) }
			t.Cleanup(free)
			var held atomic.Bool
			n1.setTakeoverHookForTest(func(p int) {
				if p == s.pid && held.CompareAndSwap(false, true) {
					close(probed)
					<-release
				}
			})
			// n0's release of n1's copy, sent once its copy to pick is
			// confirmed, is lost (else it makes n1's commit find no copy).
			n1.setReplDropForTest(func(req *peerpb.ReplicateRequest) bool {
				if req.GetSender() != "n0" {
					return false
				}
				for _, op := range req.GetOps() {
					if op.GetKind() != peerpb.PartitionOp_KIND_RELEASE || int(op.GetPartition()) != s.pid {
						return false
					}
				}
				return len(req.GetOps()) > 0
			})
			n0.markUnreachable("n1")
			n0.kickOwnership()
			select {
			case <-s.entered:
			case <-time.After(20 * time.Second):
				t.Fatalf("n0 never copied the partition to %s: %s", s.pick, n0.partForTest(s.pid))
			}
			select {
			case <-probed:
			case <-time.After(30 * time.Second):
				t.Fatalf("n1 never began a takeover:\n%s", s.parts())
			}
			s.wake()
			// n0's copy completes and is confirmed (or not) while n1 waits
			// between its probe and its commit.
			within(5*time.Second, func() bool {
				r, _, _ := n0.roleForTest(s.pid)
				return r == roleHolder && n0.backupForTest(s.pid) == s.pick || r == roleMoved || r == roleHint
			})
			free()
			by := map[string]int{"n0": 2}
			countAdmissions(s.c, s.key, 2*n0.cfg.LeaseDuration, limit, &confirmed, by)
			if confirmed > limit {
				t.Fatalf("%d admissions confirmed in one window of limit %d (by decider: %v; n0's new backup %s):\n%s", confirmed, limit, by, s.pick, s.parts())
			}
			t.Logf("confirmed %d (by decider: %v):\n%s", confirmed, by, s.parts())
		})
	}
}

// TestAttack4PromoteDelayed: a partition moves from n0 to the joiner n2,
// whose gossip goes silent as the Promote reaches it, and the Promote is
// held up before n2 applies it. n0's promote times out; it stays fenced,
// sees n2 fail, waits out LeaseDuration from when it sent the promote and
// takes the partition back. Then n2 applies the Promote and decides under
// the lease it counts from then, until its first message to n0 comes back
// stale: both decide.
func TestAttack4PromoteDelayed(t *testing.T) {
	t.Parallel()
	for _, mode := range []Replication{ReplicateOff, ReplicateAsync} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			const limit = 5
			var cut, ready atomic.Bool
			c, n0, key, pid, confirmed := promoteScene(t, mode, limit, attackLease, "promote-delayed-", &ready)
			n2 := c.addWith("n2", func(cfg *Config) {
				cutGossip := withCutTransport(t, &cut)
				cfg.Gossip = func(mc *memberlist.Config) { cutGossip(mc); mc.SuspicionMaxTimeoutMult = 50 }
			})
			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			free := func() { once.Do(func() { close(release) }) }
			t.Cleanup(free)
			var held atomic.Bool
			n2.setPromoteHookForTest(func(p int) {
				if p == pid && held.CompareAndSwap(false, true) {
					cut.Store(true)
					close(entered)
					<-release
				}
			})
			ready.Store(true)
			n0.kickOwnership()
			awaitTakeBack(t, n0, pid, entered)
			free()
			by := map[string]int{"n0": 2}
			countAdmissions(c, key, attackLease, limit, &confirmed, by) // past the 9/10 lease n2 would count
			if confirmed > limit {
				t.Fatalf("%d admissions confirmed in one window of limit %d (by decider: %v):\n%s\n%s", confirmed, limit, by, n0.partForTest(pid), n2.partForTest(pid))
			}
			t.Logf("confirmed %d (by decider: %v):\n%s\n%s", confirmed, by, n0.partForTest(pid), n2.partForTest(pid))
		})
	}
}

// promoteScene starts the Promote attacks' two members (attack gossip,
// leases of lease, policy "p" of limit under mode) and picks a key n0
// holds whose partition moves to n2 when n2 joins, with n0 as its backup;
// it confirms 2 admissions of it on n0. n0's copies of the partition to n2
// fail unsent until ready is set, so the move waits for the test.
func promoteScene(t *testing.T, mode Replication, limit int64, lease time.Duration, prefix string, ready *atomic.Bool) (c *cluster, n0 *Node, key Key, pid int, confirmed int) {
	t.Helper()
	c = startClusterWith(t, 2, Config{LeaseDuration: lease, Policies: map[string]PolicyConfig{"p": {Limit: limit, Window: time.Hour, Replication: mode}}},
		func(_ int, cfg *Config) { cfg.Gossip = attackGossip })
	n0 = c.nodes[0]
	ring3 := n0.ringWithForTest("n2")
	pid = -1
	for _, k := range hoKeys(prefix+mode.String(), 4000, "p") {
		p := n0.partIDForTest(k)
		if o, _ := n0.Owner(k); o == n0.Name() && ring3.PartitionOwner(p) == "n2" && ring3.PartitionBackup(p) == n0.Name() {
			key, pid = k, p
			break
		}
	}
	if pid < 0 {
		t.Fatal("no key held by n0 that moves to n2 when n2 joins")
	}
	confirmed = admitN(t, n0, key, 2)
	n0.setCopyFaultForTest(func(p int, to string, _ bool) copyFault {
		if p == pid && to == "n2" && !ready.Load() {
			return copyUnsent
		}
		return copySend
	})
	return c, n0, key, pid, confirmed
}

// awaitTakeBack waits for n0's Promote of partition pid to be held
// (promoted closed), then for n0, fenced, to take the partition back at a
// newer epoch; it returns the epoch n0 was fenced at.
func awaitTakeBack(t *testing.T, n0 *Node, pid int, promoted <-chan struct{}) (fenced uint64) {
	t.Helper()
	select {
	case <-promoted:
	case <-time.After(20 * time.Second):
		t.Fatalf("n0 never sent n2 the Promote: %s", n0.partForTest(pid))
	}
	_, _, fenced = n0.roleForTest(pid)
	waitFor(t, 20*time.Second, "n0 to take the partition back", func() bool {
		r, _, e := n0.roleForTest(pid)
		return r == roleHolder && e > fenced
	})
	return fenced
}
