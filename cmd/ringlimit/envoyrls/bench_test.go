package envoyrls_test

// Benchmarks of Envoy's RLS path against an in-process cluster. They live
// beside the package, not in bench/: nothing outside cmd/ringlimit
// imports it (the core packages never see Envoy's protos).

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/cmd/ringlimit/envoyrls"
	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/shard"
)

// benchKeySlots is the request pool's size, a power of two (picked with a
// mask); 10 000 distinct keys repeat in it.
const benchKeySlots = 1 << 14

// rlsSink keeps the last answer alive.
var rlsSink atomic.Pointer[rlsv3.RateLimitResponse]

// BenchmarkShouldRateLimit measures ShouldRateLimit as Envoy's ratelimit
// filter calls it: Envoy's generated client over a loopback gRPC
// connection to one node of a 3-node in-process cluster (sync
// replication), one descriptor {remote_address: <client>} per request
// (descriptors=1), or that and {client: <client>} (descriptors=2: two
// leaves, the same subject, one atomic two-policy decision), 10 000
// clients. path=local: the receiving
// node holds every key; path=forwarded: another node does. callers=1 is
// one call at a time (ns/op its latency); callers=64 runs 64 callers
// through b.RunParallel and reports ops/s, p50-ns, p99-ns, cpu-ns/op and
// mallocs/op of the whole process (client, receiver and holder).
func BenchmarkShouldRateLimit(b *testing.B) {
	lim := &envoyrls.Limit{Requests: 1 << 31, Window: time.Second}
	tab, err := envoyrls.Compile([]envoyrls.Domain{{Name: "edge", Descriptors: []envoyrls.Descriptor{
		{Key: "remote_address", Limit: lim},
		{Key: "client", Limit: lim},
	}}})
	if err != nil {
		b.Fatal(err)
	}
	nodes := startCluster(b, 3, tab.Policies(), func(s grpc.ServiceRegistrar, n *peer.Node) {
		envoyrls.New(n, tab, nil).Register(s)
	})
	via := nodes[0]
	conn, err := grpc.NewClient(via.RPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	cl := rlsv3.NewRateLimitServiceClient(conn)
	policy := envoyrls.PolicyName("edge", [][2]string{{"remote_address", ""}})
	for _, ndesc := range []int{1, 2} {
		for _, path := range []string{"local", "forwarded"} {
			local := path == "local"
			var reqs []*rlsv3.RateLimitRequest
			for i := 0; len(reqs) < 10000; i++ {
				client := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
				owner, err := via.Owner(peer.Key{Tenant: shard.KeyPart("edge"), Subject: shard.KeyPart(client), Policy: policy})
				if err != nil {
					b.Fatal(err)
				}
				if (owner == via.Name()) != local {
					continue
				}
				ds := []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: client}}}}
				if ndesc == 2 {
					// The same entry values, so the same subject: decided
					// with the first in one atomic two-policy call.
					ds = append(ds, &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "client", Value: client}}})
				}
				reqs = append(reqs, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ds})
			}
			pool := make([]*rlsv3.RateLimitRequest, benchKeySlots)
			for i := range pool {
				pool[i] = reqs[i%len(reqs)]
			}
			call := func(ctx context.Context, i int) error {
				r, err := cl.ShouldRateLimit(ctx, pool[i&(benchKeySlots-1)])
				if err != nil {
					return err
				}
				if r.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(r.GetStatuses()) != ndesc {
					return fmt.Errorf("answer %v: want OK with %d statuses", r, ndesc)
				}
				rlsSink.Store(r)
				return nil
			}
			name := fmt.Sprintf("descriptors=%d/path=%s", ndesc, path)
			b.Run(name+"/callers=1", func(b *testing.B) {
				b.ReportAllocs()
				ctx := context.Background()
				i := 0
				for b.Loop() {
					if err := call(ctx, i); err != nil {
						b.Fatal(err)
					}
					i++
				}
				reportOpsPerSec(b)
			})
			b.Run(name+"/callers=64", func(b *testing.B) {
				runTimed(b, max(1, 64/runtime.GOMAXPROCS(0)), call)
			})
		}
	}
}

