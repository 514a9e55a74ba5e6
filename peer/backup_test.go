package peer

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// hoNode returns the node of c named name.
func hoNode(t *testing.T, c *cluster, name string) *Node {
	t.Helper()
	i := slices.IndexFunc(c.nodes, func(nd *Node) bool { return nd.Name() == name && !nd.closing.Load() })
	if i < 0 {
		t.Fatalf("no live node %q", name)
	}
	return c.nodes[i]
}

// hoReplicasOK fails unless every key's backup member (in owner's ring)
// holds a replica of it.
func hoReplicasOK(t *testing.T, c *cluster, owner *Node, keys []Key) {
	t.Helper()
	for _, k := range keys {
		b := owner.backupOwnerForTest(k)
		if !hoNode(t, c, b).hasReplicaForTest(k) {
			t.Fatalf("key %v: no replica on its backup member %s", k, b)
		}
	}
}

// TestBackupStream checks the backup stream itself (the backup loop is
// idle, BackupInterval 1 h; the test calls StreamBackups): each admitted
// key reaches its backup member once, unchanged keys are not sent again,
// a failed stream is retried by the next one, every owned key is sent
// again after a ring change (backup members move), keys that arrive by
// handoff are backed up by their new owner, and with Backup off nothing is
// streamed.
func TestBackupStream(t *testing.T) {
	ctx := context.Background()
	policies := map[string]PolicyConfig{"b": {Limit: 10, Window: time.Hour}}

	t.Run("off", func(t *testing.T) {
		c := startCluster(t, 2, Config{Gossip: hoGossip, Policies: policies})
		keys := hoOwned(c.nodes[0], hoKeys("backup-off", 50, "b"))
		hoFill(t, c.nodes[1], keys, 3)
		if n := c.nodes[0].StreamBackups(ctx); n != 0 {
			t.Fatalf("StreamBackups with Backup off sent %d keys, want 0", n)
		}
		for _, k := range keys {
			if c.nodes[1].hasReplicaForTest(k) {
				t.Fatalf("key %v has a replica with Backup off", k)
			}
		}
	})

	mets := []*hoMetrics{newHoMetrics(), newHoMetrics(), newHoMetrics(), newHoMetrics()}
	c := startClusterWith(t, 3, Config{
		Gossip:         hoGossip,
		Backup:         true,
		BackupInterval: time.Hour,
		Policies:       policies,
	}, func(i int, cfg *Config) { cfg.Metrics = mets[i] })
	owner := c.nodes[0]
	keys := hoOwned(owner, hoKeys("backup", 300, "b"))

	t.Run("streams_changed_keys_once", func(t *testing.T) {
		hoFill(t, c.nodes[1], keys, 2)
		if n := owner.StreamBackups(ctx); n != len(keys) {
			t.Fatalf("first stream sent %d keys, want %d", n, len(keys))
		}
		hoReplicasOK(t, c, owner, keys)
		if n := owner.StreamBackups(ctx); n != 0 {
			t.Fatalf("second stream without admissions sent %d keys, want 0", n)
		}
		hoFill(t, c.nodes[2], keys[:5], 1)
		if n := owner.StreamBackups(ctx); n != 5 {
			t.Fatalf("stream after 5 admissions sent %d keys, want 5", n)
		}
	})

	t.Run("failed_stream_is_retried", func(t *testing.T) {
		var fired atomic.Bool
		for _, nd := range c.nodes {
			nd.setHandoffFault(func(p string) error {
				if p == faultBackup && fired.CompareAndSwap(false, true) {
					return errors.New("injected: backup refused")
				}
				return nil
			})
		}
		t.Cleanup(func() {
			for _, nd := range c.nodes {
				nd.setHandoffFault(nil)
			}
		})
		hoFill(t, c.nodes[1], keys, 1)
		failedBefore := mets[0].backupCount("sent/failed")
		first := owner.StreamBackups(ctx)
		if first >= len(keys) || mets[0].backupCount("sent/failed") == failedBefore {
			t.Fatalf("a stream with a refusing backup sent %d of %d keys and counted no failure", first, len(keys))
		}
		if second := owner.StreamBackups(ctx); first+second != len(keys) {
			t.Fatalf("the retry sent %d keys after %d, want %d in all", second, first, len(keys))
		}
		hoReplicasOK(t, c, owner, keys)
	})

	t.Run("ring_change_restreams_and_handoff_is_backed_up", func(t *testing.T) {
		joiner := c.addWith("n3", func(cfg *Config) { cfg.Metrics = mets[3] })
		c.waitMembers(4)
		// The owner's ring changed: its backup members may have moved, so
		// the next stream sends every key it still owns, admitted or not.
		waitFor(t, 10*time.Second, "the owner to hand the joiner its keys", func() bool {
			for _, k := range keys {
				if o, _ := owner.Owner(k); o != owner.Name() && owner.holdsForTest(k) {
					return false
				}
			}
			return true
		})
		still := hoOwned(owner, keys)
		if n := owner.StreamBackups(ctx); n != len(still) {
			t.Fatalf("stream after a ring change sent %d keys, want all %d still owned", n, len(still))
		}
		hoReplicasOK(t, c, owner, still)
		// The joiner got its keys by handoff, with no admission of its own:
		// it backs them up all the same.
		moved := hoOwned(joiner, keys)
		if len(moved) == 0 {
			t.Fatal("no key moved to the joiner; the test checks nothing")
		}
		waitFor(t, 10*time.Second, "the joiner to hold its keys", func() bool {
			for _, k := range moved {
				if !joiner.holdsForTest(k) {
					return false
				}
			}
			return true
		})
		if n := joiner.StreamBackups(ctx); n < len(moved) {
			t.Fatalf("the joiner streamed %d keys, want at least the %d it received", n, len(moved))
		}
		hoReplicasOK(t, c, joiner, moved)
	})
}
