package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/cmd/ringlimit/envoyrls"
	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/shard"
)

const serveUsage = `Usage: ringlimit serve [flags]

Runs one ringlimit node until SIGTERM or SIGINT, then leaves the cluster
gracefully (hands its keys to their new owners) and exits 0.

Flags (each also read from RINGLIMIT_<FLAG>, e.g. RINGLIMIT_GOSSIP_ADDR):
  --name NAME           unique member name (default: "node-" + random hex)
  --gossip-addr H:P     memberlist gossip bind address (default 127.0.0.1:7946)
  --grpc-addr H:P       gRPC address: peer traffic, public RateLimiter API,
                        Envoy's RateLimitService (see "Envoy domains" below)
                        and grpc.health.v1 (default 127.0.0.1:8081)
  --http-addr H:P       HTTP API, health and metrics; "" disables it
                        (default 127.0.0.1:8080)
  --join A,B            gossip addresses of existing members (comma-separated);
                        empty starts a new cluster. Each may also be
                        dns+NAME:PORT (every A/AAAA record of NAME, e.g. a
                        Kubernetes headless Service) or dnssrv+NAME (SRV
                        records); names are resolved at start-up (this
                        node's own address left out; no other address
                        found and no plain one given: a new cluster) and
                        again every --join-refresh, joining new members
  --join-refresh D      how often dns+ and dnssrv+ names are re-resolved;
                        0 disables (default 30s)
  --policies PATH       policy table file, YAML or JSON (see below); reloaded
                        on SIGHUP and when its contents change
  --policies-poll D     how often the policy file is re-read for changes;
                        0 disables polling (SIGHUP still reloads)
                        (default 5s)
  --gossip-key PATH     gossip encryption key file: 16, 24 or 32 raw bytes, or
                        their base64
  --tls-cert PATH       PEM certificate for mutual TLS on gRPC (peers and the
  --tls-key PATH        public API); the three flags go together. Peers are
  --tls-ca PATH         dialed by address, so certificates need IP SANs unless
  --tls-server-name N   --tls-server-name names the SAN to verify instead
  --drain-timeout D     how long shutdown may take to hand off keys (default 10s)
  --join-timeout D      how long start-up keeps retrying the --join seeds
                        (default 30s)
  --peer-pipes M        how nodes carry forwards and replication to each
                        other: framed (default: a framed TCP connection to
                        the peer's gRPC port, a gRPC stream when the peer
                        takes none), grpc (gRPC streams, for proxies that
                        pass only HTTP/2) or unary (a gRPC call per batch)
  --gossip-profile P    gossip timings: lan (default; a killed member is
                        declared failed in ~6 s), fast (one data centre
                        with low latency, ~1.2 s) or wan (~45 s); every
                        member should use the same
  --ownership M         how partition holders change: gossip (default; by
                        rules over each node's gossip view) or log (by
                        commands in a replicated log, with liveness
                        leases); every member must use the same
  --log-format F        text or json (default text)
  --log-level L         debug, info, warn or error (default info)
  --admin-token-file P  file holding the bearer token that Reset requires:
                        POST /v1/reset (Authorization: Bearer <token>; without
                        this flag /v1/reset answers 404) and gRPC
                        RateLimiter.Reset (metadata authorization: Bearer
                        <token>, or a client certificate the node verified
                        under --tls-*; without this flag gRPC Reset is open
                        to whoever reaches the port). Refusals: 401 or
                        Unauthenticated, a Warn (at most one per 10 s per
                        transport) and ringlimit_reset_refused_total

  --gossip-advertise-addr H:P  gossip address peers should use (NAT,
                        0.0.0.0 binds); default: the bound address
  --grpc-advertise-addr H:P    gRPC address peers should dial; default: the
                        bound address

The gRPC listener serves peers and clients alike; the HTTP listener is always
plaintext: bind it to loopback or put it behind a proxy. Peers dial the
address the gRPC listener is bound to unless --grpc-advertise-addr names
another, so with a 0.0.0.0 bind set the advertise address.

HTTP endpoints (request bodies are strict JSON: exact field names, no
duplicates, no unknown fields; 400 names the problem, 413 over 64 KiB):
  POST /v1/check      {"tenant","subject","policy","hits"} ->
                      {"allowed","limit","remaining","retry_after_ms",
                       "reset_after_ms","reason","owner","decided_at_unix_ns"}
                      hits is 1 when absent. 200 admitted (also failed_open,
                      fallback, shadow), 429 over limit, 503 unavailable,
                      400 bad input; RateLimit-Policy, RateLimit and
                      Retry-After headers (a 503 carries Retry-After,
                      RateLimit-Policy, RateLimit-Reason: unavailable, and
                      the policy's limit and retry_after_ms in its body).
                      "policies": ["a","b"] instead of "policy" decides
                      several policies of one tenant and subject as one:
                      admitted only if every policy admits, and only then
                      recorded in all; the body adds "refused_by" and
                      "limits": [{"policy","limit","remaining",
                      "retry_after_ms","reset_after_ms","allowed"}], and the
                      RateLimit headers list every policy
  POST /v1/checks     {"requests": [check bodies, at most 1000]} ->
                      {"results": [one per request, in order: a /v1/check
                      body, or {"error","status"}]}; independent decisions,
                      200 unless the envelope is bad or too long (400)
  POST /v1/peek       a check body -> what /v1/check would answer now,
                      reason "peek"; records nothing; always 200
  POST /v1/refund     {"tenant","subject","policy","hits"} gives back up to
                      hits (default 1) of the key's admissions in the
                      window, newest first, never below empty; 200 with the
                      key's new state, reason "refunded"
  POST /v1/acquire    {"tenant","subject","policy","hits"} takes a lease of
                      a concurrency policy -> a /v1/check body plus
                      "lease_id" (a decimal string) and "lease_ttl_ms"; 200
                      granted, 429 at the cap, 503 unavailable
  POST /v1/release    {"tenant","subject","policy","lease_id"} ends the
                      lease; 200 with reason "released", "allowed" false
                      when the id was unknown or already expired
  POST /v1/reset      {"tenant","subject","policy"} clears the key; needs
                      Authorization: Bearer <--admin-token-file's token>
                      (401 without it, 404 when serve has no token); 200
                      with reason "reset"
  GET  /healthz       200 while the process runs
  GET  /readyz        200 while part of the cluster; 503 with {"status",
                      "reason"} while draining, alone although --join was
                      given, or ignoring live members (another placement:
                      ring parameters; another policy table is fine)
  GET  /metrics       Prometheus metrics (ringlimit_*, go_*, process_*)
  GET  /debug/ring    members, ring version, partitions owned by this node,
                      policy table version of this node and of each member
  GET  /debug/hotkeys the heaviest keys this node owns (tenant and subject
                      are shown: keep /debug and /metrics private)

`

