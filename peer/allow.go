package peer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/connectivity"

	"github.com/ringlimit/ringlimit/peer/internal/grantee"
	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// Allow decides one request. It routes the key to its owner (this node, or a
// peer over gRPC), and returns the owner's decision. Over limit is a
// Decision with Allowed == false and a nil error. When the owner cannot be
// reached in time the policy's OnUnavailable applies: fail closed returns an
// error wrapping ErrUnavailable (and the cause, such as
// context.DeadlineExceeded); fail open and fallback return a Decision whose
// Reason says so. Invalid input returns an error wrapping ErrInvalidKey,
// ErrInvalidHits or ErrUnknownPolicy and changes nothing. After Close it
// returns ErrClosed. Safe for concurrent use; the local path does not
// allocate.
func (n *Node) Allow(ctx context.Context, req Request) (Decision, error) {
	if len(req.Policies) > 0 {
		return n.do(ctx, peerpb.Op_OP_CHECK, req)
	}
	// A closing node keeps routing while it drains (it holds fewer and
	// fewer partitions and forwards the rest); only once Close has
	// stopped it do calls fail. (An atomic flag: a context's Err takes a
	// lock every caller would contend on.)
	if n.stopped.Load() {
		return Decision{}, ErrClosed
	}
	// ek is appended to buf and travels beside r, not in it: r's strings
	// leak (to replication, the fallback store), and escape analysis would
	// move the buffer ek points into to the heap with them.
	var buf [shard.MaxEncodedKeyLen]byte
	var r opReq
	ek, err := n.parseReqInto(&r, peerpb.Op_OP_CHECK, req.Key, nil, req.Hits, buf[:0])
	if err != nil {
		return Decision{}, err
	}
	var d Decision
	err = n.routeInto(ctx, &r, ek, &d)
	return d, err
}

// Peek answers what Allow would decide now for req, recording nothing: the
// Decision's Reason is ReasonPeek and Allowed says whether the request
// would be admitted. It goes to the key's holder like Allow; when the
// holder cannot be reached it returns an error wrapping ErrUnavailable
// (peeks never fail open).
func (n *Node) Peek(ctx context.Context, req Request) (Decision, error) {
	return n.do(ctx, peerpb.Op_OP_PEEK, req)
}

// Refund gives back up to req.Hits units (zero means 1) of the key's
// admissions still inside the window, newest first, never below empty, and
// returns the key's new state (Reason ReasonRefunded; Allowed reports
// whether anything was given back). Hits above the policy's limit (for
// the key, overrides applied) is ErrInvalidHits and changes nothing: the
// key never holds more. Any caller may refund any key's admissions; on
// the public gRPC API Config.AuthorizeRefund says who may. For token_bucket it moves the bucket
// back by that many units' worth, never past full; for fixed_window it
// lowers the current window's count, never below zero. Decided by the
// key's holder and replicated like an admission, but answered as done
// once the holder has decided it, even if its backup does not confirm it
// (a backup without it only refuses more after a takeover): a caller
// that asks again after an error must not give a unit back twice. Only
// an answer lost on its way back (a forward that timed out) leaves a
// refund's outcome unknown.
func (n *Node) Refund(ctx context.Context, req Request) (Decision, error) {
	return n.do(ctx, peerpb.Op_OP_REFUND, req)
}

// Reset clears key's state at its holder (an operator action) and
// replicates the reset: the key starts empty. Reason is ReasonReset. Like
// a refund, a reset whose forward got no answer is not sent to another
// member (a second reset, decided later, would clear what was admitted in
// between): the error wraps ErrUnavailable and the outcome is unknown.
func (n *Node) Reset(ctx context.Context, key Key) (Decision, error) {
	return n.do(ctx, peerpb.Op_OP_RESET, Request{Key: key})
}

