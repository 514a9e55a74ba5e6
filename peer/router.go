package peer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/connectivity"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/shard"
)

// route finds the partition's holder and gets its decision: here, or by
// forwarding. The path goes down, never back: look up the partition's
// state, then decide here, forward, or wait for a transfer.
func (n *Node) route(ctx context.Context, r *opReq, ek []byte) (Decision, error) {
	var d Decision
	err := n.routeInto(ctx, r, ek, &d)
	return d, err
}

// routeInto is route with its Decision written to *d: the decision is
// built once, in the caller's memory, rather than copied up through every
// return on the way (a Decision is too large for registers, and each copy
// costs more than building it). Each turn of its loop, top to bottom:
// decide here; wait for a move here; decide from rights (a spread key);
// forward to the holder; else retry where the answer points, or the
// failure policy.
func (n *Node) routeInto(ctx context.Context, r *opReq, ek []byte, d *Decision) error {
	v := n.view.Load()
	// One hash places the key on the ring and picks its shard stripe.
	pk := shard.Place(ek)
	pid := v.snap.PartitionOfHash(pk.Hash())
	pt := &n.pt.parts[pid]
	var rt routing
	for {
		v = n.view.Load()
		// Decide here.
		st, ch, err := n.decideHere(ctx, v, pt, r, pk, d)
		if st == partition.Decided {
			if err != nil {
				return n.fail(r, d, err)
			}
			n.metrics.Decision(r.P.Name, d.Reason, PathLocal)
			return nil
		}
		rt.start(n)
		// Wait for a move here, or for a transfer to this node.
		if st == partition.Wait {
			if err := n.waitPart(ctx, ch, rt.moveUntil); err != nil {
				return n.fail(r, d, fmt.Errorf("%w: partition %d is moving: %w", ErrUnavailable, pid, err))
			}
			continue
		}
		target := rt.next(n, v, pt, pid)
		if target == "" {
			// This node is the target but not yet the holder: the
			// transfer is on its way. Wait briefly, then ask around.
			t0 := time.Now()
			until := rt.waitUntil
			if t := t0.Add(notOwnerPause); t.Before(until) {
				until = t
			}
			if err := n.waitPart(ctx, ch, until); err != nil && time.Now().After(rt.waitUntil) {
				return n.fail(r, d, fmt.Errorf("%w: partition %d has no holder yet: %w", ErrUnavailable, pid, err))
			}
			rt.waited += time.Since(t0)
			continue
		}
		// Decide from rights the holder granted this node.
		if n.spread.decide(v, r, ek, d) {
			n.metrics.Decision(r.P.Name, d.Reason, PathLocal)
			return nil
		}
		// Forward.
		fd, err := n.links.forward(ctx, v, target, r)
		if err == nil {
			*d = fd
			n.metrics.Decision(r.P.Name, d.Reason, PathForwarded)
			return nil
		}
		// Else go again where the answer points, or fail.
		if err := n.afterForward(ctx, &rt, v, target, r, err); err != nil {
			return n.fail(r, d, err)
		}
	}
}

// fail answers r by the failure policy (failure.go) for cause.
func (n *Node) fail(r *opReq, d *Decision, cause error) error {
	var err error
	*d, err = n.failure.unavailable(r, cause)
	return err
}

// routing is one request's route so far: its bounds, once it could not be
// decided at once, and the answers that redirected it.
type routing struct {
	// waitUntil bounds the wait for a holder; moveUntil the wait for a
	// partition that is moving (fenced for a transfer, here or at its
	// holder): longer than a forward, so that callers wait for a graceful
	// move rather than fail (issue 53 item 14: "partition N is moving"
	// during a leave). Both are read from the clock only once a request
	// cannot be decided at once: the local path reads the clock once.
	waitUntil, moveUntil time.Time
	redirect             string // the member the last answer named, to ask next
	redirects            int
	prevTarget           string // the member a not-owner answer came from before the last
	waited               time.Duration
}

// start sets the bounds, at the first turn that did not decide.
func (rt *routing) start(n *Node) {
	if rt.waitUntil.IsZero() {
		now := time.Now()
		rt.waitUntil, rt.moveUntil = now.Add(n.cfg.ForwardTimeout), now.Add(n.moveWait())
	}
}

// next is the member to forward to: the one the last answer named, else
// routeTarget's; "" to wait for a transfer to this node.
func (rt *routing) next(n *Node, v *view, pt *part, pid int) string {
	target := rt.redirect
	rt.redirect = ""
	if target == "" {
		target = n.routeTarget(v, pt, pid, rt.waited)
	}
	return target
}

