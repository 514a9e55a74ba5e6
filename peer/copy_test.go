package peer

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/ring"
)

// Which copy of a partition a takeover may start from: a copy at the very
// epoch a live member holds the partition at, two complete copies at one
// epoch made by different holders, and a copy of an old holding beside a
// live holder. Copies are ordered by copyClaim (ownership.go).

// TestTakeoverTieGoesToLiveHolder: a member (n2) keeps a complete
// copy of a holder that is gone, at the very epoch at which a live member
// (n0) holds the partition — as when a holder that stalled copied its
// partition at the epoch its backup had taken it over at, found that out,
// and its release of the copy was lost. A takeover compared epochs only
// ("strictly newer is stale"), so n2 took the partition over from the
// gone holder's state while n0 went on deciding: two decision points.
func TestTakeoverTieGoesToLiveHolder(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 3, Config{Policies: map[string]PolicyConfig{"p": {Limit: 5, Window: time.Hour}}})
	n0, n1, n2 := c.nodes[0], c.nodes[1], c.nodes[2]
	key, pid := keyHeldWithBackup(t, n0, n1, "takeover-tie", "p")
	admitN(t, n0, key, 1)
	_, _, epoch := n0.roleForTest(pid)
	pt := &n2.pt.parts[pid]
	pt.mu.Lock()
	pt.rep = replica{holder: "n-gone", epoch: epoch, complete: true, store: n2.newPartStore(), made: n2.mono()}
	pt.mu.Unlock()
	n2.takeOver(context.Background(), pid)
	if r, holder, e := n2.roleForTest(pid); r == roleHolder || r == roleFenced {
		t.Fatalf("n2 took the partition over at epoch %d from a gone holder's copy at %d while n0 holds it at %d (%v %s)", e, epoch, epoch, r, holder)
	}
	if r, _, e := n0.roleForTest(pid); r != roleHolder || e != epoch {
		t.Fatalf("n0: %v at epoch %d; want holder at %d", r, e, epoch)
	}
	if n2.copyForTest(pid, "n-gone") != nil {
		t.Fatal("n2 kept its stale copy")
	}
}

