package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/cmd/ringlimit/envoyrls"
	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/peer/console"
	"github.com/ringlimit/ringlimit/peer/prommetrics"
)

// runServe runs one node until ctx is cancelled (SIGTERM or SIGINT in
// main), then drains and returns nil.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseServeFlags(args, stderr)
	if err != nil {
		return err
	}
	level, err := parseLevel(f.logLevel)
	if err != nil {
		return usageError("serve: " + err.Error())
	}
	log, err := newLogger(stderr, f.logFormat, level, false)
	if err != nil {
		return usageError("serve: " + err.Error())
	}
	if f.name == "" {
		// Chosen here rather than by the node, so that serve's own lines
		// name it from the first (as the node's do).
		var b [4]byte
		_, _ = rand.Read(b[:])
		f.name = "node-" + hex.EncodeToString(b[:])
	}
	// nlog is for serve's own lines (the policy reloader, DNS join, HTTP,
	// shutdown); the node adds the attribute to its lines itself.
	nlog := log.With("node", f.name)

	cfg := f.peerConfig(log)
	// Envoy's RateLimitService is always served, on the gRPC port; without
	// "domains" in the policy file every domain is unknown, answered as its
	// unknown_domain says (by default an error, NotFound: envoyrls).
	envoy, _ := envoyrls.Compile(nil)
	var policyData []byte // the file's contents in force
	if f.policies != "" {
		var fileEnvoy *envoyrls.Table
		if policyData, err = readPolicyFile(f.policies); err == nil {
			cfg.Policies, fileEnvoy, err = parsePolicyFile(policyData)
			if err != nil {
				err = fmt.Errorf("policy file %s: %w", f.policies, err)
			}
		}
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		if fileEnvoy != nil {
			envoy = fileEnvoy
		}
	}
	envoySrv := new(*envoyrls.Server)
	cfg.RegisterServices = func(s grpc.ServiceRegistrar, n *peer.Node) {
		*envoySrv = envoyrls.New(n, envoy, nlog)
		// Envoy's negative hits are refunds: the same guard (set below,
		// before New calls this).
		(*envoySrv).GuardRefunds(cfg.AuthorizeRefund)
		(*envoySrv).Register(s)
	}
	if f.gossipKey != "" {
		if cfg.GossipKey, err = loadGossipKey(f.gossipKey); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
	}
	if f.tlsCert != "" || f.tlsKey != "" || f.tlsCA != "" {
		if f.tlsCert == "" || f.tlsKey == "" || f.tlsCA == "" {
			return usageError("serve: --tls-cert, --tls-key and --tls-ca go together (mutual TLS)")
		}
		if cfg.ServerTLS, cfg.ClientTLS, err = loadMutualTLS(f.tlsCert, f.tlsKey, f.tlsCA, f.tlsServerName); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
	}

	// The registry is this command's own: the node's metrics plus the Go
	// runtime and process collectors, nothing global.
	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("serve: metrics: %w", err)
		}
	}
	prom, err := prommetrics.NewWithOptions(reg, prommetrics.Options{HotKeyNames: f.hotKeyLabels})
	if err != nil {
		return fmt.Errorf("serve: metrics: %w", err)
	}
	// The console's traffic chart counts what the Prometheus metrics
	// count, through one Metrics.
	rec := console.NewRecorder(prom)
	cfg.Metrics = rec

	// One admin token guards Reset over HTTP and gRPC alike, and Refund
	// with the refund token (tokenguard.go says why). Without the token
	// gRPC Reset is still guarded, by a guard of no token: only a client
	// certificate the node verified passes it (issue 53 item 7), and the
	// HTTP API has no /v1/reset (reset stays nil: 404).
	var reset, refund *tokenGuard
	var admin, refundTok []byte
	if f.adminTokenFile != "" {
		if admin, err = loadAdminToken(f.adminTokenFile); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
	}
	grpcReset, err := newResetGuard(admin, nlog, reg)
	if err != nil {
		return fmt.Errorf("serve: metrics: %w", err)
	}
	grpcReset.peerNames = cfg.PeerCertNames
	cfg.AuthorizeReset = grpcReset.authorizeGRPC
	switch {
	case admin != nil:
		reset = grpcReset
	case cfg.ServerTLS != nil && len(cfg.PeerCertNames) > 0:
		nlog.Info("reset: only with a peer's client certificate (--tls-peer-name) the node verifies (no --admin-token-file): POST /v1/reset answers 404")
	case cfg.ServerTLS != nil:
		nlog.Info("reset: only with a client certificate the node verifies (no --admin-token-file): POST /v1/reset answers 404")
	default:
		nlog.Info("reset: off (no --admin-token-file): gRPC Reset is refused, POST /v1/reset answers 404")
	}
	if f.refundTokenFile != "" {
		if refundTok, err = loadToken("refund", f.refundTokenFile); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
	}
	if admin != nil || refundTok != nil {
		if refund, err = newRefundGuard(admin, refundTok, nlog, reg); err != nil {
			return fmt.Errorf("serve: metrics: %w", err)
		}
		refund.peerNames = cfg.PeerCertNames
		cfg.AuthorizeRefund = refund.authorizeGRPC
	}

	var httpLis net.Listener
	if f.httpAddr != "" {
		if httpLis, err = net.Listen("tcp", f.httpAddr); err != nil {
			return fmt.Errorf("serve: listen http: %w", err)
		}
		defer httpLis.Close()
		if f.httpTLS {
			// The decision API behind mutual TLS (issue 53 item 8): the
			// gRPC port's certificate and CA; any client certificate of
			// the CA, as the public gRPC API takes.
			httpTLS := cfg.ServerTLS.Clone()
			httpTLS.NextProtos = []string{"h2", "http/1.1"}
			httpLis = tls.NewListener(httpLis, httpTLS)
		}
	}
	var opsLis net.Listener
	if f.opsAddr != "" {
		if opsLis, err = net.Listen("tcp", f.opsAddr); err != nil {
			return fmt.Errorf("serve: listen ops: %w", err)
		}
		defer opsLis.Close()
	}

	startCtx, cancelStart := context.WithTimeout(ctx, f.joinTimeout)
	joins, _ := parseJoin(f.join) // checked in parseServeFlags
	if !hasDNS(joins) {
		cfg.Join = splitList(f.join)
	} else {
		_, port, _ := net.SplitHostPort(f.gossipAddr)
		addrs, err := resolveJoin(startCtx, net.DefaultResolver, joins, selfFunc(port))
		if err != nil {
			nlog.Warn("dns join: resolve", "err", err)
		}
		if len(addrs) == 0 {
			nlog.Info("dns join: no other member found: starting a new cluster")
		}
		cfg.Join = addrs
	}
	node, err := peer.New(startCtx, cfg)
	cancelStart()
	if err != nil {
		return fmt.Errorf("serve: start node: %w", err)
	}
	// Envoy requests for an unknown domain, counted by answer.
	if err := reg.Register(*envoySrv); err != nil {
		_ = node.Close(context.Background())
		return fmt.Errorf("serve: metrics: %w", err)
	}

	uiPeers, _ := parseUIPeers(f.uiPeers) // checked in parseServeFlags
	uiAddr := f.opsAddr
	if opsLis != nil {
		uiAddr = opsLis.Addr().String()
	} else if httpLis != nil {
		uiAddr = httpLis.Addr().String()
	}
	cons, err := newServeConsole(node, rec, admin, consolePeers(uiPeers, node, uiAddr), nlog)
	if err != nil {
		_ = node.Close(context.Background())
		return fmt.Errorf("serve: console: %w", err)
	}
	if err := reg.Register(newStatusCollector(node, cons)); err != nil {
		cons.Close()
		_ = node.Close(context.Background())
		return fmt.Errorf("serve: metrics: %w", err)
	}
	api := &httpAPI{node: node, pols: node, reg: reg, log: nlog, reset: reset, refundGuard: refund, console: cons}
	// Without --ops-addr everything is on --http-addr, as before it
	// existed; with it, --http-addr serves only the decision API.
	apiHandler := api.routes()
	if opsLis != nil {
		apiHandler = api.apiHandler()
	}
	// Both servers report to one channel: the first failure drains.
	httpErr := make(chan error, 2)
	httpAddr, opsAddr := "", ""
	var httpSrv, opsSrv *http.Server
	if httpLis != nil {
		httpAddr = httpLis.Addr().String()
		httpSrv = newHTTPServer(apiHandler, nlog)
		go func() { httpErr <- httpSrv.Serve(httpLis) }()
	}
	if opsLis != nil {
		opsAddr = opsLis.Addr().String()
		opsSrv = newHTTPServer(api.opsHandler(), nlog)
		go func() { httpErr <- opsSrv.Serve(opsLis) }()
	}
	log.Info("serving", "node", node.Name(), "http_addr", httpAddr, "http_tls", f.httpTLS, "ops_addr", opsAddr, "grpc_addr", node.RPCAddr(),
		"gossip_addr", node.GossipAddr(), "members", len(node.Members()), "policies", len(node.Policies()),
		"policy_version", node.PolicyVersion())

	stdinClosed := make(chan struct{})
	if f.exitOnStdinEOF {
		// This goroutine blocks on the process's stdin and cannot be
		// stopped; it only exists in the demo's child process, which exits
		// right after runServe returns.
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			close(stdinClosed)
		}()
	}

	// The DNS refresh goroutine is runServe's: stopped and waited for
	// before the node closes.
	refreshCtx, stopRefresh := context.WithCancel(ctx)
	refreshDone := make(chan struct{})
	if hasDNS(joins) && f.joinRefresh > 0 {
		_, port, _ := net.SplitHostPort(node.GossipAddr())
		self := selfFunc(port)
		go func() {
			defer close(refreshDone)
			t := time.NewTicker(f.joinRefresh)
			defer t.Stop()
			for {
				select {
				case <-refreshCtx.Done():
					return
				case <-t.C:
					refreshJoin(refreshCtx, net.DefaultResolver, node, joins, self, nlog)
				}
			}
		}()
	} else {
		close(refreshDone)
	}

	// The policy reload goroutine is runServe's too: stopped and waited
	// for with the DNS refresh.
	reloadDone := make(chan struct{})
	if f.policies != "" {
		r := &policyReloader{path: f.policies, node: node, envoy: *envoySrv, metrics: cfg.Metrics, log: nlog, data: policyData}
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		go func() {
			defer close(reloadDone)
			defer signal.Stop(hup)
			r.run(refreshCtx, hup, f.policiesPoll)
		}()
	} else {
		close(reloadDone)
	}

	// The collector's tuner is runServe's too (gctune.go), one per
	// process.
	var gcDone <-chan struct{}
	if gcTuning(f.gcHeadroomMiB, os.LookupEnv) {
		var started bool
		gcDone, started = startGCTuner(refreshCtx, func() (*gcTuner, func()) { return newGCTuner(f.gcHeadroomMiB << 20) })
		if !started {
			nlog.Info("garbage collector left alone: another serve in this process tunes it")
		}
	} else {
		done := make(chan struct{})
		close(done)
		gcDone = done
	}

	var runErr error
	select {
	case <-ctx.Done():
		nlog.Info("shutdown requested: draining")
	case <-stdinClosed:
		nlog.Info("stdin closed: draining")
	case err := <-httpErr:
		runErr = fmt.Errorf("serve: http: %w", err)
		nlog.Error("http server failed: draining", "err", err)
	}
	api.draining.Store(true)
	cons.Close()
	stopRefresh()
	<-refreshDone
	<-reloadDone
	<-gcDone

	// Shutdown must not inherit ctx: it is already cancelled by the signal.
	drainCtx, cancelDrain := context.WithTimeout(context.WithoutCancel(ctx), f.drainTimeout)
	defer cancelDrain()
	if err := node.Close(drainCtx); err != nil {
		// The process still exits 0: the node left, and the keys it could
		// not hand off behave as after a crash.
		nlog.Error("drain incomplete", "err", err)
	}
	for _, srv := range []*http.Server{httpSrv, opsSrv} {
		if srv == nil {
			continue
		}
		if err := srv.Shutdown(drainCtx); err != nil {
			nlog.Warn("http shutdown", "err", err)
			_ = srv.Close()
		}
	}
	nlog.Info("stopped")
	return runErr
}

// newHTTPServer is an HTTP server of h with serve's timeouts, logging its
// errors to log at Warn.
func newHTTPServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}
