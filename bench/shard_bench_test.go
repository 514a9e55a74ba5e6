package bench

import (
	"fmt"
	"math/bits"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/shard"
)

// Sinks keep the decisions alive so the calls cannot be optimised away.
var (
	sinkShardDecision shard.Decision
	sinkShardErr      error
)

// shardBenchT0 is the simulated clock's start; shardBenchStep is how far it
// moves per operation. With the benchmark policy (1000 per second) one key
// receives 1 000 000 requests per simulated second: the first 1000 of each
// window are admitted and the rest refused, so the log stays at steady state
// and most decisions are rejections. With 100 000 keys each key is visited
// about every 100 ms, is always admitted and holds about 10 runs.
var shardBenchT0 = time.Unix(1_700_000_000, 0)

const shardBenchStep = time.Microsecond

// shardBenchPolicy is the sliding-log policy the Store benchmarks use.
func shardBenchPolicy(alg shard.Algorithm) shard.Policy {
	return shard.Policy{Limit: 1000, Window: time.Second, Algorithm: alg}
}

// shardKeyPool returns distinct keys spread cyclically over a pool whose size is
// the next power of two, so the timed loop can index it with a mask.
func shardKeyPool(distinct int) []shard.Key {
	n := 1 << bits.Len(uint(distinct-1))
	pool := make([]shard.Key, n)
	for i := range pool {
		pool[i] = shard.Key{Tenant: "bench", Subject: fmt.Sprintf("user-%d", i%distinct), Policy: "api"}
	}
	return pool
}

// shardWarmStore returns a store holding every key of pool, driven for three
// simulated windows and at least four passes over the pool, so the logs
// (and their buffers) are at steady state, and the clock after it.
func shardWarmStore(b *testing.B, pool []shard.Key, p shard.Policy, hits int64) (*shard.Store, time.Time) {
	b.Helper()
	store, err := shard.NewStore(shard.Config{})
	if err != nil {
		b.Fatal(err)
	}
	now := shardBenchT0
	mask := len(pool) - 1
	steps := max(3*int(p.Window/shardBenchStep), 4*len(pool))
	for i := range steps {
		now = now.Add(shardBenchStep)
		if _, err := store.Allow(pool[i&mask], p, hits, now); err != nil {
			b.Fatal(err)
		}
	}
	return store, now
}

func reportShardBytesPerKey(b *testing.B, store *shard.Store) {
	b.ReportMetric(float64(store.Bytes())/float64(store.Len()), "bytes/key")
}

// shardStoreCases are the key-count and hits shapes of the Store benchmarks.
var shardStoreCases = []struct {
	name string
	keys int
	hits int64
}{
	{"keys=1/hits=1", 1, 1},
	{"keys=1e5/hits=1", 100_000, 1},
}

// BenchmarkStoreAllow measures one decision for an existing key, on one
// goroutine.
func BenchmarkStoreAllow(b *testing.B) {
	for _, bc := range shardStoreCases {
		b.Run(bc.name, func(b *testing.B) {
			p := shardBenchPolicy(shard.SlidingLog)
			pool := shardKeyPool(bc.keys)
			store, now := shardWarmStore(b, pool, p, bc.hits)
			mask := len(pool) - 1
			b.ReportAllocs()
			var d shard.Decision
			var err error
			i := 0
			for b.Loop() {
				now = now.Add(shardBenchStep)
				d, err = store.Allow(pool[i&mask], p, bc.hits, now)
				i++
			}
			sinkShardDecision, sinkShardErr = d, err
			if err != nil {
				b.Fatal(err)
			}
			reportShardBytesPerKey(b, store)
		})
	}
}

// BenchmarkStoreAllowParallel is BenchmarkStoreAllow from GOMAXPROCS
// goroutines. Each goroutine runs its own simulated clock from the same
// start (the store clamps each key's time, as on a real owner), advancing
// GOMAXPROCS steps per operation so that the keys see the same request rate,
// and so the same log sizes, as in the sequential benchmark.
func BenchmarkStoreAllowParallel(b *testing.B) {
	for _, bc := range shardStoreCases {
		b.Run(bc.name, func(b *testing.B) {
			p := shardBenchPolicy(shard.SlidingLog)
			pool := shardKeyPool(bc.keys)
			store, start := shardWarmStore(b, pool, p, bc.hits)
			mask := len(pool) - 1
			step := shardBenchStep * time.Duration(runtime.GOMAXPROCS(0))
			var ids atomic.Int64
			var failed atomic.Bool
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				// Goroutines start far apart in the pool so that, with
				// many keys, they rarely share a stripe.
				i := int(ids.Add(1)) * 40_503
				now := start
				var d shard.Decision
				var err error
				for pb.Next() {
					now = now.Add(step)
					d, err = store.Allow(pool[i&mask], p, bc.hits, now)
					i++
				}
				if err != nil {
					failed.Store(true)
				}
				sinkShardDecision = d
			})
			b.StopTimer()
			if failed.Load() {
				b.Fatal("Allow returned an error")
			}
			reportShardBytesPerKey(b, store)
		})
	}
}

