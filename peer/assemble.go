package peer

import (
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ringlimit/ringlimit/peer/internal/connlimit"
	"github.com/ringlimit/ringlimit/peer/internal/membership"
	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/peer/internal/transport"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// How New assembles the node's parts: each part (the ownership driver,
// the membership) gets an env of what it takes from the node, built
// here, so that the part's own file reaches nothing else of it.

// New starts a node: it binds the gRPC listener and gossip, joins
// cfg.Join, and returns once the node serves. ctx bounds start-up and the
// initial join only, never the node's lifetime. On error everything started
// has been released. Config problems wrap ErrInvalidConfig.
func New(ctx context.Context, cfg Config) (*Node, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	fallback, err := shard.NewStore(cfg.Store)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	n := &Node{
		cfg:     cfg,
		name:    cfg.Name,
		log:     cfg.Logger.With("node", cfg.Name),
		clock:   cfg.Clock,
		metrics: cfg.Metrics,
		fp:      cfg.fingerprint(),
		pt:      newPartTable(cfg.Ring.PartitionCount, cfg.Store),
		started: time.Now(),
		hot:     shard.NewHotKeys(4*cfg.HotKeys, cfg.HotKeysHalfLife),
		closed:  make(chan struct{}),
	}
	n.table.env = policyEnv{
		self: n.name, log: n.log, metrics: n.metrics, lease: cfg.LeaseDuration, stopped: n.stopped.Load,
		// The ownership log and gossip start later in New.
		raise: func() {
			ctx, cancel := context.WithTimeout(n.ctx, n.cfg.ForwardTimeout)
			n.lo.run.Raise(ctx)
			cancel()
		},
		setEmptyAfter: func(d time.Duration) { n.lo.run.SetEmptyAfter(d) },
		gossip: func() {
			n.gossiper.delegate.SetMeta(n.meta(n.closing.Load()))
			_ = n.gossiper.ml.UpdateNode(200 * time.Millisecond)
		},
	}
	n.table.Store(policy.New(cfg.Policies))
	n.metrics.PolicyTable(n.table.Load().Version(), true)
	n.links.init()
	n.part = n.newPartEnv()
	n.ops.init()
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.gossiper = newGossiper(n.newGossiperEnv())
	// A mark is probed again after ten leases.
	n.reach = newReachability(int64(10*cfg.LeaseDuration), n.checkReachable, n.log)
	if cfg.clockIsDefault {
		n.wall = newWallClock(n.started)
		n.clock = n.wall.now
	}
	n.warns.log = n.log
	n.failure = failurePolicy{fallback: fallback, env: failEnv{
		self: n.name, metrics: n.metrics, clock: n.clock, view: &n.view, warn: n.warns.warn, maxKeys: cfg.Store.MaxKeys,
	}}
	n.spread.env = spreadEnv{
		ctx: n.ctx, wg: &n.wg, self: n.name, metrics: n.metrics, clock: n.clock, mono: n.mono,
		pause: &n.hooks.decide, forwardTimeout: cfg.ForwardTimeout, warn: n.warns.warn, route: n.route,
	}
	// gossip, the ownership log and the health service start later in
	// New: readiness reads them through closures.
	n.ops.ready.env = readyEnv{
		closing: n.closing.Load, join: cfg.Join,
		members:    func() int { return n.gossiper.ml.NumMembers() },
		leaderless: func() int64 { return n.lo.run.Leaderless() },
		mono:       n.mono, lease: cfg.LeaseDuration, settled: n.Settled,
		serving: func(st healthpb.HealthCheckResponse_ServingStatus) { n.health.SetServingStatus("", st) },
		metrics: n.metrics, log: n.log,
	}
	// A data directory names its cluster (datadir.go); a new one of a
	// joiner learns it from gossip first.
	joinFirst, err := n.dataDirCluster()
	if err != nil {
		n.cancel()
		return nil, err
	}
	if len(cfg.Join) == 0 && n.gossiper.clusterID.Load() == 0 {
		// No one to join: this node starts the cluster and holds every
		// partition once its log grants them. A node that joins holds
		// nothing until partitions are transferred to it, and adopts the
		// cluster's id.
		var b [8]byte
		_, _ = crand.Read(b[:])
		n.gossiper.clusterID.Store(binary.BigEndian.Uint64(b[:]) | 1)
	}
	if joinFirst {
		if err := n.startDataDirJoiner(ctx); err != nil {
			n.cancel()
			n.wg.Wait()
			return nil, err
		}
	} else {
		if err := n.openDataDir(); err != nil {
			n.cancel()
			return nil, err
		}
		if err := n.openOwner(); err != nil {
			n.closeDataDir()
			n.cancel()
			return nil, err
		}
		if err := n.startRPC(); err != nil {
			n.cancel()
			n.lo.shutdown()
			n.closeDataDir()
			return nil, err
		}
		if err := n.gossiper.start(ctx); err != nil {
			n.grpcSrv.Stop()
			n.cancel()
			n.lo.shutdown()
			n.wg.Wait()
			n.closeDataDir()
			return nil, err
		}
	}
	n.lo.start()
	n.startDataDir()
	n.gossiper.rebuild()
	n.wg.Add(2)
	go n.gossiper.rebuildLoop()
	go n.every(cfg.SweepInterval, n.Sweep)
	n.wg.Add(1)
	go n.every(cfg.ReconnectInterval, n.gossiper.reconnect)
	if len(cfg.Join) == 0 && !n.resumed() {
		// The founder serves once its log has granted it every partition
		// (an election and a few commits), within ctx. A log resumed
		// from disk needs its other voters back first.
		n.lo.awaitFounded(ctx)
	}
	n.ops.ready.update()
	n.log.Info("node started", "gossip_addr", n.GossipAddr(), "rpc_addr", n.RPCAddr(), "members", n.view.Load().snap.Len())
	return n, nil
}

// rpcStreamWorkers is the gRPC server's standing goroutines: enough for
// issue 9's 64 concurrent callers on one connection (BenchmarkUnaryAllow,
// callers=64: 11 % less CPU a call and 9–10 % more calls a second than a
// goroutine per call; 4 workers gained nothing measurable).
const rpcStreamWorkers = 64

func (n *Node) startRPC() error {
	lis, err := net.Listen("tcp", n.cfg.RPCAddr)
	if err != nil {
		return fmt.Errorf("peer: listen rpc %s: %w", n.cfg.RPCAddr, err)
	}
	n.rpcLis = lis
	n.serve(lis)
	return nil
}

// serve starts the RPC server on lis, reporting not serving until the
// node is ready, with peer-RPC authentication and the per-peer links'
// env set up before anything is served or dialled.
func (n *Node) serve(lis net.Listener) {
	n.health = health.NewServer()
	n.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	n.setupAuth()
	n.links.env = n.newLinkEnv()
	n.serveRPC(lis)
}

// setupAuth sets up peer-RPC authentication once, before the node first
// serves or dials, logging a warning and reporting it when peer RPCs are
// open. It is never written again, so every dial reads it without locks.
func (n *Node) setupAuth() {
	n.ops.auth = newPeerAuth(n.cfg)
	n.metrics.PeerRPCOpen(n.ops.auth.Open())
	if n.ops.auth.Open() {
		n.log.Warn("peer RPCs are not authenticated: anyone who reaches the gRPC port can decide, hand off and read limiter state; set Config.PeerSecret (or GossipKey), or require client certificates")
	}
	if mtls := n.cfg.ServerTLS != nil && n.cfg.ServerTLS.ClientAuth == tls.RequireAndVerifyClientCert; mtls && len(n.cfg.PeerCertNames) == 0 {
		// Every certificate of the CA would be a peer's: Envoy's client
		// certificate could forward, replicate, lease and speak raft
		// (issue 53 item 5).
		n.log.Warn("every client certificate the CA signed is taken for a peer's: a client of the public API (Envoy, an application) may call peer RPCs; set Config.PeerCertNames (serve --tls-peer-name)")
	}
	if n.cfg.ServerTLS != nil && len(n.cfg.GossipKey) == 0 {
		// TLS covers gRPC only: without a key anyone who reaches the
		// gossip port can join memberlist, read every member's addresses
		// and, with the fingerprint copied, be placed on the ring and make
		// every member unready (issue 53 item 4).
		n.log.Warn("gossip is not encrypted: TLS secures gRPC, not gossip; anyone who reaches the gossip port can join the member list; set Config.GossipKey (serve --gossip-key)")
	}
}

// newLinkEnv is n's linkEnv, pointing at the counters and pools of its
// links (n.links); called once its peer authentication is set up.
func (n *Node) newLinkEnv() *linkEnv {
	return &linkEnv{
		ctx: n.ctx, wg: &n.wg, self: n.name, log: n.log, metrics: n.metrics, clock: n.clock,
		maxBatch: n.cfg.MaxBatch, maxInFlight: n.cfg.MaxInFlight, noBatching: n.cfg.DisableBatching, forwardTimeout: n.cfg.ForwardTimeout, framedWriteTimeout: n.framedWriteTimeout(),
		noStreams: n.cfg.DisableStreams, noFramed: n.cfg.DisableFramedPipes, tls: n.cfg.ClientTLS,
		auth: n.ops.auth,
		view: &n.view, gather: &n.links.gather,
		replSeq: &n.links.replSeq, framedOpened: &n.links.framedOpened, pipeBreaks: &n.links.pipeBreaks, replItems: &n.links.replItems,
		warn: n.warns.warn, stamp: n.table.stamp,
		recopy:     newRecopier(n.ctx, &n.wg, n.lo.run.Recopy).note,
		diskPolicy: func(name string) bool { return n.dd.diskPolicy(n.table.Load(), name) },
	}
}

// serveRPC makes the node's gRPC server (its services and n.health) and
// serves lis on a goroutine the node owns.
func (n *Node) serveRPC(lis net.Listener) {
	var opts []grpc.ServerOption
	if n.cfg.ServerTLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(n.cfg.ServerTLS)))
	}
	opts = append(opts, n.rpcAuthServerOptions()...)
	opts = append(opts, grpc.InitialWindowSize(peerWindow), grpc.InitialConnWindowSize(peerWindow))
	// Each call on a goroutine of a standing pool, not a new one: a new
	// goroutine's stack grew to a decision's depth on every unary, RLS
	// and peer call (copystack was 7 % of a unary benchmark's CPU). When
	// every worker is busy grpc starts a goroutine as before, so a slow
	// call never queues another; Stop ends the workers.
	opts = append(opts, grpc.NumStreamWorkers(rpcStreamWorkers))
	opts = append(opts, n.cfg.RPCLimits.serverOptions()...)
	srv := grpc.NewServer(opts...)
	peerpb.RegisterLimiterServer(srv, &limiterService{n: n})
	peerpb.RegisterRateLimiterServer(srv, &publicService{n: n})
	healthpb.RegisterHealthServer(srv, n.health)
	n.lo.register(srv)
	if n.cfg.RegisterServices != nil {
		n.cfg.RegisterServices(srv, n)
	}
	fs := newFramedServer(n)
	n.grpcSrv = &rpcServer{grpc: srv, framed: fs}
	// The connection bounds come first: a framed pipe is a connection
	// like any other until its hello is read.
	n.rpcConns = n.limitConns(lis)
	var sl net.Listener = n.rpcConns
	n.hooks.refuseFramed.Store(n.cfg.refuseFramed)
	if !n.cfg.noFramedServer {
		sl = transport.NewListener(sl, fs, &n.wg)
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		// Serve returns when the server stops; any other error leaves the
		// node unable to serve peers, which gossip will soon reflect.
		if err := srv.Serve(sl); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			n.log.Error("rpc server stopped", "err", err)
		}
	}()
}

