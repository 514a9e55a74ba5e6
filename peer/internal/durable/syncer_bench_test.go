package durable

import (
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkSyncerWakeups is whether a goroutine waiting for an fsync
// holds a processor (P): three goroutines (three nodes' WALs) write and
// fsync in a loop while a pair of goroutines exchange one byte over
// loopback TCP, b.N round trips; ns/op is one round trip, the wake-ups a
// network answer needs. Run at GOMAXPROCS=2 (-cpu 2): with f.Sync
// (syncer=file) each goroutine in an fsync keeps its P until the
// runtime's monitor takes it back; on the ring it is parked.
//
//	go test -run XXX -bench BenchmarkSyncerWakeups -cpu 2 -count 5 ./peer/internal/durable/
func BenchmarkSyncerWakeups(b *testing.B) {
	for _, name := range []string{"none", "file", "ring"} {
		b.Run("syncer="+name, func(b *testing.B) {
			var s syncer = fileSyncer{}
			if name == "ring" {
				r, err := newRing()
				if err != nil {
					b.Skipf("no io_uring here: %v", err)
				}
				defer r.close()
				s = r
			}
			benchWakeups(b, s, name != "none")
		})
	}
}

func benchWakeups(b *testing.B, s syncer, fsyncs bool) {
	dir := b.TempDir()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var syncs atomic.Int64
	var syncNanos atomic.Int64
	for i := range 3 {
		if !fsyncs {
			break
		}
		f, err := os.Create(filepath.Join(dir, string(rune('a'+i))))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := make([]byte, 100)
			for n := 0; n < 1_000_000; n++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := f.Write(rec); err != nil {
					b.Error(err)
					return
				}
				t0 := time.Now()
				if err := s.sync(f); err != nil {
					b.Error(err)
					return
				}
				syncNanos.Add(int64(time.Since(t0)))
				syncs.Add(1)
			}
		}()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		io.Copy(c, c) // echo until the client closes
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 1)
	b.ResetTimer()
	for range b.N {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	c.Close()
	close(stop)
	wg.Wait()
	if n := syncs.Load(); n > 0 {
		b.ReportMetric(float64(syncNanos.Load())/float64(n)/1e3, "µs/fsync")
		b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "fsyncs/s")
	}
}
