package shard

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

var resKey = Key{Tenant: "t", Subject: "s", Policy: "tokens"}

func resStore(t *testing.T) *Store {
	t.Helper()
	s, err := NewStore(Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestReserveSettle walks the reservation rules on one key: an estimate
// admitted like hits, a smaller actual giving the difference back, a
// second settle changing nothing, a larger actual recorded beyond the
// limit as overage, and every unit expiring a window after the
// reservation's instant, not the settlement's.
func TestReserveSettle(t *testing.T) {
	s := resStore(t)
	p := Policy{Limit: 10, Window: time.Second}
	t0 := time.Unix(100, 0)
	d, err := s.Reserve(resKey, p, 6, 1, t0)
	if err != nil || !d.Allowed || d.Remaining != 4 {
		t.Fatalf("Reserve 6 of 10 = %+v, %v; want admitted, 4 left", d, err)
	}
	if d, _ := s.Reserve(resKey, p, 5, 2, t0); d.Allowed {
		t.Fatalf("Reserve 5 more = %+v; want refused (4 left)", d)
	}
	st, err := s.Settle(resKey, p, 1, 2, t0.Add(100*time.Millisecond))
	if err != nil || !st.Allowed || st.Estimate != 6 || st.Overage != 0 || st.Remaining != 8 {
		t.Fatalf("Settle(6 → 2) = %+v, %v; want settled, 8 left", st, err)
	}
	again, err := s.Settle(resKey, p, 1, 9, t0.Add(200*time.Millisecond))
	if err != nil || again.Allowed || again.Remaining != 8 {
		t.Fatalf("second Settle = %+v, %v; want nothing pending, nothing changed (8 left)", again, err)
	}
	// A larger actual: 7 reserved on top of the 2, then 12 spent.
	t1 := t0.Add(300 * time.Millisecond)
	if d, _ := s.Reserve(resKey, p, 7, 3, t1); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("Reserve 7 = %+v; want admitted, 1 left", d)
	}
	st, _ = s.Settle(resKey, p, 3, 12, t1.Add(time.Millisecond))
	if !st.Allowed || st.Estimate != 7 || st.Overage != 5 || st.Remaining != 0 {
		t.Fatalf("Settle(7 → 12) = %+v; want settled with overage 5 (14 of 10 spent), 0 left", st)
	}
	// The 2 expire at t0 + W, exactly: 12 remain counted, over the limit.
	if d, _ := s.Peek(resKey, p, 1, t0.Add(time.Second)); d.Allowed || d.Remaining != 0 {
		t.Fatalf("Peek at t0+W = %+v; want refused (12 of 10 still counted)", d)
	}
	// The 12 expire a window after the reservation (t1), not the settle.
	if d, _ := s.Peek(resKey, p, 10, t1.Add(time.Second)); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("Peek 10 at t1+W = %+v; want admitted (everything expired)", d)
	}
}

// TestSettleExpired: a reservation not settled within a window is charged
// its estimate, and a late Settle changes nothing.
func TestSettleExpired(t *testing.T) {
	s := resStore(t)
	p := Policy{Limit: 10, Window: time.Second}
	t0 := time.Unix(100, 0)
	if _, err := s.Reserve(resKey, p, 4, 7, t0); err != nil {
		t.Fatal(err)
	}
	if d, _ := s.Peek(resKey, p, 1, t0.Add(999*time.Millisecond)); d.Remaining != 5 {
		t.Fatalf("Peek 1 just before expiry = %+v; want the estimate charged (6 left, 5 after the peeked unit)", d)
	}
	st, err := s.Settle(resKey, p, 7, 100, t0.Add(time.Second))
	if err != nil || st.Allowed || st.Remaining != 10 {
		t.Fatalf("Settle a window later = %+v, %v; want nothing pending and nothing recorded", st, err)
	}
}

