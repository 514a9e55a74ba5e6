package peer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

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
	if n.closing.Load() {
		return Decision{}, ErrClosed
	}
	// The key is validated first: a malformed policy part is an invalid
	// key, not an unknown policy.
	var buf [shard.MaxEncodedKeyLen]byte
	ek, ok := req.Key.AppendEncoded(buf[:0])
	if !ok {
		return Decision{}, fmt.Errorf("%w: %w", ErrInvalidKey, req.Key.Validate())
	}
	p := n.policies[req.Key.Policy]
	if p == nil {
		return Decision{}, fmt.Errorf("%w: %q", ErrUnknownPolicy, req.Key.Policy)
	}
	hits := req.Hits
	if hits == 0 {
		hits = 1
	}
	if hits < 0 || hits > p.sp.Limit {
		return Decision{}, fmt.Errorf("%w: hits %d must be between 1 and the limit %d", ErrInvalidHits, hits, p.sp.Limit)
	}
	var cause error
	redirect := ""
	for attempt := 0; attempt <= n.cfg.NotOwnerRetries; attempt++ {
		v := n.view.Load()
		owner := v.snap.Owner(ek)
		hops := uint32(0)
		if redirect != "" {
			owner, redirect, hops = redirect, "", 1
			if owner == n.name && n.handoff.adoptedFrom(ek) != v.snap.Owner(ek) {
				// Told to ask ourselves, but we hold no handed-off state
				// for the key: our ring must catch up first.
				owner = v.snap.Owner(ek)
				hops = 0
			}
		}
		var d Decision
		var err error
		path := PathLocal
		if owner == n.name {
			d, err = n.decideOwned(ctx, v, req.Key, ek, p, hits, hops > 0)
		} else {
			path = PathForwarded
			d, err = n.forward(ctx, v, owner, req.Key, hits, hops)
		}
		if err == nil {
			n.metrics.Decision(p.name, d.Reason, path)
			return d, nil
		}
		var no *notOwnerError
		if !errors.As(err, &no) {
			return n.onUnavailable(p, req.Key, hits, err)
		}
		cause = err
		if no.owner != "" && no.owner != owner && v.snap.Has(no.owner) {
			// The state moved to a member our ring does not name as owner
			// yet (handoff in progress): ask that member directly, once.
			redirect = no.owner
			continue
		}
		if err := n.awaitView(ctx, v); err != nil {
			return n.onUnavailable(p, req.Key, hits, errors.Join(cause, err))
		}
	}
	return n.onUnavailable(p, req.Key, hits, cause)
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

// notOwnerError is a receiver's "not owner" answer, with the member it
// believes holds the key and its members hash.
type notOwnerError struct {
	owner       string
	membersHash uint64
}

func (e *notOwnerError) Error() string {
	return fmt.Sprintf("peer: not owner (holder %q, members hash %016x)", e.owner, e.membersHash)
}
func (e *notOwnerError) Unwrap() error { return errNotOwner }

// decideOwned decides for a key this node owns in view v (or holds by
// handoff, when adopted is true). It returns a *notOwnerError when the key's
// state has moved away, and an error wrapping ErrUnavailable when the state
// cannot be settled in time.
func (n *Node) decideOwned(ctx context.Context, v *view, key Key, ek []byte, p *policy, hits int64, adopted bool) (Decision, error) {
	if err := n.settle(ctx, v, key, ek, p); err != nil {
		return Decision{}, err
	}
	now := n.clock()
	// admit decides under the key's handoff gate (handoff.go): a
	// *notOwnerError if the state left meanwhile, else ErrUnavailable.
	sd, err := n.admit(v, key, ek, p, hits, now)
	if err != nil {
		return Decision{}, err
	}
	d := Decision{
		Allowed:     sd.Allowed,
		Limit:       sd.Limit,
		Remaining:   sd.Remaining,
		RetryAfter:  sd.RetryAfter,
		ResetAfter:  sd.ResetAfter,
		Reason:      ReasonAdmitted,
		Owner:       n.name,
		RingVersion: v.snap.Version(),
	}
	if !sd.Allowed {
		d.Reason = ReasonOverLimit
		if p.cfg.Shadow {
			d.Allowed, d.Reason = true, ReasonShadow
		}
	} else if n.cfg.Backup {
		n.backup.note(key, ek)
	}
	// Hot keys are sampled: one decision in hotSample records hotSample
	// times the hits, which keeps the tracker's lock off most decisions.
	if rand.Uint32()%hotSample == 0 {
		n.hot.RecordBytes(ek, hits*hotSample, now)
	}
	return d, nil
}

const hotSample = 8

// onUnavailable applies the policy's OnUnavailable to a request whose owner
// could not decide. cause is kept in the returned error.
func (n *Node) onUnavailable(p *policy, key Key, hits int64, cause error) (Decision, error) {
	if errors.Is(cause, ErrClosed) {
		return Decision{}, ErrClosed
	}
	if errors.Is(cause, ErrInvalidKey) || errors.Is(cause, ErrInvalidHits) || errors.Is(cause, ErrUnknownPolicy) {
		return Decision{}, cause
	}
	v := n.view.Load()
	switch p.cfg.OnUnavailable {
	case FailOpen:
		n.warnThrottled("owner unavailable: failing open", "policy", p.name, "err", cause)
		n.metrics.Decision(p.name, ReasonFailedOpen, PathLocal)
		return Decision{Allowed: true, Limit: p.sp.Limit, Reason: ReasonFailedOpen, Owner: n.name, RingVersion: v.snap.Version()}, nil
	case Fallback:
		n.warnThrottled("owner unavailable: deciding on the local fallback limit", "policy", p.name, "err", cause)
		sp := p.sp
		sp.Limit = p.cfg.FallbackLimit
		if sp.Limit == 0 {
			sp.Limit = max(1, p.sp.Limit/int64(max(1, v.snap.Len())))
		}
		d := Decision{Limit: sp.Limit, Reason: ReasonFallback, Owner: n.name, RingVersion: v.snap.Version()}
		if hits <= sp.Limit {
			sd, err := n.fallback.Allow(key, sp, hits, n.clock())
			if err != nil {
				return Decision{}, fmt.Errorf("%w: fallback: %w", ErrUnavailable, err)
			}
			d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter = sd.Allowed, sd.Remaining, sd.RetryAfter, sd.ResetAfter
		}
		n.metrics.Decision(p.name, ReasonFallback, PathLocal)
		return d, nil
	default:
		n.metrics.Decision(p.name, ReasonUnavailable, PathLocal)
		if errors.Is(cause, ErrUnavailable) {
			return Decision{}, cause
		}
		return Decision{}, fmt.Errorf("%w: %w", ErrUnavailable, cause)
	}
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
