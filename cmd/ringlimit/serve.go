package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/shard"
)

const serveUsage = `Usage: ringlimit serve [flags]

Runs one ringlimit node until SIGTERM or SIGINT, then leaves the cluster
gracefully (hands its keys to their new owners) and exits 0.

Flags (each also read from RINGLIMIT_<FLAG>, e.g. RINGLIMIT_GOSSIP_ADDR):
  --name NAME           unique member name (default: "node-" + random hex)
  --gossip-addr H:P     memberlist gossip bind address (default 127.0.0.1:7946)
  --grpc-addr H:P       gRPC address: peer traffic, public RateLimiter API and
                        grpc.health.v1 (default 127.0.0.1:8081)
  --http-addr H:P       HTTP API, health and metrics; "" disables it
                        (default 127.0.0.1:8080)
  --join A,B            gossip addresses of existing members (comma-separated);
                        empty starts a new cluster
  --policies PATH       policy table file, YAML or JSON (see below)
  --gossip-key PATH     gossip encryption key file: 16, 24 or 32 raw bytes, or
                        their base64
  --tls-cert PATH       PEM certificate for mutual TLS on gRPC (peers and the
  --tls-key PATH        public API); the three flags go together. Peers are
  --tls-ca PATH         dialed by address, so certificates need IP SANs unless
  --tls-server-name N   --tls-server-name names the SAN to verify instead
  --drain-timeout D     how long shutdown may take to hand off keys (default 10s)
  --join-timeout D      how long start-up keeps retrying the --join seeds
                        (default 30s)
  --gossip-profile P    gossip timings: lan (default; a killed member is
                        declared failed in ~6 s), fast (one data centre
                        with low latency, ~1.2 s) or wan (~45 s); every
                        member should use the same
  --log-format F        text or json (default text)
  --log-level L         debug, info, warn or error (default info)

  --gossip-advertise-addr H:P  gossip address peers should use (NAT,
                        0.0.0.0 binds); default: the bound address
  --grpc-advertise-addr H:P    gRPC address peers should dial; default: the
                        bound address

The gRPC listener serves peers and clients alike; the HTTP listener is always
plaintext: bind it to loopback or put it behind a proxy. Peers dial the
address the gRPC listener is bound to unless --grpc-advertise-addr names
another, so with a 0.0.0.0 bind set the advertise address.

HTTP endpoints:
  POST /v1/check      {"tenant","subject","policy","hits"} ->
                      {"allowed","limit","remaining","retry_after_ms",
                       "reset_after_ms","reason","owner"}
                      200 admitted (also failed_open, fallback, shadow),
                      429 over limit, 503 unavailable, 400 bad input,
                      413 body over 64 KiB; RateLimit-Policy, RateLimit and
                      Retry-After headers (a 503 carries Retry-After,
                      RateLimit-Policy, RateLimit-Reason: unavailable, and
                      the policy's limit and retry_after_ms in its body)
  GET  /healthz       200 while the process runs
  GET  /readyz        200 while part of the cluster; 503 with {"status",
                      "reason"} while draining, alone although --join was
                      given, or ignoring live members (another policy table
                      or placement)
  GET  /metrics       Prometheus metrics (ringlimit_*, go_*, process_*)
  GET  /debug/ring    members, ring version, partitions owned by this node
  GET  /debug/hotkeys the heaviest keys this node owns (tenant and subject
                      are shown: keep /debug and /metrics private)

`

// serveFlags holds serve's configuration after flags and environment.
type serveFlags struct {
	name, gossipAddr, grpcAddr, httpAddr, join, policies, gossipKey string
	tlsCert, tlsKey, tlsCA, tlsServerName                           string
	logFormat, logLevel                                             string
	gossipAdvertise, grpcAdvertise                                  string
	drainTimeout, joinTimeout                                       time.Duration
	gossipProfile                                                   peer.GossipProfile
	// Hidden, for the demo's child node and tests: exitOnStdinEOF stops
	// the node when its parent closes stdin (or dies), so a child never
	// outlives the demo.
	exitOnStdinEOF bool
}

