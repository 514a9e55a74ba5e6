package bench

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/ringlimit/ringlimit/ring"
)

// Sinks keep the compiler from discarding lookups. Prefixed with ring so they
// cannot clash with other benchmark files of this package.
var (
	ringOwnerSink    string
	ringSnapshotSink *ring.Snapshot
	ringParallelSink atomic.Int64
)

// ringKeyPoolSize is the number of precomputed keys; a power of two so the
// benchmark loop picks one with a mask instead of a division.
const ringKeyPoolSize = 1 << 14

// ringCases are the ring sizes measured. PartitionCount grows with the
// member count so every member owns a fair number of partitions, as a
// production config for that size would.
var ringCases = []struct {
	members    int
	partitions int
}{
	{members: 3, partitions: 271},
	{members: 16, partitions: 271},
	{members: 128, partitions: 4099},
}

func ringMembers(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.0.%d.%d:7946", i/256, i%256)
	}
	return out
}

// ringKeys builds the key pool: byte strings shaped like encoded quota keys
// (length-prefixed tenant, subject, policy), distinct per index.
func ringKeys() [][]byte {
	keys := make([][]byte, ringKeyPoolSize)
	for i := range keys {
		subject := fmt.Sprintf("user-%08d", i)
		keys[i] = fmt.Appendf(nil, "\x07tenant%d%c%s\x05login", i%7, byte(len(subject)), subject)
	}
	return keys
}

func ringSnapshot(b *testing.B, members, partitions int) *ring.Snapshot {
	b.Helper()
	s, err := ring.New(ring.Config{PartitionCount: partitions}, ringMembers(members), 1)
	if err != nil {
		b.Fatalf("ring.New(members=%d, partitions=%d) = %v", members, partitions, err)
	}
	return s
}

// BenchmarkRingOwner measures one owner lookup (hash, partition, table
// read) on one goroutine. Target: a few ns, zero allocations.
func BenchmarkRingOwner(b *testing.B) {
	keys := ringKeys()
	for _, c := range ringCases {
		b.Run(fmt.Sprintf("members=%d", c.members), func(b *testing.B) {
			s := ringSnapshot(b, c.members, c.partitions)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				ringOwnerSink = s.Owner(keys[i&(ringKeyPoolSize-1)])
				i++
			}
		})
	}
}

// BenchmarkRingOwnerParallel runs owner lookups from every P on one shared
// snapshot, as concurrent requests do: lookups take no lock, so throughput
// should scale with cores.
func BenchmarkRingOwnerParallel(b *testing.B) {
	keys := ringKeys()
	for _, c := range ringCases {
		b.Run(fmt.Sprintf("members=%d", c.members), func(b *testing.B) {
			s := ringSnapshot(b, c.members, c.partitions)
			var start atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				// Each goroutine starts elsewhere in the pool.
				i := int(start.Add(ringKeyPoolSize / 8))
				n := 0
				for pb.Next() {
					n += len(s.Owner(keys[i&(ringKeyPoolSize-1)]))
					i++
				}
				ringParallelSink.Add(int64(n))
			})
		})
	}
}

// BenchmarkRingBackup measures the backup-owner lookup, which has the same
// shape as Owner plus one branch.
func BenchmarkRingBackup(b *testing.B) {
	keys := ringKeys()
	for _, c := range ringCases {
		b.Run(fmt.Sprintf("members=%d", c.members), func(b *testing.B) {
			s := ringSnapshot(b, c.members, c.partitions)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				ringOwnerSink = s.Backup(keys[i&(ringKeyPoolSize-1)])
				i++
			}
		})
	}
}

// ringNewCases are the ring sizes measured for a rebuild: the lookup sizes
// plus 64 and 256 members, keeping about 32 partitions per member (primes)
// from 128 members on, and 1 024 members at ring.PartitionsFor's count (16
// a member). Issue 9 budgets 256 members at 20 ms and 10 MB.
var ringNewCases = []struct {
	members    int
	partitions int
}{
	{members: 3, partitions: 271},
	{members: 16, partitions: 271},
	{members: 64, partitions: 2053},
	{members: 128, partitions: 4099},
	{members: 256, partitions: 8191},
	{members: 1024, partitions: 16411},
}

// BenchmarkRingNew measures a full snapshot rebuild, paid on every
// membership change: owners plus, for every member, where its partitions go
// if it leaves. MB/op is the bytes allocated per rebuild in millions, the
// unit of the issue 9 budget.
func BenchmarkRingNew(b *testing.B) {
	for _, c := range ringNewCases {
		b.Run(fmt.Sprintf("members=%d", c.members), func(b *testing.B) {
			members := ringMembers(c.members)
			cfg := ring.Config{PartitionCount: c.partitions}
			b.ReportAllocs()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for b.Loop() {
				s, err := ring.New(cfg, members, 1)
				if err != nil {
					b.Fatalf("ring.New(members=%d) = %v", c.members, err)
				}
				ringSnapshotSink = s
			}
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(b.N)/1e6, "MB/op")
		})
	}
}
