package peer

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ringlimit/ringlimit/peer/internal/connlimit"
	"github.com/ringlimit/ringlimit/peer/internal/membership"
	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/peer/internal/transport"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// Node is one ringlimit peer: gossip membership, the hash ring, the local
// store for the keys it owns, and the gRPC server and clients that forward
// every other key to its owner. It is safe for concurrent use. Create it with
// New and stop it with Close.
type Node struct {
	cfg     Config
	name    string
	log     *slog.Logger
	clock   func() time.Time
	metrics Metrics
	fp      uint64
	// table is the policy table, loaded once per request, with the
	// versions the members gossip (policies.go).
	table policyTable

	pt    *partTable    // every ring partition as this node sees it
	reach *reachability // members whose gRPC port does not answer (reach.go)
	// failure answers what a holder could not decide, with the local
	// fallback log (failure.go).
	failure failurePolicy
	spread  spreader // this node's spread keys as a grantee (spread.go)
	hot     *shard.HotKeys
	started time.Time // origin of the monotonic clock (mono)
	// wall is the default clock (clock.go), set when Config.Clock is
	// nil: one reading then serves as both the decision time and the
	// lease clock.
	wall *wallClock
	// stopped is set once Close has stopped the node: calls get ErrClosed.
	stopped atomic.Bool
	// view is the current ring and members, published by gossip.
	view atomic.Pointer[view]
	// gossiper is the membership (membership.go): memberlist, its events,
	// the cluster id, the views it rebuilds.
	gossiper *gossiper

	grpcSrv  *rpcServer
	health   *health.Server
	rpcLis   net.Listener
	rpcConns *connlimit.Listener // rpcLis within RPCLimits' connection bounds

	// links are the node's links to its peers: forwarding, replication
	// and what they share (forward.go).
	links peerLinks

	ctx    context.Context // the node's lifetime; cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// part is what the decisions on this node's partitions are given
	// (decide.go, internal/partition).
	part      partition.Env
	closing   atomic.Bool
	closeOnce sync.Once
	closeErr  error
	closed    chan struct{}
	warns     warnThrottle // degraded-service warnings, at most one a second
	// hooks are the faults tests inject (hooks.go).
	hooks faultHooks
	// framedServed counts, by kind, the framed pipes peers opened to
	// this node (tests read them).
	framedServed [3]atomic.Int64

	ops opsState // restarts, duplicate names, readiness, reconnects, peer auth

	// lo drives ownership through the replicated log (logown.go).
	lo *logOwner
	// dd is the data directory (datadir.go); nil without one.
	dd *dataDir
}

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
	n.health = health.NewServer()
	n.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	n.setupAuth()
	n.links.env = n.newLinkEnv()
	n.serveRPC(lis)
	return nil
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

// Name returns the node's member name.
func (n *Node) Name() string { return n.name }

// meta is what this node gossips about itself.
func (n *Node) meta(draining bool) membership.Meta {
	addr := n.cfg.RPCAdvertiseAddr
	if addr == "" {
		addr = n.RPCAddr()
	}
	return membership.Meta{Fingerprint: n.fp, RPCAddr: addr, Draining: draining, Start: n.ops.start, Cluster: n.gossiper.clusterID.Load(), Policies: n.table.Load().Version(),
		RaftID: n.raftID(), Heir: n.heirOf()}
}

// closeGrace is how long Close waits for the node's goroutines before the
// caller's deadline counts (their RPCs have just been cut short).
const closeGrace = 2 * time.Second

// leaveLinger is how long a leaving node keeps serving redirects after
// announcing its leave; a few gossip rounds at LAN timings.
const leaveLinger = 200 * time.Millisecond

// RingInfo describes the node's current ring, read from one snapshot.
type RingInfo struct {
	// Version is the local ring version.
	Version uint64
	// Members are the member names, sorted.
	Members []string
	// Partitions is the ring's partition count.
	Partitions int
	// PartitionsOwned is how many partitions this node owns.
	PartitionsOwned int
}

// Ring returns the node's current ring, from one snapshot.
func (n *Node) Ring() RingInfo {
	s := n.view.Load().snap
	return RingInfo{Version: s.Version(), Members: s.Members(), Partitions: s.Config().PartitionCount, PartitionsOwned: s.PartitionsOwned(n.name)}
}

// RPCAddr returns the bound gRPC address (host:port).
func (n *Node) RPCAddr() string { return n.rpcLis.Addr().String() }

// GossipAddr returns the bound gossip address (host:port).
func (n *Node) GossipAddr() string {
	ln := n.gossiper.ml.LocalNode()
	return net.JoinHostPort(ln.Addr.String(), fmt.Sprint(ln.Port))
}

// Members returns the names of the members in the node's current ring,
// sorted. The caller owns the slice.
func (n *Node) Members() []string { return n.view.Load().snap.Members() }

