package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/ringlimit/ringlimit/peer"
)

// Sinks keep the compiler from discarding decisions. Prefixed with peer so
// they cannot clash with other benchmark files of this package.
var (
	peerDecisionSink atomic.Pointer[peer.Decision]
	peerAllowedSink  atomic.Int64
)

// peerKeySlots is the size of the key pool, a power of two so the loops pick
// a key with a mask. A pool of fewer distinct keys repeats them cyclically.
const peerKeySlots = 1 << 14

// peerPolicy admits everything: the benchmarks measure the path, not
// refusals. The 10 ms resolution bounds each key's log to 100 runs per
// 1 s window however fast the loop runs.
const peerPolicy = "bench"

var peerKeyCounts = []struct {
	name     string
	distinct int
}{
	{"1", 1},
	{"1e4", 10000},
}

// startPeerCluster starts n nodes on 127.0.0.1 with ephemeral ports, joined
// through the first, waits until each sees n members and every partition
// has moved to its target with its backup copy in place (the steady
// state), and
// closes them when b ends.
func startPeerCluster(b testing.TB, n int, batching bool) []*peer.Node {
	b.Helper()
	return startPeerClusterWith(b, n, func(cfg *peer.Config) { cfg.DisableBatching = !batching })
}

// startPeerClusterWith is startPeerCluster with edit applied to each node's
// Config before it starts.
func startPeerClusterWith(b testing.TB, n int, edit func(*peer.Config)) []*peer.Node {
	b.Helper()
	const grace = 20 * time.Millisecond
	nodes := make([]*peer.Node, 0, n)
	for i := range n {
		cfg := peer.Config{
			Name: fmt.Sprintf("bench-%d", i),
			Policies: map[string]peer.PolicyConfig{
				peerPolicy: {Limit: 1 << 50, Window: time.Second, Resolution: 10 * time.Millisecond},
			},
			GossipProfile: peer.GossipFast,
		}
		edit(&cfg)
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
	if err := peer.WaitSettled(ctx, nodes, 2*grace); err != nil {
		b.Fatalf("cluster of %d did not converge: %v", n, err)
	}
	return nodes
}

// peerKeys returns a pool of peerKeySlots keys holding distinct different
// keys, each accepted by keep (given the key's owner in via's ring).
func peerKeys(b *testing.B, via *peer.Node, distinct int, keep func(owner string) bool) []peer.Key {
	b.Helper()
	uniq := make([]peer.Key, 0, distinct)
	for i := 0; len(uniq) < distinct; i++ {
		if i > 100*distinct+1000 {
			b.Fatalf("found only %d of %d keys with a wanted owner", len(uniq), distinct)
		}
		k := peer.Key{Tenant: "bench", Subject: fmt.Sprintf("user-%08d", i), Policy: peerPolicy}
		owner, err := via.Owner(k)
		if err != nil {
			b.Fatal(err)
		}
		if keep(owner) {
			uniq = append(uniq, k)
		}
	}
	pool := make([]peer.Key, peerKeySlots)
	for i := range pool {
		pool[i] = uniq[i%len(uniq)]
	}
	return pool
}

func reportOpsPerSec(b *testing.B) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(b.N)/s, "ops/s")
	}
}

// BenchmarkNodeAllowLocal measures Node.Allow on a single node, which owns
// every key: validation, the lock-free ring lookup and the shard decision.
func BenchmarkNodeAllowLocal(b *testing.B) {
	nd := startPeerCluster(b, 1, true)[0]
	for _, kc := range peerKeyCounts {
		keys := peerKeys(b, nd, kc.distinct, func(string) bool { return true })
		b.Run("keys="+kc.name+"/mode=seq", func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			var d peer.Decision
			var err error
			i := 0
			for b.Loop() {
				d, err = nd.Allow(ctx, peer.Request{Key: keys[i&(peerKeySlots-1)]})
				if err != nil || !d.Allowed {
					b.Fatalf("Allow = %+v, %v", d, err)
				}
				i++
			}
			peerDecisionSink.Store(&d)
			reportOpsPerSec(b)
		})
		b.Run("keys="+kc.name+"/mode=parallel", func(b *testing.B) {
			b.ReportAllocs()
			var next atomic.Int64
			var failed atomic.Pointer[error]
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				// Goroutines start at different places in the pool.
				i := int(next.Add(1)) * 7919
				var allowed int64
				for pb.Next() {
					d, err := nd.Allow(ctx, peer.Request{Key: keys[i&(peerKeySlots-1)]})
					if err != nil || !d.Allowed {
						// A fresh variable: taking err's address would
						// move every iteration's err to the heap.
						e := err
						if e == nil {
							e = errors.New("refused")
						}
						failed.CompareAndSwap(nil, &e)
						return
					}
					allowed++
					i++
				}
				peerAllowedSink.Add(allowed)
			})
			if err := failed.Load(); err != nil {
				b.Fatalf("Allow: %v", *err)
			}
			reportOpsPerSec(b)
		})
	}
}

