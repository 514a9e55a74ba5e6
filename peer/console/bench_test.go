package console

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer"
)

// BenchmarkClusterRefresh measures what a page costs three nodes in this
// process, each console on a loopback HTTP server. Each op is one
// second's work: every console samples its node (what runs with no page
// open), then, with refresh=1, the page asks the first node for
// api/cluster (uncached), which answers with its own view and asks its
// two peers for theirs. cpu-ms/op is the CPU the whole process spent per
// op (getrusage): the difference between the two is what one page
// refreshing once a second costs the three nodes together, in ms of CPU
// per second.
func BenchmarkClusterRefresh(b *testing.B) {
	var nodes []*peer.Node
	for i, name := range []string{"r1", "r2", "r3"} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cfg := peer.Config{Logger: slog.New(slog.DiscardHandler), Name: name, GossipAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0",
			GossipProfile: peer.GossipFast, Policies: map[string]peer.PolicyConfig{"api": {Limit: 10, Window: time.Minute}}}
		if i > 0 {
			cfg.Join = []string{nodes[0].GossipAddr()}
		}
		n, err := peer.New(ctx, cfg)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = n.Close(ctx)
		}()
		nodes = append(nodes, n)
	}
	var urls []string
	var cons []*Console
	for _, n := range nodes {
		// Sampled by the benchmark only: Interval outlasts it.
		c, err := New(n, Config{Recorder: NewRecorder(nil), ClusterCache: -1, Interval: time.Hour, Peers: func() []string { return urls }})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		srv := httptest.NewServer(c)
		defer srv.Close()
		urls = append(urls, srv.URL+"/ui/")
		cons = append(cons, c)
	}
	// Waits on the cluster's own condition (WaitSettled), with a deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	err := peer.WaitSettled(ctx, nodes, 0)
	cancel()
	if err != nil || len(nodes[2].Members()) != 3 || len(nodes[0].Members()) != 3 {
		b.Fatalf("the three nodes did not settle within 20 s: %v", err)
	}
	client := &http.Client{}
	for _, refresh := range []bool{false, true} {
		name := "refresh=0"
		if refresh {
			name = "refresh=1"
		}
		b.Run(name, func(b *testing.B) {
			var ru0, ru1 syscall.Rusage
			b.ReportAllocs()
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
			for b.Loop() {
				now := time.Now()
				for _, c := range cons {
					c.sample(now)
				}
				if !refresh {
					continue
				}
				resp, err := client.Get(urls[0] + "api/cluster")
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				b.SetBytes(n)
			}
			_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
			cpu := syscall.TimevalToNsec(ru1.Utime) - syscall.TimevalToNsec(ru0.Utime) + syscall.TimevalToNsec(ru1.Stime) - syscall.TimevalToNsec(ru0.Stime)
			b.ReportMetric(float64(cpu)/1e6/float64(b.N), "cpu-ms/op")
		})
	}
}