// TestSameEpochCopiesBothHoldersGone: n0 holds a partition (sync)
// at epoch e with n1 as its backup, and has confirmed 2 admissions. It
// marks n1 unreachable and copies the partition to pick instead; the
// first attempt fails unsent (a known outcome, but its epoch e+1 is spent),
// the second, at e+2, stalls before its only request with n0's gossip
// cut. n1 sees n0 fail, waits out the lease, takes over at e+1, copies its
// holding to its own backup b1 at e+2 and confirms the rest of the limit.
// n0 resumes: pick, which has heard of no takeover, completes n0's copy at
// e+2; n0 finds n1's holding (confirmHolding) and gives way, but the
// RELEASE of pick's copy is lost. Then n0 and n1 are both gone: pick keeps
// a complete copy of n0's old state at e+2, b1 one of n1's at e+2, and
// neither yielded to the other (no live member holds the partition, no
// epoch is newer), so both took over at e+3 and both decided: 8
// admissions in a window of 5, pick from n0's 2 (with pick kept from
// handing its holding on to b1 by a moment without b1's port). Now the
// copies are ordered by the epoch their holders held the partition at (e
// for n0's, e+1 for n1's): pick defers, b1 alone takes over.
//
// The two takeovers are made to meet between their probes and commits
// (setTakeoverHookForTest), as when both keepers see the holders fail at
// once; one after the other, the second already yields to the first's
// newer epoch.
func TestSameEpochCopiesBothHoldersGone(t *testing.T) {
	ownByGossip(t)
	t.Parallel()
	const limit = 5
	rc := ring.Config{}.WithDefaults()
	without0, err := ring.New(rc, []string{"n1", "n2", "n3", "n4"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	without01, err := ring.New(rc, []string{"n2", "n3", "n4"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	// Without n0 and n1, n1's backup is the partition's target, and pick
	// the backup it wants.
	s := startFiveNodeSceneWhere(t, PolicyConfig{Limit: limit, Window: time.Hour}, "same-epoch-copies", time.Second, func(p int, pick string) bool {
		return without01.PartitionOwner(p) == without0.PartitionBackup(p) && without01.PartitionBackup(p) == pick
	}, nil)
	n0, n1, pid, pick := s.n0, s.n1, s.pid, s.pick
	byName := map[string]*Node{}
	for _, nd := range s.c.nodes {
		byName[nd.Name()] = nd
	}
	b1, pickNode := byName[without0.PartitionBackup(pid)], byName[pick]
	confirmed, wake := s.spendStallAndFill(t, limit)
	var epoch uint64
	waitFor(t, 10*time.Second, b1.Name()+" to keep a complete copy of n1's holding", func() bool {
		var h string
		h, epoch = b1.replicaForTest(pid)
		return h == "n1"
	})
	// The two takeovers meet between their probes and their commits: each
	// waits there (once) for the other, as when both see the holders fail
	// at the same moment.
	var met sync.WaitGroup
	met.Add(2)
	meet := func(nd *Node) {
		var first atomic.Bool
		nd.setTakeoverHookForTest(func(p int) {
			if p != pid || !first.CompareAndSwap(false, true) {
				return
			}
			met.Done()
			done := make(chan struct{})
			go func() { met.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
			}
		})
	}
	meet(pickNode)
	meet(b1)
	wake()
	waitFor(t, 10*time.Second, "n0 to give the partition up", func() bool {
		r, _, _ := n0.roleForTest(pid)
		return r != roleHolder && r != roleFenced
	})
	if h, e := pickNode.replicaForTest(pid); h != "n0" || e != epoch {
		t.Fatalf("scene not reached: %s keeps %s@%d, %s keeps n1@%d:\n%s", pick, h, e, b1.Name(), epoch, s.parts())
	}
	// Without n0 and n1, b1 is the partition's target, and pick would
	// hand what it takes over on to b1 (refused: b1 holds it at the same
	// epoch). pick cannot reach b1's port for a moment, as n0 could not
	// reach n1's: it keeps the partition, with another backup.
	pickNode.markUnreachable(b1.Name())
	n0.KillForTest()
	n1.KillForTest()
	survivors := s.c.live()
	waitFor(t, 30*time.Second, "a survivor to take the partition over", func() bool {
		for _, nd := range survivors {
			if nd.decisionPointForTest(s.key) {
				return true
			}
		}
		return false
	})
	by := map[string]int{"n0": 2, "n1": limit - 2}
	countAdmissions(s.c, s.key, time.Second, limit, &confirmed, by)
	var deciders []string
	for _, nd := range survivors {
		if nd.decisionPointForTest(s.key) {
			deciders = append(deciders, nd.Name())
		}
	}
	if confirmed > limit || len(deciders) > 1 {
		t.Fatalf("%d admissions confirmed in one window of limit %d (by decider: %v); deciding now: %v (copies at epoch %d on %s from n0, on %s from n1):\n%s",
			confirmed, limit, by, deciders, epoch, pick, b1.Name(), s.parts())
	}
	t.Logf("confirmed %d (by decider: %v); deciding: %v:\n%s", confirmed, by, deciders, s.parts())
}

// spendStallAndFill plays the first half of the same-epoch attacks: n0's
// first copy of the partition to pick fails unsent (its epoch spent all
// the same), the second stalls before its only request with n0's gossip
// cut (and kept cut, so the others keep n0 failed), and the RELEASE of
// pick's copy will be lost. With n0's 2 admissions confirmed and n1
// marked unreachable by n0, it waits for the stall and n1's takeover and
// fills the limit at n1. wake resumes n0.
func (s *stallScene) spendStallAndFill(t *testing.T, limit int) (confirmed int, wake func()) {
	t.Helper()
	n0, n1, pid, pick := s.n0, s.n1, s.pid, s.pick
	resume := make(chan struct{})
	var once sync.Once
	wake = func() { once.Do(func() { close(resume) }) }
	t.Cleanup(wake)
	stalled := make(chan struct{})
	var calls atomic.Int32
	n0.setCopyFaultForTest(func(p int, to string, last bool) copyFault {
		if p != pid || to != pick || !last {
			return copySend
		}
		switch calls.Add(1) {
		case 1:
			return copyUnsent
		case 2:
			s.cut.Store(true)
			close(stalled)
			<-resume
		}
		return copySend
	})
	n0.setReleaseLostForTest(func(p int, to string) bool { return p == pid && to == pick })
	confirmed = admitN(t, n0, s.key, 2)
	n0.markUnreachable("n1")
	n0.kickOwnership()
	select {
	case <-stalled:
	case <-time.After(20 * time.Second):
		t.Fatalf("n0 never stalled copying the partition to %s: %s", pick, n0.partForTest(pid))
	}
	waitFor(t, 30*time.Second, "n1 to take the partition over", func() bool {
		r, _, _ := n1.roleForTest(pid)
		return r == roleHolder
	})
	s.fillAtN1(t, &confirmed, limit)
	return confirmed, wake
}

// TestCopyOfOldHoldingBesideLiveHolder: TestSameEpochCopiesBothHoldersGone's scene with
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
func TestCopyOfOldHoldingBesideLiveHolder(t *testing.T) {
	ownByGossip(t)
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

// TestCopyClaimOrder: copies at one epoch are ordered by the holding they
// were made from, an unknown one (an older member's answer) first, then by
// holder and keeper; every pair of distinct copies is ordered one way only.
func TestCopyClaimOrder(t *testing.T) {
	cases := []struct {
		name string
		a, b copyClaim
	}{
		{"newer epoch", copyClaim{"k1", "h1", 5, 1}, copyClaim{"k2", "h2", 4, 3}},
		{"newer holding", copyClaim{"k1", "n1", 5, 4}, copyClaim{"k2", "n0", 5, 3}},
		{"unknown holding", copyClaim{"k1", "n0", 5, 0}, copyClaim{"k2", "n1", 5, 4}},
		{"holder name", copyClaim{"k1", "n1", 5, 4}, copyClaim{"k2", "n0", 5, 4}},
		{"keeper name", copyClaim{"k2", "n0", 5, 4}, copyClaim{"k1", "n0", 5, 4}},
		{"both unknown", copyClaim{"k1", "n1", 5, 0}, copyClaim{"k2", "n0", 5, 0}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.a.above(tc.b) || tc.b.above(tc.a) {
				t.Fatalf("%+v above %+v: %v; reverse: %v; want true, false", tc.a, tc.b, tc.a.above(tc.b), tc.b.above(tc.a))
			}
		})
	}
}
