package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/shard"
)

// Handoff benchmarks: how fast a leaving node hands its keys off, and what
// the crash backup costs on the decision path. Exported API only.
//
//	go test ./bench -run '^$' -bench 'Handoff|AllowBackup' -benchtime 3x   (leave)
//	RINGLIMIT_BENCH_BIG=1 go test ./bench -run '^$' -bench HandoffLeave/keys=1e6 -benchtime 1x -timeout 30m

// hoBenchPolicy admits up to 1e15 per hour at 10 ms resolution: decisions
// are admissions (which is what the backup streams), and a key's log holds
// at most one run per 10 ms.
const hoBenchPolicy = "handoff"

func hoBenchPolicies() map[string]peer.PolicyConfig {
	return map[string]peer.PolicyConfig{
		hoBenchPolicy: {Limit: 1e15, Window: time.Hour, Resolution: 10 * time.Millisecond},
	}
}

// hoBenchGossip is the GossipFast preset with a patient failure detector,
// so a loaded machine does not turn a handoff into a false failure.
func hoBenchGossip(mc *memberlist.Config) {
	mc.TCPTimeout = 2 * time.Second
	mc.SuspicionMult = 10
}

// hoBenchCluster starts n nodes named prefix-i with cfg's settings, joined
// through the first, and waits until each sees n members. The caller closes
// them.
func hoBenchCluster(b *testing.B, prefix string, n int, cfg peer.Config) []*peer.Node {
	b.Helper()
	nodes := make([]*peer.Node, 0, n)
	for i := range n {
		c := cfg
		c.Name = fmt.Sprintf("%s-%d", prefix, i)
		if c.Policies == nil {
			c.Policies = hoBenchPolicies()
		}
		c.GossipProfile, c.Gossip = peer.GossipFast, hoBenchGossip
		if i > 0 {
			c.Join = []string{nodes[0].GossipAddr()}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		nd, err := peer.New(ctx, c)
		cancel()
		if err != nil {
			hoBenchClose(nodes)
			b.Fatalf("start node %d: %v", i, err)
		}
		nodes = append(nodes, nd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := peer.WaitSettled(ctx, nodes, 0); err != nil {
		hoBenchClose(nodes)
		b.Fatalf("cluster of %d did not converge: %v", n, err)
	}
	return nodes
}

func hoBenchClose(nodes []*peer.Node) {
	for _, nd := range nodes {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_ = nd.Close(ctx)
		cancel()
	}
}

// hoDrainLog is a slog handler that keeps the duration reported by the
// last "handoff on leave" line: the handoff part of Close.
type hoDrainLog struct{ last atomic.Int64 }

func (h *hoDrainLog) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelInfo }
func (h *hoDrainLog) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h *hoDrainLog) WithGroup(string) slog.Handler                { return h }
func (h *hoDrainLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "handoff on leave" {
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "duration" {
				h.last.Store(int64(a.Value.Duration()))
			}
			return true
		})
	}
	return nil
}

func hoBenchKey(i int) peer.Key {
	return peer.Key{Tenant: "bench", Subject: fmt.Sprintf("user-%08d", i), Policy: hoBenchPolicy}
}

// hoBenchFill admits one request for each of keys 0..n-1 on its owner (the
// local path, so filling is quick), several goroutines per node.
func hoBenchFill(b *testing.B, nodes []*peer.Node, n int) {
	b.Helper()
	byName := make(map[string]*peer.Node, len(nodes))
	for _, nd := range nodes {
		byName[nd.Name()] = nd
	}
	workers := max(2, runtime.GOMAXPROCS(0))
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				k := hoBenchKey(i)
				owner, err := nodes[0].Owner(k)
				if err == nil {
					var d peer.Decision
					d, err = byName[owner].Allow(context.Background(), peer.Request{Key: k})
					if err == nil && !d.Allowed {
						err = fmt.Errorf("key %v refused", k)
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatalf("fill: %v", err)
	}
}

// BenchmarkHandoffLeave measures a graceful leave: keys=N are spread over a
// 3-node cluster (one admission each), then the node holding the most
// closes. The timed region is that Close: hand off about N/3 keys to the
// two others (ring.Snapshot.Backup), stop deciding, leave gossip, stop.
// Reports the keys it moved per leave, keys/s over the whole Close, and the
// handoff part alone (handoff-ms/leave, from the node's "handoff on leave"
// log line). keys=1e5 and keys=1e6 run only with RINGLIMIT_BENCH_BIG=1
// (filling takes a while).
func BenchmarkHandoffLeave(b *testing.B) {
	for _, tc := range []struct {
		name string
		keys int
		big  bool
	}{
		{"keys=1e4", 1e4, false},
		{"keys=1e5", 1e5, true},
		{"keys=1e6", 1e6, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			if tc.big && os.Getenv("RINGLIMIT_BENCH_BIG") == "" {
				b.Skip("set RINGLIMIT_BENCH_BIG=1 to run")
			}
			b.ReportAllocs()
			var moved int64
			var elapsed, drained time.Duration
			drain := &hoDrainLog{}
			b.StopTimer()
			for i := 0; i < b.N; i++ {
				nodes := hoBenchCluster(b, fmt.Sprintf("leave%d", i), 3, peer.Config{
					Store:  hoStoreFor(tc.keys),
					Logger: slog.New(drain),
				})
				hoBenchFill(b, nodes, tc.keys)
				leaver := nodes[0]
				for _, nd := range nodes[1:] {
					if nd.Stats().Keys > leaver.Stats().Keys {
						leaver = nd
					}
				}
				held := leaver.Stats().Keys
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
				start := time.Now()
				b.StartTimer()
				err := leaver.Close(ctx)
				b.StopTimer()
				elapsed += time.Since(start)
				drained += time.Duration(drain.last.Load())
				cancel()
				if err != nil {
					b.Fatalf("Close of %s with %d keys: %v", leaver.Name(), held, err)
				}
				moved += int64(held)
				total := 0
				var rest []*peer.Node
				for _, nd := range nodes {
					if nd != leaver {
						total += nd.Stats().Keys
						rest = append(rest, nd)
					}
				}
				if total != tc.keys {
					b.Fatalf("after the leave the others hold %d keys, want %d", total, tc.keys)
				}
				hoBenchClose(rest)
			}
			if elapsed > 0 {
				b.ReportMetric(float64(moved)/float64(b.N), "keys/leave")
				b.ReportMetric(float64(moved)/elapsed.Seconds(), "keys/s")
				b.ReportMetric(float64(drained.Milliseconds())/float64(b.N), "handoff-ms/leave")
			}
		})
	}
}

