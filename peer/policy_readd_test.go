package peer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/shard"
)

// Policies removed and added back (issue 52, holes 2 and 3). A removed
// policy's keys keep their state in the holder's store, but a partition
// copy made while the policy is absent leaves them out. Adding the policy
// back with async or sync replication is a raise: every held partition is
// copied to its backup again, the keys included, before it decides again.
// Each test admits a key's limit, removes and re-adds its policy, has the
// holder decide under the new table, kills the holder and counts what the
// survivor that took over admits: nothing, or the window held more than
// its limit.

// readdLimit is the limit of the tests' policies, per hour.
const readdLimit = 5

// readdTables returns the tests' table with policy "p" replicated r, and
// the same table without "p" (policy "other" keeps it from being empty).
func readdTables(r Replication) (with, without map[string]PolicyConfig) {
	other := PolicyConfig{Limit: readdLimit, Window: time.Hour}
	with = map[string]PolicyConfig{"other": other, "p": {Limit: readdLimit, Window: time.Hour, Replication: r}}
	without = map[string]PolicyConfig{"other": other}
	return with, without
}

// readdConfig is the tests' node config: that of the crash tests
// (startCrashCluster), whose patient failure detection and default leases
// keep a loaded machine running the race detector from ending live
// members' holdings.
func readdConfig(pols map[string]PolicyConfig) Config {
	return Config{Policies: pols, Gossip: hoGossip, ForwardTimeout: crashForwardTimeout}
}

// setPoliciesAll sets pols on every live node of c, in order.
func setPoliciesAll(t *testing.T, c *cluster, pols map[string]PolicyConfig) {
	t.Helper()
	for _, nd := range c.live() {
		if err := nd.SetPolicies(pols); err != nil {
			t.Fatalf("SetPolicies on %s: %v", nd.Name(), err)
		}
	}
}

// awaitRefusedAtLimit waits until holder decides key, which is at its
// limit (unavailable meanwhile: after a raise every held partition is
// copied again before it decides), and fails if it admits.
func awaitRefusedAtLimit(t *testing.T, holder *Node, key Key) {
	t.Helper()
	waitFor(t, 30*time.Second, fmt.Sprintf("%s to decide %v under the re-added policy", holder.Name(), key), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		d, err := holder.Allow(ctx, Request{Key: key})
		if err != nil && !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%v after the policy came back: %v", key, err)
		}
		if err == nil && d.Allowed {
			t.Fatalf("%v at its limit admitted after the policy came back: %+v (the holder lost its state)", key, d)
		}
		return err == nil
	})
}

// checkNoneAfterCrash kills holder and fails if the survivor that takes
// key over admits any of it: the limit was already admitted in the window.
func checkNoneAfterCrash(t *testing.T, c *cluster, holder *Node, key Key, what string) {
	t.Helper()
	var rest []*Node
	for _, nd := range c.live() {
		if nd != holder {
			rest = append(rest, nd)
		}
	}
	holder.KillForTest()
	// Waited for here as well as in survivorAdmits, to say where the
	// partition is if no survivor takes it over.
	waitForWhy(t, 30*time.Second, "a survivor to decide the key", func() bool {
		for _, nd := range rest {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			_, err := nd.Peek(ctx, Request{Key: key})
			cancel()
			if err == nil {
				return true
			}
		}
		return false
	}, func() string { return logState(c, key) })
	admitted, unknown, by := survivorAdmits(t, rest, key, readdLimit, 30*time.Second)
	if admitted > 0 {
		t.Fatalf("%s: %d admitted before %s's crash, %d more through %s after it (%d of unknown outcome): %d in a window of %d",
			what, readdLimit, holder.Name(), admitted, by.Name(), unknown, readdLimit+admitted, readdLimit)
	}
}

// TestPolicyReaddedIsRaise (hole 2): a policy replicated off admits its
// limit, is removed from every table and added back replicated sync. The
// re-add must be a raise: before it, the holder decided the key under
// sync while its backup lacked the unreplicated admissions, and the
// holder's crash let the backup admit the limit again.
func TestPolicyReaddedIsRaise(t *testing.T) {
	t.Parallel()
	off, without := readdTables(ReplicateOff)
	sync, _ := readdTables(ReplicateSync)
	c := startCluster(t, 3, readdConfig(off))
	holder, backup := c.nodes[0], c.nodes[1]
	key, _ := keyHeldWithBackup(t, holder, backup, "readd-off", "p")
	admitN(t, holder, key, readdLimit)
	setPoliciesAll(t, c, without)
	setPoliciesAll(t, c, sync)
	awaitRefusedAtLimit(t, holder, key)
	checkNoneAfterCrash(t, c, holder, key, "off, removed, added back as sync")
}

