package durable

import (
	"fmt"
	"runtime"
	"testing"
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
