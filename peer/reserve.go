package peer

import (
	"context"
	"fmt"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
)

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
		_, _ = n.fallback.Settle(key, n.fallbackPolicy(r.P), id, actual, n.clock())
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
