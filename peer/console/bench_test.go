package console_test

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
	"github.com/ringlimit/ringlimit/peer/console"
)

// BenchmarkNodeJSON is one api/node answer of a node with a full traffic
// history: the work a page's refresh asks of each member.
func BenchmarkNodeJSON(b *testing.B) {
	rec := console.NewRecorder(nil)
	t := &testing.T{}
	n := startNode(t, rec)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = n.Close(ctx)
	}()
	c, err := console.New(n, console.Config{Recorder: rec})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	now := time.Now()
	for i := range 900 {
		for _, p := range []string{"api", "login", "search"} {
			rec.Decision(p, peer.ReasonAdmitted, peer.PathLocal)
			rec.Decision(p, peer.ReasonOverLimit, peer.PathLocal)
		}
		rec.Tick(now.Add(time.Duration(i-900) * time.Second))
	}
	for _, full := range []string{"", "?full=1"} {
		b.Run("full="+map[string]string{"": "0", "?full=1": "1"}[full], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				c.ServeHTTP(w, httptest.NewRequest("GET", "/ui/api/node"+full, nil))
				if w.Code != 200 {
					b.Fatal(w.Code)
				}
				b.SetBytes(int64(w.Body.Len()))
			}
		})
	}
}

// BenchmarkClusterRefresh is one page refresh (api/cluster, uncached)
// against three nodes in this process, each console on a loopback HTTP
// server: the asked node's own answer and its two peers'. cpu-ms/op is
// the CPU the whole process spent per refresh (getrusage), so a page
// refreshing once a second costs the cluster cpu-ms/op milliseconds of
// CPU a second in all.
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
	for _, n := range nodes {
		c, err := console.New(n, console.Config{Recorder: console.NewRecorder(nil), ClusterCache: -1, Peers: func() []string { return urls }})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		srv := httptest.NewServer(c)
		defer srv.Close()
		urls = append(urls, srv.URL+"/ui/")
	}
	for deadline := time.Now().Add(20 * time.Second); len(nodes[2].Members()) != 3 || len(nodes[0].Members()) != 3; {
		if time.Now().After(deadline) {
			b.Fatal("the three nodes did not see each other within 20 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	client := &http.Client{}
	var ru0, ru1 syscall.Rusage
	b.ReportAllocs()
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	for b.Loop() {
		resp, err := client.Get(urls[0] + "api/cluster")
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		b.SetBytes(n)
	}
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := time.Duration(syscall.TimevalToNsec(ru1.Utime) - syscall.TimevalToNsec(ru0.Utime) + syscall.TimevalToNsec(ru1.Stime) - syscall.TimevalToNsec(ru0.Stime))
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
}
