package shard

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// TestLargeLimitNoWrap: two requests of 5·10^18 under a limit of 6·10^18
// (count + hits would wrap past int64) — the second is refused by every
// algorithm and every entry point. Likewise at limit MaxInt64.
func TestLargeLimitNoWrap(t *testing.T) {
	for _, alg := range []Algorithm{SlidingLog, TokenBucket, FixedWindow} {
		for _, tc := range []struct{ limit, hits int64 }{
			{6e18, 5e18},
			{math.MaxInt64, math.MaxInt64/2 + 1},
		} {
			p := Policy{Limit: tc.limit, Window: time.Second, Algorithm: alg}
			t.Run(alg.String(), func(t *testing.T) {
				s := mustStore(t, Config{})
				lim, err := NewLimiter(p)
				if err != nil {
					t.Fatal(err)
				}
				key := Key{Tenant: "t", Subject: "s", Policy: "p"}
				items := []MultiItem{{Policy: "m", P: p, Hits: tc.hits}}
				out := make([]Decision, 1)
				for i, want := range []bool{true, false} {
					dl, errL := lim.Allow(t0, tc.hits)
					pk, errP := s.Peek(key, p, tc.hits, t0)
					ds, errS := s.Allow(key, p, tc.hits, t0)
					refused, errM := s.AllowMulti("t", "s", items, t0, out)
					if err := errors.Join(errL, errP, errS, errM); err != nil {
						t.Fatal(err)
					}
					if dl.Allowed != want || ds.Allowed != want || pk != ds || (refused < 0) != want || out[0].Allowed != want {
						t.Fatalf("limit %d, request %d of %d hits: limiter %+v, peek %+v, store %+v, multi %d %+v; want allowed=%v",
							tc.limit, i+1, tc.hits, dl, pk, ds, refused, out[0], want)
					}
					if !want && (ds.Remaining != tc.limit-tc.hits || ds.RetryAfter <= 0) {
						t.Fatalf("refusal %+v: want Remaining %d and a positive RetryAfter", ds, tc.limit-tc.hits)
					}
				}
			})
		}
	}
}

// TestWindowBound: windows above MaxWindow (100 years; windows above about
// 236 years used to wrap, and a Duration ends at 292) are refused with a
// message in years; MaxWindow itself is valid.
func TestWindowBound(t *testing.T) {
	err := Policy{Limit: 1, Window: 250 * year}.Validate()
	if !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), "window 250y exceeds the maximum 100y") {
		t.Fatalf("250y window: %v", err)
	}
	if err := (Policy{Limit: 1, Window: MaxWindow}).Validate(); err != nil {
		t.Fatalf("MaxWindow: %v", err)
	}
	if err := (Policy{Limit: 1, Window: MaxWindow + 1}).Validate(); !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("MaxWindow+1: %v", err)
	}
	if _, err := mustStore(t, Config{}).Allow(Key{Tenant: "t", Subject: "s", Policy: "p"}, Policy{Limit: 1, Window: 250 * year}, 1, t0); !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("Store.Allow with a 250y window: %v", err)
	}
	if _, err := NewLimiter(Policy{Limit: 1, Window: math.MaxInt64}); !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("NewLimiter with the largest Duration: %v", err)
	}
}

// TestLongWindowLateClock runs a MaxWindow policy on clocks where now + W
// passes the int64 range (year 2262): decisions stay exact and Sweep keeps
// the live key. Before the bound and saturation, token_bucket and
// fixed_window admitted wrongly and Sweep dropped the sliding log.
func TestLongWindowLateClock(t *testing.T) {
	for _, start := range []time.Time{
		time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Unix(0, math.MaxInt64-int64(24*time.Hour)).Truncate(time.Millisecond),
	} {
		for _, alg := range []Algorithm{SlidingLog, TokenBucket, FixedWindow} {
			p := Policy{Limit: 3, Window: MaxWindow, Algorithm: alg}
			t.Run(alg.String()+"/"+start.Format("2006"), func(t *testing.T) {
				s := mustStore(t, Config{})
				lim, _ := NewLimiter(p)
				key := Key{Tenant: "t", Subject: "s", Policy: "p"}
				for i := range 4 {
					now := start.Add(time.Duration(i) * time.Minute)
					want := i < 3
					ds, err := s.Allow(key, p, 1, now)
					if err != nil {
						t.Fatal(err)
					}
					dl, _ := lim.Allow(now, 1)
					if ds.Allowed != want || dl != ds {
						t.Fatalf("request %d: store %+v, limiter %+v; want allowed=%v", i+1, ds, dl, want)
					}
					if ds.ResetAfter <= 0 || ds.RetryAfter < 0 || (!want && ds.RetryAfter <= 0) {
						t.Fatalf("request %d: %+v has a wrapped duration", i+1, ds)
					}
				}
				if n := s.Sweep(start.Add(time.Hour), 0); n != 0 || s.Len() != 1 {
					t.Fatalf("Sweep removed %d live keys (Len %d)", n, s.Len())
				}
				if d, _ := s.Peek(key, p, 1, start.Add(time.Hour)); d.Allowed {
					t.Fatalf("after Sweep the key admits: %+v", d)
				}
			})
		}
	}
}