// serveFlags holds serve's configuration after flags and environment.
type serveFlags struct {
	name, gossipAddr, grpcAddr, httpAddr, join, policies, gossipKey string
	tlsCert, tlsKey, tlsCA, tlsServerName                           string
	logFormat, logLevel                                             string
	peerPipes                                                       string
	adminTokenFile                                                  string
	gossipAdvertise, grpcAdvertise                                  string
	drainTimeout, joinTimeout, joinRefresh, policiesPoll            time.Duration
	gossipProfile                                                   peer.GossipProfile
	ownership                                                       peer.OwnershipMode
	// Hidden, for the demo's child node and tests: exitOnStdinEOF stops
	// the node when its parent closes stdin (or dies), so a child never
	// outlives the demo.
	exitOnStdinEOF bool
}

func parseServeFlags(args []string, stderr io.Writer) (serveFlags, error) {
	var f serveFlags
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, serveUsage+policiesUsage+"\n"+domainsUsage) }
	fs.StringVar(&f.name, "name", "", "")
	fs.StringVar(&f.gossipAddr, "gossip-addr", "127.0.0.1:7946", "")
	fs.StringVar(&f.grpcAddr, "grpc-addr", "127.0.0.1:8081", "")
	fs.StringVar(&f.gossipAdvertise, "gossip-advertise-addr", "", "")
	fs.StringVar(&f.grpcAdvertise, "grpc-advertise-addr", "", "")
	fs.StringVar(&f.httpAddr, "http-addr", "127.0.0.1:8080", "")
	fs.StringVar(&f.join, "join", "", "")
	fs.StringVar(&f.policies, "policies", "", "")
	fs.StringVar(&f.gossipKey, "gossip-key", "", "")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "")
	fs.StringVar(&f.tlsKey, "tls-key", "", "")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "")
	fs.StringVar(&f.tlsServerName, "tls-server-name", "", "")
	fs.DurationVar(&f.drainTimeout, "drain-timeout", 10*time.Second, "")
	fs.DurationVar(&f.joinTimeout, "join-timeout", 30*time.Second, "")
	fs.DurationVar(&f.joinRefresh, "join-refresh", 30*time.Second, "")
	fs.DurationVar(&f.policiesPoll, "policies-poll", 5*time.Second, "")
	fs.StringVar(&f.logFormat, "log-format", "text", "")
	fs.StringVar(&f.logLevel, "log-level", "info", "")
	fs.StringVar(&f.adminTokenFile, "admin-token-file", "", "")
	fs.StringVar(&f.peerPipes, "peer-pipes", "framed", "")
	profile := fs.String("gossip-profile", string(peer.GossipLAN), "")
	ownership := fs.String("ownership", string(peer.OwnershipGossip), "")
	fs.BoolVar(&f.exitOnStdinEOF, "exit-on-stdin-eof", false, "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return f, err
		}
		return f, usageError("serve: " + err.Error())
	}
	if fs.NArg() > 0 {
		return f, usageError(fmt.Sprintf("serve: unexpected argument %q", fs.Arg(0)))
	}
	if err := applyEnv(fs, os.LookupEnv); err != nil {
		return f, usageError("serve: " + err.Error())
	}
	if f.drainTimeout <= 0 || f.joinTimeout <= 0 {
		return f, usageError("serve: --drain-timeout and --join-timeout must be positive")
	}
	if f.joinRefresh < 0 {
		return f, usageError("serve: --join-refresh must not be negative (0 disables)")
	}
	if f.policiesPoll < 0 {
		return f, usageError("serve: --policies-poll must not be negative (0 disables)")
	}
	if _, err := parseJoin(f.join); err != nil {
		return f, usageError("serve: " + err.Error())
	}
	if err := setPeerPipes(f.peerPipes, &peer.Config{}); err != nil {
		return f, usageError("serve: " + err.Error())
	}
	var err error
	if f.gossipProfile, err = peer.ParseGossipProfile(*profile); err != nil {
		return f, usageError(fmt.Sprintf("serve: gossip profile %q: want lan, fast or wan", *profile))
	}
	if f.ownership, err = peer.ParseOwnership(*ownership); err != nil {
		return f, usageError(fmt.Sprintf("serve: ownership %q: want gossip or log", *ownership))
	}
	return f, nil
}

