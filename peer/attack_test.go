package peer

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// Attacks on the ownership protocol: sequences of faults under which the
// cluster used to admit more than the limit in one window, or let two
// members decide for one partition at once.

// attackGossip is the fast profile with a long maximum suspicion: as with
// memberlist's LAN defaults (suspicion 4 to 24 probe intervals), a member
// cut off from the others waits the longest (nobody confirms its
// suspicions), while the members on the other side confirm each other's
// and declare it failed at the shortest.
//
// News of a failure must then reach every member of the majority: a
// member that misses every dead message waits out its own maximum
// suspicion (50 × 600 ms = 30 s with 5 members), as push/pull turns the
// others' "dead" into its own unconfirmed suspicion. memberlist sends a
// broadcast RetransmitMult × ceil(log10(N+1)) times in all, one send per
// gossip target, and a recently dead member is a target too: with the
// fast profile's 2 and 5 members, two sends among four targets, so a
// given member missed all three broadcasters' news one time in eight
// (TestAttack2StallMidCopy: n1 still suspecting n0 30 s after the others
// declared it failed). With 6, a broadcaster sends in two gossip rounds
// of three targets each: a given member misses one broadcaster's news one
// time in 16, and all three's one time in 4096.
func attackGossip(mc *memberlist.Config) {
	fastGossip(mc)
	mc.SuspicionMaxTimeoutMult = 50
	mc.RetransmitMult = 6
}

// inEveryMode runs attack in parallel subtests, one per replication mode.
func inEveryMode(t *testing.T, attack func(t *testing.T, mode Replication)) {
	t.Parallel()
	for _, mode := range []Replication{ReplicateOff, ReplicateAsync, ReplicateSync} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			attack(t, mode)
		})
	}
}

// TestAttackPromoteAnswerLostThenCut: a partition moves to a member that
// joined (n2); n2 applies the Promote, so it holds the partition with a
// lease that counts from the promote, but its answer is lost and its
// gossip link goes silent at that moment. The old holder n0 stays fenced,
// sees n2 fail (long before n2's lease ends), and used to take the
// partition back at once (at the very epoch n2 holds it at) from its fenced
// state, while n2, whose view still lists everybody, went on deciding under
// its lease (async), or under leases granted by n0 itself for a copy n2
// made there while n0 was fenced (sync). Both decided: 8 (async) or 7
// (sync) admissions confirmed in one window of 5.
func TestAttackPromoteAnswerLostThenCut(t *testing.T) {
	t.Parallel() // mostly waiting out leases, as are the other attacks
	for _, mode := range []Replication{ReplicateAsync, ReplicateSync} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			const limit = 5
			pc := startPromoteCut(t, PolicyConfig{Limit: limit, Window: time.Hour, Replication: mode}, "promote-cut", false)
			n0, n1, n2 := pc.n0, pc.n1, pc.n2
			confirmed := 2
			// Ask both sides until well past any lease n2 was given by the
			// promote, or until the limit is exceeded.
			by := map[string]int{n0.Name(): 2}
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for time.Now().Before(pc.end) && confirmed <= limit {
				for _, nd := range []*Node{n2, n0, n1} {
					ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
					d, err := nd.Allow(ctx, Request{Key: pc.key})
					cancel()
					if err == nil && d.Allowed {
						confirmed++
						by[d.Owner]++
					}
				}
				<-tick.C
			}
			if confirmed > limit {
				t.Fatalf("%d admissions confirmed in one window of limit %d (by decider: %v); n0: %s; n2: %s",
					confirmed, limit, by, n0.partForTest(pc.pid), n2.partForTest(pc.pid))
			}
			t.Logf("%d confirmed (by decider: %v); %s; %s", confirmed, by, n0.partForTest(pc.pid), n2.partForTest(pc.pid))
		})
	}
}

