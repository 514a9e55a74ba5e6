package shard

import (
	"fmt"
	"time"
)

// Limiter is one key's limit on the caller's clock. It rejects a now earlier
// than any it has seen with ErrTimeBackwards. It is not safe for concurrent
// use; Store is the concurrent, many-key form.
type Limiter struct {
	policy Policy
	lim    limiter
	last   int64
}

// NewLimiter returns an empty limiter for p, or an error wrapping
// ErrInvalidPolicy.
func NewLimiter(p Policy) (*Limiter, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &Limiter{policy: p, lim: newLimiter(p.Algorithm), last: minTime}, nil
}

// Allow decides whether hits units may be admitted at now and records them if
// so. Over limit is Allowed == false with a nil error. Errors (time moved
// backwards, invalid hits, a Concurrency policy: ErrWrongAlgorithm) change
// nothing. Limiter has no leases; a concurrency limit is held by a Store.
func (l *Limiter) Allow(now time.Time, hits int64) (Decision, error) {
	t := now.UnixNano()
	if t < l.last {
		return Decision{}, fmt.Errorf("%w: %v is %v before the last decision", ErrTimeBackwards, now, time.Duration(l.last-t))
	}
	if err := checkHits(&l.policy, hits); err != nil {
		return Decision{}, err
	}
	if l.policy.Algorithm == Concurrency {
		return Decision{}, errNeedsLease()
	}
	l.last = t
	var d Decision
	allowLimiter(l.lim, t, l.policy, hits, &d)
	return d, nil
}

// Peek returns the decision Allow would make at now, recording nothing and
// leaving the limiter's clock where it was. Errors are Allow's.
func (l *Limiter) Peek(now time.Time, hits int64) (Decision, error) {
	t := now.UnixNano()
	if t < l.last {
		return Decision{}, fmt.Errorf("%w: %v is %v before the last decision", ErrTimeBackwards, now, time.Duration(l.last-t))
	}
	if err := checkHits(&l.policy, hits); err != nil {
		return Decision{}, err
	}
	return l.lim.peek(t, l.policy, hits), nil
}

// Refund gives back up to hits units still counted at now, newest first,
// as Store.Refund does, and returns the state after it. hits must be at
// least 1. Errors (time moved backwards, invalid hits) change nothing.
func (l *Limiter) Refund(now time.Time, hits int64) (Decision, error) {
	t := now.UnixNano()
	if t < l.last {
		return Decision{}, fmt.Errorf("%w: %v is %v before the last decision", ErrTimeBackwards, now, time.Duration(l.last-t))
	}
	if hits <= 0 {
		return Decision{}, checkHits(&l.policy, hits)
	}
	if l.policy.Algorithm == Concurrency {
		return Decision{}, errNeedsLease()
	}
	l.last = t
	return l.lim.refund(t, l.policy, hits), nil
}

// Policy returns the limiter's policy.
func (l *Limiter) Policy() Policy { return l.policy }
