package peer

import (
	"context"
	"errors"
	"fmt"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/shard"
)

// This file keeps the node's ownership bookkeeping that is not the log's
// (logown.go drives the log): the clocks leases are timed on, members
// whose gRPC port does not answer (probed here; marked in reach.go), the
// takeovers' summary lines (tallied in takeovers.go), the partition
// stores, and readiness's Settled.

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

// logTakeovers warns once per failed holder whose partitions were taken
// over, once no more of them have been for a lease (a crash's takeovers
// spread over several reconcile rounds): how many partitions and keys,
// over how long. Each partition also has a Debug line. With all, every
// tally is logged now (the node is closing).
func (n *Node) logTakeovers(all bool) {
	for holder, t := range n.tookOver.due(n.mono(), int64(n.cfg.LeaseDuration), all) {
		n.log.Warn("partitions taken over from failed holder", "peer", holder, "partitions", t.partitions, "keys", t.keys, "took", time.Duration(t.last-t.first))
	}
}

// rpcTimeout bounds one ownership RPC (one chunk of a copy, a promote).
func (n *Node) rpcTimeout() time.Duration { return max(10*n.cfg.ForwardTimeout, 5*time.Second) }

// newPartStore returns an empty store for one partition's keys. MaxKeys is
// shared out evenly: each partition may hold MaxKeys/partitions keys (at
// least 64), on whichever member holds or backs it up, so that a member
// holds at most MaxKeys keys however many partitions it has (Config.Store)
// and any partition's copy fits on any member.
func (n *Node) newPartStore() *shard.Store {
	cfg := n.cfg.Store
	cfg.Stripes = partStripes
	if cfg.MaxKeys > 0 {
		cfg.MaxKeys = max(64, cfg.MaxKeys/len(n.pt.parts))
	}
	st, err := shard.NewStore(cfg)
	if err != nil {
		// cfg was validated in New; NewStore only fails on bad values.
		panic(fmt.Sprintf("peer: partition store: %v", err))
	}
	return st
}

// partStripes is the lock stripes of one partition's store.
const partStripes = 16

// heldPartitions counts the partitions this node holds or is moving, and
// their keys.
func (n *Node) heldPartitions() (parts, keys int) {
	for i := range n.pt.parts {
		pt := &n.pt.parts[i]
		pt.Mu.RLock()
		if pt.Role == partition.RoleHolder || pt.Role == partition.RoleFenced {
			parts++
			if pt.Store != nil {
				keys += pt.Store.Len()
			}
		}
		pt.Mu.RUnlock()
	}
	return parts, keys
}

var errNoPeer = errors.New("peer: member not in view")

// excludeSelf rebuilds the node's ring without itself (it is draining, so
// it is nobody's target) and waits, briefly, for the new view. When every
// member is leaving (this one the last), the rebuild keeps the ring and
// marks the view stopping: that view ends the wait too.
func (n *Node) excludeSelf(ctx context.Context) {
	ch := n.viewChanged()
	n.nudge()
	t := time.NewTimer(200 * time.Millisecond)
	defer t.Stop()
	for v := n.view.Load(); v.snap.Has(n.name) && !v.stopping; v = n.view.Load() {
		select {
		case <-ch:
			ch = n.viewChanged()
		case <-t.C:
			return // no other member: the ring keeps only us
		case <-ctx.Done():
			return
		}
	}
}

// Settled reports whether ownership on this node matches its ring: it
// holds, not fenced, every partition its ring names it the target of, each
// with its backup copy in place when the ring has another member, and
// holds none that belong to another member. A cluster whose members are
// all settled (and agree on the members) has finished moving partitions.
func (n *Node) Settled() bool {
	return n.lo.settled(n.view.Load())
}
