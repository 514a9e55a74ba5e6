package peer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/internal/grantee"
	"github.com/ringlimit/ringlimit/peer/internal/partition"
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
	ek, err := n.parseReqInto(&r, partition.OpAcquire, req.Key, nil, req.Hits, nil)
	if err != nil {
		return Lease{}, err
	}
	r.EK = ek
	d, err := n.route(ctx, &r, r.EK)
	if err != nil {
		return Lease{}, err
	}
	l := Lease{Decision: d}
	if d.Allowed {
		l.ID, l.TTL = r.Lease, r.LeaseTTL
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
	ek, err := n.parseReqInto(&r, partition.OpRelease, key, nil, 1, nil)
	if err != nil {
		return Decision{}, err
	}
	r.EK, r.Lease = ek, id
	if r.P.Config.OnUnavailable == Fallback {
		// The lease may have come from this node's fallback store.
		_, _ = n.fallback.Release(key, n.fallbackPolicy(r.P), id, n.clock())
	}
	return n.route(ctx, &r, r.EK)
}

// forwardLease asks owner to take or end a lease, as its own RPC.
func (n *Node) forwardLease(ctx context.Context, owner string, r *opReq) (Decision, error) {
	c, err := n.linkTo(owner)
	if err != nil {
		return Decision{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ForwardTimeout)
	defer cancel()
	req := &peerpb.LeaseRequest{
		Sender:  n.name,
		Item:    &peerpb.CheckItem{Key: &peerpb.Key{Tenant: r.Key.Tenant, Subject: r.Key.Subject, Policy: r.Key.Policy}, Hits: r.Hits, Op: peerpb.Op(r.Op)},
		LeaseId: r.Lease,
		Actual:  r.Actual,
	}
	for _, g := range r.Returns {
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
	if (r.Op == partition.OpAcquire || r.Op == partition.OpReserve) && d.Allowed {
		r.Lease, r.LeaseTTL = resp.GetLeaseId(), time.Duration(resp.GetLeaseTtlNs())
	}
	if r.Op == partition.OpSettle {
		r.Estimate, r.Overage = resp.GetEstimate(), resp.GetOverage()
	}
	if r.Op == partition.OpGrant {
		r.Lease, r.LeaseTTL, r.Granted = resp.GetLeaseId(), time.Duration(resp.GetLeaseTtlNs()), resp.GetGranted()
	}
	return d, nil
}

// Lease is the holder's side of forwardLease: one lease operation, decided
// like a Check item.
func (s *limiterService) Lease(ctx context.Context, req *peerpb.LeaseRequest) (*peerpb.LeaseResponse, error) {
	n := s.n
	if n.ctx.Err() != nil {
		return nil, status.Error(codes.Unavailable, ErrClosed.Error())
	}
	v := n.view.Load()
	if v == nil {
		return nil, status.Error(codes.Unavailable, "peer: node starting")
	}
	it := req.GetItem()
	op := opFromWire(it.GetOp())
	if !op.Spec().OwnRPC {
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
	r.Lease = req.GetLeaseId()
	if op == partition.OpSettle {
		if r.Actual = req.GetActual(); r.Actual < 0 {
			d := wireError(n, v, peerpb.Status_STATUS_INVALID_ARGUMENT, fmt.Errorf("%w: actual cost %d must not be negative", ErrInvalidHits, r.Actual))
			return &peerpb.LeaseResponse{Decision: d.ToPB()}, nil
		}
	}
	if op == partition.OpGrant {
		if len(req.GetReturns()) > shard.MaxGrants {
			d := wireError(n, v, peerpb.Status_STATUS_INVALID_ARGUMENT, fmt.Errorf("%w: %d grants returned, at most %d", ErrInvalidHits, len(req.GetReturns()), shard.MaxGrants))
			return &peerpb.LeaseResponse{Decision: d.ToPB()}, nil
		}
		for _, gr := range req.GetReturns() {
			ret := grantee.Return{ID: gr.GetLeaseId(), Uses: make([]shard.Run, len(gr.GetUses()))}
			for i, u := range gr.GetUses() {
				ret.Uses[i] = shard.Run{Age: time.Duration(max(u.GetAgeNs(), 0)), Count: u.GetCount()}
			}
			r.Returns = append(r.Returns, ret)
		}
	}
	d, _ := n.decideWireReq(ctx, v, r, n.waitUntil(ctx))
	resp := &peerpb.LeaseResponse{Decision: d.ToPB()}
	if op == partition.OpGrant && d.Status == peerpb.Status_STATUS_OK {
		resp.LeaseId, resp.LeaseTtlNs, resp.Granted = r.Lease, int64(r.LeaseTTL), r.Granted
	}
	if (op == partition.OpAcquire || op == partition.OpReserve) && d.Status == peerpb.Status_STATUS_OK && d.Allowed {
		resp.LeaseId, resp.LeaseTtlNs = r.Lease, int64(r.LeaseTTL)
	}
	if op == partition.OpSettle {
		resp.Estimate, resp.Overage = r.Estimate, r.Overage
	}
	return resp, nil
}
