package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/ring"
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
  --ops-addr H:P        serve /healthz, /readyz, /metrics and /debug/* here
                        instead, and only the decision API (/v1/*) on
                        --http-addr: the probes and the scraper reach this
                        port while the API stays on loopback; "" (default)
                        keeps everything on --http-addr
  --ui-peers URL,URL    the other members' consoles (http://H:P/ui/), asked
                        for their part of /ui/'s cluster view; empty: each
                        member's gRPC host at this node's --ops-addr port
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
  --tls-peer-name LIST  comma-separated patterns (path.Match: '*' is any run
                        of characters but '/') of a peer certificate's DNS
                        or URI SANs, e.g. '*.ringlimit.default.svc.cluster.local'
                        or 'spiffe://cluster.local/ns/default/sa/ringlimit':
                        a certificate of --tls-ca that matches none (Envoy's,
                        an application's) may call the public API and Envoy's
                        service, but no peer RPC, and does not stand for the
                        admin token. Without it every certificate of the CA
                        is a peer's and an admin's, and serve warns
  --http-tls            serve --http-addr's decision API over TLS with the
                        --tls-* certificate, requiring a client certificate
                        of --tls-ca (any, not only a peer's); the ops
                        listener (--ops-addr: probes, /metrics, /debug)
                        stays plaintext. Needs --tls-*
  --hot-key-labels      label ringlimit_hot_key_rate with each hot key's
                        tenant and subject (other tenants' identities, on
                        /metrics); by default a hot key is named by rank
                        and policy (/debug/hotkeys names it)
  --data-dir PATH       keep the ownership log, this node's identity and the
                        state of its partitions (policies with durability
                        disk or disk_async) here, so that quotas survive a
                        restart of every node; needs --name (the directory
                        belongs to one member); "" (default) keeps all in
                        memory
  --drain-timeout D     how long shutdown may take to hand off keys (default 10s)
  --forward-timeout D   how long a request waits for its key's owner when
                        the caller set no earlier deadline; past it the
                        policy's failure mode answers (default 500ms)
  --max-keys N          the most keys this node holds (its partitions' and
                        backup copies together; each partition holds at
                        most N/partitions wherever it is, so the cluster
                        holds at most N distinct keys); a new key past it
                        is refused as capacity (gRPC ResourceExhausted,
                        HTTP 503 reason "capacity"), never as over limit;
                        0 disables (default %d)
  --expected-members N  the most members this cluster is expected to reach;
                        sets the partition count (ring.PartitionsFor: 271
                        up to 16 members, beyond that 16 a member, e.g.
                        16411 for 1024) so every member owns some, and
                        scales gossip suspicion to the size. Fixed when
                        the cluster is founded: every member must be
                        given the same value (one with another partition
                        count is left out of the others' rings, /readyz
                        says so) and the count cannot change without
                        resetting every key
  --partitions N        the partition count itself, overriding
                        --expected-members' (default 271)
  --gc-headroom MIB     the garbage collector lets the heap grow by at least
                        this many MiB between collections (by the live
                        heap when that is larger, as Go's default): fewer
                        collections on a node with little key state, for
                        at most this much more memory; 0 disables it, and
                        so does GOGC in the environment (default 64)
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
  --ownership M         how partition holders change: log, the only mode
                        (by commands in a replicated log, with liveness
                        leases; needs 3 members to survive a crash);
                        gossip was removed
  --log-format F        text or json (default text)
  --log-level L         debug, info, warn or error (default info)
  --admin-token-file P  file holding the bearer token that Reset requires:
                        POST /v1/reset (Authorization: Bearer <token>; without
                        this flag /v1/reset answers 404) and gRPC
                        RateLimiter.Reset (metadata authorization: Bearer
                        <token>, or a client certificate the node verified
                        under --tls-*; without this flag gRPC Reset is
                        refused except to a verified client certificate,
                        and serve says so at start). Refund needs it too
                        (or --refund-token-file's). Refusals: 401 or
                        Unauthenticated, a Warn (at most one per 10 s per
                        transport) and ringlimit_reset_refused_total
                        (ringlimit_refund_refused_total)
  --refund-token-file P file holding a bearer token that Refund accepts
                        besides the admin token, for services that refund
                        but must not reset. With either file, POST
                        /v1/refund and gRPC RateLimiter.Refund need one of
                        the tokens (or a verified client certificate), as
                        Reset does: a refund gives back any caller's
                        admissions. With neither, Refund is open

  --grpc-max-conns N    connections the gRPC port holds at once, peers'
                        included (each other member holds 3); one past it
                        is reset on accept; 0 disables (default %d)
  --grpc-max-conns-per-ip N
                        the same from one client IP address; members on
                        one host share it; 0 disables (default %d)
  --grpc-max-streams N  calls in progress on one connection; gRPC clients
                        queue more, others have them refused (default %d).
                        An idle AllowStream costs ~21 KB: one address can
                        make the node hold at most per-ip x streams of them
  --grpc-idle-timeout D close a connection with no call in progress for
                        this long; 0 disables (default %v)
  --grpc-keepalive-time D
                        ping a connection silent this long (default %v)
  --grpc-keepalive-timeout D
                        close it, and end its calls, if the ping is not
                        answered within this (default %v)
  --grpc-min-ping-interval D
                        clients pinging more often are closed (default %v)

  --gossip-advertise-addr H:P  gossip address peers should use (NAT,
                        0.0.0.0 binds); default: the bound address
  --grpc-advertise-addr H:P    gRPC address peers should dial; default: the
                        bound address

The gRPC listener serves peers and clients alike; the HTTP listener is
plaintext unless --http-tls: bind it to loopback, put it behind a proxy, or
give it --http-tls. Peers dial the
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
                      hits (default 1, at most the policy's limit: more is
                      400 and changes nothing) of the key's admissions in
                      the window, newest first, never below empty; 200 with
                      the key's new state, reason "refunded" ("allowed"
                      true), or "nothing_to_refund" ("allowed" false) when
                      the key held no admissions to give back. Needs
                      Authorization: Bearer <refund or admin token> when
                      serve has either (401 without it)
  POST /v1/acquire    {"tenant","subject","policy","hits"} takes a lease of
                      a concurrency policy -> a /v1/check body plus
                      "lease_id" (a decimal string) and "lease_ttl_ms"; 200
                      granted, 429 at the cap, 503 unavailable
  POST /v1/release    {"tenant","subject","policy","lease_id"} ends the
                      lease; 200 with reason "released", "allowed" false
                      when the id was unknown or already expired
  POST /v1/reserve    a check body of a sliding_log policy whose hits is
                      the estimate of a cost known only after the work ->
                      a /v1/check body plus "reservation_id" (a decimal
                      string) and "reservation_ttl_ms" (the policy's
                      window); 200 admitted, 429 when the estimate does not
                      fit, 503 unavailable
  POST /v1/settle     {"tenant","subject","policy","reservation_id",
                      "actual"} records the actual cost at the
                      reservation's instant; 200 with reason "settled",
                      "estimate" and "overage" (actual beyond the
                      estimate, recorded without admission), or reason
                      "not_pending", "allowed" false, when the id was
                      settled already, expired or never made (changes
                      nothing). A reservation never settled is charged
                      its estimate
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
  GET  /debug/hotkeys the heaviest keys this node owns, and the spread keys
                      it decides from rights (tenant and subject are
                      shown: keep /debug and /metrics private)
  GET  /ui/           the console: members, partitions, timeline, traffic,
                      hot keys, a key inspector, policies (read-only; with
                      --admin-token-file it can reset a key)
  GET  /ui            redirects to /ui/
  POST /ui/           the console's reset of a key (POST /ui/api/reset,
                      with the admin token; 404 without --admin-token-file)
  GET  /debug/ownership
                      ownership mode; this node's
                      member ID, the log's leader and voters, its own
                      liveness; each partition's holder, backup, epoch and
                      whether this node decides for it now

`

// serveFlags holds serve's configuration after flags and environment.
type serveFlags struct {
	name, gossipAddr, grpcAddr, httpAddr, join, policies, gossipKey string
	dataDir                                                         string
	opsAddr                                                         string // "": the ops paths stay on httpAddr
	uiPeers                                                         string
	tlsCert, tlsKey, tlsCA, tlsServerName                           string
	tlsPeerNames                                                    string // comma-separated
	httpTLS, hotKeyLabels                                           bool
	logFormat, logLevel                                             string
	peerPipes                                                       string
	adminTokenFile, refundTokenFile                                 string
	gossipAdvertise, grpcAdvertise                                  string
	drainTimeout, joinTimeout, joinRefresh, policiesPoll            time.Duration
	forwardTimeout                                                  time.Duration
	gcHeadroomMiB                                                   uint64
	maxKeys                                                         int
	// partitions is --partitions (0: from --expected-members, else
	// ring's default); expectedMembers is --expected-members (0: not
	// given).
	partitions, expectedMembers int
	// rpc holds the --grpc-* bounds as flags give them: 0 disables the
	// connection bounds and the idle timeout (peerConfig maps that to
	// peer's "no bound").
	rpc           peer.RPCLimits
	gossipProfile peer.GossipProfile
	ownership     peer.OwnershipMode
	// Hidden, for the demo's child node and tests: exitOnStdinEOF stops
	// the node when its parent closes stdin (or dies), so a child never
	// outlives the demo.
	exitOnStdinEOF bool
}

func parseServeFlags(args []string, stderr io.Writer) (serveFlags, error) {
	var f serveFlags
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, serveUsageText()+policiesUsage+"\n"+domainsUsage) }
	fs.StringVar(&f.name, "name", "", "")
	fs.StringVar(&f.gossipAddr, "gossip-addr", "127.0.0.1:7946", "")
	fs.StringVar(&f.grpcAddr, "grpc-addr", "127.0.0.1:8081", "")
	fs.StringVar(&f.gossipAdvertise, "gossip-advertise-addr", "", "")
	fs.StringVar(&f.grpcAdvertise, "grpc-advertise-addr", "", "")
	fs.StringVar(&f.httpAddr, "http-addr", "127.0.0.1:8080", "")
	fs.StringVar(&f.opsAddr, "ops-addr", "", "")
	fs.StringVar(&f.uiPeers, "ui-peers", "", "")
	fs.StringVar(&f.join, "join", "", "")
	fs.StringVar(&f.policies, "policies", "", "")
	fs.StringVar(&f.gossipKey, "gossip-key", "", "")
	fs.StringVar(&f.dataDir, "data-dir", "", "")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "")
	fs.StringVar(&f.tlsKey, "tls-key", "", "")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "")
	fs.StringVar(&f.tlsServerName, "tls-server-name", "", "")
	fs.StringVar(&f.tlsPeerNames, "tls-peer-name", "", "")
	fs.BoolVar(&f.httpTLS, "http-tls", false, "")
	fs.BoolVar(&f.hotKeyLabels, "hot-key-labels", false, "")
	fs.DurationVar(&f.drainTimeout, "drain-timeout", 10*time.Second, "")
	fs.DurationVar(&f.forwardTimeout, "forward-timeout", 500*time.Millisecond, "")
	fs.Uint64Var(&f.gcHeadroomMiB, "gc-headroom", 64, "")
	fs.IntVar(&f.maxKeys, "max-keys", defaultMaxKeys, "")
	partitions := fs.Int("partitions", 0, "")
	expected := fs.Int("expected-members", 0, "")
	fs.DurationVar(&f.joinTimeout, "join-timeout", 30*time.Second, "")
	fs.DurationVar(&f.joinRefresh, "join-refresh", 30*time.Second, "")
	fs.DurationVar(&f.policiesPoll, "policies-poll", 5*time.Second, "")
	fs.StringVar(&f.logFormat, "log-format", "text", "")
	fs.StringVar(&f.logLevel, "log-level", "info", "")
	fs.StringVar(&f.adminTokenFile, "admin-token-file", "", "")
	fs.StringVar(&f.refundTokenFile, "refund-token-file", "", "")
	fs.StringVar(&f.peerPipes, "peer-pipes", "framed", "")
	def := peer.RPCLimits{}.WithDefaults()
	fs.IntVar(&f.rpc.MaxConns, "grpc-max-conns", def.MaxConns, "")
	fs.IntVar(&f.rpc.MaxConnsPerIP, "grpc-max-conns-per-ip", def.MaxConnsPerIP, "")
	fs.IntVar(&f.rpc.MaxStreams, "grpc-max-streams", def.MaxStreams, "")
	fs.DurationVar(&f.rpc.IdleTimeout, "grpc-idle-timeout", def.IdleTimeout, "")
	fs.DurationVar(&f.rpc.KeepaliveTime, "grpc-keepalive-time", def.KeepaliveTime, "")
	fs.DurationVar(&f.rpc.KeepaliveTimeout, "grpc-keepalive-timeout", def.KeepaliveTimeout, "")
	fs.DurationVar(&f.rpc.MinPingInterval, "grpc-min-ping-interval", def.MinPingInterval, "")
	profile := fs.String("gossip-profile", string(peer.GossipLAN), "")
	ownership := fs.String("ownership", string(peer.OwnershipLog), "")
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
	if f.opsAddr != "" && f.opsAddr == f.httpAddr && !strings.HasSuffix(f.opsAddr, ":0") {
		return f, usageError(fmt.Sprintf("serve: --ops-addr %s is --http-addr too: give the ops listener a port of its own, or leave --ops-addr empty to serve everything on --http-addr", f.opsAddr))
	}
	if _, err := parseUIPeers(f.uiPeers); err != nil {
		return f, usageError("serve: " + err.Error())
	}
	if tls := f.tlsCert != "" || f.tlsKey != "" || f.tlsCA != ""; !tls && (f.httpTLS || f.tlsPeerNames != "") {
		return f, usageError("serve: --http-tls and --tls-peer-name need mutual TLS (--tls-cert, --tls-key and --tls-ca)")
	}
	if err := peer.ValidPeerCertNames(splitList(f.tlsPeerNames)); err != nil {
		return f, usageError("serve: --tls-peer-name: " + err.Error())
	}
	if f.dataDir != "" && f.name == "" {
		return f, usageError("serve: --data-dir needs --name: the directory belongs to one member, and a random name would not match it after a restart")
	}
	if f.drainTimeout <= 0 || f.joinTimeout <= 0 || f.forwardTimeout <= 0 {
		return f, usageError("serve: --drain-timeout, --join-timeout and --forward-timeout must be positive")
	}
	if f.maxKeys < 0 {
		return f, usageError(fmt.Sprintf("serve: --max-keys %d must not be negative (0 disables)", f.maxKeys))
	}
	if err := f.setPartitions(*partitions, *expected); err != nil {
		return f, usageError("serve: " + err.Error())
	}
	if f.gcHeadroomMiB > 1<<20 {
		return f, usageError(fmt.Sprintf("serve: --gc-headroom %d MiB is more than 1 TiB", f.gcHeadroomMiB))
	}
	if f.joinRefresh < 0 {
		return f, usageError("serve: --join-refresh must not be negative (0 disables)")
	}
	if f.policiesPoll < 0 {
		return f, usageError("serve: --policies-poll must not be negative (0 disables)")
	}
	if err := checkRPCFlags(f.rpc); err != nil {
		return f, usageError("serve: " + err.Error())
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
		return f, usageError("serve: " + strings.TrimPrefix(err.Error(), "peer: "))
	}
	return f, nil
}

// peerConfig is the node's Config as f sets it, with log as its logger
// and the built-in policies: what runServe starts from before the policy
// file, keys, TLS, metrics and joins are added.
func (f serveFlags) peerConfig(log *slog.Logger) peer.Config {
	cfg := peer.Config{
		DataDir:    f.dataDir,
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
		ForwardTimeout:      f.forwardTimeout,
		Ownership:           f.ownership,
		RPCLimits:           f.rpcLimits(),
		Store:               shard.Config{MaxKeys: f.maxKeys},
		Ring:                ring.Config{PartitionCount: f.partitions},
		ExpectedMembers:     f.expectedMembers,
		PeerCertNames:       splitList(f.tlsPeerNames),
	}
	_ = setPeerPipes(f.peerPipes, &cfg) // checked by parseServeFlags
	return cfg
}

// setPartitions checks --partitions and --expected-members (0: not given)
// and keeps them.
func (f *serveFlags) setPartitions(partitions, expected int) error {
	if partitions < 0 || partitions > ring.MaxPartitionCount {
		return fmt.Errorf("--partitions %d must be between 1 and %d", partitions, ring.MaxPartitionCount)
	}
	if expected < 0 || expected > ring.MaxExpectedMembers {
		return fmt.Errorf("--expected-members %d must be between 1 and %d", expected, ring.MaxExpectedMembers)
	}
	f.partitions, f.expectedMembers = partitions, expected
	return nil
}

// defaultMaxKeys is --max-keys' default. A million plain keys took 390 MB
// of heap (600 MB RSS) on a node that held them all (more for sliding
// logs of many runs); before it, one client with no credentials could
// grow a node's keys without bound (issue 53: 1 048 576 a partition).
const defaultMaxKeys = 1_000_000

// serveUsageText is serveUsage with the --grpc-* defaults filled in.
func serveUsageText() string {
	d := peer.RPCLimits{}.WithDefaults()
	return fmt.Sprintf(serveUsage, defaultMaxKeys, d.MaxConns, d.MaxConnsPerIP, d.MaxStreams, d.IdleTimeout, d.KeepaliveTime, d.KeepaliveTimeout, d.MinPingInterval)
}

// checkRPCFlags checks the --grpc-* bounds as flags give them.
func checkRPCFlags(l peer.RPCLimits) error {
	switch {
	case l.MaxConns < 0 || l.MaxConnsPerIP < 0:
		return fmt.Errorf("--grpc-max-conns %d and --grpc-max-conns-per-ip %d must not be negative (0 disables)", l.MaxConns, l.MaxConnsPerIP)
	case l.MaxStreams < 1 || l.MaxStreams > 1<<20:
		return fmt.Errorf("--grpc-max-streams %d must be between 1 and %d", l.MaxStreams, 1<<20)
	case l.IdleTimeout < 0:
		return fmt.Errorf("--grpc-idle-timeout %v must not be negative (0 disables)", l.IdleTimeout)
	case l.KeepaliveTime < time.Second:
		return fmt.Errorf("--grpc-keepalive-time %v must be at least 1s", l.KeepaliveTime)
	case l.KeepaliveTimeout <= 0 || l.MinPingInterval <= 0:
		return fmt.Errorf("--grpc-keepalive-timeout %v and --grpc-min-ping-interval %v must be positive", l.KeepaliveTimeout, l.MinPingInterval)
	}
	return nil
}

// rpcLimits is the node's RPCLimits from the --grpc-* flags: their 0
// ("disabled") is peer's negative.
func (f serveFlags) rpcLimits() peer.RPCLimits {
	l := f.rpc
	for _, v := range []*int{&l.MaxConns, &l.MaxConnsPerIP} {
		if *v == 0 {
			*v = -1
		}
	}
	if l.IdleTimeout == 0 {
		l.IdleTimeout = -1
	}
	return l
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
