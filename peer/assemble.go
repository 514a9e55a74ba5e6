package peer

import (
	"context"

	"github.com/ringlimit/ringlimit/peer/internal/membership"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"google.golang.org/grpc"
)

// How New assembles the node's parts: each part (the ownership driver,
// the membership) gets an env of what it takes from the node, built
// here, so that the part's own file reaches nothing else of it.

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