// opReq is one validated request: an operation on one key, or a check of
// several policies of one tenant and subject.
type opReq struct {
	op   peerpb.Op
	key  Key    // Policy is "" for a multi-policy request
	ek   []byte // the encoded key (of the first policy for multi): placement
	p    *policy.Entry
	hits int64
	// multi holds the policies of a multi-policy request, names their names.
	multi []*policy.Entry
	names []string
	// deferWait, set by a receiver deciding a batch, makes decideHere
	// leave the wait for a synchronous backup to the caller: it returns
	// the decision with the backup's answer channel in wait, so a batch's
	// admissions reach the backup together instead of one round trip
	// each. The decision must not be answered before wait yields nil.
	deferWait bool
	wait      *replItem // its done yields; then the waiter returns it to the pool
	// lease is the lease id of OP_RELEASE, and of OP_ACQUIRE once granted
	// (lease.go).
	lease    uint64
	leaseTTL time.Duration // the holder's TTL of a granted lease
	// actual is OP_SETTLE's actual cost; estimate and overage its answer
	// (reserve.go).
	actual, estimate, overage int64
	// returns are OP_GRANT's grants to end, granted its answer (spread.go).
	returns []grantee.Return
	granted int64
}

// do validates req for op and routes it.
func (n *Node) do(ctx context.Context, op peerpb.Op, req Request) (Decision, error) {
	if op == peerpb.Op_OP_CHECK && len(req.Policies) == 0 {
		// Allow's single-policy path keeps the key's encoding on the
		// stack: every caller's check (the public API's too,
		// TestPublicAllowAllocs) allocates nothing for it.
		return n.Allow(ctx, req)
	}
	if n.stopped.Load() {
		return Decision{}, ErrClosed
	}
	// r stays on this stack. Its key's encoding does not: escape analysis
	// sees the key's strings leak (to replication, the fallback store)
	// through r and moves all of r's contents, ek too, to the heap.
	var r opReq
	ek, err := n.parseReqInto(&r, op, req.Key, req.Policies, req.Hits, nil)
	if err != nil {
		return Decision{}, err
	}
	r.ek = ek
	return n.route(ctx, &r, r.ek)
}

// parseReq validates a request from a caller or a peer; errors wrap
// ErrInvalidKey, ErrUnknownPolicy or ErrInvalidHits.
func (n *Node) parseReq(op peerpb.Op, key Key, policies []string, hits int64) (*opReq, error) {
	r := &opReq{}
	ek, err := n.parseReqInto(r, op, key, policies, hits, nil)
	if err != nil {
		return nil, err
	}
	r.ek = ek
	return r, nil
}

