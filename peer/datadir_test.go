package peer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/durable"
	"github.com/ringlimit/ringlimit/shard"
)

// TestDataDirWholeRestart: three nodes with data directories (the founder
// and two joiners whose directories are new, which learn their cluster
// from gossip first) are all killed at once and started again with their
// directories. Each comes back in its cluster, as the same raft member
// (the log's voters, on disk, are those raft IDs: without them the log
// elects no leader and nothing settles), as a new incarnation that
// gossips the one before as the incarnation it inherits, and the cluster
// decides again: the keys of policies with durability disk (sliding,
// calendar and concurrency) keep every
// admission acknowledged before the kill (the heirs restore their old
// partitions from disk), those of a memory policy start over.
func TestDataDirWholeRestart(t *testing.T) {
	root := t.TempDir()
	base := logConfig(5, time.Minute)
	base.Policies = map[string]PolicyConfig{
		"api":  {Limit: 5, Window: time.Minute, Durability: DurabilityDisk},
		"mem":  {Limit: 5, Window: time.Minute},
		"cal":  {Limit: 5, Algorithm: Calendar, Period: shard.CalendarMonth, Durability: DurabilityDisk},
		"conc": {Limit: 2, Window: time.Minute, Algorithm: Concurrency, Durability: DurabilityDisk},
	}
	dirOf := func(i int) string { return filepath.Join(root, fmt.Sprint("n", i)) }
	c := startClusterWith(t, 3, base, func(i int, cfg *Config) { cfg.DataDir = dirOf(i) })
	type was struct{ cluster, raft, start uint64 }
	before := make([]was, 3)
	for i, nd := range c.nodes {
		before[i] = was{nd.gossiper.clusterID.Load(), nd.raftID(), nd.ops.start}
		if nd.heirOf() != 0 {
			t.Fatalf("%s: heir of %016x in a new directory", nd.name, nd.heirOf())
		}
		if i > 0 && before[i].cluster != before[0].cluster {
			t.Fatalf("%s: cluster %016x, founder's %016x", nd.name, before[i].cluster, before[0].cluster)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	// Every admission acknowledged before the kill: each key's limit, on
	// keys spread over the partitions (and so over the holders).
	var keys []Key
	for i := range 12 {
		keys = append(keys, Key{Tenant: "t", Subject: fmt.Sprint("s", i), Policy: "api"}, Key{Tenant: "t", Subject: fmt.Sprint("s", i), Policy: "cal"})
	}
	var leases []Key
	for i := range 6 {
		k := Key{Tenant: "t", Subject: fmt.Sprint("c", i), Policy: "conc"}
		leases = append(leases, k)
		for j := range 2 {
			if l, err := c.nodes[(i+j)%3].Acquire(ctx, Request{Key: k}); err != nil || !l.Allowed {
				t.Fatalf("acquire %d of %v before the restart: %+v, %v", j, k, l, err)
			}
		}
	}
	mem := Key{Tenant: "t", Subject: "s0", Policy: "mem"}
	for i, k := range append(keys, mem) {
		for j := range 5 {
			if d, err := c.nodes[(i+j)%3].Allow(ctx, Request{Key: k}); err != nil || !d.Allowed {
				t.Fatalf("allow %d of %v before the restart: %+v, %v", j, k, d, err)
			}
		}
	}
	for _, nd := range c.nodes {
		nd.KillForTest()
	}

	c2 := &cluster{t: t, base: base}
	for i := range 3 {
		c2.addWith(fmt.Sprint("n", i), func(cfg *Config) { cfg.DataDir = dirOf(i) })
	}
	for i, nd := range c2.nodes {
		if got := nd.gossiper.clusterID.Load(); got != before[i].cluster {
			t.Errorf("%s: cluster %016x after the restart, %016x before", nd.name, got, before[i].cluster)
		}
		if got := nd.raftID(); got != before[i].raft {
			t.Errorf("%s: raft ID %016x after the restart, %016x before", nd.name, got, before[i].raft)
		}
		if nd.ops.start == before[i].start || nd.heirOf() != before[i].start {
			t.Errorf("%s: start %016x heir of %016x; want a new start, heir of %016x", nd.name, nd.ops.start, nd.heirOf(), before[i].start)
		}
		if !nd.resumed() {
			t.Errorf("%s: did not resume its log from disk", nd.name)
		}
	}
	waitForWhy(t, 30*time.Second, "the restarted cluster settled", func() bool {
		for _, nd := range c2.nodes {
			if !nd.Settled() {
				return false
			}
		}
		return true
	}, func() string {
		var b strings.Builder
		for _, nd := range c2.nodes {
			b.WriteString(nd.unsettledForTest() + "\n")
		}
		return b.String()
	})
	// durability disk: nothing acknowledged was lost, every key is full.
	for i, k := range keys {
		if d, err := c2.nodes[i%3].Allow(ctx, Request{Key: k}); err != nil || d.Allowed {
			t.Errorf("%v after the restart: %+v, %v; want refused (its 5 admissions were on disk)", k, d, err)
		}
	}
	for i, k := range leases {
		if l, err := c2.nodes[i%3].Acquire(ctx, Request{Key: k}); err != nil || l.Allowed {
			t.Errorf("%v after the restart: %+v, %v; want refused (its 2 leases were on disk)", k, l, err)
		}
	}
	// durability memory: the key starts over, as it always did.
	if d, err := c2.nodes[2].Allow(ctx, Request{Key: mem}); err != nil || !d.Allowed {
		t.Fatalf("memory key after the restart: %+v, %v; want admitted (its state was in memory)", d, err)
	}
}

// TestDataDirRefused: a data directory of another member, or with a
// damaged meta file, stops New with an error naming the file, and the
// directory is left exactly as it was.
func TestDataDirRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	c := startClusterWith(t, 1, logConfig(5, time.Minute), func(_ int, cfg *Config) { cfg.DataDir = dir })
	c.nodes[0].KillForTest()
	meta := filepath.Join(dir, durable.MetaFile)
	snapshot := func() string {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, e := range ents {
			data, _ := os.ReadFile(filepath.Join(dir, e.Name()))
			fmt.Fprintf(&b, "%s %x\n", e.Name(), data)
		}
		return b.String()
	}
	start := func(name string) error {
		cfg := logConfig(5, time.Minute)
		cfg.Name, cfg.DataDir, cfg.Gossip, cfg.Logger = name, dir, testGossip, testLogger(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		nd, err := New(ctx, cfg)
		if err == nil {
			nd.KillForTest()
			t.Fatalf("%s started with a directory it must refuse", name)
		}
		return err
	}
	was := snapshot()
	if err := start("other"); !errors.Is(err, durable.ErrOtherCluster) || !strings.Contains(err.Error(), meta) {
		t.Fatalf("another member's directory: %v; want ErrOtherCluster naming %s", err, meta)
	}
	if now := snapshot(); now != was {
		t.Fatalf("refused directory changed:\n%s\nthen\n%s", was, now)
	}
	b, err := os.ReadFile(meta)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-6] ^= 0x10
	if err := os.WriteFile(meta, b, 0o600); err != nil {
		t.Fatal(err)
	}
	was = snapshot()
	if err := start("n0"); !errors.Is(err, durable.ErrCorrupt) || !strings.Contains(err.Error(), meta) {
		t.Fatalf("flipped byte in the meta file: %v; want ErrCorrupt naming %s", err, meta)
	}
	if now := snapshot(); now != was {
		t.Fatalf("refused directory changed:\n%s\nthen\n%s", was, now)
	}
}

// TestDataDirClockBack: a node restarted with its data directory (a
// snapshot of its partitions and the log after it) and a
// wall clock an hour behind the state it wrote before the kill keeps the
// restored keys at the instant they were written until its clock passes
// it: a key at its limit stays refused (the window is counted longer,
// never shorter), and its decision time never goes back.
func TestDataDirClockBack(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	var clock atomic.Int64
	clock.Store(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).UnixNano())
	base := logConfig(3, time.Minute)
	base.Policies = map[string]PolicyConfig{"api": {Limit: 3, Window: time.Minute, Durability: DurabilityDisk}}
	base.Clock = func() time.Time { return time.Unix(0, clock.Load()) }
	base.DataDir = dir
	c := startCluster(t, 1, base)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// One key in the snapshot, the other in the log after it: the
	// restore needs both.
	key, key2 := Key{Tenant: "t", Subject: "s", Policy: "api"}, Key{Tenant: "t", Subject: "s2", Policy: "api"}
	var last time.Time
	for _, k := range []Key{key, key2} {
		for i := range 3 {
			d, err := c.nodes[0].Allow(ctx, Request{Key: k})
			if err != nil || !d.Allowed {
				t.Fatalf("allow %d of %v: %+v, %v", i, k, d, err)
			}
			last = d.DecidedAt
		}
		if k == key {
			c.nodes[0].dd.parts.snapshot()
		}
	}
	c.nodes[0].KillForTest()
	clock.Add(-int64(time.Hour)) // the wall clock stepped back across the restart
	c2 := startCluster(t, 1, base)
	waitFor(t, 20*time.Second, "the restarted node settled", c2.nodes[0].Settled)
	for _, k := range []Key{key, key2} {
		d, err := c2.nodes[0].Allow(ctx, Request{Key: k})
		if err != nil || d.Allowed {
			t.Fatalf("%v after the restart with the clock an hour back: %+v, %v; want refused (3 admissions restored)", k, d, err)
		}
		if d.DecidedAt.Before(last) {
			t.Fatalf("decided at %v, before the last admission written (%v): time went back for the key", d.DecidedAt, last)
		}
	}
	// Once the clock is past the window of what was written, the key
	// admits again.
	clock.Add(int64(time.Hour + 2*time.Minute))
	if d, err := c2.nodes[0].Allow(ctx, Request{Key: key}); err != nil || !d.Allowed {
		t.Fatalf("a window after the written state: %+v, %v; want admitted", d, err)
	}
}
