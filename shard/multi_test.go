package shard

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// multiPolicy is one policy of a subject driven by the multi-policy model
// test, with its model and the store's clamped clock for its key.
type multiPolicy struct {
	name  string
	p     Policy
	model refModel
	last  int64 // minTime while the store does not hold the key
}

func (mp *multiPolicy) String() string { return fmt.Sprintf("%s=%+v", mp.name, mp.p) }

// TestAllowMultiAgainstModel drives subjects with 1 to 4 policies of mixed
// algorithms through AllowMulti (on random subsets in random order), single
// Allow, Refund, Peek and invalid calls, and compares every decision with
// one reference model per policy: AllowMulti must answer each policy's own
// decision, refuse at the first refusing one, and record all or nothing.
func TestAllowMultiAgainstModel(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4, 5, 0xfeed} {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 0x6d756c7469))
			store := mustStore(t, Config{Stripes: 4})
			for seq := range 40 {
				runMultiSequence(t, seed, rng, store, seq, 400)
			}
		})
	}
}

func runMultiSequence(t *testing.T, seed uint64, rng *rand.Rand, store *Store, seq, ops int) {
	t.Helper()
	subject := fmt.Sprintf("s%d", seq)
	pols := make([]*multiPolicy, 1+rng.IntN(4))
	minW := int64(MaxWindow)
	for i := range pols {
		p := randomPolicy(rng, Algorithm(rng.IntN(int(Concurrency)))) // concurrency has its own model (concurrency_test.go)
		pols[i] = &multiPolicy{name: fmt.Sprintf("p%d", i), p: p, model: newRefModel(p), last: minTime}
		minW = min(minW, int64(p.Window))
	}
	key := func(mp *multiPolicy) Key { return Key{Tenant: "t", Subject: subject, Policy: mp.name} }
	now := t0.UnixNano() + rng.Int64N(int64(time.Hour))
	out := make([]Decision, MaxMulti)
	for op := range ops {
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d, sequence %d, op %d, policies %v: %s", seed, seq, op, pols, fmt.Sprintf(format, args...))
		}
		at := now
		switch rng.IntN(7) {
		case 0: // the same instant
		case 1:
			now += rng.Int64N(3*int64(ms) + 2)
		case 2:
			now += rng.Int64N(minW/4 + 1)
		case 3:
			if e, ok := pols[rng.IntN(len(pols))].model.edge(); ok {
				now = max(now, e+rng.Int64N(3)-1)
			}
		case 4:
			now += rng.Int64N(3 * minW)
		case 5:
			at = now - 1 - rng.Int64N(minW/2+1) // a backward probe; the cursor stays
		}
		if at >= now {
			at = now
		}
		tm := time.Unix(0, at)
		mp := pols[rng.IntN(len(pols))]
		clamped := max(mp.last, at)
		switch r := rng.IntN(20); {
		case r < 13:
			perm := rng.Perm(len(pols))[:1+rng.IntN(len(pols))]
			items := make([]MultiItem, len(perm))
			want := make([]Decision, len(perm))
			wantRefused := -1
			// One decision, at one time: the latest clock of its keys.
			wantAt := at
			for _, i := range perm {
				wantAt = max(wantAt, pols[i].last)
			}
			for k, i := range perm {
				mp := pols[i]
				items[k] = MultiItem{Policy: mp.name, P: mp.p, Hits: randomHits(rng, mp.p.Limit)}
				want[k] = mp.model.clone().decide(wantAt, items[k].Hits)
				if !want[k].Allowed && wantRefused < 0 {
					wantRefused = k
				}
			}
			refused, gotAt, err := store.AllowMultiAt("t", subject, items, tm, out)
			if err != nil || refused != wantRefused || gotAt != wantAt {
				fail("AllowMultiAt(%+v) at %d = %d, %d, %v; want %d, %d", items, at, refused, gotAt, err, wantRefused, wantAt)
			}
			for k := range items {
				if out[k] != want[k] {
					fail("AllowMulti(%+v) at %d: item %d\n got %+v\nwant %+v", items, at, k, out[k], want[k])
				}
			}
			if wantRefused < 0 {
				for k, i := range perm {
					mp := pols[i]
					mp.last = wantAt
					mp.model.decide(wantAt, items[k].Hits)
				}
			}
		case r < 15:
			hits := randomHits(rng, mp.p.Limit)
			got, err := store.Allow(key(mp), mp.p, hits, tm)
			if want := mp.model.decide(clamped, hits); err != nil || got != want {
				fail("Allow(%s, %d) at %d = %+v, %v; want %+v", mp.name, hits, at, got, err, want)
			}
			mp.last = clamped
		case r < 17:
			hits := 1 + rng.Int64N(mp.p.Limit+2)
			if mp.last == minTime {
				clamped = at // a key not held is not created, its clock not set
			} else {
				mp.last = clamped
			}
			got, err := store.Refund(key(mp), mp.p, hits, tm)
			if want := mp.model.refund(clamped, hits); err != nil || got != want {
				fail("Refund(%s, %d) at %d = %+v, %v; want %+v", mp.name, hits, at, got, err, want)
			}
		case r < 18:
			hits := randomHits(rng, mp.p.Limit)
			got, err := store.Peek(key(mp), mp.p, hits, tm)
			if want := mp.model.clone().decide(clamped, hits); err != nil || got != want {
				fail("Peek(%s, %d) at %d = %+v, %v; want %+v", mp.name, hits, at, got, err, want)
			}
		default:
			// Invalid: a duplicated name, or bad hits on one item. Nothing
			// may change, which the following comparisons check.
			items := make([]MultiItem, 0, len(pols)+1)
			for _, mp := range pols {
				items = append(items, MultiItem{Policy: mp.name, P: mp.p, Hits: 1})
			}
			bad := rng.IntN(len(items))
			if rng.IntN(2) == 0 {
				items = append(items, items[bad])
			} else {
				items[bad].Hits = []int64{0, -1, items[bad].P.Limit + 1}[rng.IntN(3)]
			}
			if refused, err := store.AllowMulti("t", subject, items, tm, out); err == nil || refused != -1 {
				fail("AllowMulti(%+v) = %d, %v; want an error", items, refused, err)
			}
		}
	}
}

