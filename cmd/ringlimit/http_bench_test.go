package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/peer"
)

// httpBenchSlots is the request pool's size, a power of two (picked with a
// mask); 10 000 distinct keys repeat in it.
const httpBenchSlots = 1 << 14

// BenchmarkHTTPCheck measures POST /v1/check as serve answers it (the
// handler of routes()), over a loopback HTTP/1.1 connection with
// keep-alive to one node of a 3-node in-process cluster (sync
// replication), 10 000 keys. path=local: the receiving node holds every
// key; path=forwarded: another node does. callers=1 is one call at a time
// (ns/op its latency); callers=64 runs 64 callers through b.RunParallel
// and reports ops/s, p50-ns, p99-ns, cpu-ns/op and mallocs/op of the whole
// process (the HTTP client, the receiver and the holder).
func BenchmarkHTTPCheck(b *testing.B) {
	pols := map[string]peer.PolicyConfig{"bench": {Limit: 1 << 50, Window: time.Second, Resolution: 10 * time.Millisecond}}
	nodes := make([]*peer.Node, 0, 3)
	for i := range 3 {
		cfg := peer.Config{Name: fmt.Sprintf("bench-%d", i), Policies: pols, GossipProfile: peer.GossipFast, Logger: slog.New(slog.DiscardHandler)}
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
			_ = nd.Close(ctx)
		})
		nodes = append(nodes, nd)
	}
	waitSettledNodes(b, nodes)
	via := nodes[0]
	api := &httpAPI{node: via, pols: via, reg: prometheus.NewRegistry(), log: slog.New(slog.DiscardHandler)}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: api.routes(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	b.Cleanup(func() { _ = srv.Close() })
	tr := &http.Transport{MaxIdleConns: 128, MaxIdleConnsPerHost: 128}
	b.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	url := "http://" + lis.Addr().String() + "/v1/check"
	for _, path := range []string{"local", "forwarded"} {
		local := path == "local"
		var bodies [][]byte
		for i := 0; len(bodies) < 10000; i++ {
			k := peer.Key{Tenant: "bench", Subject: fmt.Sprintf("user-%08d", i), Policy: "bench"}
			owner, err := via.Owner(k)
			if err != nil {
				b.Fatal(err)
			}
			if (owner == via.Name()) == local {
				bodies = append(bodies, fmt.Appendf(nil, `{"tenant":%q,"subject":%q,"policy":%q}`, k.Tenant, k.Subject, k.Policy))
			}
		}
		pool := make([][]byte, httpBenchSlots)
		for i := range pool {
			pool[i] = bodies[i%len(bodies)]
		}
		call := func(ctx context.Context, i int) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(pool[i&(httpBenchSlots-1)]))
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				return err
			}
			if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"allowed":true`)) {
				return fmt.Errorf("answer %d %s: want 200, allowed", resp.StatusCode, body)
			}
			return nil
		}
		b.Run("path="+path+"/callers=1", func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			i := 0
			for b.Loop() {
				if err := call(ctx, i); err != nil {
					b.Fatal(err)
				}
				i++
			}
			httpReportOpsPerSec(b)
		})
		b.Run("path="+path+"/callers=64", func(b *testing.B) {
			httpRunTimed(b, max(1, 64/runtime.GOMAXPROCS(0)), call)
		})
	}
}

// waitSettledNodes waits until every node sees all of them and has
// settled, steadily for 40 ms.
func waitSettledNodes(b testing.TB, nodes []*peer.Node) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := peer.WaitSettled(ctx, nodes, 40*time.Millisecond); err != nil {
		b.Fatalf("cluster of %d: %v", len(nodes), err)
	}
}

func httpReportOpsPerSec(b *testing.B) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(b.N)/s, "ops/s")
	}
}

func httpProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// httpRunTimed is bench's runTimed (which this package cannot import):
// op from parallelism × GOMAXPROCS goroutines, with ops/s, p50-ns,
// p99-ns, cpu-ns/op (the process's CPU per call) and mallocs/op
// (allocations per call with two decimals).
func httpRunTimed(b *testing.B, parallelism int, op func(ctx context.Context, i int) error) {
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
	cpu0 := httpProcessCPU()
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
	b.ReportMetric(float64((httpProcessCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
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
	httpReportOpsPerSec(b)
}

// discardWriter is a ResponseWriter that keeps the status and discards
// the body, its header map reused from call to call.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(status int)      { w.status = status }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }

// BenchmarkHTTPCheckHandler calls the /v1/check handler directly, without
// a connection, on a single node that holds every key (replication off:
// no backup): what serve's handler costs beyond net/http and the
// network, with the local decision. The request and the response writer
// are reused (only the body is reset), so allocs/op are the handler's
// and the decision's.
func BenchmarkHTTPCheckHandler(b *testing.B) {
	pols := map[string]peer.PolicyConfig{"bench": {Limit: 1 << 50, Window: time.Second, Resolution: 10 * time.Millisecond, Replication: peer.ReplicateOff}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	nd, err := peer.New(ctx, peer.Config{Name: "bench-0", Policies: pols, GossipProfile: peer.GossipFast, Logger: slog.New(slog.DiscardHandler)})
	cancel()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = nd.Close(ctx)
	})
	waitSettledNodes(b, []*peer.Node{nd})
	api := &httpAPI{node: nd, pols: nd, reg: prometheus.NewRegistry(), log: slog.New(slog.DiscardHandler)}
	h := api.routes()
	pool := make([][]byte, httpBenchSlots)
	for i := range pool {
		pool[i] = fmt.Appendf(nil, `{"tenant":"bench","subject":"user-%08d","policy":"bench"}`, i%10000)
	}
	b.Run("mode=seq", func(b *testing.B) {
		b.ReportAllocs()
		w := &discardWriter{h: http.Header{}}
		rd := bytes.NewReader(nil)
		body := io.NopCloser(rd)
		req, err := http.NewRequest(http.MethodPost, "/v1/check", nil)
		if err != nil {
			b.Fatal(err)
		}
		i := 0
		for b.Loop() {
			rd.Reset(pool[i&(httpBenchSlots-1)])
			req.Body = body
			clear(w.h)
			h.ServeHTTP(w, req)
			if w.status != http.StatusOK {
				b.Fatalf("status %d", w.status)
			}
			i++
		}
	})
	b.Run("mode=parallel", func(b *testing.B) {
		b.ReportAllocs()
		var next atomic.Int64
		var failed atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			w := &discardWriter{h: http.Header{}}
			rd := bytes.NewReader(nil)
			body := io.NopCloser(rd)
			req, err := http.NewRequest(http.MethodPost, "/v1/check", nil)
			if err != nil {
				failed.Store(-1)
				return
			}
			i := int(next.Add(1)) * 7919
			for pb.Next() {
				rd.Reset(pool[i&(httpBenchSlots-1)])
				req.Body = body
				clear(w.h)
				h.ServeHTTP(w, req)
				if w.status != http.StatusOK {
					failed.Store(int64(w.status))
					return
				}
				i++
			}
		})
		if s := failed.Load(); s != 0 {
			b.Fatalf("status %d", s)
		}
	})
}