// TestAttackPromoteAnswerLostIsolated is TestAttackPromoteAnswerLostThenCut
// with nothing of n2's getting through to n0 but the promote itself (its
// copies are lost too, so n0 never becomes its backup), for a policy that
// replicates nothing: n2 decides only under the lease the promote gave it.
// n0 used to take the partition back as soon as gossip declared n2 failed,
// long before that lease ended, so both decided at once. Now n0 waits the
// lease out: every admission of n2's comes before any of n0's.
func TestAttackPromoteAnswerLostIsolated(t *testing.T) {
	t.Parallel()
	pc := startPromoteCut(t, PolicyConfig{Limit: 1 << 20, Window: time.Hour, Replication: ReplicateOff}, "promote-isolated", true)
	n0 := pc.n0
	by, n0First, _ := watchTakeBack(t, pc)
	if n0First.IsZero() {
		t.Fatalf("n0 never took the partition back (admissions by decider: %v); n0: %s", by, n0.partForTest(pc.pid))
	}
	t.Logf("admissions by decider: %v; n0 took over %v after the promote", by, n0First.Sub(pc.promotedAt).Round(time.Millisecond))
}

// watchTakeBack asks n2 and n0 for pc.key every 20 ms until pc.end. It
// fails the test if n2 admits after n0 has (two decision points at once),
// and returns the admissions by decider, when n0 first admitted and when
// n2 last did.
func watchTakeBack(t *testing.T, pc *promoteCut) (by map[string]int, n0First, n2Last time.Time) {
	t.Helper()
	n0, n2 := pc.n0, pc.n2
	by = map[string]int{}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(pc.end) {
		for _, nd := range []*Node{n2, n0} {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			d, err := nd.Allow(ctx, Request{Key: pc.key})
			cancel()
			if err != nil || !d.Allowed {
				continue
			}
			by[d.Owner]++
			switch {
			case d.Owner == n0.Name() && n0First.IsZero():
				n0First = time.Now()
			case d.Owner == n2.Name() && !n0First.IsZero():
				t.Fatalf("n2 admitted %v after the promote, %v after n0 took the partition back: two decision points at once (admissions by decider: %v); n0: %s; n2: %s",
					time.Since(pc.promotedAt).Round(time.Millisecond), time.Since(n0First).Round(time.Millisecond), by, n0.partForTest(pc.pid), n2.partForTest(pc.pid))
			case d.Owner == n2.Name():
				n2Last = time.Now()
			}
		}
		<-tick.C
	}
	return by, n0First, n2Last
}

// promoteCut is the scene of the promote attacks: n0 held a key (two
// admissions made) whose partition moved to the joiner n2; n2 applied the
// Promote, but its answer was lost and its gossip went silent at that
// moment.
type promoteCut struct {
	n0, n1, n2 *Node
	key        Key
	pid        int
	promotedAt time.Time
	end        time.Time // well past any lease the promote gave n2, and its timeout
}

// attackLease is the attacks' LeaseDuration: longer than the majority
// side's failure detection (attackGossip), as with memberlist's LAN
// profile and a lease raised to 10 s.
const attackLease = 3 * time.Second

// startPromoteCut sets the scene for policy "p" (subjects from prefix).
// isolated also loses every copy n2 sends after the cut, so n0 never
// becomes its backup.
func startPromoteCut(t *testing.T, pol PolicyConfig, prefix string, isolated bool) *promoteCut {
	t.Helper()
	return startPromoteCutLease(t, pol, prefix, isolated, 0)
}

