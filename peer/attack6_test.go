package peer

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/shard"
)

// A sixth round of attacks on the ownership protocol: rules the fifth
// round added (a leaving member keeps the copies of holders that have
// gone; a holder asks around before copying to a restarted backup) under
// failure detection slower than two leases, a restart the holder has not
// heard of, and a refund its backup does not confirm.

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
	closed := leaveWithTheOnlyCopy(t, n0, n1, pid)
	n0.KillForTest()
	awaitLeave(t, closed)
	survivors := c.live()
	after, _ := survivorAdmits(t, survivors, key, limit, 40*time.Second)
	if admitted+after > limit {
		t.Fatalf("%d admissions in one window of limit %d (%d confirmed by n0, synchronously, before it crashed; %d after): n1 left with the only copy:\n%s",
			admitted+after, limit, admitted, after, partsOf(survivors, pid))
	}
}

// TestAttack6RestartUnseenByCutHolder: n0, holding a partition (async)
// with n1 as its backup, is cut off: its gossip hears nothing and it
// reaches nobody (as a paused process would). Cut off, n0's own suspicion
// runs longest: its view keeps every member, as they were. n1 sees n0
// fail, takes the partition over from its copy, confirms the rest of the
// limit and copies its holding to a backup of its own. Then n1 crashes
// and a new process starts under its name on the same addresses; the
// others' copies to it fail for a while, so it hears nothing of the
// partition. n0's requests get through again, but its gossip has not
// told it of the restart: to n0, n1 was the backup that granted its last
// lease, which would refuse a copy had it taken the partition over, so n0
// asked nobody before copying to it. The new process took the copy and
// granted a lease, and n0 decided again from its state of before the cut:
// 6 admissions confirmed in a window of 5 (the test stops at the first one
// too many).
func TestAttack6RestartUnseenByCutHolder(t *testing.T) {
	t.Parallel()
	const limit = 5
	cut := new(atomic.Bool)
	c := startCutCluster(t, 4, 0, cut, Config{
		LeaseDuration:  attackLease,
		ForwardTimeout: time.Second,
		Policies:       map[string]PolicyConfig{"p": {Limit: limit, Window: time.Hour, Replication: ReplicateAsync}},
	}, attackGossip, func(mc *memberlist.Config) { mc.SuspicionMaxTimeoutMult = 50 })
	n0, n1 := c.nodes[0], c.nodes[1]
	key, pid := keyKeptByBackupAfter(t, n0, n1, []string{"n1", "n2", "n3"}, "restart-unseen")
	pol := shard.Policy{Limit: limit, Window: time.Hour}
	confirmed := admitN(t, n0, key, 2)
	waitCopyHolds(t, n1, "n0", pid, key, limit, 2)
	// The new n1 hears nothing of the partition from n2 or n3.
	for _, nd := range c.nodes[2:] {
		nd.setCopyFaultForTest(func(p int, to string, _ bool) copyFault {
			if p == pid && to == "n1" {
				return copyUnsent
			}
			return copySend
		})
	}
	// Cut off: n0's gossip hears nothing, and its view, kept as it was,
	// gives it no address to send anything to.
	members := []string{"n0", "n1", "n2", "n3"}
	addrs := map[string]string{}
	for _, nd := range c.nodes {
		addrs[nd.Name()] = nd.RPCAddr()
	}
	cut.Store(true)
	if _, err := n0.SetViewForTest(members, map[string]string{"n0": addrs["n0"]}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "n1 to take the partition over", func() bool {
		n1.kickOwnership()
		r, _, _ := n1.roleForTest(pid)
		return r == roleHolder
	})
	by := map[string]int{"n0": 2}
	for confirmed < limit {
		confirmed += admitN(t, n1, key, 1)
		by["n1"]++
	}
	var y *Node
	waitFor(t, 10*time.Second, "n1's backup to have every admission", func() bool {
		n1.kickOwnership()
		b := n1.backupForTest(pid)
		for _, nd := range c.nodes[2:] {
			if nd.Name() != b {
				continue
			}
			if st := nd.copyForTest(pid, "n1"); st != nil {
				if d, err := st.Peek(key, pol, 1, time.Now()); err == nil && !d.Allowed {
					y = nd
					return true
				}
			}
		}
		return false
	})
	gossipAddr, rpcAddr := n1.GossipAddr(), n1.RPCAddr()
	n1.KillForTest()
	nodes := c.nodes
	c.nodes = []*Node{y} // joined through a member that is not cut off
	n1b := c.addWith("n1", func(cfg *Config) {
		cfg.GossipAddr, cfg.RPCAddr, cfg.Gossip = gossipAddr, rpcAddr, attackGossip
	})
	c.nodes = append(nodes, n1b)
	// n0's requests get through again (n1's address is the new process's);
	// its gossip, still cut, has told it of no restart.
	marked := n0.isUnreachable("n1")
	if _, err := n0.SetViewForTest(members, addrs); err != nil {
		t.Fatal(err)
	}
	t.Logf("n1 restarted; n0 had marked it unreachable: %v; %s", marked, n0.partForTest(pid))
	askUntil(n0, key, time.Now().Add(2*attackLease), limit, &confirmed, by)
	if confirmed > limit {
		t.Fatalf("%d admissions confirmed in one window of limit %d (by decider: %v):\n%s\n%s\n%s", confirmed, limit, by,
			n0.partForTest(pid), y.partForTest(pid), n1b.partForTest(pid))
	}
	t.Logf("confirmed %d (by decider: %v):\n%s\n%s\n%s", confirmed, by, n0.partForTest(pid), y.partForTest(pid), n1b.partForTest(pid))
}