// BenchmarkStoreAllowAlgorithms compares the three algorithms on 1024
// existing keys, each receiving about its limit (one request per ~1 ms), so
// a sliding log holds about 1000 runs per key.
func BenchmarkStoreAllowAlgorithms(b *testing.B) {
	for _, alg := range []shard.Algorithm{shard.SlidingLog, shard.TokenBucket, shard.FixedWindow} {
		b.Run("alg="+alg.String(), func(b *testing.B) {
			p := shardBenchPolicy(alg)
			pool := shardKeyPool(1024)
			store, now := shardWarmStore(b, pool, p, 1)
			mask := len(pool) - 1
			b.ReportAllocs()
			var d shard.Decision
			var err error
			i := 0
			for b.Loop() {
				now = now.Add(shardBenchStep)
				d, err = store.Allow(pool[i&mask], p, 1, now)
				i++
			}
			sinkShardDecision, sinkShardErr = d, err
			if err != nil {
				b.Fatal(err)
			}
			reportShardBytesPerKey(b, store)
		})
	}
}

// BenchmarkLimiterAllow measures the single-key Limiter (no key encoding,
// hashing or locking).
func BenchmarkLimiterAllow(b *testing.B) {
	p := shardBenchPolicy(shard.SlidingLog)
	lim, err := shard.NewLimiter(p)
	if err != nil {
		b.Fatal(err)
	}
	now := shardBenchT0
	for range int(p.Window / shardBenchStep) {
		now = now.Add(shardBenchStep)
		if _, err := lim.Allow(now, 1); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	var d shard.Decision
	for b.Loop() {
		now = now.Add(shardBenchStep)
		d, err = lim.Allow(now, 1)
	}
	sinkShardDecision, sinkShardErr = d, err
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkStoreAllowMulti measures one atomic decision over two policies
// (a sliding log and a token bucket) of one existing subject, on one
// goroutine. The caller's out slice makes it allocation-free.
func BenchmarkStoreAllowMulti(b *testing.B) {
	for _, bc := range shardStoreCases {
		b.Run(bc.name+"/policies=2", func(b *testing.B) {
			pool := shardKeyPool(bc.keys)
			items := []shard.MultiItem{
				{Policy: "api", P: shardBenchPolicy(shard.SlidingLog), Hits: bc.hits},
				{Policy: "burst", P: shardBenchPolicy(shard.TokenBucket), Hits: bc.hits},
			}
			store, err := shard.NewStore(shard.Config{})
			if err != nil {
				b.Fatal(err)
			}
			out := make([]shard.Decision, len(items))
			mask := len(pool) - 1
			now := shardBenchT0
			steps := max(3*int(time.Second/shardBenchStep), 4*len(pool))
			for i := range steps {
				now = now.Add(shardBenchStep)
				k := pool[i&mask]
				if _, err := store.AllowMulti(k.Tenant, k.Subject, items, now, out); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				now = now.Add(shardBenchStep)
				k := pool[i&mask]
				_, err = store.AllowMulti(k.Tenant, k.Subject, items, now, out)
				i++
			}
			sinkShardDecision, sinkShardErr = out[0], err
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkStorePeek measures Peek (Allow's answer, recording nothing) on
// existing keys at steady state, for each algorithm.
func BenchmarkStorePeek(b *testing.B) {
	for _, alg := range []shard.Algorithm{shard.SlidingLog, shard.TokenBucket, shard.FixedWindow} {
		b.Run("alg="+alg.String(), func(b *testing.B) {
			p := shardBenchPolicy(alg)
			pool := shardKeyPool(1024)
			store, now := shardWarmStore(b, pool, p, 1)
			mask := len(pool) - 1
			b.ReportAllocs()
			var d shard.Decision
			var err error
			i := 0
			for b.Loop() {
				now = now.Add(shardBenchStep)
				d, err = store.Peek(pool[i&mask], p, 1, now)
				i++
			}
			sinkShardDecision, sinkShardErr = d, err
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}