// startPromoteCutLease is startPromoteCut with n2's LeaseDuration set to
// n2Lease (0: attackLease, the others').
func startPromoteCutLease(t *testing.T, pol PolicyConfig, prefix string, isolated bool, n2Lease time.Duration) *promoteCut {
	t.Helper()
	var cut atomic.Bool
	c := startClusterWith(t, 2, Config{LeaseDuration: attackLease, Policies: map[string]PolicyConfig{"p": pol}},
		func(_ int, cfg *Config) { cfg.Gossip = attackGossip })
	pc := &promoteCut{n0: c.nodes[0], n1: c.nodes[1], pid: -1}
	n0 := pc.n0
	ring3 := n0.ringWithForTest("n2")
	for _, k := range hoKeys(prefix, 4000, "p") {
		p := n0.partIDForTest(k)
		if o, _ := n0.Owner(k); o == n0.Name() && ring3.PartitionOwner(p) == "n2" && ring3.PartitionBackup(p) == n0.Name() {
			pc.key, pc.pid = k, p
			break
		}
	}
	if pc.pid < 0 {
		t.Fatal("no key held by n0 that moves to n2 (with n0 as its backup) when n2 joins")
	}
	admitN(t, n0, pc.key, 2)
	// The move waits until n2's hooks are in place.
	var ready atomic.Bool
	n0.setCopyFaultForTest(func(p int, to string, _ bool) copyFault {
		if p == pc.pid && to == "n2" && !ready.Load() {
			return copyUnsent
		}
		return copySend
	})
	pc.n2 = c.addWith("n2", func(cfg *Config) {
		if n2Lease > 0 {
			cfg.LeaseDuration = n2Lease
		}
		cutGossip := withCutTransport(t, &cut)
		cfg.Gossip = func(mc *memberlist.Config) { cutGossip(mc); mc.SuspicionMaxTimeoutMult = 50 }
	})
	var promotedAt atomic.Int64
	pc.n2.setPromoteLostForTest(func(p int) bool {
		if p != pc.pid {
			return false
		}
		// n2's link fails as it answers: the answer, and every later
		// one, is lost; its gossip goes silent.
		promotedAt.CompareAndSwap(0, time.Now().UnixNano())
		cut.Store(true)
		return true
	})
	if isolated {
		pc.n2.setCopyFaultForTest(func(p int, _ string, _ bool) copyFault {
			if p == pc.pid && cut.Load() {
				return copyUnsent
			}
			return copySend
		})
	}
	ready.Store(true)
	n0.kickOwnership()
	waitFor(t, 20*time.Second, "n2 to hold the partition", func() bool {
		r, _, _ := pc.n2.roleForTest(pc.pid)
		return r == roleHolder
	})
	pc.promotedAt = time.Unix(0, promotedAt.Load())
	pc.end = pc.promotedAt.Add(max(pc.n0.rpcTimeout()+2*attackLease, n2Lease) + 2*time.Second)
	return pc
}

// TestAttackPausedHolderNewBackup stalls a holder (n0) on one partition,
// with its gossip cut, long enough for its backup (n1) to take the
// partition over, confirm the rest of the limit and crash. When n0 resumes
// its lease has ended and its backup does not answer, so it copies the
// partition, as it stood before the stall, to another member of its
// (stale) ring that has never heard of the takeover, and takes a lease
// from it. n0 then decides again from its old state, while n1's admissions
// live on in its own backup's copy.
func TestAttackPausedHolderNewBackup(t *testing.T) {
	t.Parallel()
	const limit = 5
	const lease = attackLease
	s := startFiveNodeScene(t, PolicyConfig{Limit: limit, Window: time.Hour}, "paused-new-backup")
	c, n0, n1, key, pid, pick := s.c, s.n0, s.n1, s.key, s.pid, s.pick
	confirmed := admitN(t, n0, key, 2)
	// The stall: n0's gossip goes silent and nothing of n0's touches the
	// partition (its gate is held) until it resumes.
	pt := &n0.pt.parts[pid]
	s.cut.Store(true)
	pt.mu.Lock()
	var resume sync.Once
	wake := func() { resume.Do(pt.mu.Unlock) }
	t.Cleanup(wake)
	waitFor(t, 30*time.Second, "n1 to take the partition over", func() bool {
		r, _, _ := n1.roleForTest(pid)
		return r == roleHolder
	})
	s.fillAtN1(t, &confirmed, limit)
	n1.KillForTest()
	wake()
	by := map[string]int{"n0": 2, "n1": limit - 2}
	end := time.Now().Add(3 * lease)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	live := []*Node{n0, c.nodes[2], c.nodes[3], c.nodes[4]}
	// The application on n0 first (asking the others spreads news of the
	// takeover through their redirects), then everyone.
	ask := live[:1]
	for time.Now().Before(end) && confirmed <= limit {
		if time.Now().After(end.Add(-2 * lease)) {
			ask = live
		}
		for _, nd := range ask {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			d, err := nd.Allow(ctx, Request{Key: key})
			cancel()
			if err == nil && d.Allowed {
				confirmed++
				by[d.Owner]++
			}
		}
		<-tick.C
	}
	parts := partsOf(live, pid)
	if confirmed > limit {
		t.Fatalf("%d admissions confirmed in one window of limit %d (by decider: %v; n0's new backup %s):\n%s",
			confirmed, limit, by, pick, parts)
	}
	t.Logf("confirmed %d (by decider: %v):\n%s", confirmed, by, parts)
}