// peerConfig is the node's Config as f sets it, with log as its logger
// and the built-in policies: what runServe starts from before the policy
// file, keys, TLS, metrics and joins are added.
func (f serveFlags) peerConfig(log *slog.Logger) peer.Config {
	cfg := peer.Config{
		Name:       f.name,
		GossipAddr: f.gossipAddr,
		RPCAddr:    f.grpcAddr,
		// Advertised addresses, when the bound ones are not reachable.
		GossipAdvertiseAddr: f.gossipAdvertise,
		RPCAdvertiseAddr:    f.grpcAdvertise,
		Policies:            defaultPolicies(),
		Logger:              log,
		GossipProfile:       f.gossipProfile,
		JoinTimeout:         f.joinTimeout,
		Ownership:           f.ownership,
	}
	_ = setPeerPipes(f.peerPipes, &cfg) // checked by parseServeFlags
	return cfg
}

// setPeerPipes sets cfg's peer transport from --peer-pipes.
func setPeerPipes(mode string, cfg *peer.Config) error {
	switch mode {
	case "framed":
		cfg.DisableFramedPipes, cfg.DisableStreams = false, false
	case "grpc":
		cfg.DisableFramedPipes, cfg.DisableStreams = true, false
	case "unary":
		cfg.DisableFramedPipes, cfg.DisableStreams = true, true
	default:
		return fmt.Errorf("peer pipes %q: want framed, grpc or unary", mode)
	}
	return nil
}

// applyEnv sets every flag not given on the command line from the
// environment variable RINGLIMIT_<NAME> (dashes as underscores, uppercase),
// when that variable is set.
func applyEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		env := envName(f.Name)
		v, ok := lookup(env)
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %v", env, v, err))
		}
	})
	return errors.Join(errs...)
}

