package peer

import (
	"github.com/ringlimit/ringlimit/peer/internal/partition"

	"context"
	"sync"
	"testing"
	"time"
)

// A holder paused or cut off from every member that comes back after its
// backup took the partition over: it must learn of the newer holding before
// it decides again, whether it was left without a backup, or the backup
// that took over has crashed, restarted or handed the partition on since.

// TestPausedHolderNewBackup stalls a holder (n0) on one partition,
// with its gossip cut, long enough for its backup (n1) to take the
// partition over, confirm the rest of the limit and crash. The stall holds
// the partition's gate, which the log's runner needs to publish, so n0
// stops extending its liveness and the leader ends it. When n0 resumes it
// must not decide again from its old state (its liveness epoch ended; the
// table names n1's backup), and n1's admissions live on in that backup's
// copy. Under the gossip rules n0 once copied its stale state to a member
// that had never heard of the takeover and decided again beside it.
func TestPausedHolderNewBackup(t *testing.T) {
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
	pt.Mu.Lock()
	var resume sync.Once
	wake := func() { resume.Do(pt.Mu.Unlock) }
	t.Cleanup(wake)
	waitFor(t, 30*time.Second, "n1 to take the partition over", func() bool {
		r, _, _ := n1.roleForTest(pid)
		return r == partition.RoleHolder
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