// BenchmarkNodeAllowForwarded measures Node.Allow for keys owned by another
// node of a 3-node loopback cluster: each call crosses gRPC. With batching
// on, concurrent forwards to one owner share an RPC; SetParallelism(16)
// supplies the concurrency a server would have. It reports latency
// percentiles (p50-ns, p99-ns) and throughput (ops/s).
func BenchmarkNodeAllowForwarded(b *testing.B) {
	for _, batching := range []bool{true, false} {
		name := "batching=on"
		if !batching {
			name = "batching=off"
		}
		b.Run(name, func(b *testing.B) {
			msgs := &msgCounter{}
			nodes := startPeerClusterWith(b, 3, func(cfg *peer.Config) {
				cfg.DisableBatching = !batching
				cfg.DisableFramedPipes = os.Getenv("RINGLIMIT_BENCH_GRPC_PIPES") != ""
				cfg.Metrics = msgs
			})
			via := nodes[0]
			for _, kc := range peerKeyCounts {
				keys := peerKeys(b, via, kc.distinct, func(owner string) bool { return owner != via.Name() })
				b.Run("keys="+kc.name, func(b *testing.B) {
					benchForwarded(b, via, keys, 16, msgs)
				})
				// 64 callers in all, the issue 9 load.
				b.Run("keys="+kc.name+"/callers=64", func(b *testing.B) {
					benchForwarded(b, via, keys, max(1, 64/runtime.GOMAXPROCS(0)), msgs)
				})
			}
		})
	}
}

// benchForwarded runs Allow from parallelism × GOMAXPROCS goroutines on
// keys another node holds, with runTimed's figures and the messages
// between nodes: fwd-items/msg (requests per forwarded batch) and
// msgs/op (forwarded batches and replication messages, each answered by
// one message, per decision).
func benchForwarded(b *testing.B, via *peer.Node, keys []peer.Key, parallelism int, msgs *msgCounter) {
	batches, items, repl := msgs.batches.Load(), msgs.items.Load(), msgs.repl.Load()
	runTimed(b, parallelism, func(ctx context.Context, i int) error {
		d, err := via.Allow(ctx, peer.Request{Key: keys[i&(peerKeySlots-1)]})
		if err == nil && (!d.Allowed || d.Owner == via.Name()) {
			err = fmt.Errorf("decision %+v: want admitted by another node", d)
		}
		return err
	})
	batches, items, repl = msgs.batches.Load()-batches, msgs.items.Load()-items, msgs.repl.Load()-repl
	if batches > 0 {
		b.ReportMetric(float64(items)/float64(batches), "fwd-items/msg")
	}
	b.ReportMetric(float64(batches+repl)/float64(b.N), "msgs/op")
}

// msgCounter is a peer.Metrics that counts the messages nodes send each
// other: forwarded batches (Batch) with their requests, and replication
// messages (Forward with a replicate outcome). Everything else is ignored.
type msgCounter struct {
	batches, items, repl atomic.Int64
}

func (m *msgCounter) Batch(_ string, size int) {
	m.batches.Add(1)
	m.items.Add(int64(size))
}

func (m *msgCounter) Forward(_ string, outcome string, _ time.Duration) {
	if strings.HasPrefix(outcome, "replicate_") {
		m.repl.Add(1)
	}
}

func (*msgCounter) Decision(string, peer.Reason, peer.Path) {}
func (*msgCounter) Ring(uint64, int)                        {}
func (*msgCounter) Keys(int, int64)                         {}
func (*msgCounter) Evicted(int)                             {}
func (*msgCounter) Handoff(string, string, int)             {}
func (*msgCounter) Backup(string, string, int)              {}
func (*msgCounter) HotKeys([]peer.HotKey)                   {}
func (*msgCounter) PeerRPCOpen(bool)                        {}
func (*msgCounter) Ready(bool, string)                      {}
func (*msgCounter) PolicyTable(uint64, bool)                {}