// TestReserveBadInput: every refused call changes nothing.
func TestReserveBadInput(t *testing.T) {
	s := resStore(t)
	p := Policy{Limit: 10, Window: time.Second}
	now := time.Unix(100, 0)
	if _, err := s.Reserve(resKey, p, 3, 1, now); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"id 0":        second(s.Reserve(resKey, p, 1, 0, now)),
		"pending id":  second(s.Reserve(resKey, p, 1, 1, now)),
		"hits 0":      second(s.Reserve(resKey, p, 0, 2, now)),
		"hits > L":    second(s.Reserve(resKey, p, 11, 2, now)),
		"token":       second(s.Reserve(resKey, Policy{Limit: 10, Window: time.Second, Algorithm: TokenBucket}, 1, 2, now)),
		"settle -1":   second(s.Settle(resKey, p, 1, -1, now)),
		"settle huge": second(s.Settle(resKey, p, 1, 1<<61, now)),
		"settle conc": second(s.Settle(resKey, Policy{Limit: 10, Window: time.Second, Algorithm: Concurrency}, 1, 1, now)),
		"bad key":     second(s.Reserve(Key{Tenant: "t"}, p, 1, 2, now)),
	} {
		if err == nil {
			t.Errorf("%s: nil error", name)
		}
	}
	if !errors.Is(second(s.Reserve(resKey, p, 1, 1, now)), ErrInvalidReservation) {
		t.Error("a pending id is not ErrInvalidReservation")
	}
	if !errors.Is(second(s.Reserve(resKey, Policy{Limit: 10, Window: time.Second, Algorithm: FixedWindow}, 1, 2, now)), ErrWrongAlgorithm) {
		t.Error("a fixed-window reservation is not ErrWrongAlgorithm")
	}
	if d, _ := s.Peek(resKey, p, 1, now); d.Remaining != 6 {
		t.Fatalf("after refused calls: Peek 1 = %+v; want only the first reservation (7 left, 6 after the peeked unit)", d)
	}
	if st, _ := s.Settle(resKey, p, 1, 0, now); !st.Allowed || st.Remaining != 10 {
		t.Fatalf("the reservation survived the refused calls: Settle to 0 = %+v; want settled, 10 left", st)
	}
}

func second[T any](_ T, err error) error { return err }

// TestReservePendingBound: at most MaxPendingReservations per key; a
// settled one makes room.
func TestReservePendingBound(t *testing.T) {
	s := resStore(t)
	p := Policy{Limit: 1 << 40, Window: time.Hour}
	now := time.Unix(100, 0)
	for i := range MaxPendingReservations {
		if d, err := s.Reserve(resKey, p, 1, uint64(i+1), now); err != nil || !d.Allowed {
			t.Fatalf("reservation %d: %+v, %v", i, d, err)
		}
	}
	if _, err := s.Reserve(resKey, p, 1, 1<<32, now); !errors.Is(err, ErrInvalidReservation) {
		t.Fatalf("one past the bound: %v, want ErrInvalidReservation", err)
	}
	if st, _ := s.Settle(resKey, p, 5, 1, now); !st.Allowed {
		t.Fatal("settle 5 failed")
	}
	if _, err := s.Reserve(resKey, p, 1, 1<<32, now); err != nil {
		t.Fatalf("after a settle: %v", err)
	}
}

// TestReservationsTravel: a key's pending reservations go with its state,
// so the store that imports it settles them, exactly once.
func TestReservationsTravel(t *testing.T) {
	a, b := resStore(t), resStore(t)
	p := Policy{Limit: 10, Window: time.Second}
	t0 := time.Unix(100, 0)
	if _, err := a.Reserve(resKey, p, 8, 42, t0); err != nil {
		t.Fatal(err)
	}
	ks, ok := a.Export(resKey, t0.Add(10*time.Millisecond))
	if !ok || len(ks.Reservations) != 1 || ks.Reservations[0].ID != 42 || ks.Reservations[0].Count != 8 {
		t.Fatalf("exported %+v; want the reservation", ks)
	}
	// b's clock is 5 s ahead: ages rebase.
	tb := t0.Add(5*time.Second + 20*time.Millisecond)
	if err := b.Import(ks, p, tb); err != nil {
		t.Fatal(err)
	}
	st, err := b.Settle(resKey, p, 42, 3, tb)
	if err != nil || !st.Allowed || st.Estimate != 8 || st.Remaining != 7 {
		t.Fatalf("Settle on the importer = %+v, %v; want settled, 7 left", st, err)
	}
	// A second import of the same state (a copy arriving twice) does not
	// make the settled id pending again: b's record of it is gone, but
	// the state adds up, which only refuses more.
	if st, _ := b.Settle(resKey, p, 42, 3, tb); st.Allowed {
		t.Fatalf("second Settle on the importer = %+v; want nothing pending", st)
	}
	bad := ks
	bad.Algorithm = TokenBucket
	bad.Runs = nil
	if err := bad.Validate(); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("reservations under a token bucket: %v, want ErrInvalidState", err)
	}
}