// rpcAuthServerOptions are the gRPC server's interceptors that check the
// peer token (setupAuth).
func (n *Node) rpcAuthServerOptions() []grpc.ServerOption { return n.ops.auth.ServerOptions() }

// limitConns wraps lis in the connection bounds; refusals are logged
// (at most one Warn a second, shared with the node's other throttled
// warnings).
func (n *Node) limitConns(lis net.Listener) *connlimit.Listener {
	l := n.cfg.RPCLimits
	return connlimit.New(lis, l.MaxConns, l.MaxConnsPerIP, func(remote net.Addr, why connlimit.Refusal) {
		n.warns.warn("rpc connection refused: too many connections", "remote_addr", remote.String(), "bound", why.String(),
			"max_conns", l.MaxConns, "max_conns_per_ip", l.MaxConnsPerIP)
	})
}

// startDataDirJoiner starts a joiner whose data directory is new: gossip
// first, to learn the cluster, then the directory and the log member,
// then the RPC server (its port bound before gossip, so that gossip
// carries its address; peers' connections wait in its backlog until it
// serves). On error everything started has been released.
func (n *Node) startDataDirJoiner(ctx context.Context) error {
	lis, err := net.Listen("tcp", n.cfg.RPCAddr)
	if err != nil {
		return fmt.Errorf("peer: listen rpc %s: %w", n.cfg.RPCAddr, err)
	}
	n.rpcLis = lis
	if err := n.gossiper.start(ctx); err != nil {
		lis.Close()
		return err
	}
	fail := func(err error) error {
		if n.lo != nil {
			n.lo.shutdown()
		}
		_ = n.gossiper.ml.Shutdown()
		n.gossiper.mlLog.Close()
		lis.Close()
		n.closeDataDir()
		return err
	}
	if err := n.awaitCluster(ctx); err != nil {
		return fail(err)
	}
	if err := n.openDataDir(); err != nil {
		return fail(err)
	}
	// The raft ID (the directory's first start) is this process's start:
	// the metadata gossiped so far already says so.
	if err = n.openOwner(); err != nil {
		return fail(err)
	}
	n.serve(lis)
	return nil
}

