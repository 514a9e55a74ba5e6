package peer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/internal/grantee"
	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/peer/internal/wire"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// Leases: the concurrency policy (shard.Concurrency) caps the requests in
// progress per key. Acquire takes a lease, Release ends it, and a lease not
// released expires after the policy's Window (its TTL), so a crashed client
// cannot keep capacity.
//
// The rule: a lease is decided by the key's partition holder like every
// other operation, under the partition's gate in write mode, and the key's
// whole new state (its live leases, with ids and time left) is queued for
// the backup before the gate is released (KIND_REPLACE), as refunds and
// resets are. So the backup's copy is exact, and with ReplicateSync an
// acquired lease is answered only after the backup has it: a crash of the
// holder loses no lease, and the backup that takes over never grants a unit
// a live lease still holds. A release is not waited for: if the holder
// fails before the backup has it, the backup keeps the lease until its TTL,
// which only refuses more. With ReplicateAsync a crash can lose the newest
// leases (they are then granted again: more than Limit held until those
// expire); with ReplicateOff it loses them all.
//
// Lease ids are random 64-bit numbers chosen by the holder (never zero).
// A holder that takes over does not know which ids its predecessor handed
// out beyond those in its copy, and random ids need no coordination: two
// live leases of one key share an id with probability about
// Limit²/2⁶⁵. The store refuses an id the key holds, and the holder then
// draws another.
//
// Times are the holder's: a lease expires TTL after the holder's clock at
// the decision; it travels as the time it has left, so a copy on another
// clock keeps it at least as long.
//
// When the holder cannot be reached, the policy's OnUnavailable applies:
// fail closed refuses (ErrUnavailable); fail open grants a lease nobody
// records (Reason ReasonFailedOpen), whose id Release accepts harmlessly;
// fallback takes the lease on this node's fallback store with the reduced
// limit (Reason ReasonFallback), released by a Release that reaches this
// node, else expiring after its TTL.
//
// Lease operations are forwarded one per RPC (Limiter.Lease), not batched:
// the packed batch layout has no lease fields.

// Lease is the outcome of Acquire.
type Lease struct {
	// Decision is the verdict: Allowed reports whether the lease was
	// granted; Remaining is the units still free after it.
	Decision
	// ID is the lease to pass to Release; zero when not granted.
	ID uint64
	// TTL is how long after DecidedAt (on the deciding node's clock) the
	// lease expires unless released. For ReasonFailedOpen, whose
	// DecidedAt is zero, it is this node's policy's TTL.
	TTL time.Duration
}

// Acquire takes a lease of req.Hits units (zero means 1) of req.Key, whose
// policy must be a concurrency policy (else ErrWrongAlgorithm): at most the
// policy's Limit units are held by live leases at any moment, cluster-wide.
// At the limit it returns Allowed == false with a nil error and a
// RetryAfter (the time until enough leases expire if none is released).
// A granted lease lasts until Release or until its TTL (the policy's
// Window) has passed on the holder's clock: a lease exactly TTL old has
// expired. When the holder cannot be reached the policy's OnUnavailable
// applies (see the package's lease rules). Other errors are Allow's.
// Safe for concurrent use.
func (n *Node) Acquire(ctx context.Context, req Request) (Lease, error) {
	if n.stopped.Load() {
		return Lease{}, ErrClosed
	}
	if len(req.Policies) > 0 {
		return Lease{}, fmt.Errorf("%w: a lease is of one policy", ErrInvalidKey)
	}
	var r opReq
	ek, err := n.parseReqInto(&r, peerpb.Op_OP_ACQUIRE, req.Key, nil, req.Hits, nil)
	if err != nil {
		return Lease{}, err
	}
	r.ek = ek
	d, err := n.route(ctx, &r, r.ek)
	if err != nil {
		return Lease{}, err
	}
	l := Lease{Decision: d}
	if d.Allowed {
		l.ID, l.TTL = r.lease, r.leaseTTL
	}
	return l, nil
}

// Release ends lease id of key at the key's holder. The Decision (Reason
// ReasonReleased) describes the key's leases after it; Allowed reports
// whether a live lease was ended. An unknown, already released or expired
// id is Allowed == false with a nil error: releasing twice, or releasing
// a fail-open lease, is harmless. It is never answered without the holder
// (ErrUnavailable): an unanswered release leaves the lease to expire.
func (n *Node) Release(ctx context.Context, key Key, id uint64) (Decision, error) {
	if n.stopped.Load() {
		return Decision{}, ErrClosed
	}
	var r opReq
	ek, err := n.parseReqInto(&r, peerpb.Op_OP_RELEASE, key, nil, 1, nil)
	if err != nil {
		return Decision{}, err
	}
	r.ek, r.lease = ek, id
	if r.p.Config.OnUnavailable == Fallback {
		// The lease may have come from this node's fallback store.
		_, _ = n.fallback.Release(key, n.fallbackPolicy(r.p), id, n.clock())
	}
	return n.route(ctx, &r, r.ek)
}