// afterForward reads a forward's failure: nil to route again (the holder
// was moving, the target's port is dead and r may be resent, or the
// target named another holder), else the cause to fail with.
func (n *Node) afterForward(ctx context.Context, rt *routing, v *view, target string, r *opReq, err error) error {
	if errors.Is(err, errMoving) && time.Now().Before(rt.moveUntil) {
		// The holder waited for the move and did not decide: ask again,
		// where the partition is once it has moved (safe for every
		// operation: nothing was decided).
		if err := n.awaitView(ctx, v); err != nil && ctx.Err() != nil {
			return errors.Join(err, ctx.Err())
		}
		return nil
	}
	var no *notOwnerError
	if !errors.As(err, &no) {
		if rt.redirects < n.cfg.NotOwnerRetries && n.portDead(target) {
			// Gossip lists the target but its port refuses connections
			// (a firewall, a wrong advertised address): mark it, and
			// route as if it were not the target. A refund or a reset is
			// not sent again (resendable); the mark still spares the
			// requests after it.
			n.reach.mark(target, n.mono())
			if r.Op.Spec().Resendable {
				n.metrics.Forward(target, "resent", 0)
				rt.redirects++
				return nil
			}
		}
		return err
	}
	cause := err
	// A receiver that names the member asked just before it sends the
	// request back where it came from: two views on either side of a
	// commit, which ping-ponged a request through its hops.
	asked := rt.prevTarget
	rt.prevTarget = target
	if no.owner != "" && no.owner != target && no.owner != n.name && no.owner != asked {
		// The log's table is the only record of holders: follow the
		// receiver's, learn nothing. NotOwnerRetries bounds these hops.
		rt.redirects++
		if rt.redirects > n.cfg.NotOwnerRetries || time.Now().After(rt.moveUntil) {
			return cause
		}
		rt.redirect = no.owner
		return nil
	}
	// The receiver names nobody new (itself, the member asked before it,
	// or this node): the holder is changing and the views have not caught
	// up with the log's commit. Wait for this node's view, within a move's
	// bound (moveWait), rather than spend the hops: a graceful move
	// answered callers "not owner" when its commit outlasted three short
	// waits (issue 53 item 14).
	if time.Now().After(rt.moveUntil) {
		return cause
	}
	if err := n.awaitView(ctx, v); err != nil {
		return errors.Join(cause, err)
	}
	return nil
}

// routeTarget is where a request for partition pid goes when this node does
// not hold it: the holder it knows of, else the ring's target; "" when this
// node is the target and should wait for the transfer (after waiting a
// while, the ring's next owner, which knows where the partition is).
func (n *Node) routeTarget(v *view, pt *part, pid int, waited time.Duration) string {
	pt.Mu.RLock()
	r, holder := pt.Role, pt.Holder
	pt.Mu.RUnlock()
	if r == partition.RoleHint && holder != n.name {
		if _, ok := v.alive[holder]; ok {
			return holder
		}
	}
	t := v.snap.PartitionOwner(pid)
	if t != n.name && !n.reach.is(t, n.mono()) {
		return t
	}
	if t != n.name || waited >= 2*notOwnerPause {
		// The ring's next owner: it holds the partition, or knows who
		// does, when the target does not answer or has not received it.
		if b := v.snap.PartitionBackup(pid); b != n.name {
			return b
		}
		return t
	}
	return ""
}

// portDead reports whether member's connection has failed (its port
// refuses connections or does not answer), not merely whether one call
// failed.
func (n *Node) portDead(member string) bool {
	if h := n.hooks.portDead.Load(); h != nil {
		return (*h)(member)
	}
	c, err := n.links.to(member)
	return err == nil && c.conn.GetState() == connectivity.TransientFailure
}

// waitPart waits for ch (a partition change), a short pause, or the
// deadline; it returns an error only when ctx or the deadline ended.
func (n *Node) waitPart(ctx context.Context, ch <-chan struct{}, until time.Time) error {
	d := time.Until(until)
	if d <= 0 {
		return context.DeadlineExceeded
	}
	t := time.NewTimer(min(d, notOwnerPause))
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
		if time.Now().After(until) {
			return context.DeadlineExceeded
		}
	case <-ctx.Done():
		return ctx.Err()
	case <-n.ctx.Done():
		return ErrClosed
	}
	return nil
}

// awaitView waits until the node's view differs from v, bounded by ctx and a
// short pause (the other side may have caught up instead).
func (n *Node) awaitView(ctx context.Context, v *view) error {
	ch := n.gossiper.viewChanged()
	if n.view.Load() != v {
		return nil
	}
	t := time.NewTimer(notOwnerPause)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-n.ctx.Done():
		return ErrClosed
	}
}

const notOwnerPause = 50 * time.Millisecond

// moveWait bounds how long a call waits for a partition that is moving,
// here or at its holder, before it fails as unavailable: four forward
// timeouts, at least 2 s (the caller's context may end it sooner). A
// graceful move (a leave, a join) fences a partition for a copy and a
// commit; a forward's timeout alone was too short on a loaded machine.
func (n *Node) moveWait() time.Duration { return max(4*n.cfg.ForwardTimeout, 2*time.Second) }