// hoStoreFor sizes a node's store for up to n keys.
func hoStoreFor(n int) shard.Config {
	return shard.Config{MaxKeys: max(1<<20, 2*n)}
}

// BenchmarkAllowReplication compares Node.Allow with each replication
// mode: sync (every admission answered after the partition's backup has
// it), async (sent in the next batch, not waited for) and off, in a 3-node
// cluster, 1e4 distinct keys, every decision an admission. Paths: local
// (this node holds the keys) with 2 callers, where a sync admission waits
// for one replication round trip of its own, and with 64, where
// concurrent admissions share it; forwarded (a peer holds the keys) with
// 32 callers so batches fill. Each reports latency percentiles and CPU
// per decision beside throughput (runTimed).
func BenchmarkAllowReplication(b *testing.B) {
	for _, mode := range []peer.Replication{peer.ReplicateSync, peer.ReplicateAsync, peer.ReplicateOff} {
		b.Run("replication="+mode.String(), func(b *testing.B) {
			nodes := hoBenchCluster(b, "rp", 3, peer.Config{
				Policies: map[string]peer.PolicyConfig{
					hoBenchPolicy: {Limit: 1e15, Window: time.Second, Resolution: 100 * time.Millisecond, Replication: mode},
				},
			})
			b.Cleanup(func() { hoBenchClose(nodes) })
			via := nodes[0]
			for _, path := range []struct {
				name        string
				local       bool
				parallelism int // × GOMAXPROCS callers
			}{
				{"local", true, 1},
				{"local/callers=64", true, max(1, 64/runtime.GOMAXPROCS(0))},
				{"forwarded", false, 16},
			} {
				b.Run("path="+path.name, func(b *testing.B) {
					keys := hoBenchKeys(b, via, 1e4, func(owner string) bool { return (owner == via.Name()) == path.local })
					// Settle: create every key before timing.
					for _, k := range keys[:1e4] {
						if _, err := via.Allow(context.Background(), peer.Request{Key: k}); err != nil {
							b.Fatal(err)
						}
					}
					runTimed(b, path.parallelism, func(ctx context.Context, i int) error {
						d, err := via.Allow(ctx, peer.Request{Key: keys[i&(len(keys)-1)]})
						if err == nil && !d.Allowed {
							err = fmt.Errorf("decision %+v: want admitted", d)
						}
						return err
					})
				})
			}
		})
	}
}

// hoBenchKeys returns a pool of 1<<14 keys (a power of two, indexed with a
// mask) cycling over distinct keys whose owner in via's ring passes keep.
func hoBenchKeys(b *testing.B, via *peer.Node, distinct int, keep func(owner string) bool) []peer.Key {
	b.Helper()
	uniq := make([]peer.Key, 0, distinct)
	for i := 0; len(uniq) < distinct; i++ {
		if i > 100*distinct {
			b.Fatalf("found only %d of %d keys with a wanted owner", len(uniq), distinct)
		}
		k := hoBenchKey(i)
		owner, err := via.Owner(k)
		if err != nil {
			b.Fatal(err)
		}
		if keep(owner) {
			uniq = append(uniq, k)
		}
	}
	pool := make([]peer.Key, 1<<14)
	for i := range pool {
		pool[i] = uniq[i%len(uniq)]
	}
	return pool
}