// envName is the environment variable for a flag: RINGLIMIT_ + the name in
// uppercase with dashes as underscores.
func envName(flagName string) string {
	return "RINGLIMIT_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// splitList splits a comma-separated list, dropping blanks.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

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
	// "domains" in the policy file every domain is unknown and answered
	// OK, as envoyproxy/ratelimit answers an unknown domain.
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
	if cfg.Metrics, err = peer.NewPrometheusMetrics(reg); err != nil {
		return fmt.Errorf("serve: metrics: %w", err)
	}

	// One admin token guards Reset over HTTP and gRPC alike.
	var reset *resetGuard
	if f.adminTokenFile != "" {
		token, err := loadAdminToken(f.adminTokenFile)
		if err != nil {
			return fmt.Errorf("serve: %w", err)
		}
		if reset, err = newResetGuard(token, nlog, reg); err != nil {
			return fmt.Errorf("serve: metrics: %w", err)
		}
		cfg.AuthorizeReset = reset.authorizeGRPC
	}

	var httpLis net.Listener
	if f.httpAddr != "" {
		if httpLis, err = net.Listen("tcp", f.httpAddr); err != nil {
			return fmt.Errorf("serve: listen http: %w", err)
		}
		defer httpLis.Close()
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

	api := &httpAPI{node: node, pols: node, reg: reg, log: nlog, reset: reset}
	var httpSrv *http.Server
	httpErr := make(chan error, 1)
	httpAddr := ""
	if httpLis != nil {
		httpAddr = httpLis.Addr().String()
		httpSrv = &http.Server{
			Handler:           api.routes(),
			ReadHeaderTimeout: 5 * time.Second,
			ReadTimeout:       30 * time.Second,
			WriteTimeout:      30 * time.Second,
			IdleTimeout:       2 * time.Minute,
			ErrorLog:          slog.NewLogLogger(nlog.Handler(), slog.LevelWarn),
		}
		go func() { httpErr <- httpSrv.Serve(httpLis) }()
	}
	log.Info("serving", "node", node.Name(), "http_addr", httpAddr, "grpc_addr", node.RPCAddr(),
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
	stopRefresh()
	<-refreshDone
	<-reloadDone

	// Shutdown must not inherit ctx: it is already cancelled by the signal.
	drainCtx, cancelDrain := context.WithTimeout(context.WithoutCancel(ctx), f.drainTimeout)
	defer cancelDrain()
	if err := node.Close(drainCtx); err != nil {
		// The process still exits 0: the node left, and the keys it could
		// not hand off behave as after a crash.
		nlog.Error("drain incomplete", "err", err)
	}
	if httpSrv != nil {
		if err := httpSrv.Shutdown(drainCtx); err != nil {
			nlog.Warn("http shutdown", "err", err)
			_ = httpSrv.Close()
		}
	}
	nlog.Info("stopped")
	return runErr
}

// loadGossipKey reads a gossip key file: the base64 of 16, 24 or 32 bytes
// (surrounding whitespace ignored), or exactly 16, 24 or 32 raw bytes.
func loadGossipKey(path string) ([]byte, error) {
	data, err := readSmallFile(path, 4096)
	if err != nil {
		return nil, fmt.Errorf("gossip key: %w", err)
	}
	validLen := func(n int) bool { return n == 16 || n == 24 || n == 32 }
	// Base64 first: the text of a 24-byte key is 32 bytes long and would
	// otherwise pass as a raw 32-byte key.
	if k, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(data))); err == nil && validLen(len(k)) {
		return k, nil
	}
	if validLen(len(data)) {
		return data, nil
	}
	return nil, fmt.Errorf("gossip key %s: want 16, 24 or 32 raw bytes or their base64, got %d bytes", path, len(data))
}

// readSmallFile reads at most limit bytes of path, failing if it is larger.
func readSmallFile(path string, limit int64) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return data, nil
}

// loadMutualTLS builds the server and client TLS configs for mutual TLS
// between peers: both present certFile/keyFile and trust only caFile.
// serverName, if set, is the name a client verifies in the server's
// certificate instead of the dialed host.
func loadMutualTLS(certFile, keyFile, caFile, serverName string) (server, client *tls.Config, err error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("tls key pair: %w", err)
	}
	pool, err := loadCAPool(caFile)
	if err != nil {
		return nil, nil, err
	}
	server = &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
	client = &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ServerName:   serverName,
	}
	return server, client, nil
}

// loadCAPool reads PEM certificates from path into a pool.
func loadCAPool(path string) (*x509.CertPool, error) {
	pem, err := readSmallFile(path, 1<<20)
	if err != nil {
		return nil, fmt.Errorf("tls ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls ca %s: no PEM certificate found", path)
	}
	return pool, nil
}

// maxCheckBody bounds a /v1/check (peek, refund, reset) request body.
const maxCheckBody = 64 << 10

// httpAPI serves the HTTP endpoints of one node.
type httpAPI struct {
	node *peer.Node
	// pols is the node's policy table (the node itself in serve): looked
	// up per request, since a reload may replace it at any time.
	pols interface {
		Policy(name string) (peer.PolicyConfig, bool)
		Policies() map[string]peer.PolicyConfig
	}
	reg      *prometheus.Registry
	log      *slog.Logger
	draining atomic.Bool
	// reset guards /v1/reset with the admin token; nil disables the
	// endpoint (404).
	reset *resetGuard
}

// policy returns the node's current entry for name (zero if unknown): the
// table can be reloaded at any time, so it is looked up per request.
func (a *httpAPI) policy(name string) peer.PolicyConfig {
	pc, _ := a.pols.Policy(name)
	return pc
}

func (a *httpAPI) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", a.check)
	mux.HandleFunc("POST /v1/checks", a.checks)
	mux.HandleFunc("POST /v1/peek", a.peek)
	mux.HandleFunc("POST /v1/refund", a.refund)
	mux.HandleFunc("POST /v1/reset", a.resetKey)
	mux.HandleFunc("POST /v1/acquire", a.acquire)
	mux.HandleFunc("POST /v1/release", a.release)
	mux.HandleFunc("GET /healthz", a.healthz)
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /debug/ring", a.debugRing)
	mux.HandleFunc("GET /debug/hotkeys", a.debugHotKeys)
	return mux
}

