package peer

// The failure policy, in one place: what a node answers when the holder
// of a key could not decide (unreachable, no holder yet, a partition
// moving, its lease ended). A check takes its policy's OnUnavailable:
// FailClosed (the default) answers an error wrapping ErrUnavailable;
// FailOpen admits with ReasonFailedOpen; Fallback decides on a local log
// with the fallback limit (FallbackLimit, or the limit shared among the
// ring's members) with ReasonFallback. Whichever applies, the answer says
// unavailable, never over limit. Peeks, refunds and resets are never
// answered without their holder; acquires and reserves fall back to a
// local lease or reservation nobody else records.

import (
	"errors"
	"fmt"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/shard"
)

// unavailable applies the failure policy to a request the holder could
// not decide: a check takes its policy's OnUnavailable (for several
// policies, those of the policies the key is limited by: fail closed if
// any of them does, else the first's; admitted as unlimited only when it
// is unlimited in all); peeks, refunds and resets are never answered
// without their holder.
func (n *Node) unavailable(r *opReq, cause error) (Decision, error) {
	switch r.Op.Spec().Fail {
	case partition.FailLease:
		return n.acquireUnavailable(r, cause)
	case partition.FailNever:
		// Never answered without the holder, even for an unlimited key.
		return n.onUnavailable(&policy.Entry{Name: r.P.Name, Shard: r.P.Shard}, r.Key, r.Hits, cause)
	}
	p := r.P
	limited := false
	for _, q := range r.Multi {
		// A policy the key is unlimited in would admit without a
		// decision (onUnavailable): it must not stand for a limited one,
		// whose own failure policy holds.
		if q.Unlimited {
			continue
		}
		if !limited {
			p, limited = q, true
		}
		if q.Config.OnUnavailable == FailClosed {
			p = q
			break
		}
	}
	if r.Multi != nil && p.Config.OnUnavailable != FailClosed {
		// Fail open or fall back on the first policy's terms: the local
		// fallback log is per key, so a multi-policy fallback uses the
		// first policy's key.
		k := r.Key
		k.Policy = p.Name
		return n.onUnavailable(p, k, r.Hits, cause)
	}
	return n.onUnavailable(p, r.Key, r.Hits, cause)
}

// onUnavailable applies the policy's OnUnavailable to a request whose owner
// could not decide. cause is kept in the returned error.
func (n *Node) onUnavailable(p *policy.Entry, key Key, hits int64, cause error) (Decision, error) {
	if errors.Is(cause, ErrClosed) {
		return Decision{}, ErrClosed
	}
	if errors.Is(cause, ErrInvalidKey) || errors.Is(cause, ErrInvalidHits) || errors.Is(cause, ErrUnknownPolicy) || errors.Is(cause, ErrWrongAlgorithm) {
		return Decision{}, cause
	}
	v := n.view.Load()
	if p.Unlimited {
		// This node's table exempts the key; the holder's would most
		// likely too. Admitting is what the exemption asks for.
		n.metrics.Decision(p.Name, ReasonUnlimited, PathLocal)
		return Decision{Allowed: true, Reason: ReasonUnlimited, Owner: n.name, RingVersion: v.snap.Version()}, nil
	}
	switch p.Config.OnUnavailable {
	case FailOpen:
		n.warnThrottled("owner unavailable: failing open", "policy", p.Name, "err", cause)
		n.metrics.Decision(p.Name, ReasonFailedOpen, PathLocal)
		return Decision{Allowed: true, Limit: p.Shard.Limit, Reason: ReasonFailedOpen, Owner: n.name, RingVersion: v.snap.Version()}, nil
	case Fallback:
		n.warnThrottled("owner unavailable: deciding on the local fallback limit", "policy", p.Name, "err", cause)
		sp := n.fallbackPolicy(p)
		d := Decision{Limit: sp.Limit, Reason: ReasonFallback, Owner: n.name, RingVersion: v.snap.Version()}
		if hits <= sp.Limit {
			sd, err := n.fallback.Allow(key, sp, hits, n.clock())
			if err != nil {
				return Decision{}, fmt.Errorf("%w: fallback: %w", ErrUnavailable, err)
			}
			d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter = sd.Allowed, sd.Remaining, sd.RetryAfter, sd.ResetAfter
		}
		n.metrics.Decision(p.Name, ReasonFallback, PathLocal)
		return d, nil
	default:
		reason := ReasonUnavailable
		if errors.Is(cause, ErrCapacity) {
			reason = ReasonCapacity
		}
		n.metrics.Decision(p.Name, reason, PathLocal)
		if errors.Is(cause, ErrUnavailable) {
			return Decision{}, cause
		}
		return Decision{}, fmt.Errorf("%w: %w", ErrUnavailable, cause)
	}
}

