package peer

import (
	"context"
	"fmt"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/shard"
)

// The public API: each call parses its request (request.go) and hands it
// to the router (router.go); what an operation does at the key's holder is
// internal/partition's operation table. The node's policy table, its
// spread keys and its readiness are asked for here too, and answered by
// their parts (policies.go, spread.go, ready.go).

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
		return n.do(ctx, partition.OpCheck, req)
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
	ek, err := n.parseReqInto(&r, partition.OpCheck, req.Key, nil, req.Hits, buf[:0])
	if err != nil {
		return Decision{}, err
	}
	var d Decision
	err = n.routeInto(ctx, &r, ek, &d)
	return d, err
}

// do validates req for op and routes it.
func (n *Node) do(ctx context.Context, op partition.Op, req Request) (Decision, error) {
	if op == partition.OpCheck && len(req.Policies) == 0 {
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
	r.EK = ek
	return n.route(ctx, &r, r.EK)
}

// Peek answers what Allow would decide now for req, recording nothing: the
// Decision's Reason is ReasonPeek and Allowed says whether the request
// would be admitted. It goes to the key's holder like Allow; when the
// holder cannot be reached it returns an error wrapping ErrUnavailable
// (peeks never fail open).
func (n *Node) Peek(ctx context.Context, req Request) (Decision, error) {
	return n.do(ctx, partition.OpPeek, req)
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
	return n.do(ctx, partition.OpRefund, req)
}

// Reset clears key's state at its holder (an operator action) and
// replicates the reset: the key starts empty. Reason is ReasonReset. Like
// a refund, a reset whose forward got no answer is not sent to another
// member (a second reset, decided later, would clear what was admitted in
// between): the error wraps ErrUnavailable and the outcome is unknown.
func (n *Node) Reset(ctx context.Context, key Key) (Decision, error) {
	return n.do(ctx, partition.OpReset, Request{Key: key})
}

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
		_, _ = n.failure.fallback.Release(key, n.failure.fallbackPolicy(r.P), id, n.clock())
	}
	return n.route(ctx, &r, r.EK)
}

// Reservations: costs known only after the work (an LLM call's tokens).
// Reserve admits an estimate and returns a reservation id; Settle replaces
// the estimate with the actual cost at the reservation's instant (see
// shard.Store.Reserve for the accounting rule and what it bounds). They
// are decided by the key's partition holder like leases: under the
// partition's gate in write mode, the key's whole new state (its pending
// reservations with it) queued for the backup before the gate is
// released, a reservation answered under ReplicateSync only once the
// backup has it, so a takeover keeps it pending and settles it exactly
// once. A settlement is not failed by its backup (as a refund is not): it
// took effect on the holder, and a retry finds nothing pending.
//
// When the holder cannot be reached, Reserve takes the policy's
// OnUnavailable as Acquire does (fail open: an id nobody records, whose
// Settle is harmless; fallback: reserved on this node's fallback store).
// Settle is never answered without the holder (ErrUnavailable): the
// estimate then stands, charged until it expires a window later.

// Reservation is the outcome of Reserve.
type Reservation struct {
	// Decision is the verdict on the estimate: Allowed reports whether it
	// was admitted; Remaining is the units left after it.
	Decision
	// ID is the reservation to pass to Settle; zero when not admitted.
	ID uint64
	// TTL is how long after DecidedAt (on the deciding node's clock) the
	// reservation stays pending: the policy's window. A Settle after it
	// changes nothing, and the estimate stands.
	TTL time.Duration
}

// Settlement is the outcome of Settle.
type Settlement struct {
	// Decision is the key's state after the settlement (Reason
	// ReasonSettled): Allowed reports whether a pending reservation was
	// settled.
	Decision
	// Estimate is the settled reservation's estimate (0 when none was
	// pending).
	Estimate int64
	// Overage is the units of the actual cost beyond the estimate,
	// recorded without admission: the windows holding the reservation's
	// instant may hold Limit + Overage.
	Overage int64
}

// Reserve admits req.Hits units (zero means 1) of req.Key as an estimate,
// pending under the returned reservation's ID until Settle or its TTL.
// The policy must be a sliding_log policy (else ErrWrongAlgorithm). Over
// the limit is Allowed == false with a nil error and a RetryAfter, as for
// Allow. Other errors are Allow's. Safe for concurrent use.
func (n *Node) Reserve(ctx context.Context, req Request) (Reservation, error) {
	if n.stopped.Load() {
		return Reservation{}, ErrClosed
	}
	if len(req.Policies) > 0 {
		return Reservation{}, fmt.Errorf("%w: a reservation is of one policy", ErrInvalidKey)
	}
	var r opReq
	ek, err := n.parseReqInto(&r, partition.OpReserve, req.Key, nil, req.Hits, nil)
	if err != nil {
		return Reservation{}, err
	}
	r.EK = ek
	d, err := n.route(ctx, &r, r.EK)
	if err != nil {
		return Reservation{}, err
	}
	out := Reservation{Decision: d}
	if d.Allowed {
		out.ID, out.TTL = r.Lease, r.LeaseTTL
	}
	return out, nil
}