// parseReqInto is parseReq into r, except that it returns the key's
// encoding (r.ek) for the caller to set: a single-policy key's is appended
// to ekBuf, so a caller with room there spares an allocation, and a store
// through r would make escape analysis move ekBuf to the heap.
func (n *Node) parseReqInto(r *opReq, op peerpb.Op, key Key, policies []string, hits int64, ekBuf []byte) (ek []byte, err error) {
	// Cleared, then set field by field: a composite literal is built
	// aside and copied in, and the copy stalls on the byte just written.
	*r = opReq{}
	r.op, r.key = op, key
	tab := n.table.Load() // once per request
	if hits == 0 {
		hits = 1
	}
	if hits < 0 {
		return nil, fmt.Errorf("%w: hits %d must be at least 1", ErrInvalidHits, hits)
	}
	r.hits = hits
	if len(policies) > 0 {
		if op != peerpb.Op_OP_CHECK && op != peerpb.Op_OP_PEEK {
			return nil, fmt.Errorf("%w: several policies are for checks and peeks only", ErrInvalidKey)
		}
		if key.Policy != "" {
			return nil, fmt.Errorf("%w: give the policy or the list of policies, not both", ErrInvalidKey)
		}
		if len(policies) > shard.MaxMulti {
			return nil, fmt.Errorf("%w: %d policies, at most %d", ErrInvalidKey, len(policies), shard.MaxMulti)
		}
		r.multi = make([]*policy.Entry, 0, len(policies)) // one allocation, not append's growth
		for i, name := range policies {
			k := Key{Tenant: key.Tenant, Subject: key.Subject, Policy: name}
			if i == 0 {
				// The first policy's key places the request.
				var ok bool
				if ek, ok = k.AppendEncoded(nil); !ok {
					return nil, fmt.Errorf("%w: %w", ErrInvalidKey, k.Validate())
				}
			} else if err := k.Validate(); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrInvalidKey, err)
			}
			for _, prev := range policies[:i] {
				if prev == name {
					return nil, fmt.Errorf("%w: policy %q named twice", ErrInvalidKey, name)
				}
			}
			p := tab.Lookup(name)
			if p == nil {
				return nil, fmt.Errorf("%w: %q", ErrUnknownPolicy, name)
			}
			if p.Shard.Algorithm == shard.Concurrency {
				return nil, errNeedsLease(name)
			}
			p = p.ForKey(key.Tenant, key.Subject)
			if hits > p.Shard.Limit && !p.Unlimited {
				return nil, fmt.Errorf("%w: hits %d exceed policy %q's limit %d", ErrInvalidHits, hits, name, p.Shard.Limit)
			}
			r.multi = append(r.multi, p)
		}
		r.names = policies
		r.p = r.multi[0]
		return ek, nil
	}
	ek, ok := key.AppendEncoded(ekBuf)
	if !ok {
		return nil, fmt.Errorf("%w: %w", ErrInvalidKey, key.Validate())
	}
	r.p = tab.Lookup(key.Policy)
	if r.p == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownPolicy, key.Policy)
	}
	if err := checkLeaseOp(op, r.p); err != nil {
		return nil, err
	}
	r.p = r.p.ForKey(key.Tenant, key.Subject)
	// A refund past the limit is refused too: a key never holds more
	// admissions than its limit, so more can only be a mistake or an
	// attempt to empty it (issue 53: hits 2^63-1 with no credentials).
	if (op == peerpb.Op_OP_CHECK || op == peerpb.Op_OP_PEEK || op == peerpb.Op_OP_ACQUIRE || op == peerpb.Op_OP_RESERVE || op == peerpb.Op_OP_REFUND) && hits > r.p.Shard.Limit && !r.p.Unlimited {
		return nil, fmt.Errorf("%w: hits %d must be between 1 and the limit %d", ErrInvalidHits, hits, r.p.Shard.Limit)
	}
	return ek, nil
}

// decideStatus says what decideHere did.
type decideStatus uint8