// awaitCluster waits, within ctx and the join timeout, until gossip shows
// a member of this node's placement with a cluster id, and adopts it.
func (n *Node) awaitCluster(ctx context.Context) error {
	limit := time.NewTimer(max(n.cfg.JoinTimeout, time.Second))
	defer limit.Stop()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		members := map[string][]byte{}
		for _, m := range n.gossiper.ml.Members() {
			members[m.Name] = m.Meta
		}
		if id := n.gossiper.adoptCluster(members); id != 0 {
			return nil
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("peer: data directory %s: waiting for the cluster id from gossip: %w", n.cfg.DataDir, ctx.Err())
		case <-limit.C:
			return fmt.Errorf("peer: data directory %s: no member gossiped a cluster id within %v", n.cfg.DataDir, max(n.cfg.JoinTimeout, time.Second))
		}
	}
}

// openOwner makes the node's ownership driver (n.lo) and wires the
// decisions to it: its runner is their lease, and with a data directory
// they log to it. Its goroutines start with n.lo.start.
func (n *Node) openOwner() error {
	e := &ownerEnv{
		ctx: n.ctx, wg: &n.wg, name: n.name, start: n.ops.start, raftID: n.raftID(), log: n.log, metrics: n.metrics,
		clock: n.clock, mono: n.mono,
		parts: n.pt.parts, lease: n.cfg.LeaseDuration, failedGone: n.cfg.FailedMemberTimeout, forwardTimeout: n.cfg.ForwardTimeout,
		chunkBytes: n.cfg.TransferChunkBytes, founder: len(n.cfg.Join) == 0, emptyAfter: n.table.growEmptyWait(n.table.Load()),
		view: &n.view, table: &n.table, copyUnsent: &n.hooks.copyUnsent,
		newStore: n.pt.newStore,
		linkConn: func(name, addr string) (*grpc.ClientConn, peerpb.LimiterClient, error) {
			var c *peerLink
			var err error
			if addr == "" {
				c, err = n.links.to(name)
			} else {
				c, err = n.links.dial(name, addr)
			}
			if err != nil {
				return nil, nil, err
			}
			return c.conn, c.stub, nil
		},
		barrier: n.links.replBarrier, warn: n.warns.warn, ready: n.ops.ready.update,
		policyStamp: func(req *peerpb.ReplicateRequest, member string) {
			n.table.stamp(req, member, opsPolicies(req.Ops))
		},
		leaveRing: n.gossiper.excludeSelf,
	}
	if n.dd != nil {
		e.disk, e.restore, e.transition = n.dd.raft, n.dd.parts.restore, n.dd.parts.transition
	}
	lo, err := newLogOwner(e)
	if err != nil {
		return err
	}
	n.lo = lo
	n.part.Lease = lo.run
	if n.dd != nil {
		n.part.Disk = diskLog{n.dd}
	}
	return nil
}