// checkResponse is the answer of /v1/check, /v1/peek, /v1/refund and
// /v1/reset (and check --json). Durations are in milliseconds, rounded up so
// that waiting them is never too short. For a multi-policy request the
// top-level fields describe the whole decision (the refusing policy, or the
// admitted one with the least remaining) and Limits has one entry per policy.
type checkResponse struct {
	Allowed      bool   `json:"allowed"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	ResetAfterMs int64  `json:"reset_after_ms"`
	Reason       string `json:"reason"`
	Owner        string `json:"owner,omitempty"`
	// DecidedAtUnixNs is the deciding node's clock when it decided, in
	// nanoseconds since the Unix epoch (0 when nothing decided, as for
	// failed_open). Above 2^53: parse it as a 64-bit integer.
	DecidedAtUnixNs int64           `json:"decided_at_unix_ns,omitempty"`
	RefusedBy       string          `json:"refused_by,omitempty"`
	Limits          []limitResponse `json:"limits,omitempty"`
	// LeaseID (/v1/acquire, when allowed) is the lease to pass to
	// /v1/release, as a decimal string (64-bit ids exceed a JSON number's
	// exact range); LeaseTTLMs is how long after decided_at_unix_ns it
	// expires unless released.
	LeaseID    string `json:"lease_id,omitempty"`
	LeaseTTLMs int64  `json:"lease_ttl_ms,omitempty"`
	Error      string `json:"error,omitempty"`
}

// limitResponse is one policy's part of a multi-policy decision.
type limitResponse struct {
	Policy       string `json:"policy"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	ResetAfterMs int64  `json:"reset_after_ms"`
	Allowed      bool   `json:"allowed"`
}

func responseFrom(d peer.Decision) checkResponse {
	r := checkResponse{
		Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining,
		RetryAfterMs: ceilMillis(d.RetryAfter), ResetAfterMs: ceilMillis(d.ResetAfter),
		Reason: d.Reason.String(), Owner: d.Owner, RefusedBy: d.RefusedBy,
	}
	if !d.DecidedAt.IsZero() {
		r.DecidedAtUnixNs = d.DecidedAt.UnixNano()
	}
	for _, l := range d.Limits {
		r.Limits = append(r.Limits, limitResponse{Policy: l.Policy, Limit: l.Limit, Remaining: l.Remaining,
			RetryAfterMs: ceilMillis(l.RetryAfter), ResetAfterMs: ceilMillis(l.ResetAfter), Allowed: l.Allowed})
	}
	return r
}

// ceilMillis returns d in whole milliseconds, rounded up; 0 for d <= 0.
func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

type errorResponse struct {
	Error string `json:"error"`
}

// bodyBufs holds serveOp's request body buffers.
var bodyBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// errReader returns err from every Read.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// check answers POST /v1/check: one decision that consumes quota.
func (a *httpAPI) check(w http.ResponseWriter, r *http.Request) { a.serveOp(w, r, opCheck) }

// serveOp answers one operation on one body (check, peek, refund, reset).
func (a *httpAPI) serveOp(w http.ResponseWriter, r *http.Request, o op) {
	r.Body = http.MaxBytesReader(w, r.Body, maxCheckBody)
	// Strict: exact field names, no duplicates, hits 1 when absent and
	// never 0, null or fractional (httpdecode.go). The common body is
	// read by quickCheck; anything else by decodeCheck, from the same
	// bytes followed by the same read error.
	buf := bodyBufs.Get().(*bytes.Buffer)
	buf.Reset()
	defer bodyBufs.Put(buf) // at most maxCheckBody + bytes.MinRead
	_, rerr := buf.ReadFrom(r.Body)
	b, ok := checkBody{}, false
	if rerr == nil {
		b, ok = quickCheck(buf.Bytes())
	}
	var err error
	if !ok {
		var body io.Reader = bytes.NewReader(buf.Bytes())
		if rerr != nil {
			body = io.MultiReader(body, errReader{rerr})
		}
		b, err = decodeCheck(body)
	}
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeJSON(w, http.StatusRequestEntityTooLarge, errorResponse{Error: fmt.Sprintf("body larger than %d bytes", maxCheckBody)})
			return
		}
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: "bad JSON body: " + err.Error()})
		return
	}
	if o == opReset {
		a.log.Info("reset", "remote_addr", r.RemoteAddr, "tenant", b.Tenant, "policy", b.Policy)
		a.log.Debug("reset subject", "remote_addr", r.RemoteAddr, "tenant", b.Tenant, "subject", b.Subject, "policy", b.Policy)
	}
	status, body := a.do(r.Context(), w.Header(), o, b)
	writeJSON(w, status, body)
}