// TestAttack6RefundUnconfirmedRetried: n0 holds a key (sync, limit 5)
// with n1 as its backup and has admitted the whole limit. n1 loses its
// copy (a restart, say: it answers NEED_SYNC until n0 copies again). A
// refund of one unit is decided at n0, whose copy to n1 is refused, and
// the caller used to be told unavailable — although the refund had taken
// effect at n0. A call answered unavailable is retried (nothing was
// decided for it, as far as its caller can tell); the retry, once n0 had
// copied the partition to n1 again, gave back a second unit: two
// admissions then fit where one refunded unit left room for one (6 net
// admissions in a window of 5).
func TestAttack6RefundUnconfirmedRetried(t *testing.T) {
	t.Parallel()
	const limit = 5
	c := startCluster(t, 2, Config{
		LeaseDuration:  attackLease,
		ForwardTimeout: time.Second,
		Policies:       map[string]PolicyConfig{"p": {Limit: limit, Window: time.Hour, Replication: ReplicateSync}},
	})
	n0, n1 := c.nodes[0], c.nodes[1]
	key, pid := keyHeldWithBackup(t, n0, n1, "refund-unconfirmed", "p")
	net := admitN(t, n0, key, limit)
	n1.dropCopyForTest(pid)
	calls := 0
	waitFor(t, 20*time.Second, "the refund to be answered", func() bool {
		calls++
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		d, err := n0.Refund(ctx, Request{Key: key})
		if err != nil {
			t.Logf("refund call %d: %v", calls, err)
			return false
		}
		if d.Allowed {
			net--
		}
		return true
	})
	admitted := 0
	waitFor(t, 20*time.Second, "the key to refuse", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		d, err := n0.Allow(ctx, Request{Key: key})
		if err == nil && d.Allowed {
			admitted++
		}
		return err == nil && !d.Allowed
	})
	net += admitted
	if net > limit {
		t.Fatalf("%d net admissions (admitted minus refunded) in one window of limit %d: one unit refunded (in %d calls), %d admitted after it",
			net, limit, calls, admitted)
	}
	t.Logf("one unit refunded in %d calls, %d admitted after it", calls, admitted)
}

// awaitLeave waits for the graceful leave leaveWithTheOnlyCopy started
// to return (its error is only logged: a drain cut short by its deadline
// is part of some scenes).
func awaitLeave(t *testing.T, closed <-chan error) {
	t.Helper()
	select {
	case err := <-closed:
		if err != nil {
			t.Logf("n1's close: %v", err)
		}
	case <-time.After(45 * time.Second):
		t.Fatal("n1's close did not return")
	}
}

// leaveWithTheOnlyCopy makes backup n1 of holder n0's partition pid the
// only member n0 can copy pid to, starts n1's graceful leave (Close, its
// result on the returned channel) and waits until n1 has handed on what it
// holds: from then on n1 keeps, besides the copies of other holders, the
// only copy of pid's state.
func leaveWithTheOnlyCopy(t *testing.T, n0, n1 *Node, pid int) <-chan error {
	t.Helper()
	n0.setCopyFaultForTest(func(p int, to string, _ bool) copyFault {
		if p == pid && to != n1.Name() {
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
	waitFor(t, 20*time.Second, n1.Name()+" to hand on what it holds", func() bool {
		held, _ := n1.heldPartitions()
		return held == 0
	})
	return closed
}
