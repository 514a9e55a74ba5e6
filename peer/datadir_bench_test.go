package peer

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkAllowDurability: Node.Allow on the holder (one node with a data
// directory, 10 000 keys, 64 goroutines) for a policy of each durability:
// memory (nothing written), disk_async (the key's state logged, fsynced
// every 10 ms) and disk (answered after its fsync; concurrent admissions
// share one). go test -run XXX -bench BenchmarkAllowDurability -benchtime 2s ./peer/
func BenchmarkAllowDurability(b *testing.B) {
	cfg := logConfig(1<<40, time.Hour)
	cfg.Policies = map[string]PolicyConfig{
		"memory":     {Limit: 1 << 40, Window: time.Hour},
		"disk_async": {Limit: 1 << 40, Window: time.Hour, Durability: DurabilityDiskAsync},
		"disk":       {Limit: 1 << 40, Window: time.Hour, Durability: DurabilityDisk},
	}
	cfg.Name, cfg.DataDir, cfg.Gossip, cfg.Logger = "n0", b.TempDir(), testGossip, testLogger(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nd, err := New(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer nd.Close(context.Background())
	for _, pol := range []string{"memory", "disk_async", "disk"} {
		keys := make([]Key, 10000)
		for i := range keys {
			keys[i] = Key{Tenant: "t", Subject: fmt.Sprint("s", i), Policy: pol}
		}
		b.Run("durability="+pol, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(32) // 64 goroutines on 2 cores
			var next atomic.Int64
			var failed atomic.Pointer[error]
			syncs := nd.dd.parts.parts.Syncs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(1)) * 7919
				for pb.Next() {
					d, err := nd.Allow(ctx, Request{Key: keys[i%len(keys)]})
					if err != nil || !d.Allowed {
						e := fmt.Errorf("allow: %+v, %v", d, err)
						failed.CompareAndSwap(nil, &e)
						return
					}
					i++
				}
			})
			b.StopTimer()
			if e := failed.Load(); e != nil {
				b.Fatal(*e)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
			b.ReportMetric(float64(nd.dd.parts.parts.Syncs()-syncs)/float64(b.N), "fsyncs/op")
		})
	}
}
