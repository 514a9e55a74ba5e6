package shard

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// t0 is the fixed epoch of every time table in this package's tests. It is
// a multiple of 60 s (and of 7 ms), so fixed windows of 60 s and resolution
// steps of 7 ms start exactly at t0 and offsets read as in the boundary facts.
var t0 = time.Unix(1_699_999_980, 0)

const ms = time.Millisecond

// allowFunc is one implementation of a single key's decision.
type allowFunc func(now time.Time, hits int64) (Decision, error)

// namedDecider is an implementation under test, named for failure messages.
type namedDecider struct {
	name  string
	allow allowFunc
}

// deciders returns a fresh Limiter and a fresh Store key for p; every
// boundary fact must hold for both.
func deciders(t *testing.T, p Policy) []namedDecider {
	t.Helper()
	lim, err := NewLimiter(p)
	if err != nil {
		t.Fatalf("NewLimiter(%+v): %v", p, err)
	}
	store, err := NewStore(Config{})
	if err != nil {
		t.Fatalf("NewStore: %v", err)
	}
	key := Key{Tenant: "acme", Subject: "user-1", Policy: "api"}
	return []namedDecider{
		{"limiter", lim.Allow},
		{"store", func(now time.Time, hits int64) (Decision, error) { return store.Allow(key, p, hits, now) }},
	}
}

// boundaryStep is n identical requests at t0+at.
type boundaryStep struct {
	at      time.Duration
	n       int   // zero means 1
	hits    int64 // zero means 1
	allowed bool
	// want, if set, is the exact decision expected for the last of the n.
	want *Decision
}

func allowedD(limit, remaining int64, reset time.Duration) *Decision {
	return &Decision{Allowed: true, Limit: limit, Remaining: remaining, ResetAfter: reset}
}

func rejectedD(limit, remaining int64, retry, reset time.Duration) *Decision {
	return &Decision{Limit: limit, Remaining: remaining, RetryAfter: retry, ResetAfter: reset}
}

// rejectStorm is n rejected requests spread evenly over [from, to).
func rejectStorm(from, to time.Duration, n int) []boundaryStep {
	steps := make([]boundaryStep, n)
	for i := range steps {
		steps[i] = boundaryStep{at: from + (to-from)*time.Duration(i)/time.Duration(n)}
	}
	return steps
}