// BenchmarkGRPCStreamRoundTrip is BenchmarkLoopbackRoundTrip through a
// gRPC bidirectional stream (grpc-go's own test service, a 512-byte
// payload each way), as the peers' streams use it: what gRPC's framing,
// flow control and goroutine hand-offs add to each message and answer.
func BenchmarkGRPCStreamRoundTrip(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(srv, echoService{})
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	defer func() {
		srv.Stop()
		<-served
	}()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := testgrpc.NewTestServiceClient(conn).FullDuplexCall(ctx)
	if err != nil {
		b.Fatal(err)
	}
	req := &testgrpc.StreamingOutputCallRequest{Payload: &testgrpc.Payload{Body: make([]byte, 512)}}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	for b.Loop() {
		if err := st.Send(req); err != nil {
			b.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	b.StopTimer()
	_ = st.CloseSend()
}

// echoService answers each FullDuplexCall message with its payload.
type echoService struct {
	testgrpc.UnimplementedTestServiceServer
}

func (echoService) FullDuplexCall(st testgrpc.TestService_FullDuplexCallServer) error {
	for {
		req, err := st.Recv()
		if err != nil {
			return nil
		}
		if err := st.Send(&testgrpc.StreamingOutputCallResponse{Payload: req.GetPayload()}); err != nil {
			return err
		}
	}
}

// BenchmarkLoopbackRoundTrip is the floor under every message between
// nodes on this machine: one 512-byte message and its answer over a
// loopback TCP connection, with no framing, codec or batching, one round
// trip at a time. cpu-ns/op is the process's CPU per round trip (both
// ends, the kernel's share included).
func BenchmarkLoopbackRoundTrip(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 512)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 512)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	for b.Loop() {
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	b.StopTimer()
	c.Close()
	<-done
}

// BenchmarkHandoffFloor is the floor under what a forwarded decision does
// on the sender besides its messages, at issue 9's 64 callers: the caller
// queues its request for a loop goroutine and parks until its answer
// comes; one goroutine takes what has queued, in batches, and wakes each
// caller with its answer, as a pipe's receiver does. No network, codec or
// decision: cpu-ns/op is the process's CPU per handed-off request.
func BenchmarkHandoffFloor(b *testing.B) {
	type req struct{ done chan int }
	queue := make(chan *req, 1024)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		batch := make([]*req, 0, 256)
		for {
			select {
			case r := <-queue:
				batch = append(batch[:0], r)
			case <-quit:
				return
			}
		drain:
			for len(batch) < cap(batch) {
				select {
				case r := <-queue:
					batch = append(batch, r)
				default:
					break drain
				}
			}
			for i, r := range batch {
				r.done <- i
			}
		}
	})
	pool := sync.Pool{New: func() any { return &req{done: make(chan int, 1)} }}
	runTimed(b, max(1, 64/runtime.GOMAXPROCS(0)), func(context.Context, int) error {
		r := pool.Get().(*req)
		queue <- r
		<-r.done
		pool.Put(r)
		return nil
	})
	close(quit)
	wg.Wait()
}

// runTimed runs op from parallelism × GOMAXPROCS goroutines, each with
// its own i (starting at a different place), and stops at op's first
// error. Besides ops/s it reports each call's latency (p50-ns, p99-ns)
// and cpu-ns/op, the whole process's CPU time (callers, sender and owner
// nodes) per call.
func runTimed(b *testing.B, parallelism int, op func(ctx context.Context, i int) error) {
	b.ReportAllocs()
	b.SetParallelism(parallelism)
	// One latency slice per RunParallel goroutine, allocated before the
	// timer starts; each can hold b.N samples, so no append reallocates
	// inside the measured loop however the iterations are spread.
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
		} // else: more goroutines than RunParallel documents; drop samples.
		i := id * 7919
		for pb.Next() {
			start := time.Now()
			err := op(ctx, i)
			rec = append(rec, time.Since(start))
			if err != nil {
				e := err // not &err: see BenchmarkNodeAllowLocal
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
	// allocs/op with two decimals: the built-in figure is rounded down to
	// an integer, too coarse for an amortised cost near 1.
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

// floorSink keeps the floor benchmarks' results alive.
var floorSink atomic.Int64

// BenchmarkLocalFloor is the floor under the local decision path on this
// machine: the steps every decision takes at least once, each alone, with
// nothing else in the loop. A decision reads the clock (wall and
// monotonic: the admission's time and the lease check), hashes the key's
// placement, looks the key up in a map under a lock, and then decides.
func BenchmarkLocalFloor(b *testing.B) {
	b.Run("step=clock", func(b *testing.B) {
		b.ReportAllocs()
		var s int64
		for b.Loop() {
			s += time.Now().UnixNano()
		}
		floorSink.Add(s)
	})
	b.Run("step=monotonic-clock", func(b *testing.B) {
		b.ReportAllocs()
		t0 := time.Now()
		var s int64
		for b.Loop() {
			s += int64(time.Since(t0))
		}
		floorSink.Add(s)
	})
	key := []byte("\x05bench\x0duser-00000042\x03api")
	b.Run("step=hash", func(b *testing.B) {
		b.ReportAllocs()
		var s uint64
		for b.Loop() {
			s += xxhash.Sum64(key)
		}
		floorSink.Add(int64(s))
	})
	b.Run("step=map-lookup-locked", func(b *testing.B) {
		b.ReportAllocs()
		m := map[string]int64{string(key): 1}
		var mu sync.Mutex
		var s int64
		for b.Loop() {
			mu.Lock()
			s += m[string(key)]
			mu.Unlock()
		}
		floorSink.Add(s)
	})
}