func parseServeFlags(args []string, stderr io.Writer) (serveFlags, error) {
	var f serveFlags
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, serveUsage+policiesUsage) }
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
	fs.StringVar(&f.logFormat, "log-format", "text", "")
	fs.StringVar(&f.logLevel, "log-level", "info", "")
	profile := fs.String("gossip-profile", string(peer.GossipLAN), "")
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
	var err error
	if f.gossipProfile, err = peer.ParseGossipProfile(*profile); err != nil {
		return f, usageError(fmt.Sprintf("serve: gossip profile %q: want lan, fast or wan", *profile))
	}
	return f, nil
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

	cfg := peer.Config{
		Name:       f.name,
		GossipAddr: f.gossipAddr,
		RPCAddr:    f.grpcAddr,
		Join:       splitList(f.join),
		// Advertised addresses, when the bound ones are not reachable.
		GossipAdvertiseAddr: f.gossipAdvertise,
		RPCAdvertiseAddr:    f.grpcAdvertise,
		Policies:            defaultPolicies(),
		Logger:              log,
		GossipProfile:       f.gossipProfile,
		JoinTimeout:         f.joinTimeout,
	}
	if f.policies != "" {
		if cfg.Policies, err = loadPolicies(f.policies); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
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

	var httpLis net.Listener
	if f.httpAddr != "" {
		if httpLis, err = net.Listen("tcp", f.httpAddr); err != nil {
			return fmt.Errorf("serve: listen http: %w", err)
		}
		defer httpLis.Close()
	}

	startCtx, cancelStart := context.WithTimeout(ctx, f.joinTimeout)
	node, err := peer.New(startCtx, cfg)
	cancelStart()
	if err != nil {
		return fmt.Errorf("serve: start node: %w", err)
	}

	api := &httpAPI{node: node, policies: node.Policies(), reg: reg, log: log}
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
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}
		go func() { httpErr <- httpSrv.Serve(httpLis) }()
	}
	log.Info("serving", "node", node.Name(), "http_addr", httpAddr, "grpc_addr", node.RPCAddr(),
		"gossip_addr", node.GossipAddr(), "members", len(node.Members()), "policies", len(api.policies))

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

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutdown requested: draining")
	case <-stdinClosed:
		log.Info("stdin closed: draining")
	case err := <-httpErr:
		runErr = fmt.Errorf("serve: http: %w", err)
		log.Error("http server failed: draining", "err", err)
	}
	api.draining.Store(true)

	// Shutdown must not inherit ctx: it is already cancelled by the signal.
	drainCtx, cancelDrain := context.WithTimeout(context.WithoutCancel(ctx), f.drainTimeout)
	defer cancelDrain()
	if err := node.Close(drainCtx); err != nil {
		// The process still exits 0: the node left, and the keys it could
		// not hand off behave as after a crash.
		log.Error("drain incomplete", "err", err)
	}
	if httpSrv != nil {
		if err := httpSrv.Shutdown(drainCtx); err != nil {
			log.Warn("http shutdown", "err", err)
			_ = httpSrv.Close()
		}
	}
	log.Info("stopped")
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

// maxCheckBody bounds a /v1/check request body.
const maxCheckBody = 64 << 10

// httpAPI serves the HTTP endpoints of one node.
type httpAPI struct {
	node     *peer.Node
	policies map[string]peer.PolicyConfig // the node's table; fixed for its life
	reg      *prometheus.Registry
	log      *slog.Logger
	draining atomic.Bool
}

func (a *httpAPI) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", a.check)
	mux.HandleFunc("GET /healthz", a.healthz)
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /debug/ring", a.debugRing)
	mux.HandleFunc("GET /debug/hotkeys", a.debugHotKeys)
	return mux
}

// checkRequest is the body of POST /v1/check.
type checkRequest struct {
	Tenant  string `json:"tenant"`
	Subject string `json:"subject"`
	Policy  string `json:"policy"`
	Hits    int64  `json:"hits"`
}

