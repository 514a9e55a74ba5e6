package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/peer/console"
)

// demoUI serves the console of each in-process demo node (demo --ui): the
// first node's at the address given, the others' on ephemeral loopback
// ports, each told of the others.
type demoUI struct {
	pause time.Duration
	recs  map[string]*console.Recorder
	lis   []net.Listener
	urls  []string
	cons  []*console.Console
	srvs  []*http.Server
	done  chan error
}

// newDemoUI binds a listener per node name, the first at addr.
func newDemoUI(addr string, names []string, pause time.Duration) (*demoUI, error) {
	u := &demoUI{pause: pause, recs: map[string]*console.Recorder{}, done: make(chan error, len(names))}
	for i, name := range names {
		a := "127.0.0.1:0"
		if i == 0 {
			a = addr
		}
		l, err := net.Listen("tcp", a)
		if err != nil {
			u.close()
			return nil, fmt.Errorf("--ui %s: %w", a, err)
		}
		u.lis = append(u.lis, l)
		u.urls = append(u.urls, "http://"+l.Addr().String()+"/ui/")
		u.recs[name] = console.NewRecorder(nil)
	}
	return u, nil
}

// configure gives a node its Recorder (startClusterWith's hook).
func (u *demoUI) configure(cfg *peer.Config) { cfg.Metrics = u.recs[cfg.Name] }

// serve starts a console per node, in the order of names.
func (u *demoUI) serve(nodes []*peer.Node) error {
	for i, n := range nodes {
		c, err := console.New(n, console.Config{Recorder: u.recs[n.Name()], Peers: func() []string { return u.urls }, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		u.cons = append(u.cons, c)
		mux := http.NewServeMux()
		mountConsole(mux, c)
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		u.srvs = append(u.srvs, srv)
		go func(l net.Listener) { u.done <- srv.Serve(l) }(u.lis[i])
	}
	return nil
}

// step waits the pause between two steps, so that a person watching the
// console sees each one land in the timeline.
func (u *demoUI) step(ctx context.Context) {
	if u == nil || u.pause <= 0 {
		return
	}
	t := time.NewTimer(u.pause)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// linger keeps the cluster and its consoles up after the walkthrough,
// with a little traffic for the charts (at most 20 checks a second, for at
// most an hour), until ctx ends (Ctrl-C).
func (u *demoUI) linger(ctx context.Context, nodes []*peer.Node, out func(string)) {
	out(fmt.Sprintf("\nthe console stays up at %s with light traffic: Ctrl-C to stop", u.urls[0]))
	ctx, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n := nodes[i%len(nodes)]
		key := peer.Key{Tenant: "acme", Subject: fmt.Sprintf("user-%d", i%13), Policy: "login"}
		if i%4 != 0 {
			key.Policy = "api"
		}
		actx, acancel := context.WithTimeout(ctx, time.Second)
		_, _ = n.Allow(actx, peer.Request{Key: key})
		acancel()
	}
}

// close stops the servers and the consoles.
func (u *demoUI) close() {
	if u == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, s := range u.srvs {
		_ = s.Shutdown(ctx)
	}
	for range u.srvs {
		// ErrServerClosed, or why a server stopped early: the
		// walkthrough's result stands either way.
		<-u.done
	}
	for _, l := range u.lis[len(u.srvs):] {
		_ = l.Close()
	}
	for _, c := range u.cons {
		c.Close()
	}
}
