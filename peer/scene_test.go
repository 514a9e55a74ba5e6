package peer

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/ring"
)

// What the ownership fault scenes share: sequences of faults under which
// the cluster used to admit more than the limit in one window, or let two
// members decide for one partition at once. Each scene's test sits in the
// file named after what it protects (promote_test.go, takeover_test.go,
// copy_test.go, leave_test.go, cut_off_holder_test.go,
// operations_faults_test.go); here are the gossip profile and lease they
// run with, every replication mode, and how they start a cut cluster, find
// a key, count admissions and describe a partition.

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
// (TestStallMidCopy: n1 still suspecting n0 30 s after the others
// declared it failed). With 6, a broadcaster sends in two gossip rounds
// of three targets each: a given member misses one broadcaster's news one
// time in 16, and all three's one time in 4096.
func attackGossip(mc *memberlist.Config) {
	fastGossip(mc)
	mc.SuspicionMaxTimeoutMult = 50
	mc.RetransmitMult = 6
}

// attackLease is the attacks' LeaseDuration: longer than the majority
// side's failure detection (attackGossip), as with memberlist's LAN
// profile and a lease raised to 10 s.
const attackLease = 3 * time.Second

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

// startCutCluster starts n nodes from base with the gossip settings
// gossip, except node cutIdx: it gets withCutTransport's (fast timings, a
// transport cut while cut is set), then tweak.
func startCutCluster(t *testing.T, n, cutIdx int, cut *atomic.Bool, base Config, gossip, tweak func(*memberlist.Config)) *cluster {
	t.Helper()
	return startClusterWith(t, n, base, func(i int, cfg *Config) {
		cfg.Gossip = gossip
		if i == cutIdx {
			cutGossip := withCutTransport(t, cut)
			cfg.Gossip = func(mc *memberlist.Config) {
				cutGossip(mc)
				tweak(mc)
			}
		}
	})
}

// keyKeptByBackupAfter returns a key of policy "p" (subjects from prefix)
// that holder holds with backup as its backup, in a partition whose ring
// target among survivors (the members left once holder is gone) is backup:
// a partition backup keeps once it takes it over.
func keyKeptByBackupAfter(t *testing.T, holder, backup *Node, survivors []string, prefix string) (Key, int) {
	t.Helper()
	after, err := ring.New(holder.cfg.Ring, survivors, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range hoKeys(prefix, 4000, "p") {
		p := holder.partIDForTest(k)
		if o, _ := holder.Owner(k); o == holder.Name() && holder.backupForTest(p) == backup.Name() && after.PartitionOwner(p) == backup.Name() {
			return k, p
		}
	}
	t.Fatal("no partition fitting the scenario")
	return Key{}, -1
}

// within polls cond until it holds or d has passed, and reports whether it
// held (a wait whose end is not itself the test's verdict).
func within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

// countAdmissions asks every live node of c for key every 20 ms for d, or
// until more than limit admissions are confirmed, and adds them to
// confirmed and by.
func countAdmissions(c *cluster, key Key, d time.Duration, limit int, confirmed *int, by map[string]int) {
	end := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(end) && *confirmed <= limit {
		for _, nd := range c.nodes {
			if nd.closing.Load() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			d, err := nd.Allow(ctx, Request{Key: key})
			cancel()
			if err == nil && d.Allowed {
				*confirmed++
				by[d.Owner]++
			}
		}
		<-tick.C
	}
}

// partsOf describes partition pid on each of nodes, a line each: what a
// failed attack prints.
func partsOf(nodes []*Node, pid int) string {
	var parts []string
	for _, nd := range nodes {
		parts = append(parts, nd.partForTest(pid))
	}
	return strings.Join(parts, "\n")
}