// fixedLimiter admits everything with a fixed decision, allocating
// nothing: what ShouldRateLimit itself costs, without a node.
type fixedLimiter struct{ limits []peer.PolicyDecision }

func (f fixedLimiter) Allow(_ context.Context, req peer.Request) (peer.Decision, error) {
	d := peer.Decision{Allowed: true, Limit: 1 << 31, Remaining: 1<<31 - 1, ResetAfter: time.Second, Reason: peer.ReasonAdmitted}
	if n := len(req.Policies); n > 0 {
		d.Limits = f.limits[:n]
	}
	return d, nil
}

func (f fixedLimiter) Peek(ctx context.Context, req peer.Request) (peer.Decision, error) {
	return f.Allow(ctx, req)
}

func (f fixedLimiter) Refund(ctx context.Context, req peer.Request) (peer.Decision, error) {
	return f.Allow(ctx, req)
}

// BenchmarkShouldRateLimitHandler calls Server.ShouldRateLimit directly,
// with no gRPC: limiter=fixed is the handler alone (a Limiter that
// answers at once and allocates nothing), limiter=node adds the local
// decision of a single node (which holds every key, replication off: no
// backup). descriptors as in BenchmarkShouldRateLimit; headers=on adds
// the RateLimit header fields (Domain.ResponseHeaders). mode=parallel
// calls from b.RunParallel.
func BenchmarkShouldRateLimitHandler(b *testing.B) {
	lim := &envoyrls.Limit{Requests: 1 << 31, Window: time.Second}
	compile := func(headers bool) *envoyrls.Table {
		tab, err := envoyrls.Compile([]envoyrls.Domain{{Name: "edge", ResponseHeaders: headers, Descriptors: []envoyrls.Descriptor{
			{Key: "remote_address", Limit: lim}, {Key: "client", Limit: lim},
		}}})
		if err != nil {
			b.Fatal(err)
		}
		return tab
	}
	plain, withHeaders := compile(false), compile(true)
	pols := plain.Policies()
	for name, pc := range pols {
		pc.Replication = peer.ReplicateOff
		pols[name] = pc
	}
	nd := startCluster(b, 1, pols, nil)[0]
	pool := make([]*rlsv3.RateLimitRequest, benchKeySlots)
	for _, ndesc := range []int{1, 2} {
		for i := range pool {
			client := fmt.Sprintf("10.%d.%d.%d", i%10000>>16&255, i%10000>>8&255, i%10000&255)
			ds := []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: client}}}}
			if ndesc == 2 {
				ds = append(ds, &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "client", Value: client}}})
			}
			pool[i] = &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: ds}
		}
		fixed := fixedLimiter{limits: []peer.PolicyDecision{
			{Policy: envoyrls.PolicyName("edge", [][2]string{{"remote_address", ""}}), Allowed: true, Limit: 1 << 31, Remaining: 1<<31 - 1, ResetAfter: time.Second},
			{Policy: envoyrls.PolicyName("edge", [][2]string{{"client", ""}}), Allowed: true, Limit: 1 << 31, Remaining: 1<<31 - 1, ResetAfter: time.Second},
		}}
		for _, tc := range []struct {
			name string
			l    envoyrls.Limiter
			tab  *envoyrls.Table
		}{
			{"limiter=fixed", fixed, plain},
			{"limiter=fixed/headers=on", fixed, withHeaders},
			{"limiter=node", nd, plain},
		} {
			s := envoyrls.New(tc.l, tc.tab, nil)
			name := fmt.Sprintf("%s/descriptors=%d", tc.name, ndesc)
			b.Run(name+"/mode=seq", func(b *testing.B) {
				b.ReportAllocs()
				ctx := context.Background()
				i := 0
				var r *rlsv3.RateLimitResponse
				for b.Loop() {
					var err error
					r, err = s.ShouldRateLimit(ctx, pool[i&(benchKeySlots-1)])
					if err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
						b.Fatalf("ShouldRateLimit = %v, %v", r, err)
					}
					i++
				}
				rlsSink.Store(r)
			})
			b.Run(name+"/mode=parallel", func(b *testing.B) {
				b.ReportAllocs()
				var next atomic.Int64
				var failed atomic.Pointer[error]
				b.RunParallel(func(pb *testing.PB) {
					ctx := context.Background()
					i := int(next.Add(1)) * 7919
					for pb.Next() {
						r, err := s.ShouldRateLimit(ctx, pool[i&(benchKeySlots-1)])
						if err == nil && r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
							err = fmt.Errorf("answer %v", r)
						}
						if err != nil {
							e := err
							failed.CompareAndSwap(nil, &e)
							return
						}
						i++
					}
				})
				if err := failed.Load(); err != nil {
					b.Fatal(*err)
				}
			})
		}
	}
}