// checkResponse is the answer of /v1/check (and check --json). Durations are
// in milliseconds, rounded up so that waiting them is never too short.
type checkResponse struct {
	Allowed      bool   `json:"allowed"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	ResetAfterMs int64  `json:"reset_after_ms"`
	Reason       string `json:"reason"`
	Owner        string `json:"owner,omitempty"`
	Error        string `json:"error,omitempty"`
}

func responseFrom(d peer.Decision) checkResponse {
	return checkResponse{
		Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining,
		RetryAfterMs: ceilMillis(d.RetryAfter), ResetAfterMs: ceilMillis(d.ResetAfter),
		Reason: d.Reason.String(), Owner: d.Owner,
	}
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

func (a *httpAPI) check(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxCheckBody)
	// Strict: exact field names, no duplicates, hits 1 when absent and
	// never 0, null or fractional (httpdecode.go). One policy per check.
	req, err := decodeCheck(r.Body)
	if err == nil && req.Policies != nil {
		err = errors.New(`/v1/check takes one "policy"; "policies" is for the multi-limit endpoint`)
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
	key := peer.Key{Tenant: req.Tenant, Subject: req.Subject, Policy: req.Policy}
	d, err := a.node.Allow(r.Context(), peer.Request{Key: key, Hits: req.Hits})
	if err != nil {
		a.writeAllowError(w, key, req.Hits, err)
		return
	}
	// RateLimitHeaders also sets Retry-After on a refusal.
	peer.RateLimitHeaders(w.Header(), req.Policy, a.policies[req.Policy], d)
	status := http.StatusOK
	if !d.Allowed {
		status = http.StatusTooManyRequests
	}
	writeJSON(w, status, responseFrom(d))
}

// writeAllowError answers an error from Node.Allow for key and hits: 400
// for bad input, in the client's terms and once (the error's own text
// stacks the peer and shard prefixes); 503 for unavailability, with the
// headers and body fields a 429 carries; 500 otherwise.
func (a *httpAPI) writeAllowError(w http.ResponseWriter, key peer.Key, hits int64, err error) {
	pc, known := a.policies[key.Policy]
	switch {
	case errors.Is(err, peer.ErrInvalidKey):
		msg := "invalid key"
		if p := key.Problem(); p != "" {
			msg += ": " + p
		}
		msg += fmt.Sprintf("; tenant, subject and policy must each be 1 to %d bytes of visible ASCII", shard.MaxKeyPartLen)
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: msg})
	case errors.Is(err, peer.ErrUnknownPolicy):
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: fmt.Sprintf("unknown policy %q: this node's policies are %s", key.Policy, policyNames(a.policies))})
	case errors.Is(err, peer.ErrInvalidHits):
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: fmt.Sprintf("invalid hits %d: must be between 1 and the policy's limit %d (0 means 1)", hits, pc.Limit)})
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
		a.log.Debug("check unavailable", "policy", key.Policy, "err", err)
		body := checkResponse{Reason: peer.ReasonUnavailable.String(), Error: msg,
			RetryAfterMs: peer.UnavailableRetryAfter.Milliseconds()}
		if known {
			peer.UnavailableHeaders(w.Header(), key.Policy, pc)
			body.Limit = pc.Limit
		} else {
			// Closed before the policy was looked up.
			w.Header().Set("Retry-After", fmt.Sprint(peer.RetryAfterSeconds(peer.UnavailableRetryAfter)))
		}
		writeJSON(w, http.StatusServiceUnavailable, body)
	default:
		a.log.Error("check failed", "policy", key.Policy, "err", err)
		writeJSON(w, http.StatusInternalServerError, errorResponse{Error: "internal error"})
	}
}

// policyNames lists a policy table's names, sorted and comma-separated.
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
}

func (a *httpAPI) debugRing(w http.ResponseWriter, _ *http.Request) {
	r := a.node.Ring()
	writeJSON(w, http.StatusOK, ringInfo{
		Node:            a.node.Name(),
		RingVersion:     r.Version,
		Members:         r.Members,
		Partitions:      r.Partitions,
		PartitionsOwned: r.PartitionsOwned,
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

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"internal error"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
