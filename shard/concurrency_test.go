package shard

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// leaseModel is the reference for Concurrency: a plain list of leases,
// scanned on every call.
type leaseModel struct {
	l []lease
}

func (m *leaseModel) live(now int64) {
	var keep []lease
	for _, ls := range m.l {
		if ls.exp > now { // a lease exactly TTL old has expired
			keep = append(keep, ls)
		}
	}
	m.l = keep
}

func (m *leaseModel) held() int64 {
	var h int64
	for _, ls := range m.l {
		h += ls.n
	}
	return h
}

func (m *leaseModel) lastExp(now int64) time.Duration {
	var last int64 = now
	for _, ls := range m.l {
		last = max(last, ls.exp)
	}
	return time.Duration(last - now)
}

func (m *leaseModel) acquire(now int64, p Policy, hits int64, id uint64) Decision {
	m.live(now)
	h := m.held()
	d := Decision{Limit: p.Limit}
	if h+hits <= p.Limit {
		m.l = append(m.l, lease{id: id, exp: now + int64(p.Window), n: hits})
		d.Allowed, d.Remaining, d.ResetAfter = true, p.Limit-h-hits, m.lastExp(now)
		return d
	}
	d.Remaining = p.Limit - h
	// RetryAfter: the earliest expiry at which enough units are free.
	for _, ls := range m.l {
		var freed int64
		for _, o := range m.l {
			if o.exp <= ls.exp {
				freed += o.n
			}
		}
		if h-freed+hits <= p.Limit {
			if ra := time.Duration(ls.exp - now); d.RetryAfter == 0 || ra < d.RetryAfter {
				d.RetryAfter = ra
			}
		}
	}
	d.ResetAfter = m.lastExp(now)
	return d
}

func (m *leaseModel) release(now int64, p Policy, id uint64) Decision {
	m.live(now)
	d := Decision{Limit: p.Limit}
	for i, ls := range m.l {
		if ls.id == id {
			m.l = append(m.l[:i:i], m.l[i+1:]...)
			d.Allowed = true
			break
		}
	}
	d.Remaining = p.Limit - m.held()
	if len(m.l) > 0 {
		d.ResetAfter = m.lastExp(now)
	}
	return d
}

// TestConcurrencyAgainstModel drives random acquires, releases, peeks,
// time steps (many landing exactly on an expiry) and export/import round
// trips through a Store and the model, decision by decision.
func TestConcurrencyAgainstModel(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		p := Policy{Limit: 1 + rng.Int64N(8), Window: time.Duration(1+rng.IntN(50)) * time.Millisecond, Algorithm: Concurrency}
		s := mustStore(t, Config{})
		key := testKey(int(seed))
		var m leaseModel
		now := t0.UnixNano()
		nextID := uint64(1)
		var issued []uint64
		for op := range 2000 {
			fail := func(what string, got, want any) {
				t.Helper()
				t.Fatalf("seed %d, op %d, policy %+v, %s: got %+v, want %+v", seed, op, p, what, got, want)
			}
			switch r := rng.IntN(10); {
			case r < 4:
				hits := 1 + rng.Int64N(p.Limit)
				id := nextID
				nextID++
				got, err := s.Acquire(key, p, hits, id, time.Unix(0, now))
				want := m.acquire(now, p, hits, id)
				if err != nil || got != want {
					fail("Acquire", got, want)
				}
				if got.Allowed {
					issued = append(issued, id)
				}
			case r < 7:
				id := uint64(1_000_000) // never issued
				if len(issued) > 0 && rng.IntN(5) > 0 {
					id = issued[rng.IntN(len(issued))] // maybe released or expired already
				}
				got, err := s.Release(key, p, id, time.Unix(0, now))
				want := m.release(now, p, id)
				if err != nil || got != want {
					fail("Release", got, want)
				}
			case r < 8:
				hits := 1 + rng.Int64N(p.Limit)
				got, err := s.Peek(key, p, hits, time.Unix(0, now))
				mm := leaseModel{l: append([]lease(nil), m.l...)}
				want := mm.acquire(now, p, hits, 0)
				if err != nil || got != want {
					fail("Peek", got, want)
				}
			case r < 9:
				// Hand the key to a fresh store at the same instant: the
				// leases, their ids and expiries survive exactly.
				ks, ok := s.Take(key, time.Unix(0, now))
				if !ok {
					continue
				}
				if err := ks.Validate(); err != nil {
					fail("Validate(export)", err, nil)
				}
				s = mustStore(t, Config{})
				if err := s.Import(ks, p, time.Unix(0, now)); err != nil {
					fail("Import", err, nil)
				}
			default:
				// Step time, often exactly onto a lease's expiry.
				if len(m.l) > 0 && rng.IntN(2) == 0 {
					now = max(now, m.l[rng.IntN(len(m.l))].exp)
				} else {
					now += rng.Int64N(int64(p.Window))
				}
			}
		}
	}
}