// Settle replaces reservation id's estimate with actual (0 or more) at
// the key's holder. An id that is not pending (settled already, expired,
// reset, a fail-open id, or never made) is Allowed == false with a nil
// error and changes nothing: settling twice is harmless. It is never
// answered without the holder (ErrUnavailable): the estimate stands.
func (n *Node) Settle(ctx context.Context, key Key, id uint64, actual int64) (Settlement, error) {
	if n.stopped.Load() {
		return Settlement{}, ErrClosed
	}
	if actual < 0 {
		return Settlement{}, fmt.Errorf("%w: actual cost %d must not be negative", ErrInvalidHits, actual)
	}
	var r opReq
	ek, err := n.parseReqInto(&r, partition.OpSettle, key, nil, 1, nil)
	if err != nil {
		return Settlement{}, err
	}
	r.EK, r.Lease, r.Actual = ek, id, actual
	if r.P.Config.OnUnavailable == Fallback {
		// The reservation may have come from this node's fallback store.
		_, _ = n.failure.fallback.Settle(key, n.failure.fallbackPolicy(r.P), id, actual, n.clock())
	}
	d, err := n.route(ctx, &r, r.EK)
	if err != nil {
		return Settlement{}, err
	}
	if d.Allowed && r.Overage > 0 {
		if m, ok := n.metrics.(overageSink); ok {
			m.Overage(r.P.Name, r.Overage)
		}
	}
	return Settlement{Decision: d, Estimate: r.Estimate, Overage: r.Overage}, nil
}

// overageSink is the optional Metrics method that counts settlements'
// overage (peer/prommetrics has it).
type overageSink interface {
	Overage(policy string, units int64)
}

// SetPolicies replaces the node's policy table with a copy of pols, at
// once, for every request that starts afterwards (requests in progress
// finish with the table they started with). An invalid table returns an
// error wrapping ErrInvalidConfig, naming every problem, and the node
// keeps its table. Either way the outcome is reported to
// Metrics.PolicyTable. The new table's version is gossiped to the other
// members, which keep using this node as a holder whatever table they run
// (a change keeps each key's state; the comment at the top of
// peer/policies.go says what that means for each algorithm). Safe for
// concurrent use; calls are applied one at a time.
func (n *Node) SetPolicies(pols map[string]PolicyConfig) error { return n.table.set(pols) }

// PolicyVersion returns the version of the node's current policy table: a
// hash of what changes a holder's decision (53 bits, never zero). Two
// members with the same version decide alike.
func (n *Node) PolicyVersion() uint64 { return n.table.Load().Version() }

// Policy returns the current table's entry for name. Safe for concurrent
// use; it neither locks nor allocates.
func (n *Node) Policy(name string) (PolicyConfig, bool) {
	p := n.table.Load().Lookup(name)
	if p == nil {
		return PolicyConfig{}, false
	}
	return p.Config, true
}

// MemberPolicyVersions returns the policy table version each live member
// gossips, by member name (this node included); 0 for a member that does
// not gossip one (an older version). The caller owns the map.
func (n *Node) MemberPolicyVersions() map[string]uint64 { return n.table.memberVersions() }

// SpreadKeys lists the keys this node tracks for spreading, most active
// first (for /debug/hotkeys).
func (n *Node) SpreadKeys() []SpreadKey { return n.spread.keys() }

// Ready reports whether the node is part of the cluster, and if not, why
// (the reason is empty when ready). It is not ready while closing, while
// it was given Join seeds but knows no other live member, while it
// ignores live gossip members (another placement fingerprint,
// unreadable metadata, another cluster), or while partitions are still
// moving to or from it (Settled). Safe for concurrent use.
//
// While partitions move, the reason names the first one that keeps the
// node unsettled and how it stands here (ownership's Explain): what an
// operator needs when a node stays unready.
func (n *Node) Ready() (bool, string) {
	ok, reason, code := n.ops.ready.readiness()
	if code == ReadyReasonMoving {
		if p := n.lo.unsettled(n.view.Load()); p >= 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			if ex := n.lo.run.Explain(ctx, []int{p}); len(ex) == 1 {
				reason += " (first: " + ex[0] + ")"
			}
			cancel()
		}
	}
	return ok, reason
}
