package peer

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ringlimit/ringlimit/peer/internal/connlimit"
	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/peer/internal/transport"
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

// rpcServer is the node's RPC server: gRPC, and framed pipes beside it.
type rpcServer struct {
	grpc   *grpc.Server
	framed *transport.Server
}

// Stop ends every RPC and pipe at once.
func (s *rpcServer) Stop() {
	s.framed.Stop(false)
	s.grpc.Stop()
}

// GracefulStop stops accepting, lets gRPC calls finish and answers what
// framed pipes have read.
func (s *rpcServer) GracefulStop() {
	done := make(chan struct{})
	go func() { s.framed.Stop(true); close(done) }()
	s.grpc.GracefulStop()
	<-done
}

// Name returns the node's member name.
func (n *Node) Name() string { return n.name }

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
	// DataDirSyncTime is the wall time those fsyncs took, added up.
	DataDirSyncTime time.Duration
	// DataDirAsyncSync: those fsyncs run on an io_uring, their waiters
	// parked (Linux); false where the kernel refused one, the log then
	// calling a blocking fsync.
	DataDirAsyncSync bool
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
		s.DataDirSyncTime = n.dd.parts.parts.SyncTime()
		s.DataDirAsyncSync, _ = n.dd.parts.parts.AsyncSync()
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
