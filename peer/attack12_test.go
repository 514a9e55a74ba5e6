package peer

import (
	"sync"
	"testing"
	"time"
)

// TestAttack12CopyOfOldHoldingBesideLiveHolder: TestAttack9's scene with
// one holder left alive. n0 holds a partition at epoch e with n1 as its
// backup (async). It marks n1 unreachable and copies to pick; the first
// attempt fails unsent (epoch e+1 spent), the second, at e+2, stalls
// before its only request with n0's gossip cut. n1 takes over at e+1 and
// decides (async needs no backup to decide), but its own copy to a backup
// stalls, so it stays at e+1. n0 resumes: pick completes n0's copy at
// e+2, n0 gives way, the RELEASE of pick's copy is lost, and n0 dies.
// pick keeps a complete copy at e+2 of n0's holding at e, while n1 lives
// on, holding at e+1. pick's takeover asked every member; n1 answered
// that it holds the partition at e+1, below the copy's epoch, so pick
// took over at e+3 from n0's old state and handed it on to n1, the
// ring's target, replacing n1's own admissions: 8 in a window of 5. Now
// a copy is stale when a live member holds the partition above the epoch
// the copy's holder held it at (e). (Under sync n1 would not decide
// before its copy is done; off copies no admission to count.)
func TestAttack12CopyOfOldHoldingBesideLiveHolder(t *testing.T) {
	t.Parallel()
	const limit = 5
	s := startFiveNodeSceneWhere(t, PolicyConfig{Limit: limit, Window: time.Hour, Replication: ReplicateAsync}, "copy-old-holding", time.Second, nil, nil)
	n0, n1, pid, pick := s.n0, s.n1, s.pid, s.pick
	var pickNode *Node
	for _, nd := range s.c.nodes {
		if nd.Name() == pick {
			pickNode = nd
		}
	}
	hold1 := make(chan struct{})
	var once1 sync.Once
	free1 := func() { once1.Do(func() { close(hold1) }) }
	t.Cleanup(free1)
	// n1's copy of its holding to a backup stalls before its first
	// request, so n1 keeps holding at the takeover's epoch.
	n1.setCopyFaultForTest(func(p int, _ string, _ bool) copyFault {
		if p == pid {
			<-hold1
		}
		return copySend
	})
	confirmed, wake := s.spendStallAndFill(t, limit)
	wake()
	waitFor(t, 10*time.Second, "n0 to give the partition up", func() bool {
		r, _, _ := n0.roleForTest(pid)
		return r != roleHolder && r != roleFenced
	})
	h, e := pickNode.replicaForTest(pid)
	_, _, e1 := n1.roleForTest(pid)
	if h != "n0" || e <= e1 {
		t.Fatalf("scene not reached: %s keeps %s@%d, n1 holds at %d:\n%s", pick, h, e, e1, s.parts())
	}
	n0.KillForTest()
	by := map[string]int{"n0": 2, "n1": limit - 2}
	// pick sees n0 fail and waits out the lease n0 had from it: give it
	// that and more, asking all along.
	countAdmissions(s.c, s.key, 15*time.Second, limit, &confirmed, by)
	if confirmed > limit || pickNode.decisionPointForTest(s.key) {
		t.Fatalf("%d admissions confirmed in one window of limit %d (by decider: %v); %s decides: %v (it kept n0's copy at %d, n1 holds at %d):\n%s",
			confirmed, limit, by, pick, pickNode.decisionPointForTest(s.key), e, e1, s.parts())
	}
	t.Logf("confirmed %d (by decider: %v):\n%s", confirmed, by, s.parts())
}