// do runs operation o for body b and returns the HTTP status and body,
// setting the response's header fields in h. It is what one /v1/check (or
// /v1/peek, ...) does, and what each item of /v1/checks does.
func (a *httpAPI) do(ctx context.Context, h http.Header, o op, b checkBody) (int, any) {
	if msg := o.problem(b); msg != "" {
		return http.StatusBadRequest, errorResponse{Error: msg}
	}
	req := peer.Request{Key: peer.Key{Tenant: b.Tenant, Subject: b.Subject, Policy: b.Policy}, Hits: b.Hits, Policies: b.Policies}
	var d peer.Decision
	var err error
	var lease peer.Lease
	switch o {
	case opAcquire:
		lease, err = a.node.Acquire(ctx, req)
		d = lease.Decision
	case opRelease:
		id, _ := strconv.ParseUint(b.LeaseID, 10, 64) // checked by problem
		d, err = a.node.Release(ctx, req.Key, id)
	case opPeek:
		d, err = a.node.Peek(ctx, req)
	case opRefund:
		d, err = a.node.Refund(ctx, req)
	case opReset:
		d, err = a.node.Reset(ctx, req.Key)
	default:
		d, err = a.node.Allow(ctx, req)
	}
	if err != nil {
		return a.allowError(h, b, err)
	}
	a.rateLimitHeaders(h, o, b, d)
	resp := responseFrom(d)
	if lease.ID != 0 {
		resp.LeaseID, resp.LeaseTTLMs = strconv.FormatUint(lease.ID, 10), ceilMillis(lease.TTL)
	}
	if (o == opCheck || o == opAcquire) && !d.Allowed {
		return http.StatusTooManyRequests, resp
	}
	return http.StatusOK, resp
}

// rateLimitHeaders sets the RateLimit header fields for decision d on b's
// policy or policies. Several policies are listed in one field each, in the
// request's order, as the IETF draft allows:
//
//	RateLimit-Policy: "per_second";q=10;w=1, "per_day";q=1000;w=86400
//	RateLimit: "per_second";r=9;t=1, "per_day";r=999;t=86400
//
// A refused check carries Retry-After from the refusing policy. Peek,
// refund and reset answers describe the key's state and never carry
// Retry-After (they are not refusals).
func (a *httpAPI) rateLimitHeaders(h http.Header, o op, b checkBody, d peer.Decision) {
	if o == opRefund || o == opReset || o == opRelease {
		// Allowed reports whether anything was given back, not a refusal:
		// describe the state as an admitted decision would.
		d.Allowed = true
	}
	if len(b.Policies) == 0 {
		peer.RateLimitHeaders(h, b.Policy, a.policy(b.Policy), d)
	} else {
		a.multiHeaders(h, b.Policies, d)
	}
	if o != opCheck && o != opAcquire {
		h.Del("Retry-After")
	}
}

// multiHeaders is rateLimitHeaders for a multi-policy decision.
func (a *httpAPI) multiHeaders(h http.Header, names []string, d peer.Decision) {
	var pols, states []string
	retry := ""
	if len(d.Limits) == 0 {
		// failed_open or fallback: no per-policy state is known; list the
		// configured quotas only.
		for _, name := range names {
			tmp := http.Header{}
			peer.UnavailableHeaders(tmp, name, a.policy(name))
			pols = append(pols, tmp.Get("RateLimit-Policy"))
		}
		if !d.Allowed {
			retry = fmt.Sprint(max(peer.RetryAfterSeconds(d.RetryAfter), 1))
		}
	}
	for _, l := range d.Limits {
		if l.Limit == 0 {
			// An unlimited override exempts the key from this policy:
			// no quota to advertise.
			continue
		}
		tmp := http.Header{}
		peer.RateLimitHeaders(tmp, l.Policy, a.policy(l.Policy), peer.Decision{
			Allowed: l.Allowed, Limit: l.Limit, Remaining: l.Remaining, RetryAfter: l.RetryAfter, ResetAfter: l.ResetAfter, Reason: d.Reason})
		pols = append(pols, tmp.Get("RateLimit-Policy"))
		states = append(states, tmp.Get("RateLimit"))
		if l.Policy == d.RefusedBy {
			retry = tmp.Get("Retry-After")
		}
	}
	if len(pols) > 0 {
		h.Set("RateLimit-Policy", strings.Join(pols, ", "))
	} else {
		h.Del("RateLimit-Policy")
	}
	if len(states) > 0 {
		h.Set("RateLimit", strings.Join(states, ", "))
	} else {
		h.Del("RateLimit")
	}
	if !d.Allowed && retry != "" {
		h.Set("Retry-After", retry)
	}
	switch d.Reason {
	case peer.ReasonFailedOpen, peer.ReasonFallback, peer.ReasonShadow:
		h.Set("RateLimit-Reason", d.Reason.String())
	default:
		h.Del("RateLimit-Reason")
	}
}