// refReserve is a naive model of a sliding-log key with reservations:
// every admission kept with its instant and units, settlements rewriting
// the reserved admission's units.
type refReserve struct {
	limit, win int64
	adm        []refAdm
}

type refAdm struct {
	ts, n int64
	id    uint64 // pending reservation, 0 when none
	over  int64  // its settlement's overage
}

// window is the units recorded in (x − W, x] and the overage among them.
func (m *refReserve) window(x int64) (c, over int64) {
	for _, a := range m.adm {
		if a.ts > x-m.win && a.ts <= x {
			c += a.n
			over += a.over
		}
	}
	return c, over
}

func (m *refReserve) count(now int64) (c int64) {
	for _, a := range m.adm {
		if a.ts > now-m.win {
			c += a.n
		}
	}
	return c
}

// TestReserveAgainstModel drives Store with random allows, reserves,
// settles (smaller, equal, larger, repeated, unknown) and time steps, some
// exactly to a window edge, against refReserve: every decision and
// settlement agrees, and no window holds more than the limit plus the
// overage the settlements reported.
func TestReserveAgainstModel(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		s := resStore(t)
		p := Policy{Limit: 1 + rng.Int64N(20), Window: time.Duration(1+rng.IntN(50)) * time.Millisecond}
		m := &refReserve{limit: p.Limit, win: int64(p.Window)}
		now := int64(time.Second)
		var ids []uint64
		for step := range 300 {
			switch k := rng.IntN(10); {
			case k < 2:
				now += int64(rng.IntN(5)) * int64(time.Millisecond)
			case k == 2 && len(m.adm) > 0:
				now = max(now, m.adm[rng.IntN(len(m.adm))].ts+m.win) // exactly to an edge
			case k < 5:
				hits := 1 + rng.Int64N(p.Limit)
				d, err := s.Allow(resKey, p, hits, time.Unix(0, now))
				want := m.count(now)+hits <= m.limit
				if err != nil || d.Allowed != want {
					t.Fatalf("seed %d step %d: Allow(%d) = %+v, %v; model admits %v (count %d)", seed, step, hits, d, err, want, m.count(now))
				}
				if want {
					m.adm = append(m.adm, refAdm{ts: now, n: hits})
				}
			case k < 7:
				hits := 1 + rng.Int64N(p.Limit)
				id := uint64(len(ids) + 1)
				d, err := s.Reserve(resKey, p, hits, id, time.Unix(0, now))
				want := m.count(now)+hits <= m.limit
				if err != nil || d.Allowed != want || d.Remaining != max(m.limit-m.count(now)-hits*b2i(want), 0) {
					t.Fatalf("seed %d step %d: Reserve(%d) = %+v, %v; model admits %v (count %d)", seed, step, hits, d, err, want, m.count(now))
				}
				if want {
					m.adm = append(m.adm, refAdm{ts: now, n: hits, id: id})
					ids = append(ids, id)
				}
			default:
				var id uint64 = 1 << 40 // unknown
				if len(ids) > 0 && rng.IntN(8) > 0 {
					id = ids[rng.IntN(len(ids))]
				}
				actual := rng.Int64N(2 * p.Limit)
				st, err := s.Settle(resKey, p, id, actual, time.Unix(0, now))
				if err != nil {
					t.Fatalf("seed %d step %d: Settle: %v", seed, step, err)
				}
				var want Settlement
				before := m.count(now)
				for i := range m.adm {
					a := &m.adm[i]
					if a.id == id && a.ts > now-m.win {
						want.Allowed, want.Estimate = true, a.n
						a.over = max(actual-a.n, 0)
						a.n, a.id = actual, 0
						break
					}
				}
				after := m.count(now)
				_ = before
				if want.Allowed {
					want.Overage = max(actual-want.Estimate, 0)
				}
				if st.Allowed != want.Allowed || st.Estimate != want.Estimate || st.Overage != want.Overage || st.Remaining != max(m.limit-after, 0) {
					t.Fatalf("seed %d step %d: Settle(%d, %d) = %+v; model %+v, remaining %d", seed, step, id, actual, st, want, max(m.limit-after, 0))
				}
			}
			// Every window ending at an admission's instant holds at most
			// the limit plus the overage of the reservations made in it.
			for _, a := range m.adm {
				if c, over := m.window(a.ts); c > m.limit+over {
					t.Fatalf("seed %d step %d: window ending at %d holds %d, limit %d, overage in it %d", seed, step, a.ts, c, m.limit, over)
				}
			}
		}
	}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