// TestPolicyReaddedAfterBackupJoined (hole 3): a policy replicated sync
// admits its limit (acknowledged: the backup has it), is removed from
// every table, and a member joins and becomes the partition's backup; its
// copy leaves the absent policy's keys out while the holder keeps them.
// The policy comes back, still sync. The re-add must be a raise: before
// it, the holder decided the key while the new backup lacked the
// acknowledged admissions, and the holder's crash lost them.
func TestPolicyReaddedAfterBackupJoined(t *testing.T) {
	t.Parallel()
	sync, without := readdTables(ReplicateSync)
	c := startCluster(t, 3, readdConfig(sync))
	const joiner = "n3"
	next := c.nodes[0].ringWithForTest(joiner)
	var (
		key    Key
		pid    int
		holder *Node
	)
	// A key whose holder stays the holder when joiner joins, and whose
	// backup becomes joiner.
	for _, k := range hoKeys("readd-join", 4000, "p") {
		p := c.nodes[0].partIDForTest(k)
		owner, _ := c.nodes[0].Owner(k)
		if next.PartitionOwner(p) == owner && next.PartitionBackup(p) == joiner {
			key, pid = k, p
			for _, nd := range c.nodes {
				if nd.Name() == owner {
					holder = nd
				}
			}
			break
		}
	}
	if holder == nil {
		t.Fatalf("no key whose holder stays and whose backup becomes %s", joiner)
	}
	admitN(t, holder, key, readdLimit)
	setPoliciesAll(t, c, without)
	c.addWith(joiner, func(cfg *Config) { cfg.Policies = without })
	c.waitMembers(4)
	waitFor(t, 30*time.Second, fmt.Sprintf("%s to become partition %d's backup", joiner, pid), func() bool {
		return holder.backupForTest(pid) == joiner && c.nodes[3].copyForTest(pid, holder.Name()) != nil
	})
	setPoliciesAll(t, c, sync)
	awaitRefusedAtLimit(t, holder, key)
	checkNoneAfterCrash(t, c, holder, key, "sync, removed, a backup joined, added back")
}

// TestReplicationRaised: which table changes are a raise.
func TestReplicationRaised(t *testing.T) {
	pol := func(r Replication, alg shard.Algorithm) PolicyConfig {
		return PolicyConfig{Limit: 5, Window: time.Minute, Replication: r, Algorithm: alg}
	}
	const (
		off   = ReplicateOff
		async = ReplicateAsync
		sync  = ReplicateSync
	)
	sl, tb := shard.SlidingLog, shard.TokenBucket
	other := pol(off, sl)
	for _, tc := range []struct {
		name       string
		prev, next map[string]PolicyConfig
		want       bool
	}{
		{"absent to off", map[string]PolicyConfig{"o": other}, map[string]PolicyConfig{"o": other, "p": pol(off, sl)}, false},
		{"absent to async", map[string]PolicyConfig{"o": other}, map[string]PolicyConfig{"o": other, "p": pol(async, sl)}, true},
		{"absent to sync", map[string]PolicyConfig{"o": other}, map[string]PolicyConfig{"o": other, "p": pol(sync, sl)}, true},
		{"off to async", map[string]PolicyConfig{"p": pol(off, sl)}, map[string]PolicyConfig{"p": pol(async, sl)}, true},
		{"off to sync", map[string]PolicyConfig{"p": pol(off, sl)}, map[string]PolicyConfig{"p": pol(sync, sl)}, true},
		{"async to sync", map[string]PolicyConfig{"p": pol(async, sl)}, map[string]PolicyConfig{"p": pol(sync, sl)}, true},
		{"off unchanged", map[string]PolicyConfig{"p": pol(off, sl)}, map[string]PolicyConfig{"p": pol(off, sl)}, false},
		{"async unchanged", map[string]PolicyConfig{"p": pol(async, sl)}, map[string]PolicyConfig{"p": pol(async, sl)}, false},
		{"sync unchanged", map[string]PolicyConfig{"p": pol(sync, sl)}, map[string]PolicyConfig{"p": pol(sync, sl)}, false},
		{"sync to async", map[string]PolicyConfig{"p": pol(sync, sl)}, map[string]PolicyConfig{"p": pol(async, sl)}, false},
		{"sync to off", map[string]PolicyConfig{"p": pol(sync, sl)}, map[string]PolicyConfig{"p": pol(off, sl)}, false},
		{"sync removed", map[string]PolicyConfig{"o": other, "p": pol(sync, sl)}, map[string]PolicyConfig{"o": other}, false},
		{"sync, limit changed", map[string]PolicyConfig{"p": pol(sync, sl)}, map[string]PolicyConfig{"p": {Limit: 9, Window: time.Minute}}, false},
		// Copies made under prev left out keys of the other algorithm.
		{"sync, algorithm changed", map[string]PolicyConfig{"p": pol(sync, tb)}, map[string]PolicyConfig{"p": pol(sync, sl)}, true},
		{"off, algorithm changed", map[string]PolicyConfig{"p": pol(off, tb)}, map[string]PolicyConfig{"p": pol(off, sl)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, tab := range []map[string]PolicyConfig{tc.prev, tc.next} {
				if errs := policy.Validate(tab); len(errs) > 0 {
					t.Fatalf("invalid test table %v: %v", tab, errs)
				}
			}
			if got := replicationRaised(policy.New(tc.prev), policy.New(tc.next)); got != tc.want {
				t.Fatalf("replicationRaised(%s, %s) = %v, want %v", replTable(tc.prev), replTable(tc.next), got, tc.want)
			}
		})
	}
}

// replTable describes pols by what replicationRaised reads, sorted by
// name: "o:off/sliding_log p:sync/token_bucket".
func replTable(pols map[string]PolicyConfig) string {
	var out []string
	for name, p := range pols {
		out = append(out, fmt.Sprintf("%s:%v/%v", name, p.Replication, p.Algorithm))
	}
	slices.Sort(out)
	return "{" + strings.Join(out, " ") + "}"
}