// TestConcurrencyBoundary: a lease exactly TTL old has expired; one
// nanosecond earlier it still holds its units.
func TestConcurrencyBoundary(t *testing.T) {
	p := Policy{Limit: 2, Window: time.Minute, Algorithm: Concurrency}
	s := mustStore(t, Config{})
	k := testKey(1)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	steps := []struct {
		name    string
		acquire bool
		hits    int64
		id      uint64
		at      time.Duration
		allowed bool
	}{
		{"first lease, 2 units", true, 2, 1, 0, true},
		{"full at 59.999999999s", true, 1, 2, time.Minute - 1, false},
		{"the first expired at exactly 60s", true, 1, 3, time.Minute, true},
		{"releasing the expired lease finds nothing", false, 0, 1, time.Minute, false},
		{"one unit still free", true, 1, 4, time.Minute, true},
		{"full again", true, 1, 5, time.Minute, false},
		{"release lease 3", false, 0, 3, time.Minute + time.Second, true},
		{"release lease 3 again finds nothing", false, 0, 3, time.Minute + time.Second, false},
		{"a unit is free again", true, 1, 6, time.Minute + time.Second, true},
	}
	for _, st := range steps {
		var d Decision
		var err error
		if st.acquire {
			d, err = s.Acquire(k, p, st.hits, st.id, at(st.at))
		} else {
			d, err = s.Release(k, p, st.id, at(st.at))
		}
		if err != nil || d.Allowed != st.allowed {
			t.Fatalf("%s: got %+v, %v; want allowed %v", st.name, d, err, st.allowed)
		}
	}
}

// TestConcurrencyRefusals: operations that do not apply to the algorithm
// are errors that change nothing; an id already held or zero is
// ErrInvalidLease; a release of an unknown key creates nothing.
func TestConcurrencyRefusals(t *testing.T) {
	p := Policy{Limit: 3, Window: time.Second, Algorithm: Concurrency}
	rate := Policy{Limit: 3, Window: time.Second}
	s := mustStore(t, Config{})
	k := testKey(1)
	if _, err := s.Acquire(k, p, 1, 7, t0); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		call func() error
		want error
	}{
		{"Allow", func() error { _, err := s.Allow(k, p, 1, t0); return err }, ErrWrongAlgorithm},
		{"Refund", func() error { _, err := s.Refund(k, p, 1, t0); return err }, ErrWrongAlgorithm},
		{"AllowMulti", func() error {
			_, err := s.AllowMulti(k.Tenant, k.Subject, []MultiItem{{Policy: k.Policy, P: p, Hits: 1}}, t0, make([]Decision, 1))
			return err
		}, ErrWrongAlgorithm},
		{"Acquire on a rate policy", func() error { _, err := s.Acquire(k, rate, 1, 8, t0); return err }, ErrWrongAlgorithm},
		{"Release on a rate policy", func() error { _, err := s.Release(k, rate, 7, t0); return err }, ErrWrongAlgorithm},
		{"id zero", func() error { _, err := s.Acquire(k, p, 1, 0, t0); return err }, ErrInvalidLease},
		{"id held", func() error { _, err := s.Acquire(k, p, 1, 7, t0); return err }, ErrInvalidLease},
		{"hits above limit", func() error { _, err := s.Acquire(k, p, 4, 9, t0); return err }, ErrInvalidHits},
		{"Limiter.Allow", func() error {
			l, err := NewLimiter(p)
			if err != nil {
				return err
			}
			_, err = l.Allow(t0, 1)
			return err
		}, ErrWrongAlgorithm},
	}
	for _, tc := range cases {
		if err := tc.call(); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	if d, _ := s.Peek(k, p, 2, t0); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after the refusals Peek(2) = %+v, want allowed with 0 remaining (one lease of 1 held)", d)
	}
	other := testKey(2)
	if d, err := s.Release(other, p, 7, t0); err != nil || d.Allowed || s.Has(other) {
		t.Fatalf("Release of an unknown key = %+v, %v, held %v; want not released, nothing created", d, err, s.Has(other))
	}
}

