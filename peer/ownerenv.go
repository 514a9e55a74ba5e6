package peer

import (
	"context"
	"iter"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/ownlog"
	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// ownerEnv is everything the ownership driver (logOwner: the log, its
// view of the members, copies sent, takeovers, the leave) takes from its
// node, set once when the node opens its log and never changed. The
// driver reaches nothing else of the node: what it reads is here, what it
// changes is the partitions' published state (under each partition's
// lock) and what the funcs below do, and its goroutines join the node's
// group and end with the node's context.
type ownerEnv struct {
	ctx     context.Context // the node's lifetime: cancelled by Close
	wg      *sync.WaitGroup // the node's goroutines; the driver's join it
	name    string          // this node's member name
	start   uint64          // this process's start id (its incarnation)
	raftID  uint64          // this member's raft ID (datadir.go)
	log     *slog.Logger
	metrics Metrics
	clock   func() time.Time // the node's clock: a copy's ages
	mono    func() int64     // the node's monotonic clock: leases

	parts          []part        // every ring partition, as the node publishes it
	lease          time.Duration // Config.LeaseDuration
	failedGone     time.Duration // Config.FailedMemberTimeout
	forwardTimeout time.Duration // Config.ForwardTimeout
	chunkBytes     int           // Config.TransferChunkBytes
	founder        bool          // started without Join: founds the log
	emptyAfter     time.Duration // the log's first EmptyAfter (policies.go)
	disk           *ownlog.Disk  // the log on disk; nil without a data directory

	view  *atomic.Pointer[view]         // the node's current view (ring, members)
	table *atomic.Pointer[policy.Table] // the node's policy table: what a copy carries
	// copyUnsent (tests) fails the copies it returns true for.
	copyUnsent *atomic.Pointer[func(pid int, to string) bool]

	// newStore is an empty store for one partition's keys.
	newStore func() *shard.Store
	// restore refills st with partition pid's state at epoch from the
	// data directory and reports whether it did; transition tells the
	// data directory of a change of this member's part in pid. Both nil
	// without a data directory.
	restore    func(pid int, epoch uint64, st *shard.Store) bool
	transition func(pid int, had, holds, backs bool, epoch uint64, st *shard.Store)
	// link is the per-peer link to member name (dialled at addr when
	// addr is set, else at the address its view lists).
	link func(name, addr string) (*peerLink, error)
	// barrier waits until the replication queued to member to is
	// answered, within ctx (replicate.go).
	barrier func(ctx context.Context, to string) error
	// stamp sets a replication message's policy version (replicate.go).
	stamp func(req *peerpb.ReplicateRequest, member string, names iter.Seq[string])
	// warn logs a degraded-service warning, throttled node-wide.
	warn func(msg string, args ...any)
	// ready recomputes the node's readiness (ready.go).
	ready func()
	// leaveRing takes this node out of its own ring and waits, briefly,
	// for the view without it (membership.go).
	leaveRing func(ctx context.Context)
}

// openOwner makes the node's ownership driver (n.lo) and wires the
// decisions to it: its runner is their lease, and with a data directory
// they log to it. Its goroutines start with n.lo.start.
func (n *Node) openOwner() error {
	e := &ownerEnv{
		ctx: n.ctx, wg: &n.wg, name: n.name, start: n.ops.start, raftID: n.raftID(), log: n.log, metrics: n.metrics,
		clock: n.clock, mono: n.mono,
		parts: n.pt.parts, lease: n.cfg.LeaseDuration, failedGone: n.cfg.FailedMemberTimeout, forwardTimeout: n.cfg.ForwardTimeout,
		chunkBytes: n.cfg.TransferChunkBytes, founder: len(n.cfg.Join) == 0, emptyAfter: n.emptyAfter(n.table.Load(), 0),
		view: &n.view, table: &n.table, copyUnsent: &n.hooks.copyUnsent,
		newStore: n.newPartStore,
		link: func(name, addr string) (*peerLink, error) {
			if addr == "" {
				return n.linkTo(name)
			}
			return n.dialLink(name, addr)
		},
		barrier: n.replBarrier, stamp: n.stampPolicies, warn: n.warnThrottled, ready: n.updateReady,
		leaveRing: n.gossip.excludeSelf,
	}
	if n.dd != nil {
		e.disk, e.restore, e.transition = n.dd.raft, n.restorePartition, n.durableTransition
	}
	lo, err := newLogOwner(e)
	if err != nil {
		return err
	}
	n.lo = lo
	n.part.Lease = lo.run
	if n.dd != nil {
		n.part.Disk = diskLog{n}
	}
	return nil
}
