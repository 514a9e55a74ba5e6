package peer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// The operations besides a single-policy check: several policies decided
// as one, peek, refund and reset. Each goes to the partition's holder like
// a check and passes the same gate (decideHere); refunds and resets change
// a key's state in ways an addition cannot express, so they replicate the
// key's whole new state (KIND_REPLACE), taken under the partition's gate in
// write mode so that no admission can slip between the change and the copy.

// decideOther decides r (not a single-policy check) if this node holds
// partition pid and may decide; the statuses are decideHere's.
func (n *Node) decideOther(ctx context.Context, v *view, pt *part, pid int, r *opReq) (Decision, decideStatus, <-chan struct{}, error) {
	// Lease operations replicate the key's whole state too (lease.go).
	exclusive := r.op == peerpb.Op_OP_REFUND || r.op == peerpb.Op_OP_RESET || isLeaseOp(r.op)
	lock, unlock := pt.Mu.RLock, pt.Mu.RUnlock
	if exclusive {
		lock, unlock = pt.Mu.Lock, pt.Mu.Unlock
	}
	lock()
	ch := pt.Changed
	switch pt.Role {
	case partition.RoleFenced:
		unlock()
		return Decision{}, waitHere, ch, nil
	case partition.RoleHolder:
	default:
		unlock()
		return Decision{}, remote, ch, nil
	}
	sync := r.p.Config.Replication == ReplicateSync
	for _, q := range r.multi {
		sync = sync || q.Config.Replication == ReplicateSync
	}
	// fenced: an admission of this request is copied synchronously, so a
	// backup that has taken over refuses it and the answer is not
	// confirmed. A synchronous policy the key is unlimited in records and
	// copies nothing: it fences nothing, and the other policies'
	// admissions need the lease checked again after the decision.
	fenced := r.p.Config.Replication == ReplicateSync && !r.p.Unlimited
	for _, q := range r.multi {
		fenced = fenced || q.Config.Replication == ReplicateSync && !q.Unlimited
	}
	if !n.lo.run.MayDecide(pid, n.mono()) || sync && r.op != peerpb.Op_OP_PEEK && pt.Backup == "" && len(v.alive) > 1 {
		unlock()
		return Decision{}, waitHere, ch, nil
	}
	if h := n.hooks.decide.Load(); h != nil {
		(*h)() // tests: a pause between the lease check and the decision
	}
	now := n.clock()
	d := Decision{Owner: n.name, RingVersion: v.snap.Version(), DecidedAt: now}
	var waits []chan error
	var err error
	switch {
	case r.multi != nil:
		d, waits, err = n.decideMultiLocked(pt, pid, r, now, d)
	case r.op == peerpb.Op_OP_PEEK && r.p.Unlimited:
		d = unlimitedDecision(n.name, v, now)
	case r.op == peerpb.Op_OP_PEEK:
		var sd shard.Decision
		sd, err = pt.Store.Peek(r.key, r.p.Shard, r.hits, now)
		d = fillDecision(d, sd, ReasonPeek)
	case r.op == peerpb.Op_OP_REFUND:
		var sd shard.Decision
		sd, err = pt.Store.Refund(r.key, r.p.Shard, r.hits, now)
		d = fillDecision(d, sd, ReasonRefunded)
		if err == nil {
			waits, err = n.replicateStateLocked(pt, pid, r, now)
		}
	case r.op == peerpb.Op_OP_ACQUIRE || r.op == peerpb.Op_OP_RELEASE:
		d, waits, err = n.decideLeaseLocked(pt, pid, r, now, d)
	case r.op == peerpb.Op_OP_RESERVE || r.op == peerpb.Op_OP_SETTLE:
		d, waits, err = n.decideReserveLocked(pt, pid, r, now, d)
	case r.op == peerpb.Op_OP_GRANT:
		d, waits, err = n.decideGrantLocked(pt, pid, r, now, d)
	case r.op == peerpb.Op_OP_RESET:
		pt.Store.Delete(r.key)
		d = Decision{Allowed: true, Limit: r.p.Shard.Limit, Remaining: r.p.Shard.Limit, Reason: ReasonReset, Owner: n.name, RingVersion: v.snap.Version(), DecidedAt: now}
		waits, err = n.replicateStateLocked(pt, pid, r, now)
	default:
		err = fmt.Errorf("%w: unknown operation %v", ErrInvalidKey, r.op)
	}
	var didx uint64
	if n.dd != nil && err == nil {
		didx, err = n.durableOp(pt, pid, r, d.Allowed, now) // partlog.go
	}
	unlock()
	if err == nil && didx != 0 {
		err = n.durableSync(didx)
	}
	if err == nil && d.Allowed && !fenced && (r.op == peerpb.Op_OP_CHECK || r.op == peerpb.Op_OP_ACQUIRE || r.op == peerpb.Op_OP_RESERVE || r.op == peerpb.Op_OP_GRANT && r.granted > 0) && n.leaseEnded() {
		// As in decideHere: not confirmed without a fencing copy.
		err = errLeaseEnded
	}
	if err != nil {
		if errors.Is(err, shard.ErrInvalidHits) {
			return Decision{}, decided, nil, fmt.Errorf("%w: %w", ErrInvalidHits, err)
		}
		if errors.Is(err, shard.ErrWrongAlgorithm) {
			return Decision{}, decided, nil, fmt.Errorf("%w: %w", ErrWrongAlgorithm, err)
		}
		if errors.Is(err, shard.ErrCapacity) {
			return Decision{}, decided, nil, n.capacityReached(pid, err)
		}
		if errors.Is(err, ErrInvalidKey) || errors.Is(err, ErrInvalidHits) || errors.Is(err, ErrWrongAlgorithm) || errors.Is(err, ErrUnavailable) {
			return Decision{}, decided, nil, err
		}
		return Decision{}, decided, nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	// A refund or reset has taken effect here once decided, whatever the
	// backup answers: it is waited for so that, as a rule, a crash of this
	// node right after the answer does not lose it, but a backup that
	// does not confirm it does not make it unavailable. Its caller would
	// take that to mean nothing was done and ask again, and a refund done
	// twice gives back units that were never admitted. A backup lacking
	// it only refuses more after a takeover.
	frees := r.op == peerpb.Op_OP_REFUND || r.op == peerpb.Op_OP_RESET || r.op == peerpb.Op_OP_SETTLE
	for _, w := range waits {
		select {
		case err := <-w:
			if err != nil && !frees {
				return Decision{}, decided, nil, err
			}
		case <-ctx.Done():
			if frees {
				return d, decided, nil, nil
			}
			return Decision{}, decided, nil, fmt.Errorf("%w: waiting for the backup: %w", ErrUnavailable, ctx.Err())
		}
	}
	return d, decided, nil, nil
}

// fillDecision copies a shard decision into d with reason.
func fillDecision(d Decision, sd shard.Decision, reason Reason) Decision {
	d.Allowed, d.Limit, d.Remaining, d.RetryAfter, d.ResetAfter, d.Reason = sd.Allowed, sd.Limit, sd.Remaining, sd.RetryAfter, sd.ResetAfter, reason
	return d
}

// decideMultiLocked decides (or peeks) several policies of one subject as
// one, under the partition gate held by the caller, and queues the
// admissions for the backup. The top-level fields of the result describe
// the refusing policy, or the admitted policy with the least Remaining.
// When one refuses, nothing is recorded and every entry of Limits is what
// a peek of the same request would answer now.
func (n *Node) decideMultiLocked(pt *part, pid int, r *opReq, now time.Time, d Decision) (Decision, []chan error, error) {
	d.Limits = make([]PolicyDecision, len(r.multi))
	var out [shard.MaxMulti]shard.Decision
	refused := -1
	// Policies an Unlimited override exempts take no part: they admit,
	// record nothing, and are never the top-level answer unless all are.
	counted := 0
	for i, p := range r.multi {
		if p.Unlimited {
			out[i] = shard.Decision{Allowed: true, Remaining: math.MaxInt64}
		} else {
			counted++
		}
	}
	if r.op == peerpb.Op_OP_PEEK {
		for i, p := range r.multi {
			if p.Unlimited {
				continue
			}
			k := Key{Tenant: r.key.Tenant, Subject: r.key.Subject, Policy: p.Name}
			sd, err := pt.Store.Peek(k, p.Shard, r.hits, now)
			if err != nil {
				return d, nil, err
			}
			out[i] = sd
			if !sd.Allowed && refused < 0 {
				refused = i
			}
		}
	} else if counted > 0 {
		var itemBuf [shard.MaxMulti]shard.MultiItem
		var idxBuf [shard.MaxMulti]int
		items, idx := itemBuf[:0], idxBuf[:0] // idx[j]: items[j] is r.multi[idx[j]]
		for i, p := range r.multi {
			if !p.Unlimited {
				items = append(items, shard.MultiItem{Policy: p.Name, P: p.Shard, Hits: r.hits})
				idx = append(idx, i)
			}
		}
		var res [shard.MaxMulti]shard.Decision
		j, at, err := pt.Store.AllowMultiAt(r.key.Tenant, r.key.Subject, items, now, res[:len(items)])
		if err == nil && at != now.UnixNano() {
			// A key's clock was ahead of ours: the decision, and every
			// admission of it, is recorded at that time (as in
			// decideHere), so report and copy that time.
			now = time.Unix(0, at)
			d.DecidedAt = now
		}
		if err != nil {
			if errors.Is(err, shard.ErrInvalidMulti) {
				return d, nil, fmt.Errorf("%w: %w", ErrInvalidKey, err)
			}
			return d, nil, err
		}
		for k, i := range idx {
			out[i] = res[k]
		}
		if j >= 0 {
			refused = idx[j]
		}
	}
	top := 0
	for i, p := range r.multi {
		sd := out[i]
		if p.Unlimited {
			d.Limits[i] = PolicyDecision{Policy: p.Name, Allowed: true}
			if sd.Remaining < out[top].Remaining {
				top = i
			}
			continue
		}
		// A refused check recorded nothing: each policy's entry is what
		// a peek of the same request answers (the shard decided them so),
		// an admitting one counting the hits as taken, as an admitted
		// check's and a peek's do, so that the three agree.
		d.Limits[i] = PolicyDecision{Policy: p.Name, Allowed: sd.Allowed, Limit: sd.Limit, Remaining: sd.Remaining, RetryAfter: sd.RetryAfter, ResetAfter: sd.ResetAfter}
		if sd.Remaining < out[top].Remaining {
			top = i
		}
	}
	if refused >= 0 {
		top = refused
		d.RefusedBy = r.multi[refused].Name
	}
	d = fillDecision(d, out[top], ReasonAdmitted)
	d.Allowed = refused < 0
	switch {
	case counted == 0:
		d.Allowed, d.Limit, d.Remaining, d.RetryAfter, d.ResetAfter, d.Reason = true, 0, 0, 0, 0, ReasonUnlimited
		return d, nil, nil
	case r.op == peerpb.Op_OP_PEEK:
		d.Reason = ReasonPeek
		return d, nil, nil
	case refused >= 0:
		d.Reason = ReasonOverLimit
		shadow := true
		for _, p := range r.multi {
			shadow = shadow && p.Config.Shadow
		}
		if shadow {
			d.Allowed, d.Reason = true, ReasonShadow
		}
		return d, nil, nil
	}
	var waits []chan error
	if pt.Backup == "" {
		return d, nil, nil
	}
	for i, p := range r.multi {
		if p.Config.Replication == ReplicateOff || p.Unlimited {
			continue
		}
		k := Key{Tenant: r.key.Tenant, Subject: r.key.Subject, Policy: p.Name}
		w, err := n.replicateAdmission(pt.Backup, pid, pt.Epoch, k, p.Shard.Algorithm, admissionRun(p, out[i], r.hits, now), now, p.Config.Replication == ReplicateSync)
		if err != nil {
			if p.Config.Replication == ReplicateSync {
				return d, nil, err
			}
			continue
		}
		if w != nil {
			waits = append(waits, w)
		}
	}
	return d, waits, nil
}

// replicateStateLocked queues the key's whole state (after a refund or a
// reset) for the partition's backup; the caller holds the gate in write
// mode. A policy with replication off sends nothing.
func (n *Node) replicateStateLocked(pt *part, pid int, r *opReq, now time.Time) ([]chan error, error) {
	if pt.Backup == "" || r.p.Config.Replication == ReplicateOff {
		return nil, nil
	}
	st, ok := pt.Store.Export(r.key, now)
	if !ok {
		st = shard.KeyState{Key: r.key, Algorithm: r.p.Shard.Algorithm}
	}
	w, err := n.replicateState(pt.Backup, pid, pt.Epoch, st, now, r.p.Config.Replication == ReplicateSync)
	if err != nil {
		// Not queued (the queue is full): the change stands here all the
		// same (see decideOther); the backup's copy keeps the state of
		// before it, which only refuses more after a takeover.
		return nil, nil
	}
	if w == nil {
		return nil, nil
	}
	return []chan error{w}, nil
}
