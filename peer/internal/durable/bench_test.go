package durable

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// BenchmarkSync measures one record appended and fsynced per operation:
// with writers = parallelism × GOMAXPROCS goroutines appending at once,
// which share fsyncs (group commit). fsyncs/op is what the disk was asked
// to do; ns/op ÷ fsyncs/op is one fsync's cost.
func BenchmarkSync(b *testing.B) {
	rec := make([]byte, 120) // about one admission's REPLACE record
	for _, par := range []int{1, 8, 32} {
		writers := par * runtime.GOMAXPROCS(0)
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			b.ReportAllocs()
			w, err := OpenWAL(b.TempDir(), "bench", "c", 0, func(uint64, []byte) error { return nil })
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			b.SetParallelism(par)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := w.Sync(w.Append(rec)); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(w.Syncs())/float64(b.N), "fsyncs/op")
		})
	}
}

// BenchmarkAdmit measures a local decision with its durability: the
// shard decision alone (memory), and the decision plus its key's state
// logged as a KIND_REPLACE record and, for disk, fsynced before it
// returns (group commit across the goroutines), as a holder would for
// each admission; disk_async flushes every 10 ms instead. par is the parallelism (× GOMAXPROCS goroutines).
func BenchmarkAdmit(b *testing.B) {
	// 1 s resolution: a key holds at most 60 runs, so records stay the
	// same size however long the benchmark runs.
	p := shard.Policy{Limit: 1 << 40, Window: time.Minute, Resolution: time.Second}
	const keys = 1 << 12
	pool := make([]shard.Key, keys)
	for i := range pool {
		pool[i] = shard.Key{Tenant: "t", Subject: fmt.Sprintf("s%d", i), Policy: "p"}
	}
	for _, dur := range []string{"memory", "disk_async", "disk"} {
		for _, par := range []int{1, 32} {
			b.Run(fmt.Sprintf("durability=%s/par=%d", dur, par), func(b *testing.B) {
				b.ReportAllocs()
				st, err := shard.NewStore(shard.Config{})
				if err != nil {
					b.Fatal(err)
				}
				parts, _, err := OpenParts(b.TempDir(), "c", 0)
				if err != nil {
					b.Fatal(err)
				}
				defer parts.Close()
				var next atomic.Uint64
				stop, flushed := make(chan struct{}), make(chan struct{})
				go func() {
					// disk_async's driver: a flush every FlushEvery (10 ms).
					defer close(flushed)
					t := time.NewTicker(10 * time.Millisecond)
					defer t.Stop()
					for {
						select {
						case <-stop:
							return
						case <-t.C:
							if dur == "disk_async" {
								parts.Flush()
							}
						}
					}
				}()
				defer func() { close(stop); <-flushed }()
				b.SetParallelism(par)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					ks := make([]shard.KeyState, 1)
					for pb.Next() {
						k := pool[next.Add(1)&(keys-1)]
						now := time.Now()
						d, err := st.Allow(k, p, 1, now)
						if err != nil || !d.Allowed || dur == "memory" {
							continue
						}
						// As peer logs an admission: exported into a
						// reused state, encoded into the log's buffer.
						if !st.ExportInto(k, now, &ks[0]) {
							continue
						}
						i := parts.LogKeys(now.UnixNano(), 1, 1, ks)
						if dur == "disk" {
							if err := parts.Sync(i); err != nil {
								b.Error(err)
								return
							}
						}
					}
				})
				b.StopTimer()
				if dur == "disk_async" {
					parts.Flush()
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
				b.ReportMetric(float64(parts.Syncs())/float64(b.N), "fsyncs/op")
			})
		}
	}
}

// TestRestoreTime measures how long a restarted member takes to read back
// and restore 100 000 keys (a snapshot of 90 000 and a log of 10 000
// admissions after it) before it can decide again. Opt-in:
// RINGLIMIT_RESTORE_KEYS=100000 go test -run TestRestoreTime -v.
func TestRestoreTime(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("RINGLIMIT_RESTORE_KEYS"))
	if n <= 0 {
		t.Skip("set RINGLIMIT_RESTORE_KEYS to measure (e.g. 100000)")
	}
	dir := t.TempDir()
	parts, _, err := OpenParts(dir, "c", 0)
	if err != nil {
		t.Fatal(err)
	}
	p := shard.Policy{Limit: 100, Window: time.Hour}
	st := newStore(t)
	now := t0
	snapAt := n * 9 / 10
	var snap []*peerpb.KeyState
	for i := range n {
		k := shard.Key{Tenant: "t", Subject: fmt.Sprintf("s%d", i), Policy: "p"}
		for j := range 3 {
			st.Allow(k, p, 1, now.Add(time.Duration(j)*time.Second))
		}
		ks, _ := st.Export(k, now.Add(3*time.Second))
		if i < snapAt {
			snap = append(snap, KeyToWire(ks))
			continue
		}
		if i == snapAt {
			covers := parts.Next()
			if err := parts.Snapshot(now.Add(3*time.Second).UnixNano(), covers, []*peerpb.PartitionOp{{Kind: peerpb.PartitionOp_KIND_SYNC_CHUNK, Partition: 1, Epoch: 1, Keys: snap}}); err != nil {
				t.Fatal(err)
			}
		}
		parts.Log(now.Add(3*time.Second).UnixNano(), &peerpb.PartitionOp{Kind: peerpb.PartitionOp_KIND_REPLACE, Partition: 1, Epoch: 1, Keys: []*peerpb.KeyState{KeyToWire(ks)}})
	}
	parts.Close()
	start := time.Now()
	parts, rec, err := OpenParts(dir, "c", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer parts.Close()
	read := time.Since(start)
	at, _ := rec.At(now.Add(time.Minute))
	into := newStore(t)
	restored, skipped, err := rec.Part(1).Restore(into, func(shard.Key) (shard.Policy, bool) { return p, true }, at)
	if err != nil || restored != n || skipped != 0 {
		t.Fatalf("restored %d of %d keys (%d skipped): %v", restored, n, skipped, err)
	}
	t.Logf("%d keys: read back in %v, restored in %v more (total %v)", n, read, time.Since(start)-read, time.Since(start))
}
