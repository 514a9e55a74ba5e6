package durable

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BenchmarkFsync is what one fsync costs on the file system of
// os.TempDir() (the one the load tests' data directories use), outside
// the WAL: each operation writes one 100-byte record after the last and
// syncs it, from flights goroutines at once (each its own records, as
// the WAL's pipelined flushes). The variants:
//
//   - file=growing: appended past the end, as the WAL's segments are, so
//     each sync also commits the file's new size (a journal commit on
//     ext4);
//   - file=zeroed: written over a file filled with zeros and synced
//     beforehand, so a sync has only the data to write (no size change,
//     no block allocation);
//   - call=fsync or fdatasync.
//
// ns/op is the wall time per record (throughput); latency-µs is one
// write and sync's own wall time (ns/op × flights), and cpu-µs/op the
// process's CPU time (user and system) per operation: on a virtual
// machine most of a sync's cost may be CPU, which the decisions around
// it then lack.
//
//	go test -run XXX -bench BenchmarkFsync -benchtime 2000x ./peer/internal/durable/
func BenchmarkFsync(b *testing.B) {
	for _, file := range []string{"growing", "zeroed"} {
		for _, call := range []string{"fsync", "fdatasync"} {
			for _, flights := range []int{1, 2} {
				b.Run(fmt.Sprintf("file=%s/call=%s/flights=%d", file, call, flights), func(b *testing.B) {
					benchFsync(b, file == "zeroed", call == "fdatasync", flights)
				})
			}
		}
	}
}

func benchFsync(b *testing.B, zeroed, datasync bool, flights int) {
	const recLen = 100
	f, err := os.OpenFile(filepath.Join(b.TempDir(), "f"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if zeroed {
		zero := make([]byte, 1<<20)
		for off := int64(0); off < int64(b.N+flights)*recLen; off += int64(len(zero)) {
			if _, err := f.WriteAt(zero, off); err != nil {
				b.Fatal(err)
			}
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	sync1 := f.Sync
	if datasync {
		sync1 = func() error { return syscall.Fdatasync(int(f.Fd())) }
	}
	rec := make([]byte, recLen)
	for i := range rec {
		rec[i] = byte(i) | 1
	}
	var mu sync.Mutex
	next := int64(0)
	cpu0 := cpuTime(b)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for g := range flights {
		n := b.N / flights
		if g < b.N%flights {
			n++
		}
		wg.Go(func() {
			for range n {
				mu.Lock()
				off := next
				next += recLen
				mu.Unlock()
				if _, err := f.WriteAt(rec, off); err != nil {
					b.Error(err)
					return
				}
				if err := sync1(); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(el.Microseconds())*float64(flights)/float64(b.N), "latency-µs")
	b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
}

// cpuTime is the process's CPU time so far, user and system.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
