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
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/shard"
)

// failEnv is what the failure policy takes of its node, set once in New.
type failEnv struct {
	self    string // this node's name, the Owner of its answers
	metrics Metrics
	clock   func() time.Time      // the node's clock: fallback decisions' time
	view    *atomic.Pointer[view] // the node's view: ring version, member count
	warn    func(msg string, args ...any)
	maxKeys int // Config.Store.MaxKeys, named when a store is full
}

// failurePolicy answers what the holder could not decide. It owns the
// local fallback log: decisions under Fallback, and the leases and
// reservations taken on it.
type failurePolicy struct {
	env      failEnv
	fallback *shard.Store
}

// unavailable applies the failure policy to a request the holder could
// not decide: a check takes its policy's OnUnavailable (for several
// policies, those of the policies the key is limited by: fail closed if
// any of them does, else the first's; admitted as unlimited only when it
// is unlimited in all); peeks, refunds and resets are never answered
// without their holder.
func (f *failurePolicy) unavailable(r *opReq, cause error) (Decision, error) {
	switch r.Op.Spec().Fail {
	case partition.FailLease:
		return f.acquireUnavailable(r, cause)
	case partition.FailNever:
		// Never answered without the holder, even for an unlimited key.
		return f.onUnavailable(&policy.Entry{Name: r.P.Name, Shard: r.P.Shard}, r.Key, r.Hits, cause)
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
		return f.onUnavailable(p, k, r.Hits, cause)
	}
	return f.onUnavailable(p, r.Key, r.Hits, cause)
}

// onUnavailable applies the policy's OnUnavailable to a request whose owner
// could not decide. cause is kept in the returned error.
func (f *failurePolicy) onUnavailable(p *policy.Entry, key Key, hits int64, cause error) (Decision, error) {
	if errors.Is(cause, ErrClosed) {
		return Decision{}, ErrClosed
	}
	if errors.Is(cause, ErrInvalidKey) || errors.Is(cause, ErrInvalidHits) || errors.Is(cause, ErrUnknownPolicy) || errors.Is(cause, ErrWrongAlgorithm) {
		return Decision{}, cause
	}
	v := f.env.view.Load()
	if p.Unlimited {
		// This node's table exempts the key; the holder's would most
		// likely too. Admitting is what the exemption asks for.
		f.env.metrics.Decision(p.Name, ReasonUnlimited, PathLocal)
		return Decision{Allowed: true, Reason: ReasonUnlimited, Owner: f.env.self, RingVersion: v.snap.Version()}, nil
	}
	switch p.Config.OnUnavailable {
	case FailOpen:
		f.env.warn("owner unavailable: failing open", "policy", p.Name, "err", cause)
		f.env.metrics.Decision(p.Name, ReasonFailedOpen, PathLocal)
		return Decision{Allowed: true, Limit: p.Shard.Limit, Reason: ReasonFailedOpen, Owner: f.env.self, RingVersion: v.snap.Version()}, nil
	case Fallback:
		f.env.warn("owner unavailable: deciding on the local fallback limit", "policy", p.Name, "err", cause)
		sp := f.fallbackPolicy(p)
		d := Decision{Limit: sp.Limit, Reason: ReasonFallback, Owner: f.env.self, RingVersion: v.snap.Version()}
		if hits <= sp.Limit {
			sd, err := f.fallback.Allow(key, sp, hits, f.env.clock())
			if err != nil {
				return Decision{}, fmt.Errorf("%w: fallback: %w", ErrUnavailable, err)
			}
			d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter = sd.Allowed, sd.Remaining, sd.RetryAfter, sd.ResetAfter
		}
		f.env.metrics.Decision(p.Name, ReasonFallback, PathLocal)
		return d, nil
	default:
		reason := ReasonUnavailable
		if errors.Is(cause, ErrCapacity) {
			reason = ReasonCapacity
		}
		f.env.metrics.Decision(p.Name, reason, PathLocal)
		if errors.Is(cause, ErrUnavailable) {
			return Decision{}, cause
		}
		return Decision{}, fmt.Errorf("%w: %w", ErrUnavailable, cause)
	}
}

// acquireUnavailable applies the policy's OnUnavailable to an acquire (or
// a reserve) the holder could not decide.
func (f *failurePolicy) acquireUnavailable(r *opReq, cause error) (Decision, error) {
	p := r.P
	if p.Config.OnUnavailable != Fallback || p.Unlimited || errors.Is(cause, ErrClosed) ||
		errors.Is(cause, ErrInvalidKey) || errors.Is(cause, ErrInvalidHits) || errors.Is(cause, ErrUnknownPolicy) || errors.Is(cause, ErrWrongAlgorithm) {
		d, err := f.onUnavailable(p, r.Key, r.Hits, cause)
		if err == nil && d.Allowed {
			// Fail open (or an unlimited key): a lease nobody records.
			r.Lease, r.LeaseTTL = partition.NewLeaseID(), p.Shard.Window
		}
		return d, err
	}
	f.env.warn("owner unavailable: leasing on the local fallback limit", "policy", p.Name, "err", cause)
	sp := f.fallbackPolicy(p)
	v := f.env.view.Load()
	d := Decision{Limit: sp.Limit, Reason: ReasonFallback, Owner: f.env.self, RingVersion: v.snap.Version()}
	if r.Hits <= sp.Limit {
		now := f.env.clock()
		var sd shard.Decision
		var err error
		for range 4 {
			r.Lease = partition.NewLeaseID()
			if r.Op == partition.OpReserve {
				if sd, err = f.fallback.Reserve(r.Key, sp, r.Hits, r.Lease, now); !errors.Is(err, shard.ErrInvalidReservation) {
					break
				}
			} else if sd, err = f.fallback.Acquire(r.Key, sp, r.Hits, r.Lease, now); !errors.Is(err, shard.ErrInvalidLease) {
				break
			}
		}
		if err != nil {
			return Decision{}, fmt.Errorf("%w: fallback: %w", ErrUnavailable, err)
		}
		d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter, d.DecidedAt = sd.Allowed, sd.Remaining, sd.RetryAfter, sd.ResetAfter, now
		r.LeaseTTL = sp.Window
	}
	f.env.metrics.Decision(p.Name, ReasonFallback, PathLocal)
	return d, nil
}

// fallbackPolicy is p with the local fallback limit.
func (f *failurePolicy) fallbackPolicy(p *policy.Entry) shard.Policy {
	sp := p.Shard
	sp.Limit = p.Config.FallbackLimit
	if sp.Limit == 0 {
		sp.Limit = max(1, p.Shard.Limit/int64(max(1, f.env.view.Load().snap.Len())))
	}
	return sp
}

// capacityReached is the error of a request for a new key that partition
// pid's store has no room for (shard.ErrCapacity), warned about (throttled)
// on the holder, where the operator can act.
func (f *failurePolicy) capacityReached(pid int, cause error) error {
	f.env.warn("key capacity reached: new keys refused", "partition", pid, "max_keys", f.env.maxKeys)
	return &capacityError{cause: cause}
}

// warnThrottle logs a node's degraded-service warnings at most once per
// second, so an outage does not flood the log.
type warnThrottle struct {
	log  *slog.Logger
	last atomic.Int64 // unix ns of the last warning logged
}

// warn logs msg at Warn unless a warning was logged in the last second.
func (w *warnThrottle) warn(msg string, args ...any) {
	now := time.Now().UnixNano()
	last := w.last.Load()
	if now-last < int64(time.Second) || !w.last.CompareAndSwap(last, now) {
		return
	}
	w.log.Warn(msg, args...)
}
