package shard

import (
	"errors"
	"fmt"
	"time"
)

// Algorithm names one limiting algorithm. Each keeps a different promise;
// they are separate policies, not tunings of one another.
type Algorithm uint8

const (
	// SlidingLog (the default) admits at most Limit units in any rolling
	// interval (t − Window, t]. It is exact: the log holds every admission as
	// (timestamp, count) runs until it is Window old. It allows a burst of
	// Limit at one instant when the log is empty.
	SlidingLog Algorithm = iota
	// TokenBucket is GCRA: a bucket of Limit units that refills one unit
	// every Window/Limit. It allows a burst of at most Limit, then a steady
	// rate of Limit per Window. Over any interval of length d it admits at
	// most Limit + d·Limit/Window units, so a rolling window can see up to
	// about 2·Limit: it smooths, it does not cap a window.
	TokenBucket
	// FixedWindow counts admissions per aligned interval [kW, (k+1)W). It is
	// kept to demonstrate the boundary problem: Limit just before an edge and
	// Limit just after it are all admitted, 2·Limit within moments. A window
	// imported from another node (Store.Import) keeps its boundaries until
	// it ends, so a handoff between offset clocks never resets it early.
	FixedWindow
	// Concurrency caps work in progress, not a rate: at most Limit units
	// held at any moment by leases. Store.Acquire takes a lease of hits
	// units; Store.Release ends it; a lease not released expires Window
	// after it was taken (the lease TTL), so a crashed client cannot keep
	// capacity. A lease exactly Window old has expired, as an admission
	// exactly Window old has in the sliding log. Allow, AllowMulti and
	// Refund refuse a Concurrency policy with ErrWrongAlgorithm: an
	// admission that cannot be released would be a lease nobody ends.
	Concurrency
	// Calendar counts admissions per calendar period (Policy.Period: a
	// day, ISO week, month or year) in Policy.Zone. A period starts at its
	// calendar boundary and the instant of the edge belongs to the new
	// period; at most Limit units are admitted per period, so Limit just
	// before an edge and Limit at it are all admitted, as in FixedWindow.
	// Window and Resolution must be zero: the calendar sets the length (a
	// day of 23 or 25 hours on a daylight-saving change, months of 28 to
	// 31 days). Its exported state names the period by its start instant,
	// not by an age (see calendarWindow).
	Calendar
	numAlgorithms
)

var algorithmNames = [numAlgorithms]string{"sliding_log", "token_bucket", "fixed_window", "concurrency", "calendar"}