// decideLeaseLocked takes or ends a lease under the partition gate held
// in write mode, and queues the key's new state for the backup: an
// acquire is waited for under ReplicateSync, a release never (see the
// lease rules).
func (n *Node) decideLeaseLocked(pt *part, pid int, r *opReq, now time.Time, d Decision) (Decision, []chan error, error) {
	p := r.p
	if r.op == peerpb.Op_OP_RELEASE {
		sd, err := pt.Store.Release(r.key, p.Shard, r.lease, now)
		if err != nil {
			return d, nil, err
		}
		d = fillDecision(d, sd, ReasonReleased)
		if sd.Allowed {
			n.replicateLeaseLocked(pt, pid, r, now, false)
		}
		return d, nil, nil
	}
	r.leaseTTL = p.Shard.Window
	if p.Unlimited {
		r.lease = newLeaseID()
		return unlimitedDecision(n.name, n.view.Load(), now), nil, nil
	}
	var sd shard.Decision
	var err error
	for range 4 {
		r.lease = newLeaseID()
		if sd, err = pt.Store.Acquire(r.key, p.Shard, r.hits, r.lease, now); !errors.Is(err, shard.ErrInvalidLease) {
			break
		}
	}
	if err != nil {
		return d, nil, err
	}
	d = fillDecision(d, sd, ReasonAdmitted)
	if !sd.Allowed {
		d.Reason = ReasonOverLimit
		if p.Config.Shadow {
			// Admitted without a lease: its id is released harmlessly.
			d.Allowed, d.Reason = true, ReasonShadow
		}
		return d, nil, nil
	}
	w, err := n.replicateLeaseLocked(pt, pid, r, now, p.Config.Replication == ReplicateSync)
	if err != nil {
		return d, nil, err
	}
	if w == nil {
		return d, nil, nil
	}
	return d, []chan error{w}, nil
}

// replicateLeaseLocked queues the key's whole state for the partition's
// backup (the caller holds the gate in write mode); wait makes the
// returned channel yield the backup's answer. A failure to queue matters
// only when waited for.
func (n *Node) replicateLeaseLocked(pt *part, pid int, r *opReq, now time.Time, wait bool) (chan error, error) {
	if pt.Backup == "" || r.p.Config.Replication == ReplicateOff {
		return nil, nil
	}
	st, ok := pt.Store.Export(r.key, now)
	if !ok {
		st = shard.KeyState{Key: r.key, Algorithm: r.p.Shard.Algorithm}
	}
	w, err := n.replicateState(pt.Backup, pid, pt.Epoch, st, now, wait)
	if err != nil && wait {
		return nil, err
	}
	return w, nil
}

// newLeaseID returns a random lease id, never zero.
func newLeaseID() uint64 {
	for {
		if id := rand.Uint64(); id != 0 {
			return id
		}
	}
}

// checkLeaseOp refuses an operation that does not apply to p's algorithm.
func checkLeaseOp(op peerpb.Op, p *policy.Entry) error {
	lease := op == peerpb.Op_OP_ACQUIRE || op == peerpb.Op_OP_RELEASE
	conc := p.Shard.Algorithm == shard.Concurrency
	switch {
	case op == peerpb.Op_OP_GRANT && p.Config.Spread == SpreadOff:
		return fmt.Errorf("%w: policy %q does not spread its keys", ErrWrongAlgorithm, p.Name)
	case (op == peerpb.Op_OP_RESERVE || op == peerpb.Op_OP_SETTLE) && p.Shard.Algorithm != shard.SlidingLog:
		return fmt.Errorf("%w: policy %q is %v; reserve and settle need a sliding_log policy", ErrWrongAlgorithm, p.Name, p.Shard.Algorithm)
	case lease && !conc:
		return fmt.Errorf("%w: policy %q is %v; acquire and release need a concurrency policy", ErrWrongAlgorithm, p.Name, p.Shard.Algorithm)
	case conc && (op == peerpb.Op_OP_CHECK || op == peerpb.Op_OP_REFUND):
		return errNeedsLease(p.Name)
	}
	return nil
}

// errNeedsLease is the error of a check or refund of a concurrency policy.
func errNeedsLease(policy string) error {
	return fmt.Errorf("%w: policy %q is a concurrency policy: take a lease with Acquire and end it with Release", ErrWrongAlgorithm, policy)
}

