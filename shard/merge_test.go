package shard

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestSlidingLogMergeOneRun checks merge's one-run shortcut against the
// general merge on random logs: the same runs and counts either way.
func TestSlidingLogMergeOneRun(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range 20000 {
		p := Policy{Limit: 1 + rng.Int64N(20), Window: time.Duration(1 + rng.Int64N(100))}
		var a, b slidingLog
		ts := int64(0)
		for range rng.IntN(12) {
			ts += rng.Int64N(20)
			n := 1 + rng.Int64N(3)
			if a.count+n <= p.Limit {
				a.push(ts, n)
				b.push(ts, n)
			}
		}
		now := ts + rng.Int64N(120)
		r := []Run{{Age: time.Duration(rng.Int64N(140) - 10), Count: 1 + rng.Int64N(4)}}
		a.merge(now, r, p)
		b.mergeAll(now, r, p)
		if a.size != b.size || a.count != b.count {
			t.Fatalf("seed %d case %d: merge of %+v at %d (policy %+v): shortcut size %d count %d, general size %d count %d", seed, i, r, now, p, a.size, a.count, b.size, b.count)
		}
		for k := range a.size {
			if *a.at(k) != *b.at(k) {
				t.Fatalf("seed %d case %d: run %d: shortcut %+v, general %+v", seed, i, k, *a.at(k), *b.at(k))
			}
		}
	}
}