// TestConcurrencyHandoffAndSweep: export ages rebase on the receiver's
// clock (a receiver whose clock is behind keeps the lease its full
// remaining life); a repeated import does not count a lease twice; Sweep
// drops a key once its last lease expired, not before.
func TestConcurrencyHandoffAndSweep(t *testing.T) {
	p := Policy{Limit: 2, Window: 10 * time.Second, Algorithm: Concurrency}
	a, b := mustStore(t, Config{}), mustStore(t, Config{})
	k := testKey(1)
	if _, err := a.Acquire(k, p, 1, 11, t0); err != nil {
		t.Fatal(err)
	}
	ks, _ := a.Export(k, t0.Add(4*time.Second))
	if len(ks.Runs) != 1 || ks.Runs[0] != (Run{Age: -6 * time.Second, Count: 1, ID: 11}) {
		t.Fatalf("export at +4s = %+v, want one lease with 6s left", ks.Runs)
	}
	// b's clock reads 1h behind; the lease must still live 6s there.
	bNow := t0.Add(-time.Hour)
	for range 2 {
		if err := b.Import(ks, p, bNow); err != nil {
			t.Fatal(err)
		}
	}
	if d, _ := b.Peek(k, p, 1, bNow.Add(6*time.Second-1)); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("receiver just before expiry: %+v, want one unit free (the lease counted once)", d)
	}
	if n := b.Sweep(bNow.Add(6*time.Second-1), 0); n != 0 {
		t.Fatalf("Sweep before expiry removed %d keys", n)
	}
	if d, _ := b.Release(k, p, 11, bNow.Add(time.Second)); !d.Allowed || d.Remaining != 2 {
		t.Fatalf("release of the imported lease = %+v, want released, 2 free", d)
	}
	if n := a.Sweep(t0.Add(10*time.Second), 0); n != 1 || a.Len() != 0 {
		t.Fatalf("Sweep at expiry removed %d keys (len %d), want 1", n, a.Len())
	}
}

// TestConcurrencyNoAllocRelease: acquire and release on an existing key
// whose lease slice has room do not allocate.
func TestConcurrencyNoAllocRelease(t *testing.T) {
	p := Policy{Limit: 4, Window: time.Second, Algorithm: Concurrency}
	s := mustStore(t, Config{})
	k := testKey(1)
	id := uint64(1)
	for range 4 {
		_, _ = s.Acquire(k, p, 1, id, t0)
		id++
	}
	for i := uint64(1); i <= 4; i++ {
		_, _ = s.Release(k, p, i, t0)
	}
	allocs := testing.AllocsPerRun(100, func() {
		_, _ = s.Acquire(k, p, 1, id, t0)
		_, _ = s.Release(k, p, id, t0)
		id++
	})
	if allocs != 0 {
		t.Fatalf("acquire+release allocate %v times, want 0", allocs)
	}
}