// forwardLease asks owner to take or end a lease, as its own RPC.
func (n *Node) forwardLease(ctx context.Context, owner string, r *opReq) (Decision, error) {
	c, err := n.peerClient(owner)
	if err != nil {
		return Decision{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ForwardTimeout)
	defer cancel()
	req := &peerpb.LeaseRequest{
		Sender:  n.name,
		Item:    &peerpb.CheckItem{Key: &peerpb.Key{Tenant: r.key.Tenant, Subject: r.key.Subject, Policy: r.key.Policy}, Hits: r.hits, Op: r.op},
		LeaseId: r.lease,
		Actual:  r.actual,
	}
	for _, g := range r.returns {
		gr := &peerpb.GrantReturn{LeaseId: g.ID, Uses: make([]*peerpb.Run, len(g.Uses))}
		for i, u := range g.Uses {
			gr.Uses[i] = &peerpb.Run{AgeNs: int64(u.Age), Count: u.Count}
		}
		req.Returns = append(req.Returns, gr)
	}
	start := time.Now()
	resp, err := c.stub.Lease(ctx, req)
	n.metrics.Batch(c.name, 1)
	if err != nil {
		n.metrics.Forward(c.name, "error", time.Since(start))
		return Decision{}, fmt.Errorf("%w: forward to %s: %w", ErrUnavailable, c.name, withCtxErr(ctx, err))
	}
	n.metrics.Forward(c.name, "ok", time.Since(start))
	wd := wire.DecisionFromPB(resp.GetDecision())
	d, err := fromWire(&wd, owner)
	if err != nil {
		return Decision{}, err
	}
	if (r.op == peerpb.Op_OP_ACQUIRE || r.op == peerpb.Op_OP_RESERVE) && d.Allowed {
		r.lease, r.leaseTTL = resp.GetLeaseId(), time.Duration(resp.GetLeaseTtlNs())
	}
	if r.op == peerpb.Op_OP_SETTLE {
		r.estimate, r.overage = resp.GetEstimate(), resp.GetOverage()
	}
	if r.op == peerpb.Op_OP_GRANT {
		r.lease, r.leaseTTL, r.granted = resp.GetLeaseId(), time.Duration(resp.GetLeaseTtlNs()), resp.GetGranted()
	}
	return d, nil
}

// Lease is the holder's side of forwardLease: one lease operation, decided
// like a Check item.
func (s *server) Lease(ctx context.Context, req *peerpb.LeaseRequest) (*peerpb.LeaseResponse, error) {
	n := s.n
	if n.ctx.Err() != nil {
		return nil, status.Error(codes.Unavailable, ErrClosed.Error())
	}
	v := n.view.Load()
	if v == nil {
		return nil, status.Error(codes.Unavailable, "peer: node starting")
	}
	it := req.GetItem()
	op := it.GetOp()
	if !isLeaseOp(op) {
		return nil, statusInvalid(fmt.Sprintf("lease operation %v", op))
	}
	pk := it.GetKey()
	r, err := n.parseReq(op, Key{Tenant: pk.GetTenant(), Subject: pk.GetSubject(), Policy: pk.GetPolicy()}, nil, it.GetHits())
	if err != nil {
		st := peerpb.Status_STATUS_INVALID_ARGUMENT
		if errors.Is(err, ErrUnknownPolicy) {
			st = peerpb.Status_STATUS_UNKNOWN_POLICY
		}
		d := wireError(n, v, st, err)
		return &peerpb.LeaseResponse{Decision: d.ToPB()}, nil
	}
	r.lease = req.GetLeaseId()
	if op == peerpb.Op_OP_SETTLE {
		if r.actual = req.GetActual(); r.actual < 0 {
			d := wireError(n, v, peerpb.Status_STATUS_INVALID_ARGUMENT, fmt.Errorf("%w: actual cost %d must not be negative", ErrInvalidHits, r.actual))
			return &peerpb.LeaseResponse{Decision: d.ToPB()}, nil
		}
	}
	if op == peerpb.Op_OP_GRANT {
		if len(req.GetReturns()) > shard.MaxGrants {
			d := wireError(n, v, peerpb.Status_STATUS_INVALID_ARGUMENT, fmt.Errorf("%w: %d grants returned, at most %d", ErrInvalidHits, len(req.GetReturns()), shard.MaxGrants))
			return &peerpb.LeaseResponse{Decision: d.ToPB()}, nil
		}
		for _, gr := range req.GetReturns() {
			ret := grantee.Return{ID: gr.GetLeaseId(), Uses: make([]shard.Run, len(gr.GetUses()))}
			for i, u := range gr.GetUses() {
				ret.Uses[i] = shard.Run{Age: time.Duration(max(u.GetAgeNs(), 0)), Count: u.GetCount()}
			}
			r.returns = append(r.returns, ret)
		}
	}
	d, _ := n.decideWireReq(ctx, v, r, n.waitUntil(ctx))
	resp := &peerpb.LeaseResponse{Decision: d.ToPB()}
	if op == peerpb.Op_OP_GRANT && d.Status == peerpb.Status_STATUS_OK {
		resp.LeaseId, resp.LeaseTtlNs, resp.Granted = r.lease, int64(r.leaseTTL), r.granted
	}
	if (op == peerpb.Op_OP_ACQUIRE || op == peerpb.Op_OP_RESERVE) && d.Status == peerpb.Status_STATUS_OK && d.Allowed {
		resp.LeaseId, resp.LeaseTtlNs = r.lease, int64(r.leaseTTL)
	}
	if op == peerpb.Op_OP_SETTLE {
		resp.Estimate, resp.Overage = r.estimate, r.overage
	}
	return resp, nil
}
