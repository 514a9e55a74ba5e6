package peer

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestDataDirRestartTime measures how soon a node whose data directory
// holds many keys decides again after a restart of the whole cluster (one
// node holding every partition, killed and started again): from the start
// (New called) to New returning, to the first decision, and to a decision
// in every partition, each from the state on disk (a key admitted once
// before the kill answers with the one admission counted). Two rounds:
// every key's state in the log (no snapshot yet: each admission's record
// replayed), then a snapshot of every partition plus a tenth of the keys
// admitted again after it (the state partSnapshotEvery leaves). Opt-in,
// it writes RINGLIMIT_RESTART_KEYS keys:
//
//	RINGLIMIT_RESTART_KEYS=100000 go test -run TestDataDirRestartTime -v ./peer/
func TestDataDirRestartTime(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("RINGLIMIT_RESTART_KEYS"))
	if n <= 0 {
		t.Skip("opt-in: RINGLIMIT_RESTART_KEYS=100000")
	}
	base := logConfig(restartLimit, time.Hour)
	base.Policies = map[string]PolicyConfig{"api": {Limit: restartLimit, Window: time.Hour, Durability: DurabilityDiskAsync}}
	base.DataDir = filepath.Join(t.TempDir(), "d")
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = Key{Tenant: "t", Subject: fmt.Sprintf("user-%08d", i), Policy: "api"}
	}
	c := startCluster(t, 1, base)
	nd := c.nodes[0]
	admit(t, nd, keys, 1)
	// A key per partition, to see each decide again.
	probe := map[int]Key{}
	for _, k := range keys {
		if _, ok := probe[nd.partIDForTest(k)]; !ok {
			probe[nd.partIDForTest(k)] = k
		}
	}
	flushed(t, nd)
	nd.KillForTest()
	used := map[Key]int{}
	for _, k := range probe {
		used[k] = 1
	}
	nd = restartTimed(t, base, probe, used, "every key in the log")

	nd.dd.parts.snapshot()
	// A tenth of the keys admitted again, after the snapshot; the probes
	// are keys not probed before, among them where the partition has one.
	again := keys[:n/10]
	admit(t, nd, again, 1)
	probed := map[Key]bool{}
	for _, k := range probe {
		probed[k] = true
	}
	// Admissions so far: one each, one more for the probes and for the
	// keys admitted again.
	used = map[Key]int{}
	for i, k := range keys {
		used[k] = 1
		if probed[k] {
			used[k]++
		}
		if i < len(again) {
			used[k]++
		}
		if pid := nd.partIDForTest(k); !probed[k] && used[k] > used[probe[pid]]-b2i(probed[probe[pid]]) {
			probe[pid] = k // prefer a key not probed before, admitted again
		}
	}
	flushed(t, nd)
	nd.KillForTest()
	restartTimed(t, base, probe, used, "a snapshot and a tenth of the keys in the log after it")
}

// admit makes times admissions of each key, from 32 goroutines.
func admit(t *testing.T, nd *Node, keys []Key, times int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	var next atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < len(keys) && failed.Load() == nil; i = int(next.Add(1)) - 1 {
				for range times {
					if d, err := nd.Allow(ctx, Request{Key: keys[i]}); err != nil || !d.Allowed {
						e := fmt.Errorf("allow %v: %+v, %v", keys[i], d, err)
						failed.CompareAndSwap(nil, &e)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	if e := failed.Load(); e != nil {
		t.Fatal(*e)
	}
	t.Logf("%d keys admitted %d times each in %v", len(keys), times, time.Since(start).Round(time.Millisecond))
}

// flushed waits until everything logged is on disk (disk_async).
func flushed(t *testing.T, nd *Node) {
	t.Helper()
	if err := nd.dd.parts.parts.Flush(); err != nil {
		t.Fatal(err)
	}
}

// restartTimed starts the node again from base's data directory and
// waits until every probe key's partition decides, each key's admissions
// (used) restored. It returns the restarted node.
func restartTimed(t *testing.T, base Config, probe map[int]Key, used map[Key]int, what string) *Node {
	t.Helper()
	start := time.Now()
	c := &cluster{t: t, base: base}
	nd := c.addWith("n0", nil)
	started := time.Since(start)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// One poller: a partition is asked once the node may decide it (a
	// goroutine spinning per partition starved the restore of CPU).
	var first, last time.Duration
	pending := maps.Clone(probe)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for len(pending) > 0 {
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d partitions not deciding within the deadline", len(pending), len(probe))
		case <-tick.C:
		}
		for pid, k := range pending {
			if !nd.lo.run.MayDecide(pid, nd.mono()) {
				continue
			}
			d, err := nd.Allow(ctx, Request{Key: k})
			el := time.Since(start)
			if first == 0 {
				first = el
			}
			last = el
			delete(pending, pid)
			// The probe's admission is one more than those restored.
			if u := used[k]; err != nil || !d.Allowed || d.Remaining != int64(restartLimit-u-1) {
				t.Fatalf("%v after the restart: %+v, %v; want admitted with %d left (%d restored)", k, d, err, restartLimit-u-1, u)
			}
		}
	}
	t.Logf("restart with %s: New returned after %v, first decision after %v, every one of %d partitions deciding after %v",
		what, started.Round(time.Millisecond), first.Round(time.Millisecond), len(probe), last.Round(time.Millisecond))
	return nd
}

// restartLimit is TestDataDirRestartTime's limit: above any key's
// admissions there.
const restartLimit = 10

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestDataDirRestoredNotLogged: after a restart of the whole cluster (one
// node), a partition whose state came back whole from the data directory
// is not reported as restarted empty (an Error, and the lost-handoff
// count, for each of its 271 partitions before), and its key keeps its
// admission.
func TestDataDirRestoredNotLogged(t *testing.T) {
	base := logConfig(restartLimit, time.Hour)
	base.Policies = map[string]PolicyConfig{"api": {Limit: restartLimit, Window: time.Hour, Durability: DurabilityDisk}}
	base.DataDir = filepath.Join(t.TempDir(), "d")
	c := startCluster(t, 1, base)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := Key{Tenant: "t", Subject: "s", Policy: "api"}
	if d, err := c.nodes[0].Allow(ctx, Request{Key: k}); err != nil || !d.Allowed {
		t.Fatalf("before the restart: %+v, %v", d, err)
	}
	c.nodes[0].KillForTest()
	var logs restartLogBuffer
	base.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	c2 := startCluster(t, 1, base)
	d, err := c2.nodes[0].Allow(ctx, Request{Key: k})
	if err != nil || !d.Allowed || d.Remaining != restartLimit-2 {
		t.Fatalf("after the restart: %+v, %v; want admitted with %d left (1 restored)", d, err, restartLimit-2)
	}
	if s := logs.String(); strings.Contains(s, "restarted empty") || !strings.Contains(s, "partition restored from the data directory") {
		t.Fatalf("a restart from the data directory logged:\n%s", s)
	}
}

// restartLogBuffer is a bytes.Buffer safe for concurrent writers.
type restartLogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *restartLogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *restartLogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