// allowError answers an error from the node for body b: 400 for bad input,
// in the client's terms and once (the error's own text stacks the peer and
// shard prefixes); 503 for unavailability, with the headers and body fields
// a 429 carries; 500 otherwise. It sets header fields in h and returns the
// status and body.
func (a *httpAPI) allowError(h http.Header, b checkBody, err error) (int, any) {
	names := b.Policies
	if names == nil {
		names = []string{b.Policy}
	}
	switch {
	case errors.Is(err, peer.ErrInvalidKey):
		msg := "invalid key"
		for _, name := range names {
			if p := (peer.Key{Tenant: b.Tenant, Subject: b.Subject, Policy: name}).Problem(); p != "" {
				msg += ": " + p
				break
			}
		}
		msg += fmt.Sprintf("; tenant, subject and policy must each be 1 to %d bytes of visible ASCII", shard.MaxKeyPartLen)
		msg += encodingHint(b.Tenant, b.Subject)
		return http.StatusBadRequest, errorResponse{Error: msg}
	case errors.Is(err, peer.ErrWrongAlgorithm):
		// A check that names a concurrency policy (among others or alone)
		// is the concurrency policy's mistake; an acquire or release names
		// one policy, of another kind.
		for _, name := range names {
			if a.policy(name).Algorithm != peer.Concurrency {
				continue
			}
			if len(names) > 1 {
				return http.StatusBadRequest, errorResponse{Error: fmt.Sprintf("policy %q is a concurrency policy: it cannot be part of a multi-policy check; take its lease with /v1/acquire (end it with /v1/release) and check the other policies without it", name)}
			}
			return http.StatusBadRequest, errorResponse{Error: fmt.Sprintf("policy %q is a concurrency policy: use /v1/acquire and /v1/release", name)}
		}
		return http.StatusBadRequest, errorResponse{Error: fmt.Sprintf("policy %q is %v: /v1/acquire and /v1/release need a concurrency policy", names[0], a.policy(names[0]).Algorithm)}
	case errors.Is(err, peer.ErrUnknownPolicy):
		unknown := names[0]
		for _, name := range names {
			if _, ok := a.pols.Policy(name); !ok {
				unknown = name
				break
			}
		}
		return http.StatusBadRequest, errorResponse{Error: fmt.Sprintf("unknown policy %q: this node's policies are %s", unknown, policyNames(a.pols.Policies()))}
	case errors.Is(err, peer.ErrInvalidHits):
		if len(names) > 1 {
			for _, name := range names {
				if lim := a.policy(name).For(b.Tenant, b.Subject).Limit; b.Hits > lim && lim > 0 {
					return http.StatusBadRequest, errorResponse{Error: fmt.Sprintf("invalid hits %d: above policy %q's limit %d; a multi-policy check must fit every policy", b.Hits, name, lim)}
				}
			}
		}
		return http.StatusBadRequest, errorResponse{Error: fmt.Sprintf("invalid hits %d: must be between 1 and the policy's limit %d (leave hits out to mean 1)", b.Hits, a.policy(names[0]).For(b.Tenant, b.Subject).Limit)}
	case errors.Is(err, peer.ErrUnavailable), errors.Is(err, peer.ErrClosed):
		// Unavailable is never 429: the limiter could not decide. The
		// cause (addresses, refused connections) stays in the node's own
		// logs; the text claims a timeout only when there was one.
		msg := "rate limiter unavailable: could not get a decision from the key's owner"
		switch {
		case errors.Is(err, peer.ErrClosed):
			msg = "rate limiter unavailable: node is shutting down"
		case errors.Is(err, context.DeadlineExceeded):
			msg = "rate limiter unavailable: the key's owner could not decide in time"
		}
		a.log.Debug("check unavailable", "policy", strings.Join(names, ","), "err", err)
		body := checkResponse{Reason: peer.ReasonUnavailable.String(), Error: msg,
			RetryAfterMs: peer.UnavailableRetryAfter.Milliseconds()}
		var pols []string
		for _, name := range names {
			pc, known := a.pols.Policy(name)
			pc = pc.For(b.Tenant, b.Subject)
			if !known || pc.Limit == 0 {
				continue // unknown, or exempt by an unlimited override
			}
			tmp := http.Header{}
			peer.UnavailableHeaders(tmp, name, pc)
			pols = append(pols, tmp.Get("RateLimit-Policy"))
			if len(names) > 1 {
				body.Limits = append(body.Limits, limitResponse{Policy: name, Limit: pc.Limit})
			} else {
				body.Limit = pc.Limit
			}
		}
		h.Set("Retry-After", fmt.Sprint(peer.RetryAfterSeconds(peer.UnavailableRetryAfter)))
		h.Del("RateLimit")
		if len(pols) > 0 {
			h.Set("RateLimit-Policy", strings.Join(pols, ", "))
			h.Set("RateLimit-Reason", peer.ReasonUnavailable.String())
		}
		return http.StatusServiceUnavailable, body
	default:
		a.log.Error("check failed", "policy", strings.Join(names, ","), "err", err)
		return http.StatusInternalServerError, errorResponse{Error: "internal error"}
	}
}