// acquireUnavailable applies the policy's OnUnavailable to an acquire (or
// a reserve) the holder could not decide.
func (n *Node) acquireUnavailable(r *opReq, cause error) (Decision, error) {
	p := r.P
	if p.Config.OnUnavailable != Fallback || p.Unlimited || errors.Is(cause, ErrClosed) ||
		errors.Is(cause, ErrInvalidKey) || errors.Is(cause, ErrInvalidHits) || errors.Is(cause, ErrUnknownPolicy) || errors.Is(cause, ErrWrongAlgorithm) {
		d, err := n.onUnavailable(p, r.Key, r.Hits, cause)
		if err == nil && d.Allowed {
			// Fail open (or an unlimited key): a lease nobody records.
			r.Lease, r.LeaseTTL = partition.NewLeaseID(), p.Shard.Window
		}
		return d, err
	}
	n.warnThrottled("owner unavailable: leasing on the local fallback limit", "policy", p.Name, "err", cause)
	sp := n.fallbackPolicy(p)
	v := n.view.Load()
	d := Decision{Limit: sp.Limit, Reason: ReasonFallback, Owner: n.name, RingVersion: v.snap.Version()}
	if r.Hits <= sp.Limit {
		now := n.clock()
		var sd shard.Decision
		var err error
		for range 4 {
			r.Lease = partition.NewLeaseID()
			if r.Op == partition.OpReserve {
				if sd, err = n.fallback.Reserve(r.Key, sp, r.Hits, r.Lease, now); !errors.Is(err, shard.ErrInvalidReservation) {
					break
				}
			} else if sd, err = n.fallback.Acquire(r.Key, sp, r.Hits, r.Lease, now); !errors.Is(err, shard.ErrInvalidLease) {
				break
			}
		}
		if err != nil {
			return Decision{}, fmt.Errorf("%w: fallback: %w", ErrUnavailable, err)
		}
		d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter, d.DecidedAt = sd.Allowed, sd.Remaining, sd.RetryAfter, sd.ResetAfter, now
		r.LeaseTTL = sp.Window
	}
	n.metrics.Decision(p.Name, ReasonFallback, PathLocal)
	return d, nil
}

// fallbackPolicy is p with the local fallback limit.
func (n *Node) fallbackPolicy(p *policy.Entry) shard.Policy {
	sp := p.Shard
	sp.Limit = p.Config.FallbackLimit
	if sp.Limit == 0 {
		sp.Limit = max(1, p.Shard.Limit/int64(max(1, n.view.Load().snap.Len())))
	}
	return sp
}

// capacityReached is the error of a request for a new key that partition
// pid's store has no room for (shard.ErrCapacity), warned about (throttled)
// on the holder, where the operator can act.
func (n *Node) capacityReached(pid int, cause error) error {
	n.warnThrottled("key capacity reached: new keys refused", "partition", pid, "max_keys", n.cfg.Store.MaxKeys)
	return &capacityError{cause: cause}
}

// warnThrottled logs a degraded-service warning at most once per second per
// node, so an outage does not flood the log.
func (n *Node) warnThrottled(msg string, args ...any) {
	now := time.Now().UnixNano()
	last := n.lastWarn.Load()
	if now-last < int64(time.Second) || !n.lastWarn.CompareAndSwap(last, now) {
		return
	}
	n.log.Warn(msg, args...)
}