// startCluster starts n nodes on 127.0.0.1 with ephemeral ports and the
// given policies, each registering register's services, joined through
// the first; it waits until every node sees n members and has settled
// (each partition at its target with its backup in place), and closes
// them when b ends.
func startCluster(b *testing.B, n int, pols map[string]peer.PolicyConfig, register func(grpc.ServiceRegistrar, *peer.Node)) []*peer.Node {
	b.Helper()
	nodes := make([]*peer.Node, 0, n)
	for i := range n {
		cfg := peer.Config{Name: fmt.Sprintf("bench-%d", i), Policies: pols, GossipProfile: peer.GossipFast, RegisterServices: register, Logger: slog.New(slog.DiscardHandler)}
		if i > 0 {
			cfg.Join = []string{nodes[0].GossipAddr()}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		nd, err := peer.New(ctx, cfg)
		cancel()
		if err != nil {
			b.Fatalf("start node %d: %v", i, err)
		}
		b.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := nd.Close(ctx); err != nil {
				b.Errorf("close %s: %v", nd.Name(), err)
			}
		})
		nodes = append(nodes, nd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := peer.WaitSettled(ctx, nodes, 40*time.Millisecond); err != nil {
		b.Fatalf("cluster of %d: %v", n, err)
	}
	return nodes
}

func reportOpsPerSec(b *testing.B) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(b.N)/s, "ops/s")
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runTimed runs op from parallelism × GOMAXPROCS goroutines (bench's
// runTimed, which this package cannot import): ops/s, p50-ns, p99-ns,
// cpu-ns/op (the process's CPU per call) and mallocs/op (allocations per
// call with two decimals).
func runTimed(b *testing.B, parallelism int, op func(ctx context.Context, i int) error) {
	b.ReportAllocs()
	b.SetParallelism(parallelism)
	lat := make([][]time.Duration, parallelism*runtime.GOMAXPROCS(0))
	for i := range lat {
		lat[i] = make([]time.Duration, 0, b.N)
	}
	var next atomic.Int64
	var failed atomic.Pointer[error]
	b.ResetTimer()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	mallocs0 := ms.Mallocs
	cpu0 := processCPU()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		id := int(next.Add(1) - 1)
		var rec []time.Duration
		if id < len(lat) {
			rec = lat[id]
		}
		i := id * 7919
		for pb.Next() {
			start := time.Now()
			err := op(ctx, i)
			rec = append(rec, time.Since(start))
			if err != nil {
				e := err
				failed.CompareAndSwap(nil, &e)
				return
			}
			i++
		}
		if id < len(lat) {
			lat[id] = rec
		}
	})
	b.StopTimer()
	b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.Mallocs-mallocs0)/float64(b.N), "mallocs/op")
	if err := failed.Load(); err != nil {
		b.Fatalf("%v", *err)
	}
	var all []time.Duration
	for _, r := range lat {
		all = append(all, r...)
	}
	if len(all) == 0 {
		return
	}
	slices.Sort(all)
	pct := func(p float64) float64 { return float64(all[min(len(all)-1, int(p*float64(len(all))))].Nanoseconds()) }
	b.ReportMetric(pct(0.50), "p50-ns")
	b.ReportMetric(pct(0.99), "p99-ns")
	reportOpsPerSec(b)
}