// RingVersion returns the node's local ring version: it increases by one
// each time the member set changes.
func (n *Node) RingVersion() uint64 { return n.view.Load().snap.Version() }

// Owner returns the member that the node's current ring names as the
// target of key's partition: its holder once any move has finished. Keys
// are placed by tenant and subject, so every policy of one subject has the
// same owner.
func (n *Node) Owner(key Key) (string, error) {
	var buf [shard.MaxEncodedKeyLen]byte
	ek, ok := key.AppendEncoded(buf[:0])
	if !ok {
		return "", fmt.Errorf("%w: %w", ErrInvalidKey, key.Validate())
	}
	return n.view.Load().snap.Owner(placement(ek)), nil
}

// Policies returns a copy of the node's current policy table.
func (n *Node) Policies() map[string]PolicyConfig {
	return n.table.Load().Configs()
}

// Stats describes the local stores.
type Stats struct {
	// Keys is the number of keys held in partitions this node holds.
	Keys int
	// Bytes estimates the memory those keys hold.
	Bytes int64
	// Partitions is how many partitions this node holds.
	Partitions int
	// ReplicaKeys is the number of keys in the copies this node keeps as a
	// backup.
	ReplicaKeys int
	// DataDirSyncs is how many fsyncs the data directory's partition log
	// has done since the node started (0 without a data directory).
	DataDirSyncs uint64
}

// Stats returns the local stores' sizes.
func (n *Node) Stats() Stats {
	var s Stats
	for i := range n.pt.parts {
		pt := &n.pt.parts[i]
		pt.Mu.RLock()
		if pt.Store != nil && (pt.Role == partition.RoleHolder || pt.Role == partition.RoleFenced) {
			s.Partitions++
			s.Keys += pt.Store.Len()
			s.Bytes += pt.Store.Bytes()
		}
		if pt.Store != nil && pt.Role != partition.RoleHolder && pt.Role != partition.RoleFenced && pt.Rep.Complete {
			// A backup's complete copy is the partition's store.
			s.ReplicaKeys += pt.Store.Len()
		}
		pt.Mu.RUnlock()
	}
	if n.dd != nil && n.dd.parts != nil {
		s.DataDirSyncs = n.dd.parts.parts.Syncs()
	}
	return s
}

// HotKeys returns up to Config.HotKeys of the heaviest keys this node holds,
// heaviest first, by time-decayed hit rate. The caller owns the slice.
//
// What it guarantees: the holder records one decision in 8, chosen at
// random, with 8 times its hits, into a Space-Saving sketch of 4 ×
// Config.HotKeys counters (this keeps the sketch's lock off most
// decisions). Rates are therefore estimates: a key with a few dozen hits
// may be missed, and each rate may be off by the sketch's smallest counter
// plus sampling noise (relative error about 1/sqrt(hits/8)). A key taking
// more than 1/(4 × HotKeys) of a node's traffic for a few seconds is
// reported. Only keys this node decided for as holder are counted.
func (n *Node) HotKeys() []HotKey {
	top := n.hot.Top(n.cfg.HotKeys, n.clock())
	out := make([]HotKey, 0, len(top))
	for _, h := range top {
		k, err := shard.DecodeKey(h.Key)
		if err != nil {
			continue // only valid encodings are ever recorded
		}
		out = append(out, HotKey{Key: k, Rate: h.Rate})
	}
	return out
}

// every calls fn every d until the node closes. It runs on a goroutine the
// node owns (counted in wg by the caller).
func (n *Node) every(d time.Duration, fn func()) {
	defer n.wg.Done()
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
			fn()
		}
	}
}

// mono returns the node's monotonic clock in nanoseconds. Leases are timed
// on it, never on Config.Clock: a paused process does not stop it, and wall
// clock steps cannot move it.
func (n *Node) mono() int64 { return int64(time.Since(n.started)) }

// now returns the node clock and the monotonic clock for one decision,
// reading the system clock once when Config.Clock is the default.
func (n *Node) now() (time.Time, int64) {
	if n.wall != nil {
		return n.wall.read()
	}
	return n.clock(), n.mono()
}

// checkReachable asks member, on a goroutine the node owns, for its gRPC
// health; no answer within ForwardTimeout marks it unreachable, an answer
// clears the mark. One check per member at a time. It is n.reach's probe.
func (n *Node) checkReachable(member string) {
	if n.closing.Load() || !n.reach.claim(member) {
		return
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer n.reach.done(member)
		c, err := n.links.to(member)
		if err == nil {
			ctx, cancel := context.WithTimeout(n.ctx, n.cfg.ForwardTimeout)
			_, err = healthpb.NewHealthClient(c.conn).Check(ctx, &healthpb.HealthCheckRequest{})
			cancel()
		}
		switch {
		case n.ctx.Err() != nil:
		case err != nil:
			n.reach.mark(member, n.mono())
		default:
			n.reach.clear(member)
		}
	}()
}