// String returns the algorithm's stable name: sliding_log, token_bucket,
// fixed_window, concurrency or calendar.
func (a Algorithm) String() string {
	if a < numAlgorithms {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// ParseAlgorithm maps a stable name (see String) to its Algorithm. The empty
// string means SlidingLog.
func ParseAlgorithm(s string) (Algorithm, error) {
	if s == "" {
		return SlidingLog, nil
	}
	for i, n := range algorithmNames {
		if n == s {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown algorithm %q (want sliding_log, token_bucket, fixed_window, concurrency or calendar)", ErrInvalidPolicy, s)
}

// DefaultResolution is the timestamp resolution used when
// Policy.Resolution is zero.
const DefaultResolution = time.Millisecond

// MaxWindow bounds Policy.Window: 100 years of 365.25 days, about 3.16·10^18
// ns, below 2^62. The bound keeps every difference of two in-window times,
// twice a window, and a window plus the unrounded part of a timestamp inside
// int64; sums with now that could still pass the int64 range (now itself is
// any int64) saturate. Without it a window above about 236 years made
// now + Window wrap, so token_bucket and fixed_window admitted at random and
// Sweep dropped live sliding-log keys. A rate limit over a longer window is
// not a rate limit.
const MaxWindow = 100 * year

// year is 365.25 days, for MaxWindow and for messages about it.
const year = 36525 * 24 * time.Hour / 100

// Limit has no bound below math.MaxInt64: every comparison is written as
// hits ≤ Limit − count (count never exceeds Limit, see slidingLog.merge), so
// count + hits is never computed.

// Policy is one named limit: how many units (Limit) per Window, under which
// Algorithm.
type Policy struct {
	// Limit is the number of units admitted per window (for Concurrency,
	// the units held at once). Must be positive.
	Limit int64
	// Window is the rolling interval (for Concurrency, the lease TTL). Must
	// be positive and at most MaxWindow (100 years).
	Window time.Duration
	// Algorithm is the limiting algorithm. Zero means SlidingLog.
	Algorithm Algorithm
	// Resolution is the SlidingLog timestamp granularity: admission times
	// are rounded up to a multiple of it, which keeps the promise and bounds
	// a key's log to Window/Resolution runs. Zero means 1 ms. Must not
	// exceed Window.
	Resolution time.Duration
	// Period is the calendar unit of a Calendar policy; required there and
	// NoPeriod for every other algorithm.
	Period Period
	// Zone is the time zone whose calendar a Calendar policy follows. Nil
	// means UTC. Ignored by other algorithms.
	Zone *time.Location
}

// Validate reports every problem with the policy, joined, each wrapping
// ErrInvalidPolicy.
func (p Policy) Validate() error {
	var errs []error
	if p.Limit <= 0 {
		errs = append(errs, fmt.Errorf("%w: limit %d must be positive", ErrInvalidPolicy, p.Limit))
	}
	if p.Algorithm == Calendar {
		if p.Period == NoPeriod || p.Period >= numPeriods {
			errs = append(errs, fmt.Errorf("%w: calendar policy needs a period (calendar_day, calendar_week, calendar_month or calendar_year)", ErrInvalidPolicy))
		}
		if p.Window != 0 || p.Resolution != 0 {
			errs = append(errs, fmt.Errorf("%w: calendar policy takes its length from its period; leave window (%v) and resolution (%v) zero", ErrInvalidPolicy, p.Window, p.Resolution))
		}
		return errors.Join(errs...)
	}
	if p.Period != NoPeriod {
		errs = append(errs, fmt.Errorf("%w: period %v needs algorithm calendar, not %v", ErrInvalidPolicy, p.Period, p.Algorithm))
	}
	if p.Window <= 0 {
		errs = append(errs, fmt.Errorf("%w: window %v must be positive", ErrInvalidPolicy, p.Window))
	} else if p.Window > MaxWindow {
		errs = append(errs, fmt.Errorf("%w: window %s exceeds the maximum %s; use a window of at most 100 years", ErrInvalidPolicy, years(p.Window), years(MaxWindow)))
	}
	if p.Algorithm >= numAlgorithms {
		errs = append(errs, fmt.Errorf("%w: unknown algorithm %d", ErrInvalidPolicy, p.Algorithm))
	}
	if p.Resolution < 0 {
		errs = append(errs, fmt.Errorf("%w: resolution %v must not be negative", ErrInvalidPolicy, p.Resolution))
	} else if p.Window > 0 && p.Resolution > p.Window {
		errs = append(errs, fmt.Errorf("%w: resolution %v exceeds window %v", ErrInvalidPolicy, p.Resolution, p.Window))
	}
	return errors.Join(errs...)
}

// valid is the allocation-free check used on the decision path.
func (p *Policy) valid() bool {
	if p.Algorithm == Calendar {
		return p.Limit > 0 && p.Period != NoPeriod && p.Period < numPeriods && p.Window == 0 && p.Resolution == 0
	}
	return p.Period == NoPeriod && p.Limit > 0 && p.Window > 0 && p.Window <= MaxWindow && p.Algorithm < numAlgorithms && p.Resolution >= 0 && p.Resolution <= p.Window
}

// years formats a long duration in years of 365.25 days ("300y"), with the
// exact Duration for windows that are not whole years.
func years(d time.Duration) string {
	if d%year == 0 {
		return fmt.Sprintf("%dy", d/year)
	}
	return fmt.Sprintf("%.1fy (%v)", float64(d)/float64(year), d)
}

func (p *Policy) resolution() int64 {
	if p.Resolution == 0 {
		return int64(DefaultResolution)
	}
	return int64(p.Resolution)
}

// checkHits validates a request's cost against the policy.
func checkHits(p *Policy, hits int64) error {
	if hits <= 0 {
		return fmt.Errorf("%w: hits %d must be positive", ErrInvalidHits, hits)
	}
	if hits > p.Limit {
		return fmt.Errorf("%w: hits %d exceed limit %d and can never be admitted", ErrInvalidHits, hits, p.Limit)
	}
	return nil
}

// Decision is the verdict on one request. Over limit is Allowed == false with
// a nil error.
type Decision struct {
	// Allowed reports whether the request was admitted (and recorded).
	Allowed bool
	// Limit is the policy's limit.
	Limit int64
	// Remaining is how many units could still be admitted at this instant,
	// after this decision.
	Remaining int64
	// RetryAfter is, for a rejected request, the exact time until enough
	// admissions expire for this request's hits to fit (assuming no other
	// admissions). Zero when allowed.
	RetryAfter time.Duration
	// ResetAfter is the time until the key's state is empty again (every
	// recorded admission expired, or the bucket full).
	ResetAfter time.Duration
}

// limiter is one key's state under one algorithm. Implementations assume the
// caller validated the policy and hits and serialises calls. Each also has
// allow(now int64, p Policy, hits int64, d *Decision), called through
// allowLimiter rather than this interface (see there).
type limiter interface {
	// idleAt returns the time (ns) from which the state is equivalent to a
	// fresh one and may be reclaimed.
	idleAt(window int64) int64
	// export appends the state to dst as runs with ages relative to now.
	export(dst []Run, now int64) []Run
	// merge folds rebased runs into the state, conservatively (never freeing
	// quota the sender had used).
	merge(now int64, runs []Run, p Policy)
	// peek returns the decision allow would make at now, changing nothing.
	peek(now int64, p Policy, hits int64) Decision
	// refund gives back up to hits (>= 1) units still counted at now,
	// newest first, and returns the state after it: Allowed reports whether
	// anything was given back, Remaining and ResetAfter describe the state.
	refund(now int64, p Policy, hits int64) Decision
	// bytes is the memory the state holds beyond its fixed struct.
	bytes() int64
}

// allowLimiter makes lim's decision at now (ns) into *d and records it on
// admission. The decision is written through d rather than returned: a
// Decision has too many fields for registers, so each return copies it
// through the stack. allow is called on the concrete type, not through
// limiter, because a pointer passed to an interface method escapes and d
// would be allocated on every decision.
func allowLimiter(lim limiter, now int64, p Policy, hits int64, d *Decision) {
	switch l := lim.(type) {
	case *slidingLog:
		l.allow(now, p, hits, d)
	case *gcra:
		l.allow(now, p, hits, d)
	case *fixedWindow:
		l.allow(now, p, hits, d)
	case *calendarWindow:
		l.allow(now, p, hits, d)
	case *leases:
		l.allow(now, p, hits, d)
	default:
		panic(fmt.Sprintf("shard: unknown limiter %T", lim))
	}
}

func newLimiter(a Algorithm) limiter {
	switch a {
	case Concurrency:
		return &leases{}
	case TokenBucket:
		return &gcra{}
	case FixedWindow:
		return &fixedWindow{}
	case Calendar:
		return &calendarWindow{}
	default:
		return &slidingLog{}
	}
}