// TestImportNoWrap: merging states whose counts add past int64 (or past
// the limit) keeps the key full, never negative or wrapped.
func TestImportNoWrap(t *testing.T) {
	const big = math.MaxInt64 - 1
	key := Key{Tenant: "t", Subject: "s", Policy: "p"}
	for _, alg := range []Algorithm{SlidingLog, FixedWindow} {
		p := Policy{Limit: big, Window: time.Minute, Algorithm: alg}
		t.Run(alg.String(), func(t *testing.T) {
			s := mustStore(t, Config{})
			for _, age := range []time.Duration{2 * time.Second, time.Second, time.Second} {
				ks := KeyState{Key: key, Algorithm: alg, Runs: []Run{{Age: age, Count: big}}}
				if err := s.Import(ks, p, t0); err != nil {
					t.Fatal(err)
				}
			}
			d, err := s.Allow(key, p, 1, t0)
			if err != nil || d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 {
				t.Fatalf("after imports: %+v, %v; want refused with Remaining 0", d, err)
			}
			ks, _ := s.Export(key, t0)
			var sum int64
			for _, r := range ks.Runs {
				if r.Count < 0 || sum > math.MaxInt64-r.Count {
					t.Fatalf("exported runs wrap: %+v", ks.Runs)
				}
				sum += r.Count
			}
			if sum > big {
				t.Fatalf("state holds %d units > limit %d", sum, big)
			}
		})
	}
}

// TestRefundFacts pins Refund's rules on small tables: newest first, never
// below empty, the token bucket never beyond full, hits >= 1.
func TestRefundFacts(t *testing.T) {
	key := Key{Tenant: "t", Subject: "s", Policy: "p"}
	t.Run("sliding_log newest first", func(t *testing.T) {
		p := Policy{Limit: 10, Window: time.Second}
		s := mustStore(t, Config{})
		s.Allow(key, p, 3, t0)
		s.Allow(key, p, 4, t0.Add(500*ms))
		d, _ := s.Refund(key, p, 5, t0.Add(600*ms)) // all 4 newest, 1 of the oldest
		if want := (Decision{Allowed: true, Limit: 10, Remaining: 8, ResetAfter: 400 * ms}); d != want {
			t.Fatalf("refund: %+v, want %+v", d, want)
		}
		d, _ = s.Refund(key, p, 100, t0.Add(600*ms))
		if want := (Decision{Allowed: true, Limit: 10, Remaining: 10}); d != want {
			t.Fatalf("refund past empty: %+v, want %+v", d, want)
		}
		if d, _ = s.Refund(key, p, 1, t0.Add(600*ms)); d.Allowed || d.Remaining != 10 {
			t.Fatalf("refund of an empty log: %+v", d)
		}
	})
	t.Run("token_bucket never beyond full", func(t *testing.T) {
		p := Policy{Limit: 4, Window: time.Second, Algorithm: TokenBucket}
		s := mustStore(t, Config{})
		s.Allow(key, p, 4, t0)
		d, _ := s.Refund(key, p, 1, t0)
		if want := (Decision{Allowed: true, Limit: 4, Remaining: 1, ResetAfter: 750 * ms}); d != want {
			t.Fatalf("refund 1: %+v, want %+v", d, want)
		}
		d, _ = s.Refund(key, p, 1000, t0)
		if want := (Decision{Allowed: true, Limit: 4, Remaining: 4}); d != want {
			t.Fatalf("refund 1000: %+v, want %+v", d, want)
		}
		if d, _ := s.Allow(key, p, 4, t0); !d.Allowed {
			t.Fatalf("full bucket after refund refuses a burst of 4: %+v", d)
		}
		if d, _ := s.Allow(key, p, 1, t0); d.Allowed {
			t.Fatalf("refund made the bucket hold more than full: %+v", d)
		}
	})
	t.Run("fixed_window not below zero", func(t *testing.T) {
		p := Policy{Limit: 5, Window: time.Minute, Algorithm: FixedWindow}
		s := mustStore(t, Config{})
		s.Allow(key, p, 5, t0)
		if d, _ := s.Refund(key, p, 2, t0.Add(time.Second)); d != (Decision{Allowed: true, Limit: 5, Remaining: 2, ResetAfter: 59 * time.Second}) {
			t.Fatalf("refund 2: %+v", d)
		}
		if d, _ := s.Refund(key, p, 9, t0.Add(time.Second)); d != (Decision{Allowed: true, Limit: 5, Remaining: 5}) {
			t.Fatalf("refund 9: %+v", d)
		}
		if d, _ := s.Refund(key, p, 1, t0.Add(time.Minute)); d.Allowed || d.Remaining != 5 {
			t.Fatalf("refund in the next window: %+v", d)
		}
	})
	t.Run("invalid hits", func(t *testing.T) {
		p := Policy{Limit: 5, Window: time.Minute}
		s := mustStore(t, Config{})
		lim, _ := NewLimiter(p)
		for _, h := range []int64{0, -1} {
			if _, err := s.Refund(key, p, h, t0); !errors.Is(err, ErrInvalidHits) {
				t.Fatalf("Store.Refund hits %d: %v", h, err)
			}
			if _, err := lim.Refund(t0, h); !errors.Is(err, ErrInvalidHits) {
				t.Fatalf("Limiter.Refund hits %d: %v", h, err)
			}
		}
		if s.Len() != 0 {
			t.Fatalf("Refund created a key")
		}
	})
}

// TestDeleteResets: Delete is the reset primitive; the subject's other
// policies keep their state.
func TestDeleteResets(t *testing.T) {
	p := Policy{Limit: 2, Window: time.Hour}
	s := mustStore(t, Config{})
	a := Key{Tenant: "t", Subject: "s", Policy: "a"}
	b := Key{Tenant: "t", Subject: "s", Policy: "b"}
	s.Allow(a, p, 2, t0)
	s.Allow(b, p, 2, t0)
	if !s.Delete(a) {
		t.Fatal("Delete of a held key returned false")
	}
	if d, _ := s.Allow(a, p, 2, t0); !d.Allowed {
		t.Fatalf("after Delete: %+v", d)
	}
	if d, _ := s.Peek(b, p, 1, t0); d.Allowed {
		t.Fatalf("Delete of a reset b: %+v", d)
	}
}
