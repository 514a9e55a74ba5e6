package peer

import (
	"context"
	"testing"
	"time"
)

// TestRejoinAfterKill kills a member abruptly and restarts it at once under
// the same name and addresses, before failure detection removes it. A peer
// that failed to reach it meanwhile (its connection now in gRPC's reconnect
// backoff) must reach the new process with its first forward once the
// restarted member has its partitions back; and the quota is kept (the
// backup took the partitions over from its copy, not from empty).
func TestRejoinAfterKill(t *testing.T) {
	t.Parallel()
	pols := map[string]PolicyConfig{"p": {Limit: 100, Window: time.Minute}}
	tap, log := newLogTap(t)
	c := startClusterWith(t, 2, Config{Policies: pols, Gossip: hoGossip, ForwardTimeout: 2 * time.Second},
		func(i int, cfg *Config) {
			if i == 0 {
				cfg.Logger = log
			}
		})
	n0, n1 := c.nodes[0], c.nodes[1]
	key := pmKeyOwnedBy(t, n0, "p", "n1")
	if _, err := n0.Allow(context.Background(), Request{Key: key}); err != nil {
		t.Fatalf("Allow via n0 before the kill: %v", err)
	}
	gossipAddr, rpcAddr := n1.GossipAddr(), n1.RPCAddr()
	n1.KillForTest()
	// The first forward fails on the cut connection (which goes idle);
	// the next ones dial, are refused, and put the connection into gRPC's
	// reconnect backoff.
	for range 3 {
		if d, err := n0.Allow(context.Background(), Request{Key: key}); err == nil {
			t.Fatalf("Allow via n0 with its owner killed = %+v, want an error", d)
		}
	}
	restarted := tap.on("peer restarted", func(a map[string]string) bool { return a["peer"] == "n1" })
	c.addWith("n1", func(cfg *Config) { cfg.GossipAddr, cfg.RPCAddr = gossipAddr, rpcAddr })
	ready := time.Now()
	waitLog(t, restarted, 10*time.Second, "n0 to notice n1's restart")
	noticed := time.Since(ready)
	// The new process holds nothing: n0, n1's backup, takes its partitions
	// over once the old process's lease has expired, and moves them back
	// to n1, their target. Then the first forward must reach n1.
	c.waitMembers(2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := n0.Allow(ctx, Request{Key: key})
	if err == nil && d.Remaining != 98 {
		t.Fatalf("after the restart the key has %d remaining, want 98 (one admission before the kill, one now)", d.Remaining)
	}
	if err != nil || d.Owner != "n1" {
		t.Fatalf("first Allow via n0 after n1 restarted = %+v, %v; want a decision by n1", d, err)
	}
	t.Logf("n0 noticed the restart %v after the new n1 served; first forward ok %v after", noticed, time.Since(ready))
}