// Sweep reclaims idle keys and refreshes key and hot-key metrics. The node
// calls it every SweepInterval; tests may call it directly.
func (n *Node) Sweep() {
	now := n.clock()
	ev := n.failure.fallback.Sweep(now, 0)
	for i := range n.pt.parts {
		pt := &n.pt.parts[i]
		pt.Mu.RLock()
		st := pt.Store
		pt.Mu.RUnlock()
		// A store's own locks cover its sweep (a backup's copy is its
		// store too); a store that has just been given away is swept
		// harmlessly.
		if st != nil {
			ev += st.Sweep(now, 0)
		}
	}
	if ev > 0 {
		n.metrics.Evicted(ev)
	}
	st := n.Stats()
	n.metrics.Keys(st.Keys, st.Bytes)
	n.metrics.HotKeys(n.HotKeys())
}

// Close leaves the cluster gracefully: it announces that it is leaving (no
// partition targets it any more), transfers every partition it holds to
// its new holder within ctx's deadline (calls made meanwhile are still
// routed: they wait for the move or go to the new holder), leaves gossip,
// stops the gRPC server and waits for every goroutine the node started;
// from then on calls return ErrClosed. It is idempotent and safe while Allow calls
// are in flight; later calls return the first call's result.
func (n *Node) Close(ctx context.Context) error {
	n.closeOnce.Do(func() {
		n.closeErr = n.close(ctx)
		close(n.closed)
	})
	<-n.closed
	return n.closeErr
}

func (n *Node) close(ctx context.Context) error {
	n.closing.Store(true)
	n.ops.ready.update() // not serving from here on
	var errs []error
	// Announce the drain first, so peers log our departure as a leave,
	// not a failure. Best effort: a slow gossip only changes the log line.
	n.gossiper.delegate.SetMeta(n.meta(true))
	_ = n.gossiper.ml.UpdateNode(200 * time.Millisecond)
	n.gossiper.announceLeave()
	drainErr := n.lo.drain(ctx)
	if drainErr != nil {
		errs = append(errs, drainErr)
	}
	leaveTimeout := 2 * time.Second
	if n.view.Load().stopping || errors.Is(drainErr, errNoLeader) {
		// Every member is leaving: the broadcast is a courtesy to
		// members that are going too. Or the log has no leader: most
		// members are unreachable, and the leave is not graceful anyway.
		leaveTimeout = 200 * time.Millisecond
	}
	if dl, ok := ctx.Deadline(); ok {
		leaveTimeout = max(min(time.Until(dl), leaveTimeout), 10*time.Millisecond)
	}
	if err := n.gossiper.ml.Leave(leaveTimeout); err != nil {
		if n.view.Load().stopping {
			// Every member is leaving: nobody is left to hear it.
			n.log.Debug("leave not broadcast: every member is leaving", "err", err)
		} else {
			// Not an error of Close: the drain has moved everything off
			// and ended this member's liveness in the log, and its
			// metadata already says it is draining. Peers that miss the
			// broadcast log the departure as a failure instead.
			n.log.Warn("leave not broadcast in time: peers may log this node as failed rather than left", "err", err)
		}
	}
	if v := n.view.Load(); v.snap.Len() > 1 && !v.stopping && !errors.Is(drainErr, errNoLeader) {
		// Peers learn of the leave by gossip, a little later. Until then
		// they still forward to us; keep answering (with "not owner, ask
		// <new holder>") for a moment rather than refuse their connections.
		t := time.NewTimer(leaveLinger)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	if err := n.gossiper.ml.Shutdown(); err != nil {
		errs = append(errs, fmt.Errorf("peer: shut down gossip: %w", err))
	}
	n.stopped.Store(true)
	n.lo.shutdown()
	n.cancel()
	stopped := make(chan struct{})
	go func() { n.grpcSrv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		n.grpcSrv.Stop()
		<-stopped
	}
	n.links.stopAll()
	// Every goroutine the node started stops on n.ctx; wait for them, but
	// never forever: a goroutine stuck past the deadline (plus a grace for
	// RPCs cut short just now) is a bug to report, not a reason to hang the
	// caller's shutdown.
	waited := make(chan struct{})
	go func() { n.wg.Wait(); close(waited) }()
	grace := time.NewTimer(closeGrace)
	defer grace.Stop()
	select {
	case <-waited:
	case <-grace.C:
		select {
		case <-waited:
		case <-ctx.Done():
			n.log.Error("node goroutines did not stop by the close deadline")
			errs = append(errs, fmt.Errorf("peer: goroutines still running at the close deadline: %w", ctx.Err()))
		}
	}
	// After every goroutine and call that could write to it.
	n.closeDataDir()
	n.gossiper.mlLog.Close()
	n.log.Info("node closed")
	return errors.Join(errs...)
}