const (
	decided  decideStatus = iota // a decision or an error for the caller
	waitHere                     // this node holds or will hold the partition: wait for it
	remote                       // another node holds the partition
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
// costs more than building it).
func (n *Node) routeInto(ctx context.Context, r *opReq, ek []byte, d *Decision) error {
	v := n.view.Load()
	// One hash places the key on the ring and picks its shard stripe.
	pk := shard.Place(ek)
	pid := v.snap.PartitionOfHash(pk.Hash())
	pt := &n.pt.parts[pid]
	var cause error
	redirect := ""
	redirects := 0
	// The routing deadline is read from the clock only once a request
	// cannot be decided at once: the local path reads the clock once, in
	// decideHere.
	var waitUntil time.Time
	// moveUntil bounds the wait for a partition that is moving (fenced
	// for a transfer, here or at its holder): longer than a forward, so
	// that callers wait for a graceful move rather than fail (issue 53
	// item 14: "partition N is moving" during a leave).
	var moveUntil time.Time
	prevTarget := "" // the member a not-owner answer came from before the last
	waited := time.Duration(0)
	for {
		v = n.view.Load()
		st, ch, err := n.decideHere(ctx, v, pt, pid, r, pk, d)
		if st == decided {
			if err != nil {
				*d, err = n.unavailable(r, err)
				return err
			}
			n.metrics.Decision(r.p.Name, d.Reason, PathLocal)
			return nil
		}
		if waitUntil.IsZero() {
			now := time.Now()
			waitUntil, moveUntil = now.Add(n.cfg.ForwardTimeout), now.Add(n.moveWait())
		}
		switch st {
		case waitHere:
			if err := n.waitPart(ctx, ch, moveUntil); err != nil {
				*d, err = n.unavailable(r, fmt.Errorf("%w: partition %d is moving: %w", ErrUnavailable, pid, err))
				return err
			}
			continue
		}
		target := redirect
		redirect = ""
		if target == "" {
			target = n.routeTarget(v, pt, pid, waited)
		}
		if target == "" {
			// This node is the target but not yet the holder: the
			// transfer is on its way. Wait briefly, then ask around.
			t0 := time.Now()
			until := waitUntil
			if t := t0.Add(notOwnerPause); t.Before(until) {
				until = t
			}
			if err := n.waitPart(ctx, ch, until); err != nil && time.Now().After(waitUntil) {
				*d, err = n.unavailable(r, fmt.Errorf("%w: partition %d has no holder yet: %w", ErrUnavailable, pid, err))
				return err
			}
			waited += time.Since(t0)
			continue
		}
		if n.spreadDecide(v, r, ek, d) {
			n.metrics.Decision(r.p.Name, d.Reason, PathLocal)
			return nil
		}
		fd, err := n.forward(ctx, v, target, r)
		if err == nil {
			*d = fd
			n.metrics.Decision(r.p.Name, d.Reason, PathForwarded)
			return nil
		}
		var no *notOwnerError
		if errors.Is(err, errMoving) && time.Now().Before(moveUntil) {
			// The holder waited for the move and did not decide: ask
			// again, where the partition is once it has moved (safe for
			// every operation: nothing was decided).
			if err := n.awaitView(ctx, v); err != nil && ctx.Err() != nil {
				*d, err = n.unavailable(r, errors.Join(err, ctx.Err()))
				return err
			}
			continue
		}
		if !errors.As(err, &no) {
			if redirects < n.cfg.NotOwnerRetries && n.portDead(target) {
				// Gossip lists the target but its port refuses
				// connections (a firewall, a wrong advertised address):
				// mark it, and route as if it were not the target. A
				// refund or a reset is not sent again (resendable); the
				// mark still spares the requests after it.
				n.reach.mark(target, n.mono())
				if resendable(r.op) {
					n.metrics.Forward(target, "resent", 0)
					redirects++
					continue
				}
			}
			*d, err = n.unavailable(r, err)
			return err
		}
		cause = err
		// A receiver that names the member asked just before it sends the
		// request back where it came from: two views on either side of a
		// commit, which ping-ponged a request through its hops.
		asked := prevTarget
		prevTarget = target
		if no.owner != "" && no.owner != target && no.owner != n.name && no.owner != asked {
			// The log's table is the only record of holders: follow the
			// receiver's, learn nothing. NotOwnerRetries bounds these
			// hops.
			redirects++
			if redirects > n.cfg.NotOwnerRetries || time.Now().After(moveUntil) {
				*d, err = n.unavailable(r, cause)
				return err
			}
			redirect = no.owner
			continue
		}
		// The receiver names nobody new (itself, the member asked before
		// it, or this node): the holder is changing and the views have not
		// caught up with the log's commit. Wait for this node's view,
		// within a move's bound (moveWait), rather than spend the hops:
		// a graceful move answered callers "not owner" when its commit
		// outlasted three short waits (issue 53 item 14).
		if time.Now().After(moveUntil) {
			*d, err = n.unavailable(r, cause)
			return err
		}
		if err := n.awaitView(ctx, v); err != nil {
			*d, err = n.unavailable(r, errors.Join(cause, err))
			return err
		}
	}
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

// resendable reports whether op may go to another member after a forward
// whose outcome is unknown: the target may have decided it, copied it to
// its backup and died before answering, and the backup, once it takes
// over, would decide it again. An admission or an acquire decided twice
// only counts twice (the limiter refuses more, never less), and a peek or
// a release by lease ID changes nothing the second time; a refund would
// give its units back twice, and a reset would clear what was admitted in
// between. Those fail as unavailable instead, their outcome unknown, as
// Refund's doc says.
func resendable(op peerpb.Op) bool {
	return op != peerpb.Op_OP_REFUND && op != peerpb.Op_OP_RESET
}

// portDead reports whether member's connection has failed (its port
// refuses connections or does not answer), not merely whether one call
// failed.
func (n *Node) portDead(member string) bool {
	if h := n.hooks.portDead.Load(); h != nil {
		return (*h)(member)
	}
	c, err := n.peerClient(member)
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
	ch := n.viewChanged()
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

// notOwnerError is a receiver's "not owner" answer, with the member it
// believes holds the partition and that holder's epoch (0 when it only
// names its ring's target).
type notOwnerError struct {
	owner string
	epoch uint64
}

func (e *notOwnerError) Error() string {
	return fmt.Sprintf("peer: not owner (holder %q, epoch %d)", e.owner, e.epoch)
}
func (e *notOwnerError) Unwrap() error { return errNotOwner }

// decideHere decides on this node if it holds partition pid and may decide
// (lease, backup): a Decision in *d, or an error for the caller. waitHere
// means the node holds the partition but cannot decide yet (fenced for a
// move, a lease or a backup copy on its way): ch is closed at the next
// change. remote means another node holds it. pk is r's key placed (its
// partition is pid). *d is written only for a decision.
func (n *Node) decideHere(ctx context.Context, v *view, pt *part, pid int, r *opReq, pk shard.Placed, d *Decision) (decideStatus, <-chan struct{}, error) {
	if r.op != peerpb.Op_OP_CHECK || r.multi != nil {
		od, st, ch, err := n.decideOther(ctx, v, pt, pid, r)
		if st == decided && err == nil {
			*d = od
		}
		return st, ch, err
	}
	key, p, hits := r.key, r.p, r.hits
	pt.Mu.RLock()
	ch := pt.Changed
	switch pt.Role {
	case partition.RoleFenced:
		pt.Mu.RUnlock()
		return waitHere, ch, nil
	case partition.RoleHolder:
	default:
		pt.Mu.RUnlock()
		return remote, ch, nil
	}
	now, mono := n.now()
	if !n.lo.run.MayDecide(pid, mono) || p.Config.Replication == ReplicateSync && pt.Backup == "" && len(v.alive) > 1 {
		// The lease ended or its renewal is late, or a synchronous
		// policy waits for the backup the holder is making.
		pt.Mu.RUnlock()
		return waitHere, ch, nil
	}
	if p.Unlimited {
		// The holder's table exempts the key: nothing to count or copy.
		pt.Mu.RUnlock()
		*d = unlimitedDecision(n.name, v, now)
		return decided, nil, nil
	}
	if h := n.hooks.decide.Load(); h != nil {
		(*h)() // tests: a pause between the lease check and the decision
	}
	var sd shard.Decision
	at, err := pt.Store.AllowPlaced(pk, p.Shard, hits, now, &sd)
	if err == nil && at != now.UnixNano() {
		// The key's clock was ahead of ours (a decision that read the
		// clock after us took the key's lock before us): the admission is
		// recorded at the key's time, so report and copy that time.
		now = time.Unix(0, at)
	}
	if err != nil {
		pt.Mu.RUnlock()
		if errors.Is(err, shard.ErrInvalidHits) {
			return decided, nil, fmt.Errorf("%w: %w", ErrInvalidHits, err)
		}
		if errors.Is(err, shard.ErrCapacity) {
			return decided, nil, n.capacityReached(pid, err)
		}
		return decided, nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	var ri *replItem
	var rerr error
	if sd.Allowed && pt.Backup != "" && p.Config.Replication != ReplicateOff {
		ri, rerr = n.replicateAdmissionItem(pt.Backup, pid, pt.Epoch, key, p.Shard.Algorithm, admissionRun(p, sd, hits, now), now, p.Config.Replication == ReplicateSync)
	}
	var didx uint64
	var derr error
	if sd.Allowed && p.Config.Durability != DurabilityMemory && n.dd != nil {
		// Kept on disk (partlog.go); under disk answered once fsynced.
		didx, derr = n.durableKey(pid, pt.Epoch, pt.Store, key, p.Config.Durability, now)
	}
	pt.Mu.RUnlock()
	if rerr != nil && p.Config.Replication == ReplicateSync {
		return decided, nil, rerr
	}
	if derr == nil && didx != 0 {
		derr = n.durableSync(didx)
	}
	if derr != nil {
		return decided, nil, derr
	}
	if sd.Allowed && p.Config.Replication != ReplicateSync && n.leaseEnded() {
		return decided, nil, errLeaseEnded
	}
	if ri != nil && r.deferWait {
		r.wait = ri
	} else if ri != nil {
		// The admission is recorded here; it is answered only once the
		// backup has it too. If the backup does not confirm, the caller
		// gets unavailable and the admission stays counted (it can only
		// refuse more).
		select {
		case err := <-ri.done:
			n.putReplItem(ri)
			if err != nil {
				return decided, nil, err
			}
		case <-ctx.Done():
			return decided, nil, fmt.Errorf("%w: waiting for the backup: %w", ErrUnavailable, ctx.Err())
		}
	}
	reason := ReasonAdmitted
	allowed := sd.Allowed
	if !allowed {
		reason = ReasonOverLimit
		if p.Config.Shadow {
			allowed, reason = true, ReasonShadow
		}
	}
	// Field by field: a composite literal is built aside and then copied
	// in, and the copy stalls on the bytes just written.
	d.Allowed, d.Limit, d.Remaining = allowed, sd.Limit, sd.Remaining
	d.RetryAfter, d.ResetAfter, d.Reason = sd.RetryAfter, sd.ResetAfter, reason
	d.Owner, d.RingVersion, d.DecidedAt = n.name, v.snap.Version(), now
	d.Limits, d.RefusedBy = nil, ""
	// Hot keys are sampled: one decision in hotSample records hotSample
	// times the hits, which keeps the tracker's lock off most decisions.
	if hotSampled(mono, pk.Hash()) {
		n.hot.RecordBytes(pk.Encoded(), hits*hotSample, now)
	}
	return decided, nil, nil
}

const hotSample = 1 << hotSampleBits

const hotSampleBits = 3

// hotSampled draws whether a decision is one of the 1 in hotSample whose
// hits the hot-key tracker records. It scrambles the decision's monotonic
// clock reading and its key's placement hash with a multiplicative
// (Fibonacci) hash and keeps the top bits: successive readings spread
// evenly over the outcomes, and different keys decided at the same reading
// get different ones. A random number cost as much as the rest of the
// sampling. On a clock coarser than the decisions (some platforms tick
// every millisecond or more) one key's decisions within a tick share their
// outcome: the estimate stays unbiased, only noisier.
func hotSampled(mono int64, placementHash uint64) bool {
	return (uint64(mono)^placementHash)*0x9e3779b97f4a7c15>>(64-hotSampleBits) == 0
}

// errLeaseEnded answers an admission whose partition lease ended while it
// was being decided.
var errLeaseEnded = fmt.Errorf("%w: the partition's lease ended during the decision", ErrUnavailable)

// leaseEnded reports whether partition pt's lease has ended, now. It is
// checked before a decision and, for admissions no backup fences, again
// after: a process paused between the check and the decision (a GC pause,
// SIGSTOP, a VM stall) may wake after its backup has taken over. A
// synchronous copy is then refused by the backup, which fences the
// admission; an asynchronous one or none is not, so the answer must not
// confirm it. The admission stays recorded here, where it can only refuse
// more.
func (n *Node) leaseEnded() bool { return n.mono() >= n.lo.run.LiveUntil() }

// unlimitedDecision is the holder's answer for a key an Unlimited override
// covers.
func unlimitedDecision(owner string, v *view, now time.Time) Decision {
	return Decision{Allowed: true, Reason: ReasonUnlimited, Owner: owner, RingVersion: v.snap.Version(), DecidedAt: now}
}
