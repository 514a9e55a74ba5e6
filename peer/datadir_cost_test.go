package peer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// TestDurableBatchOneFsync: a batch of disk admissions received from a
// peer (Limiter.Check) is decided whole and then waits for the data
// directory once, so its items share one fsync (group commit within the
// batch). Answering each item after its own fsync cost one per item: the
// routed client's decisions/s under disk fell to the fsync rate.
func TestDurableBatchOneFsync(t *testing.T) {
	base := logConfig(1000, time.Hour)
	base.Policies = map[string]PolicyConfig{"api": {Limit: 1000, Window: time.Hour, Durability: DurabilityDisk}}
	base.DataDir = filepath.Join(t.TempDir(), "d")
	c := startCluster(t, 1, base)
	nd := c.nodes[0]
	const items = 50
	req := &peerpb.CheckRequest{}
	for i := range items {
		req.Items = append(req.Items, &peerpb.CheckItem{Key: &peerpb.Key{Tenant: "t", Subject: fmt.Sprint("s", i), Policy: "api"}, Hits: 1})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// No timed flush: the batch's own fsync is the only one.
	nd.dd.parts.timedOff.Store(true)
	done := make(chan struct{})
	nd.dd.parts.flushNow <- done
	<-done
	log := nd.dd.parts.parts
	for round := range 3 {
		syncs, next := log.Syncs(), log.Next()
		resp, err := (&limiterService{n: nd}).Check(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for i, d := range resp.GetDecisions() {
			if d.GetStatus() != peerpb.Status_STATUS_OK || !d.GetAllowed() {
				t.Fatalf("round %d item %d: %v", round, i, d)
			}
		}
		// Partition copies logged as the node took its partitions may
		// still come in (without an fsync of their own).
		if got := log.Next() - next; got < items {
			t.Fatalf("round %d: %d records logged for %d admissions", round, got, items)
		}
		if got := log.Syncs() - syncs; got != 1 {
			t.Fatalf("round %d: %d fsyncs for a batch of %d disk admissions; want 1", round, got, items)
		}
		if log.Next() > 0 {
			if err := log.Sync(log.Next() - 1); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestDurableAllowAllocs pins the local decision of a policy kept on disk
// at the memory policy's zero allocations: the key's state is exported
// into the partition's reusable state and encoded straight into the
// log's buffer. Built as peerpb messages and marshalled, each decision
// allocated per run of the state, per message and for the record: 9
// times in this test, 26 in an earlier benchmark with longer states. The
// flusher allocates per batch at most, outside the decision.
func TestDurableAllowAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	base := logConfig(1<<40, time.Second)
	base.Policies = map[string]PolicyConfig{
		"async": {Limit: 1 << 40, Window: time.Second, Durability: DurabilityDiskAsync},
		"disk":  {Limit: 1 << 40, Window: time.Second, Durability: DurabilityDisk},
	}
	base.DataDir = filepath.Join(t.TempDir(), "d")
	c := startCluster(t, 1, base)
	nd := c.nodes[0]
	ctx := context.Background()
	for _, pol := range []string{"async", "disk"} {
		req := Request{Key: Key{Tenant: "t", Subject: "s", Policy: pol}}
		next := nd.dd.parts.parts.Next()
		for range 50 { // the key's state and the buffers grow to their size
			if d, err := nd.Allow(ctx, req); err != nil || !d.Allowed {
				t.Fatalf("%s: %+v, %v", pol, d, err)
			}
		}
		if logged := nd.dd.parts.parts.Next() - next; logged < 50 {
			t.Fatalf("%s: %d records logged for 50 admissions", pol, logged)
		}
		if n, where := ownAllocs(300, "peer.(*Node).Allow", func() {
			if _, err := nd.Allow(ctx, req); err != nil {
				t.Fatal(err)
			}
		}); n >= 0.1 {
			// A shared buffer that grows now and then is not a cost per
			// call: 300 calls of the disk_async policy grew the log's
			// buffer about 10 times (0.03 a call).
			t.Fatalf("Node.Allow of a %s policy allocates %.2f times per call, want 0; one of them:\n%s", pol, n, where)
		}
	}
}

// ownAllocs runs fn runs times and returns the allocations per run made
// under a frame named within (fn's own call, not the rest of the process), with the stack
// that made the most. AllocsPerRun counts the whole process: the node's own
// goroutines (its ticks, gossip, the disk flusher) allocate meanwhile,
// and a disk decision waits for an fsync, so on a loaded machine, where
// fsyncs take milliseconds, theirs came to one a call (CI, beside the
// race step). Every allocation is recorded while fn runs
// (MemProfileRate 1) and only those whose stack holds within count. The
// profile sees the tiny allocator's blocks (up to 16 bytes), not each
// object in them: an 8-byte allocation per call counts about half.
func ownAllocs(runs int, within string, fn func()) (float64, string) {
	defer func(rate int) { runtime.MemProfileRate = rate }(runtime.MemProfileRate)
	runtime.MemProfileRate = 1
	fn() // the first call may grow buffers
	before := allocsUnder(within)
	for range runs {
		fn()
	}
	var total int64
	var where string
	var most int64
	for stack, n := range allocsUnder(within) {
		if d := n - before[stack]; d > 0 {
			total += d
			if d > most {
				most, where = d, stack
			}
		}
	}
	return float64(total) / float64(runs), where
}

// allocsUnder returns the objects allocated so far, as far as the memory
// profile knows, by each stack that holds a frame named within.
func allocsUnder(within string) map[string]int64 {
	// The profile publishes allocations two collections after them.
	runtime.GC()
	runtime.GC()
	var recs []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, true)
	for {
		recs = make([]runtime.MemProfileRecord, n+50)
		var ok bool
		if n, ok = runtime.MemProfile(recs, true); ok {
			recs = recs[:n]
			break
		}
	}
	by := map[string]int64{}
	for _, r := range recs {
		var b strings.Builder
		under := false
		frames := runtime.CallersFrames(r.Stack())
		for {
			f, more := frames.Next()
			under = under || strings.HasSuffix(f.Function, within)
			fmt.Fprintf(&b, "\t%s (%s:%d)\n", f.Function, filepath.Base(f.File), f.Line)
			if !more {
				break
			}
		}
		if under {
			by[b.String()] += r.AllocObjects
		}
	}
	return by
}

// TestDurableReplicaOneFsync: a backup answers a replication message whose
// operations carry disk admissions of many partitions after one fsync
// for them all, not one per partition in turn (which held the routed
// client's disk rate to a tenth of memory's).
func TestDurableReplicaOneFsync(t *testing.T) {
	base := logConfig(1000, time.Hour)
	base.Policies = map[string]PolicyConfig{"api": {Limit: 1000, Window: time.Hour, Durability: DurabilityDisk}}
	root := t.TempDir()
	c := startClusterWith(t, 2, base, func(i int, cfg *Config) { cfg.DataDir = filepath.Join(root, fmt.Sprint("n", i)) })
	var holder, backup *Node
	req := &peerpb.ReplicateRequest{}
	for _, b := range c.nodes {
		for pid := range b.pt.parts {
			st := b.lo.run.Part(pid)
			if !b.lo.run.AcceptReplica(pid, st.Holder, st.Epoch) || len(req.Ops) == 20 {
				continue
			}
			backup = b
			req.Ops = append(req.Ops, &peerpb.PartitionOp{Kind: peerpb.PartitionOp_KIND_REPLACE, Partition: uint32(pid), Epoch: st.Epoch,
				Keys: []*peerpb.KeyState{{Key: &peerpb.Key{Tenant: "t", Subject: fmt.Sprint("s", pid), Policy: "api"}, Runs: []*peerpb.Run{{AgeNs: 1, Count: 1}}}}})
		}
		if backup != nil {
			break
		}
	}
	if len(req.Ops) < 10 {
		t.Fatalf("%d partitions backed with a replica accepted; want 10 or more", len(req.Ops))
	}
	for _, nd := range c.nodes {
		if nd != backup {
			holder = nd
		}
	}
	req.Sender = holder.name
	backup.dd.parts.timedOff.Store(true) // the message's fsync is the only one
	done := make(chan struct{})
	backup.dd.parts.flushNow <- done
	<-done
	log := backup.dd.parts.parts
	syncs, next := log.Syncs(), log.Next()
	resp, err := (&limiterService{n: backup}).replicate(req, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range resp.GetResults() {
		if r.GetStatus() != peerpb.OpStatus_OP_STATUS_OK {
			t.Fatalf("operation %d: %v", i, r)
		}
	}
	if got := log.Next() - next; got < uint64(len(req.Ops)) {
		t.Fatalf("%d records logged for %d operations", got, len(req.Ops))
	}
	if got := log.Syncs() - syncs; got != 1 {
		t.Fatalf("%d fsyncs for a message of %d partitions' disk admissions; want 1", got, len(req.Ops))
	}
}

// TestDiskAsyncLossBound: under disk_async, what a crash loses of the
// admissions acknowledged is exactly those logged after the flusher's
// last flush, and nothing before it: the bound is one flush interval
// (diskFlushInterval) of admissions. The flusher's timed flushes are
// stopped and flushes made on demand; the crash is the data directory as
// it is on disk at that instant (copied: what a kill -9 leaves, since a
// record reaches its file only with its flush), restarted from.
func TestDiskAsyncLossBound(t *testing.T) {
	const limit = 100
	base := logConfig(limit, time.Hour)
	base.Policies = map[string]PolicyConfig{"api": {Limit: limit, Window: time.Hour, Durability: DurabilityDiskAsync}}
	dir := filepath.Join(t.TempDir(), "d")
	base.DataDir = dir
	c := startCluster(t, 1, base)
	nd := c.nodes[0]
	pl := nd.dd.parts
	pl.timedOff.Store(true)
	flush := func() {
		done := make(chan struct{})
		pl.flushNow <- done
		<-done
	}
	flush() // a timed flush under way has ended too: the flusher is one goroutine
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admit := func(k Key, times int) {
		for i := range times {
			if d, err := nd.Allow(ctx, Request{Key: k}); err != nil || !d.Allowed {
				t.Fatalf("allow %d of %v: %+v, %v", i, k, d, err)
			}
		}
	}
	kA, kB := Key{Tenant: "t", Subject: "a", Policy: "api"}, Key{Tenant: "t", Subject: "b", Policy: "api"}
	admit(kA, 20)
	flush()
	admit(kA, 3) // acknowledged, not yet flushed
	admit(kB, 7)
	crash := filepath.Join(t.TempDir(), "crash")
	if err := os.CopyFS(crash, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	nd.KillForTest()
	base.DataDir = crash
	c2 := startCluster(t, 1, base)
	for _, w := range []struct {
		k    Key
		kept int
	}{{kA, 20}, {kB, 0}} {
		d, err := c2.nodes[0].Allow(ctx, Request{Key: w.k})
		if err != nil || !d.Allowed || d.Remaining != int64(limit-w.kept-1) {
			t.Fatalf("%v after the crash: %+v, %v; want %d admissions kept (those flushed), %d left", w.k, d, err, w.kept, limit-w.kept-1)
		}
	}
}
