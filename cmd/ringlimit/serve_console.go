package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/peer/console"
)

// parseUIPeers checks --ui-peers: comma-separated http(s) URLs of other
// members' consoles. Empty is fine (the peers are then guessed).
func parseUIPeers(list string) ([]string, error) {
	var out []string
	for _, s := range splitList(list) {
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("--ui-peers: %q is not a console URL such as http://10.0.0.2:9091/ui/", s)
		}
		if !strings.HasSuffix(u.Path, "/") {
			u.Path += "/"
		}
		out = append(out, u.String())
	}
	return out, nil
}

// consolePeers returns Config.Peers for serve's console: the --ui-peers
// URLs when given, else each ring member's gRPC host at this node's ops
// port (in a StatefulSet every pod listens on the same ports), asked
// from this node's overview each time.
func consolePeers(list []string, node *peer.Node, opsAddr string) func() []string {
	if len(list) > 0 {
		return func() []string { return list }
	}
	_, port, err := net.SplitHostPort(opsAddr)
	if err != nil {
		return nil
	}
	return func() []string {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		var out []string
		for _, m := range node.Overview(ctx).Members {
			host, _, err := net.SplitHostPort(m.RPCAddr)
			if m.Name == node.Name() || err != nil {
				continue
			}
			out = append(out, "http://"+net.JoinHostPort(host, port)+"/ui/")
		}
		return out
	}
}

// newServeConsole starts the console serve mounts at /ui/ beside the ops
// paths: actions only with the admin token (nil: none).
func newServeConsole(node *peer.Node, rec *console.Recorder, admin []byte, peers func() []string, log *slog.Logger) (*console.Console, error) {
	return console.New(node, console.Config{Recorder: rec, AdminToken: admin, Peers: peers, Logger: log})
}

// mountConsole serves c at /ui/ on mux (and /ui redirects there): its
// page and reads by GET, its one action (a reset, with the admin token)
// by POST.
func mountConsole(mux *http.ServeMux, c *console.Console) {
	mux.Handle("GET /ui/", c)
	mux.Handle("POST /ui/", c)
	mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
}
