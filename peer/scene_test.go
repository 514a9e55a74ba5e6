package peer

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// What the ownership fault scenes share: sequences of faults under which
// the cluster used to admit more than the limit in one window, or let two
// members decide for one partition at once. Each scene's test sits in the
// file named after what it protects (promote_test.go, takeover_test.go,
// copy_test.go, leave_test.go, cut_off_holder_test.go,
// operations_faults_test.go); here are the gossip profile and lease they
// run with, every replication mode, and how they start a cut cluster, find
// a key, count admissions and describe a partition.

// attackGossip is testGossip (the fast profile with a probe timeout and
// a suspicion a starved member can answer and refute in) with a long
// maximum suspicion: as with memberlist's LAN defaults (suspicion 4 to 24
// probe intervals), a member cut off from the others waits the longest
// (nobody confirms its suspicions), while the members on the other side
// confirm each other's and declare it failed at the shortest (1 s: all
// three others of the majority of four confirm).
//
// Built on the fast profile alone (100 ms probes, one confirmation
// enough), five members on a loaded machine (two busy loops beside the
// race detector) declared each other failed and came back dozens of
// times a minute, so ring targets kept changing and the scene's five
// members never settled within waitMembers' minute: TestPausedHolderNewBackup
// failed there, before its stall began, in 3 runs of 3 (and in 3 more
// with only the probe timeout raised, or fewer partitions); in 1 of 3
// on these timings.
//
// News of a failure must then reach every member of the majority: a
// member that misses every dead message waits out its own maximum
// suspicion (50 × 1 s = 50 s with 5 members), as push/pull turns the
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
	testGossip(mc)
	mc.SuspicionMaxTimeoutMult = 50
	mc.RetransmitMult = 6
}

// attackLease is the attacks' LeaseDuration: longer than the majority
// side's failure detection (attackGossip), as with memberlist's LAN
// profile and a lease raised to 10 s.
const attackLease = 3 * time.Second

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

// partsOf describes partition pid on each of nodes, a line each: what a
// failed attack prints.
func partsOf(nodes []*Node, pid int) string {
	var parts []string
	for _, nd := range nodes {
		parts = append(parts, nd.partForTest(pid))
	}
	return strings.Join(parts, "\n")
}
