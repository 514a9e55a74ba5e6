package peer

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// A seventh round of attacks on the ownership protocol: the newest rules'
// own edges.

// TestAttack7LeaverTrustsRestartedHolder: n0 holds a partition (sync) with
// n1 as its backup and has confirmed the whole limit; its copies of the
// partition to any other member fail. n1 leaves gracefully and hands on
// what it holds; its drain then keeps n0's copy until n0 answers that it
// has moved on. n0 crashes and a new process starts at once under its
// name on the same addresses, before n1's gossip tells it of the restart.
// Asked, the new process holds nothing — it knows nothing of the
// partition — and n1's drain took that for "moved on": it left with the
// only copy, which the partition's target restarted empty once it found
// nobody held it (10 admissions in a window of 5, five confirmed
// synchronous admissions lost to one crash).
func TestAttack7LeaverTrustsRestartedHolder(t *testing.T) {
	t.Parallel()
	const limit = 5
	cut := new(atomic.Bool)
	c := startCutCluster(t, 4, 1, cut, Config{
		LeaseDuration:  500 * time.Millisecond,
		ForwardTimeout: time.Second,
		Policies:       map[string]PolicyConfig{"p": {Limit: limit, Window: time.Hour, Replication: ReplicateSync}},
	}, slowDetectGossip, func(mc *memberlist.Config) { mc.SuspicionMult = 12 })
	n0, n1 := c.nodes[0], c.nodes[1]
	key, pid := keyHeldWithBackup(t, n0, n1, "leaver-restarted-holder", "p")
	admitted := admitN(t, n0, key, limit)
	closed := leaveWithTheOnlyCopy(t, n0, n1, pid)
	// n1's gossip hears nothing for a while: it learns of no restart.
	cut.Store(true)
	gossipAddr, rpcAddr := n0.GossipAddr(), n0.RPCAddr()
	n0.KillForTest()
	nodes := c.nodes
	c.nodes = []*Node{nodes[2]}
	n0b := c.addWith("n0", func(cfg *Config) {
		cfg.GossipAddr, cfg.RPCAddr, cfg.Gossip = gossipAddr, rpcAddr, slowDetectGossip
	})
	c.nodes = append(nodes, n0b)
	left := false
	select {
	case err := <-closed:
		left = true
		if err != nil {
			t.Logf("n1's close: %v", err)
		}
	case <-time.After(4 * n1.cfg.LeaseDuration):
		// n1 waits for the restart to reach it (or for the new process to
		// say it holds the partition at a newer epoch).
	}
	cut.Store(false)
	if !left {
		awaitLeave(t, closed)
	}
	var survivors []*Node
	for _, nd := range c.live() {
		if nd != n0 {
			survivors = append(survivors, nd)
		}
	}
	after, _ := survivorAdmits(t, survivors, key, limit, 40*time.Second)
	if admitted+after > limit {
		t.Fatalf("%d admissions in one window of limit %d (%d confirmed by n0, synchronously, before it crashed; %d after; n1 left before the restart reached it: %v):\n%s",
			admitted+after, limit, admitted, after, left, partsOf(survivors, pid))
	}
}