func concatSteps(parts ...[]boundaryStep) []boundaryStep {
	var out []boundaryStep
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// TestBoundaryFacts is the promise's boundary facts as a table, run against Limiter and
// Store.
func TestBoundaryFacts(t *testing.T) {
	l100 := Policy{Limit: 100, Window: 60 * time.Second}
	cases := []struct {
		name  string
		p     Policy
		steps []boundaryStep
	}{
		{
			name: "L=100 W=60s design facts",
			p:    l100,
			steps: []boundaryStep{
				{at: 59_900 * ms, n: 99, allowed: true},
				{at: 59_900 * ms, allowed: true, want: allowedD(100, 0, 60*time.Second)},
				{at: 60_100 * ms, n: 99},
				{at: 60_100 * ms, want: rejectedD(100, 0, 59_800*ms, 59_800*ms)},
				{at: 119_899 * ms, want: rejectedD(100, 0, ms, ms)},
				{at: 119_900 * ms, allowed: true, want: allowedD(100, 99, 60*time.Second)},
			},
		},
		{
			name: "L=100 W=60s first admission",
			p:    l100,
			steps: []boundaryStep{
				{at: 59_900 * ms, allowed: true, want: allowedD(100, 99, 60*time.Second)},
			},
		},
		{
			name: "L=1 admission exactly W old has expired",
			p:    Policy{Limit: 1, Window: 60 * time.Second},
			steps: []boundaryStep{
				{at: 0, allowed: true, want: allowedD(1, 0, 60*time.Second)},
				{at: 59_999 * ms, want: rejectedD(1, 0, ms, ms)},
				{at: 60_000 * ms, allowed: true, want: allowedD(1, 0, 60*time.Second)},
				{at: 60_000*ms + 1, want: rejectedD(1, 0, 60*time.Second-1, 60*time.Second-1)},
			},
		},
		{
			name: "fixed window admits both bursts",
			p:    Policy{Limit: 100, Window: 60 * time.Second, Algorithm: FixedWindow},
			steps: []boundaryStep{
				{at: 59_900 * ms, n: 99, allowed: true},
				{at: 59_900 * ms, allowed: true, want: allowedD(100, 0, 100*ms)},
				{at: 60_100 * ms, allowed: true, want: allowedD(100, 99, 59_900*ms)},
				{at: 60_100 * ms, n: 99, allowed: true},
				{at: 60_200 * ms, want: rejectedD(100, 0, 59_800*ms, 59_800*ms)},
				{at: 120_000 * ms, allowed: true, want: allowedD(100, 99, 60*time.Second)},
			},
		},
		{
			name: "rejected storm costs nothing",
			p:    Policy{Limit: 2, Window: time.Second},
			steps: concatSteps(
				[]boundaryStep{
					{at: 0, allowed: true},
					{at: 500 * ms, allowed: true},
				},
				rejectStorm(500*ms, 1000*ms, 2000),
				[]boundaryStep{
					{at: 1000 * ms, allowed: true, want: allowedD(2, 0, time.Second)},
					{at: 1000 * ms, want: rejectedD(2, 0, 500*ms, time.Second)},
				},
				rejectStorm(1000*ms, 1500*ms, 2000),
				[]boundaryStep{
					{at: 1500 * ms, allowed: true, want: allowedD(2, 0, time.Second)},
				},
			),
		},
		{
			name: "equal timestamps stay distinct",
			p:    Policy{Limit: 5, Window: 10 * time.Second},
			steps: []boundaryStep{
				{at: 3 * ms, allowed: true, want: allowedD(5, 4, 10*time.Second)},
				{at: 3 * ms, allowed: true, want: allowedD(5, 3, 10*time.Second)},
				{at: 3 * ms, allowed: true, want: allowedD(5, 2, 10*time.Second)},
				{at: 3 * ms, allowed: true, want: allowedD(5, 1, 10*time.Second)},
				{at: 3 * ms, allowed: true, want: allowedD(5, 0, 10*time.Second)},
				{at: 3 * ms, want: rejectedD(5, 0, 10*time.Second, 10*time.Second)},
				{at: 10_002 * ms, want: rejectedD(5, 0, ms, ms)},
				{at: 10_003 * ms, n: 5, allowed: true},
				{at: 10_003 * ms},
			},
		},
		{
			name: "hits above one",
			p:    Policy{Limit: 10, Window: 10 * time.Second},
			steps: []boundaryStep{
				{at: 0, hits: 4, allowed: true, want: allowedD(10, 6, 10*time.Second)},
				{at: 1000 * ms, hits: 5, allowed: true, want: allowedD(10, 1, 10*time.Second)},
				// need 2: the run of 4 at 0 must expire.
				{at: 2000 * ms, hits: 3, want: rejectedD(10, 1, 8*time.Second, 9*time.Second)},
				{at: 2000 * ms, hits: 1, allowed: true, want: allowedD(10, 0, 10*time.Second)},
				{at: 9_999 * ms, hits: 3, want: rejectedD(10, 0, ms, 2001*ms)},
				{at: 10_000 * ms, hits: 3, allowed: true, want: allowedD(10, 1, 10*time.Second)},
				// need 1: the run of 5 at 1 s.
				{at: 10_000 * ms, hits: 2, want: rejectedD(10, 1, time.Second, 10*time.Second)},
				// need 9: runs 5 (1 s), 1 (2 s), 3 (10 s).
				{at: 10_000 * ms, hits: 10, want: rejectedD(10, 1, 10*time.Second, 10*time.Second)},
				{at: 11_000 * ms, hits: 5, allowed: true, want: allowedD(10, 1, 10*time.Second)},
			},
		},
		{
			name: "times round up to 1 ms",
			p:    Policy{Limit: 1, Window: time.Second},
			steps: []boundaryStep{
				// Recorded at 1 ms, so it expires at 1001 ms, never earlier.
				{at: 500 * time.Microsecond, allowed: true, want: allowedD(1, 0, 1000*ms+500*time.Microsecond)},
				{at: 1000*ms + 500*time.Microsecond, want: rejectedD(1, 0, 500*time.Microsecond, 500*time.Microsecond)},
				{at: 1001*ms - 1, want: rejectedD(1, 0, 1, 1)},
				{at: 1001 * ms, allowed: true, want: allowedD(1, 0, time.Second)},
			},
		},
		{
			name: "times round up to 7 ms",
			p:    Policy{Limit: 2, Window: time.Second, Resolution: 7 * ms},
			steps: []boundaryStep{
				{at: 1 * ms, allowed: true, want: allowedD(2, 1, 1006*ms)},
				{at: 7 * ms, allowed: true, want: allowedD(2, 0, time.Second)},
				{at: 8 * ms, want: rejectedD(2, 0, 999*ms, 999*ms)},
				{at: 1006 * ms, want: rejectedD(2, 0, ms, ms)},
				// Recorded at 1008 ms, the next multiple of 7 ms.
				{at: 1007 * ms, allowed: true, want: allowedD(2, 1, 1001*ms)},
			},
		},
		{
			name: "token bucket burst of L then steady rate",
			p:    Policy{Limit: 3, Window: time.Second, Algorithm: TokenBucket},
			steps: []boundaryStep{
				{at: 0, allowed: true, want: allowedD(3, 2, time.Second/3+1)},
				{at: 0, allowed: true, want: allowedD(3, 1, 2*time.Second/3+1)},
				{at: 0, allowed: true, want: allowedD(3, 0, time.Second)},
				// One unit refills every 333 333 333⅓ ns.
				{at: 0, want: rejectedD(3, 0, 333_333_334, time.Second)},
				{at: 333_333_333, want: rejectedD(3, 0, 1, 666_666_667)},
				{at: 333_333_334, allowed: true, want: allowedD(3, 0, time.Second)},
				{at: 666_666_667, allowed: true, want: allowedD(3, 0, time.Second)},
				{at: 1_000_000_000, allowed: true, want: allowedD(3, 0, time.Second)},
				{at: 4_000_000_000, n: 3, allowed: true},
				{at: 4_000_000_000},
			},
		},
		{
			name: "token bucket hits above one",
			p:    Policy{Limit: 10, Window: 10 * time.Second, Algorithm: TokenBucket},
			steps: []boundaryStep{
				{at: 0, hits: 10, allowed: true, want: allowedD(10, 0, 10*time.Second)},
				{at: 0, hits: 4, want: rejectedD(10, 0, 4*time.Second, 10*time.Second)},
				{at: 4000 * ms, hits: 4, allowed: true, want: allowedD(10, 0, 10*time.Second)},
				{at: 9000 * ms, hits: 2, allowed: true, want: allowedD(10, 3, 7*time.Second)},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, d := range deciders(t, tc.p) {
				for i, st := range tc.steps {
					n, hits := max(st.n, 1), max(st.hits, 1)
					for j := range n {
						got, err := d.allow(t0.Add(st.at), hits)
						if err != nil {
							t.Fatalf("%s: step %d (at %v, hits %d) repeat %d: %v", d.name, i, st.at, hits, j, err)
						}
						if got.Allowed != st.allowed {
							t.Fatalf("%s: step %d (at %v, hits %d) repeat %d: Allowed = %v, want %v (%+v)",
								d.name, i, st.at, hits, j, got.Allowed, st.allowed, got)
						}
						if j == n-1 && st.want != nil && got != *st.want {
							t.Fatalf("%s: step %d (at %v, hits %d):\n got %+v\nwant %+v", d.name, i, st.at, hits, got, *st.want)
						}
					}
				}
			}
		})
	}
}

// TestLimiterTimeBackwards checks that a backward time is refused and
// changes nothing: the next decision is as if it never happened.
func TestLimiterTimeBackwards(t *testing.T) {
	p := Policy{Limit: 2, Window: time.Second}
	lim, err := NewLimiter(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Allow(t0.Add(500*ms), 1); err != nil {
		t.Fatal(err)
	}
	for _, back := range []time.Duration{1, ms, 500 * ms, time.Hour} {
		if d, err := lim.Allow(t0.Add(500*ms-back), 1); !errors.Is(err, ErrTimeBackwards) || d != (Decision{}) {
			t.Fatalf("Allow %v before the last decision = %+v, %v; want zero decision, ErrTimeBackwards", back, d, err)
		}
	}
	// Equal time is not backwards.
	got, err := lim.Allow(t0.Add(500*ms), 1)
	if want := *allowedD(2, 0, time.Second); err != nil || got != want {
		t.Fatalf("Allow at the same time = %+v, %v; want %+v", got, err, want)
	}
	got, err = lim.Allow(t0.Add(1500*ms), 1)
	if want := *allowedD(2, 1, time.Second); err != nil || got != want {
		t.Fatalf("Allow one window later = %+v, %v; want %+v", got, err, want)
	}
}

// TestStoreClampsTime checks that the Store treats a step back on a key as
// no time passing: an admission is not forgotten by moving the clock back.
func TestStoreClampsTime(t *testing.T) {
	store, err := NewStore(Config{})
	if err != nil {
		t.Fatal(err)
	}
	key := Key{Tenant: "acme", Subject: "u", Policy: "api"}
	p := Policy{Limit: 1, Window: time.Second}
	if d, err := store.Allow(key, p, 1, t0.Add(10*time.Second)); err != nil || !d.Allowed {
		t.Fatalf("first Allow = %+v, %v", d, err)
	}
	// An hour earlier is clamped to 10 s: still inside the window, and
	// RetryAfter is measured from the clamped time.
	got, err := store.Allow(key, p, 1, t0.Add(10*time.Second-time.Hour))
	if want := *rejectedD(1, 0, time.Second, time.Second); err != nil || got != want {
		t.Fatalf("Allow an hour back = %+v, %v; want %+v", got, err, want)
	}
	got, err = store.Allow(key, p, 1, t0.Add(11*time.Second))
	if want := *allowedD(1, 0, time.Second); err != nil || got != want {
		t.Fatalf("Allow one window later = %+v, %v; want %+v", got, err, want)
	}
}

// TestInvalidRequests checks the argument errors of both forms and that
// they record nothing.
func TestInvalidRequests(t *testing.T) {
	p := Policy{Limit: 3, Window: time.Second}
	for _, hits := range []int64{0, -1, 4, 1 << 40} {
		t.Run(fmt.Sprintf("hits=%d", hits), func(t *testing.T) {
			for _, d := range deciders(t, p) {
				if got, err := d.allow(t0, hits); !errors.Is(err, ErrInvalidHits) || got != (Decision{}) {
					t.Fatalf("%s: Allow(hits %d) = %+v, %v; want ErrInvalidHits", d.name, hits, got, err)
				}
				// Nothing was recorded: a full burst still fits.
				if got, err := d.allow(t0, 3); err != nil || got != *allowedD(3, 0, time.Second) {
					t.Fatalf("%s: Allow(3) after the error = %+v, %v", d.name, got, err)
				}
			}
		})
	}
}