// TestAllowMultiConcurrent runs AllowMulti on one subject's three policies
// (one of each algorithm) from several goroutines, mixed with single Allow
// calls on one of them. The window outlasts the test, so "no window exceeds
// its limit" is "no policy admits more than its limit in total"; each key's
// exported state must hold exactly the units its admitted calls reported,
// so a request refused overall recorded nothing under any policy.
func TestAllowMultiConcurrent(t *testing.T) {
	items := []MultiItem{
		{Policy: "minute", P: Policy{Limit: 60, Window: time.Hour}},
		{Policy: "bucket", P: Policy{Limit: 90, Window: time.Hour, Algorithm: TokenBucket}},
		{Policy: "fixed", P: Policy{Limit: 120, Window: time.Minute, Algorithm: FixedWindow}},
	}
	store := mustStore(t, Config{})
	var clock atomic.Int64 // µs after t0
	var admitted [3]atomic.Int64
	const workers, calls = 8, 300
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			mine := make([]MultiItem, len(items))
			out := make([]Decision, len(items))
			for range calls {
				now := t0.Add(time.Duration(clock.Add(1)) * time.Microsecond)
				if rng.IntN(5) == 0 {
					// A single decision on the fixed window interleaves.
					d, err := store.Allow(Key{Tenant: "t", Subject: "s", Policy: "fixed"}, items[2].P, 1, now)
					if err != nil {
						errs <- err
						return
					}
					if d.Allowed {
						admitted[2].Add(1)
					}
					continue
				}
				copy(mine, items)
				for i := range mine {
					mine[i].Hits = 1 + rng.Int64N(3)
				}
				refused, err := store.AllowMulti("t", "s", mine, now, out)
				if err != nil {
					errs <- err
					return
				}
				for i := range mine {
					if refused < 0 && !out[i].Allowed || refused >= 0 && i < refused && !out[i].Allowed {
						errs <- fmt.Errorf("refused %d but item %d says %+v", refused, i, out[i])
						return
					}
				}
				if refused >= 0 && out[refused].Allowed {
					errs <- fmt.Errorf("refused %d but its decision is %+v", refused, out[refused])
					return
				}
				if refused < 0 {
					for i := range mine {
						admitted[i].Add(mine[i].Hits)
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	end := t0.Add(time.Duration(clock.Load()) * time.Microsecond)
	for i, it := range items {
		got := admitted[i].Load()
		if got > it.P.Limit {
			t.Errorf("%s admitted %d > limit %d", it.Policy, got, it.P.Limit)
		}
		// The state holds exactly what was reported admitted, read back as
		// used capacity: Peek's Remaining counts its own unit when it would
		// admit, and is 0 (count == limit) when not. The token bucket's
		// refill over the test's few ms is far below one unit (W/L = 40 s).
		d, err := store.Peek(Key{Tenant: "t", Subject: "s", Policy: it.Policy}, it.P, 1, end)
		if err != nil {
			t.Fatal(err)
		}
		used := it.P.Limit - d.Remaining
		if d.Allowed {
			used--
		}
		if used != got {
			t.Errorf("%s: state holds %d units, admitted calls reported %d", it.Policy, used, got)
		}
	}
	// The tightest policy is saturated: demand was far above it.
	if got := admitted[0].Load(); got < items[0].P.Limit-2 {
		t.Errorf("minute admitted only %d of %d", got, items[0].P.Limit)
	}
}

// TestAllowMultiInvalid checks that every invalid call returns an error,
// refused -1, and changes nothing.
func TestAllowMultiInvalid(t *testing.T) {
	p := Policy{Limit: 5, Window: time.Second}
	ok := MultiItem{Policy: "a", P: p, Hits: 1}
	many := make([]MultiItem, MaxMulti+1)
	for i := range many {
		many[i] = MultiItem{Policy: fmt.Sprintf("p%d", i), P: p, Hits: 1}
	}
	cases := []struct {
		name            string
		tenant, subject string
		items           []MultiItem
		out             int
		want            error
		wantMsg         string
	}{
		{"empty", "t", "s", nil, 4, ErrInvalidMulti, "0 policies"},
		{"too many", "t", "s", many, len(many), ErrInvalidMulti, "17 policies"},
		{"short out", "t", "s", []MultiItem{ok, {Policy: "b", P: p, Hits: 1}}, 1, ErrInvalidMulti, "out holds 1"},
		{"duplicate", "t", "s", []MultiItem{ok, {Policy: "b", P: p, Hits: 1}, ok}, 3, ErrInvalidMulti, `policy "a" given twice (items 0 and 2)`},
		{"zero hits", "t", "s", []MultiItem{ok, {Policy: "b", P: p}}, 2, ErrInvalidHits, `(policy "b")`},
		{"hits over limit", "t", "s", []MultiItem{{Policy: "b", P: p, Hits: 6}, ok}, 2, ErrInvalidHits, "exceed limit 5"},
		{"bad policy", "t", "s", []MultiItem{ok, {Policy: "b", P: Policy{Limit: 1}, Hits: 1}}, 2, ErrInvalidPolicy, "window 0s"},
		{"bad tenant", "", "s", []MultiItem{ok}, 1, ErrInvalidKey, "tenant is empty"},
		{"bad name", "t", "s", []MultiItem{ok, {Policy: "a b", P: p, Hits: 1}}, 2, ErrInvalidKey, "policy has byte 0x20"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := mustStore(t, Config{})
			if _, err := s.Allow(Key{Tenant: "t", Subject: "s", Policy: "a"}, p, 2, t0); err != nil {
				t.Fatal(err)
			}
			refused, err := s.AllowMulti(tc.tenant, tc.subject, tc.items, t0, make([]Decision, tc.out))
			if refused != -1 || !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("AllowMulti = %d, %v; want -1 and %v containing %q", refused, err, tc.want, tc.wantMsg)
			}
			if s.Len() != 1 {
				t.Fatalf("Len = %d after a failed call, want 1", s.Len())
			}
			if d, _ := s.Peek(Key{Tenant: "t", Subject: "s", Policy: "a"}, p, 1, t0); d.Remaining != 2 {
				t.Fatalf("key a: %+v after a failed call, want Remaining 2 (3 used of 5 plus this 1)", d)
			}
		})
	}
}

// TestAllowMultiCapacity checks that ErrCapacity on any new key leaves
// nothing recorded, and that reclaiming idle keys (one of them in the call
// itself) still records into the held entries.
func TestAllowMultiCapacity(t *testing.T) {
	p := Policy{Limit: 3, Window: time.Second}
	items := func(names ...string) []MultiItem {
		var it []MultiItem
		for _, n := range names {
			it = append(it, MultiItem{Policy: n, P: p, Hits: 1})
		}
		return it
	}
	out := make([]Decision, 4)
	s := mustStore(t, Config{Stripes: 1, MaxKeys: 2})
	if refused, err := s.AllowMulti("t", "s", items("a"), t0, out); err != nil || refused != -1 {
		t.Fatalf("first call: %d, %v", refused, err)
	}
	refused, err := s.AllowMulti("t", "s", items("a", "b", "c"), t0, out)
	if !errors.Is(err, ErrCapacity) || refused != -1 || s.Len() != 1 {
		t.Fatalf("over capacity: %d, %v, Len %d; want ErrCapacity and Len 1", refused, err, s.Len())
	}
	if d, _ := s.Peek(Key{Tenant: "t", Subject: "s", Policy: "a"}, p, 1, t0); d.Remaining != 1 {
		t.Fatalf("a after a failed call: %+v, want 1 used (Remaining 1 after this 1)", d)
	}
	// A second, idle key fills the store; later both held keys are idle.
	if _, err := s.Allow(Key{Tenant: "t", Subject: "other", Policy: "x"}, p, 1, t0); err != nil {
		t.Fatal(err)
	}
	later := t0.Add(time.Second)
	if refused, err := s.AllowMulti("t", "s", items("a", "b"), later, out); err != nil || refused != -1 {
		t.Fatalf("after keys went idle: %d, %v", refused, err)
	}
	for _, n := range []string{"a", "b"} {
		if d, _ := s.Peek(Key{Tenant: "t", Subject: "s", Policy: n}, p, 1, later); d.Remaining != 1 {
			t.Fatalf("%s after an admitted call that reclaimed idle keys: %+v, want 1 used", n, d)
		}
	}
	if s.Len() != 2 {
		t.Fatalf("Len = %d, want 2", s.Len())
	}
}

// TestAppendPlacement checks that the placement is the encoding's (tenant,
// subject) prefix, the same for every policy of a subject, and that those
// keys share a stripe.
func TestAppendPlacement(t *testing.T) {
	s := mustStore(t, Config{Stripes: 1024})
	a := Key{Tenant: "acme", Subject: "user-1", Policy: "api"}
	b := Key{Tenant: "acme", Subject: "user-1", Policy: "upload"}
	pa, ok := a.AppendPlacement(nil)
	if !ok {
		t.Fatal("valid key refused")
	}
	ea, _ := a.AppendEncoded(nil)
	eb, _ := b.AppendEncoded(nil)
	pb, _ := b.AppendPlacement(nil)
	if !bytes.HasPrefix(ea, pa) || !bytes.Equal(pa, pb) || len(pa) != 2+len("acme")+len("user-1") {
		t.Fatalf("placement %q of %q and %q of %q", pa, ea, pb, eb)
	}
	if s.stripeFor(ea) != s.stripeFor(eb) {
		t.Fatal("two policies of one subject on different stripes")
	}
	// Length prefixes keep placements injective.
	c, _ := Key{Tenant: "acme", Subject: "user-12", Policy: "api"}.AppendPlacement(nil)
	d, _ := Key{Tenant: "acme", Subject: "user-1", Policy: "2api"}.AppendPlacement(nil)
	if bytes.Equal(c, d) {
		t.Fatalf("different subjects share placement %q", c)
	}
	if got, ok := (Key{Tenant: "acme", Subject: "user-1", Policy: ""}).AppendPlacement([]byte("x")); ok || string(got) != "x" {
		t.Fatalf("invalid key: %q, %v; want dst unchanged and false", got, ok)
	}
	for _, ek := range [][]byte{nil, {5}, {1, 'a'}, {1, 'a', 9, 'b'}} {
		_ = s.stripeFor(ek) // malformed encodings must not panic
	}
}

// TestContractAllocs checks that Peek, Refund and AllowMulti on held keys
// (and Peek of a key not held) do not allocate.
func TestContractAllocs(t *testing.T) {
	for _, alg := range []Algorithm{SlidingLog, TokenBucket, FixedWindow} {
		p := Policy{Limit: 1000, Window: time.Second, Algorithm: alg}
		s := mustStore(t, Config{})
		items := []MultiItem{{Policy: "a", P: p, Hits: 1}, {Policy: "b", P: p, Hits: 1}}
		out := make([]Decision, 2)
		ka := Key{Tenant: "t", Subject: "s", Policy: "a"}
		now := t0
		for range 30_000 {
			now = now.Add(100 * time.Microsecond)
			if _, err := s.AllowMulti("t", "s", items, now, out); err != nil {
				t.Fatal(err)
			}
		}
		checks := map[string]func(){
			"AllowMulti": func() { sinkTestRefused, _ = s.AllowMulti("t", "s", items, now, out) },
			"Peek":       func() { sinkTestDecision, _ = s.Peek(ka, p, 1, now) },
			"Peek absent": func() {
				sinkTestDecision, _ = s.Peek(Key{Tenant: "t", Subject: "s", Policy: "none"}, p, 1, now)
			},
			"Refund": func() { sinkTestDecision, _ = s.Refund(ka, p, 1, now) },
		}
		for name, fn := range checks {
			if a := testing.AllocsPerRun(1000, func() { now = now.Add(100 * time.Microsecond); fn() }); a != 0 {
				t.Errorf("%v: %s allocates %.2f per call", alg, name, a)
			}
		}
	}
}

var sinkTestRefused int