// policyNames lists a policy table's names, sorted and comma-separated.
// encodingHint says how to send a tenant or subject that is not visible
// ASCII (a UTF-8 name, a space): percent-encoded the way Go embedders'
// shard.KeyPart encodes it, so that both build the same key. "" when
// every part is visible ASCII (the problem is its length).
func encodingHint(parts ...string) string {
	for _, part := range parts {
		for i := 0; i < len(part); i++ {
			if part[i] < 0x21 || part[i] > 0x7e {
				return `; to send other text, percent-encode it as shard.KeyPart does: keep A-Z a-z 0-9 . _ @ - and write every other byte as %XX in uppercase hex ("josé" is "jos%C3%A9"), so that HTTP and Go clients share one key`
			}
		}
	}
	return ""
}

func policyNames(pols map[string]peer.PolicyConfig) string {
	names := make([]string, 0, len(pols))
	for n := range pols {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func (a *httpAPI) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (a *httpAPI) readyz(w http.ResponseWriter, _ *http.Request) {
	members := len(a.node.Members())
	ready, reason := a.node.Ready()
	switch {
	case a.draining.Load():
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "draining", "members": members})
	case !ready:
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "not ready", "reason": reason, "members": members})
	case members == 0:
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "no members", "members": members})
	default:
		writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "members": members})
	}
}

// ringInfo is the body of /debug/ring.
type ringInfo struct {
	Node            string   `json:"node"`
	RingVersion     uint64   `json:"ring_version"`
	Members         []string `json:"members"`
	PartitionsOwned int      `json:"partitions_owned"`
	Partitions      int      `json:"partitions"`
	// PolicyVersion is the version of this node's policy table;
	// MemberPolicyVersions the one each live member gossips (0: an older
	// member that does not say). They differ during a rolling change.
	PolicyVersion        uint64            `json:"policy_version"`
	MemberPolicyVersions map[string]uint64 `json:"member_policy_versions"`
}

func (a *httpAPI) debugRing(w http.ResponseWriter, _ *http.Request) {
	r := a.node.Ring()
	writeJSON(w, http.StatusOK, ringInfo{
		Node:            a.node.Name(),
		RingVersion:     r.Version,
		Members:         r.Members,
		Partitions:      r.Partitions,
		PartitionsOwned: r.PartitionsOwned,

		PolicyVersion:        a.node.PolicyVersion(),
		MemberPolicyVersions: a.node.MemberPolicyVersions(),
	})
}

// hotKeyInfo is one entry of /debug/hotkeys.
type hotKeyInfo struct {
	Tenant  string  `json:"tenant"`
	Subject string  `json:"subject"`
	Policy  string  `json:"policy"`
	Rate    float64 `json:"rate_per_second"`
}

func (a *httpAPI) debugHotKeys(w http.ResponseWriter, _ *http.Request) {
	hot := a.node.HotKeys()
	out := make([]hotKeyInfo, 0, len(hot))
	for _, h := range hot {
		out = append(out, hotKeyInfo{Tenant: h.Key.Tenant, Subject: h.Key.Subject, Policy: h.Key.Policy, Rate: h.Rate})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Rate > out[j].Rate })
	writeJSON(w, http.StatusOK, map[string]any{"node": a.node.Name(), "hot_keys": out})
}

// jsonBufs holds writeJSON's buffers: a body is encoded into one and
// written from it, where json.Marshal returned a copy of its encoding and
// appending the newline copied it again.
var jsonBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledJSON bounds the buffers jsonBufs keeps (a /v1/checks answer or
// /debug/ring can be large; a check's is a few hundred bytes).
const maxPooledJSON = 64 << 10

// The values of writeJSON's fixed header fields, shared by every response
// instead of one slice each from Header.Set: never modified, and len ==
// cap, so an Add to the field copies.
var (
	contentTypeJSON = []string{"application/json"}
	cacheNoStore    = []string{"no-store"}
	noSniff         = []string{"nosniff"}
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	buf := jsonBufs.Get().(*bytes.Buffer)
	buf.Reset()
	// Encode writes what json.Marshal returns, and a newline.
	if err := json.NewEncoder(buf).Encode(v); err != nil {
		status = http.StatusInternalServerError
		buf.Reset()
		buf.WriteString(`{"error":"internal error"}` + "\n")
	}
	h := w.Header()
	h["Content-Type"] = contentTypeJSON
	h["Cache-Control"] = cacheNoStore
	h["X-Content-Type-Options"] = noSniff
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
	if buf.Cap() <= maxPooledJSON {
		jsonBufs.Put(buf)
	}
}
