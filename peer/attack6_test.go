package peer

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// A sixth round of attacks on the ownership protocol: a rule the fifth
// round added (a leaving member keeps the copies of holders that have
// gone, takes them over and hands them on) under failure detection slower
// than two leases.

// slowDetectGossip is the fast profile with a suspicion of 12 probe
// intervals: a killed member is declared failed after about 2.8 s, more
// than two half-second leases, as the LAN profile's 5.8 s is more than two
// of the default 2 s leases.
func slowDetectGossip(mc *memberlist.Config) {
	fastGossip(mc)
	mc.SuspicionMult = 12
}

// TestAttack6BackupLeavesBeforeHolderCrashSeen: n0 holds a partition
// (sync) with n1 as its backup and has confirmed the whole limit; its
// copies of the partition to any other member fail (it has not made one
// yet). n1 leaves gracefully (Close), hands on what it holds, and just
// then n0 crashes. Failure detection takes longer than two leases. n1's
// drain used to end two leases after it held nothing, whatever its copies
// of live holders: a holder gossip still lists, it reasoned, copies
// elsewhere once its lease from a leaving member ends. n0 never would: n1
// left with the only copy of n0's partition, which its target restarted
// empty once it found nobody held it: 10 admissions in a window of 5, five
// of them confirmed synchronous admissions lost to one crash.
func TestAttack6BackupLeavesBeforeHolderCrashSeen(t *testing.T) {
	t.Parallel()
	const limit = 5
	c := startCluster(t, 4, Config{
		Gossip:         slowDetectGossip,
		LeaseDuration:  500 * time.Millisecond,
		ForwardTimeout: time.Second,
		Policies:       map[string]PolicyConfig{"p": {Limit: limit, Window: time.Hour, Replication: ReplicateSync}},
	})
	n0, n1 := c.nodes[0], c.nodes[1]
	key, pid := keyHeldWithBackup(t, n0, n1, "leave-before-crash-seen", "p")
	admitted := admitN(t, n0, key, limit)
	n0.setCopyFaultForTest(func(p int, to string, _ bool) copyFault {
		if p == pid && to != "n1" {
			return copyUnsent
		}
		return copySend
	})
	closed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
		defer cancel()
		closed <- n1.Close(ctx)
	}()
	waitFor(t, 20*time.Second, "n1 to hand on what it holds", func() bool {
		held, _ := n1.heldPartitions()
		return held == 0
	})
	n0.KillForTest()
	select {
	case err := <-closed:
		if err != nil {
			t.Logf("n1's close: %v", err)
		}
	case <-time.After(45 * time.Second):
		t.Fatal("n1's close did not return")
	}
	survivors := c.live()
	after := 0
	var by *Node
	waitFor(t, 40*time.Second, "a survivor to decide the key", func() bool {
		for _, nd := range survivors {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			d, err := nd.Allow(ctx, Request{Key: key})
			cancel()
			if err == nil && d.Allowed {
				after++
			}
			if err == nil {
				by = nd
				return true
			}
		}
		return false
	})
	for range 2 * limit {
		if d, err := by.Allow(context.Background(), Request{Key: key}); err == nil && d.Allowed {
			after++
		}
	}
	if admitted+after > limit {
		var parts []string
		for _, nd := range survivors {
			parts = append(parts, nd.partForTest(pid))
		}
		t.Fatalf("%d admissions in one window of limit %d (%d confirmed by n0, synchronously, before it crashed; %d after): n1 left with the only copy %v",
			admitted+after, limit, admitted, after, parts)
	}
}