// newGossiperEnv is n's gossiperEnv; called once in New, before the
// ownership driver is open (the funcs that reach it read n.lo when
// called).
func (n *Node) newGossiperEnv() *gossiperEnv {
	return &gossiperEnv{
		ctx: n.ctx, wg: &n.wg, name: n.name, log: n.log, metrics: n.metrics, cfg: &n.cfg, fp: n.fp,
		closing: &n.closing, view: &n.view, hooks: &n.hooks,
		meta:  n.meta,
		fresh: func(ctx context.Context, ids []string) map[string]bool { return n.lo.run.Fresh(ctx, ids) },
		ownerView: func(v *view, evs []membership.Event, starts, raftIDs, heirs map[string]uint64, targets []string) {
			n.lo.setView(v, evs, starts, raftIDs, heirs, targets)
		},
		logAddrs:       func(alive map[string]string) map[string]string { return n.lo.withLogAddrs(alive) },
		dropLinks:      n.links.drop,
		resetLink:      n.links.dropMember,
		policyVersions: n.table.noteMembers,
		reachStarts:    func(starts map[string]uint64) { n.reach.noteStarts(starts, n.name) },
		ignore:         n.ops.ready.ignore, commitIgnored: n.ops.ready.commitIgnored,
		ready: n.ops.ready.update,
	}
}

// meta is what this node gossips about itself.
func (n *Node) meta(draining bool) membership.Meta {
	addr := n.cfg.RPCAdvertiseAddr
	if addr == "" {
		addr = n.RPCAddr()
	}
	return membership.Meta{Fingerprint: n.fp, RPCAddr: addr, Draining: draining, Start: n.ops.start, Cluster: n.gossiper.clusterID.Load(), Policies: n.table.Load().Version(),
		RaftID: n.raftID(), Heir: n.heirOf()}
}
