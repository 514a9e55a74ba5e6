package shard

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

var grKey = Key{Tenant: "t", Subject: "s", Policy: "hot"}

// TestGrantRules walks the rights rules on one key: a grant takes at most
// half the spare units and is charged as admitted; the holder's own
// decisions see it; a return records the uses at their instants and
// frees the rest; an unreturned grant holds its slots until the lease's
// end plus a window, exactly.
func TestGrantRules(t *testing.T) {
	s := resStore(t)
	p := Policy{Limit: 10, Window: time.Second}
	t0 := time.Unix(100, 0)
	g, err := s.Grant(grKey, p, 8, 200*time.Millisecond, 1, t0)
	if err != nil || !g.Allowed || g.Granted != 5 || g.Remaining != 5 {
		t.Fatalf("Grant 8 of 10 spare = %+v, %v; want 5 granted (half the spare), 5 left", g, err)
	}
	if d, _ := s.Allow(grKey, p, 6, t0); d.Allowed {
		t.Fatalf("Allow 6 beside a grant of 5 = %+v; want refused", d)
	}
	if d, _ := s.Allow(grKey, p, 5, t0); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("Allow 5 beside a grant of 5 = %+v; want admitted, 0 left", d)
	}
	if g2, _ := s.Grant(grKey, p, 1, time.Second, 2, t0); g2.Allowed || g2.RetryAfter != time.Second {
		t.Fatalf("Grant with nothing spare = %+v; want none, retry after 1s (the 5 admitted free first)", g2)
	}
	// Two rights used 50 ms and 150 ms into the lease; returned at 300 ms.
	t3 := t0.Add(300 * time.Millisecond)
	r, err := s.Return(grKey, p, 1, []Run{{Age: 250 * time.Millisecond, Count: 1}, {Age: 150 * time.Millisecond, Count: 1}}, t3)
	if err != nil || !r.Found || r.Used != 2 || r.Unused != 3 || r.Remaining != 3 {
		t.Fatalf("Return = %+v, %v; want 2 used, 3 freed, 3 spare", r, err)
	}
	if again, _ := s.Return(grKey, p, 1, []Run{{Count: 5}}, t3); again.Found || again.Remaining != 3 {
		t.Fatalf("second Return = %+v; want not found, nothing changed", again)
	}
	// The use at t0+50ms expires at t0+1050ms exactly.
	if d, _ := s.Peek(grKey, p, 9, t0.Add(1049*time.Millisecond)); d.Allowed {
		t.Fatalf("Peek 9 at t0+1049ms = %+v; want refused (both uses live)", d)
	}
	if d, _ := s.Peek(grKey, p, 9, t0.Add(1050*time.Millisecond)); !d.Allowed {
		t.Fatalf("Peek 9 at t0+1050ms = %+v; want admitted (the 5 and the first use expired)", d)
	}
	// An unreturned grant is charged until its lease's end plus W.
	t5 := t0.Add(5 * time.Second)
	if g, _ := s.Grant(grKey, p, 10, 100*time.Millisecond, 3, t5); g.Granted != 5 {
		t.Fatalf("Grant at t5 = %+v; want 5", g)
	}
	end := t5.Add(100*time.Millisecond + time.Second)
	if d, _ := s.Peek(grKey, p, 6, end.Add(-time.Nanosecond)); d.Allowed || d.RetryAfter != time.Nanosecond {
		t.Fatalf("Peek 6 just before lease end + W = %+v; want refused, retry in 1ns", d)
	}
	if d, _ := s.Peek(grKey, p, 10, end); !d.Allowed {
		t.Fatalf("Peek 10 at lease end + W = %+v; want admitted", d)
	}
}

// TestGrantTravelsInState: an exported key carries its grants, and the
// importer charges them until they end.
func TestGrantTravelsInState(t *testing.T) {
	a, b := resStore(t), resStore(t)
	p := Policy{Limit: 10, Window: time.Second}
	t0 := time.Unix(100, 0)
	if g, _ := a.Grant(grKey, p, 10, 500*time.Millisecond, 7, t0); g.Granted != 5 {
		t.Fatalf("Grant = %+v", g)
	}
	ks, ok := a.Take(grKey, t0.Add(10*time.Millisecond))
	if !ok || len(ks.Grants) != 1 || ks.Grants[0].Age != -490*time.Millisecond {
		t.Fatalf("Take = %+v, %v; want one grant ending 490ms ahead", ks, ok)
	}
	// Imported 20 ms later on the receiver's clock (transfer delay).
	t1 := t0.Add(30 * time.Millisecond)
	if err := b.Import(ks, p, t1); err != nil {
		t.Fatal(err)
	}
	if d, _ := b.Peek(grKey, p, 6, t1); d.Allowed {
		t.Fatalf("Peek 6 on the importer = %+v; want refused (5 charged)", d)
	}
	r, _ := b.Return(grKey, p, 7, []Run{{Age: 10 * time.Millisecond, Count: 3}}, t1)
	if !r.Found || r.Used != 3 || r.Unused != 2 {
		t.Fatalf("Return on the importer = %+v; want the grant found, 3 used", r)
	}
	if n := b.Sweep(t1.Add(2*time.Second), 0); n != 1 {
		t.Fatalf("Sweep = %d; want the key dropped once everything expired", n)
	}
	if _, ok := b.Export(grKey, t1.Add(2*time.Second)); ok {
		t.Fatal("key still held")
	}
}

// TestGrantBadInput: bad requests are errors that change nothing.
func TestGrantBadInput(t *testing.T) {
	s := resStore(t)
	p := Policy{Limit: 10, Window: time.Second}
	t0 := time.Unix(100, 0)
	for _, c := range []struct {
		name  string
		want  int64
		lease time.Duration
		id    uint64
		err   error
	}{
		{"zero id", 1, time.Second, 0, ErrInvalidReservation},
		{"zero lease", 1, 0, 1, ErrInvalidReservation},
		{"long lease", 1, 2 * MaxGrantLease, 1, ErrInvalidReservation},
		{"want 0", 0, time.Second, 1, ErrInvalidHits},
		{"want over limit", 11, time.Second, 1, ErrInvalidHits},
	} {
		if _, err := s.Grant(grKey, p, c.want, c.lease, c.id, t0); !errors.Is(err, c.err) {
			t.Errorf("%s: err %v, want %v", c.name, err, c.err)
		}
	}
	if _, err := s.Grant(grKey, Policy{Limit: 10, Window: time.Second, Algorithm: TokenBucket}, 1, time.Second, 1, t0); !errors.Is(err, ErrWrongAlgorithm) {
		t.Errorf("token bucket: %v", err)
	}
	if _, err := s.Grant(grKey, p, 1, time.Second, 1, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Grant(grKey, p, 1, time.Second, 1, t0); !errors.Is(err, ErrInvalidReservation) {
		t.Errorf("outstanding id again: %v", err)
	}
	if _, err := s.Return(grKey, p, 1, []Run{{Count: -1}}, t0); !errors.Is(err, ErrInvalidState) {
		t.Errorf("negative use: %v", err)
	}
	if d, _ := s.Peek(grKey, p, 9, t0); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after the bad calls Peek 9 = %+v; want the one grant only", d)
	}
	for i := range MaxGrants - 1 {
		s.Grant(grKey, Policy{Limit: 1 << 20, Window: time.Second}, 1, time.Second, uint64(100+i), t0)
	}
	if g, _ := s.Grant(grKey, Policy{Limit: 1 << 20, Window: time.Second}, 1, time.Second, 99, t0); g.Allowed {
		t.Fatalf("grant beyond MaxGrants = %+v; want none", g)
	}
}

// TestGrantAgainstModel drives random admissions, grants, grantee uses,
// returns and expiries against a naive model on a millisecond grid, and
// checks (1) every decision and grant equals the naive model's, computed
// from scratch (live units plus charged grants), and (2) the real
// admissions (holder's and grantees') never exceed Limit in any window.
func TestGrantAgainstModel(t *testing.T) {
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 11))
		s := resStore(t)
		const ms = int64(time.Millisecond)
		limit := 1 + rng.Int64N(20)
		w := (1 + rng.Int64N(50)) * ms
		p := Policy{Limit: limit, Window: time.Duration(w)}
		type mgrant struct {
			id          uint64
			from, until int64
			n, used     int64
			uses        []int64
			done        bool
		}
		var recorded []int64 // the model's log, one entry per unit
		var real []int64     // every real admission, per unit
		var gs []*mgrant
		now := int64(1_000_000) * ms
		nextID := uint64(1)
		charge := func(t int64) int64 {
			var c int64
			for _, x := range recorded {
				if x > t-w && x <= t {
					c++
				}
			}
			for _, g := range gs {
				if !g.done && g.from <= t && g.until+w > t {
					c += g.n
				}
			}
			return c
		}
		for step := range 400 {
			now += rng.Int64N(3) * ms
			tm := time.Unix(0, now)
			switch op := rng.IntN(10); {
			case op < 3:
				hits := 1 + rng.Int64N(limit)
				d, err := s.Allow(grKey, p, hits, tm)
				want := charge(now)+hits <= limit
				if err != nil || d.Allowed != want {
					t.Fatalf("seed %d step %d: Allow(%d) at %d = %+v, %v; model says %v (charge %d of %d)", seed, step, hits, now, d, err, want, charge(now), limit)
				}
				if want {
					for range hits {
						recorded = append(recorded, now)
						real = append(real, now)
					}
				}
			case op < 5:
				want := 1 + rng.Int64N(limit)
				lease := (1 + rng.Int64N(30)) * ms
				g, err := s.Grant(grKey, p, want, time.Duration(lease), nextID, tm)
				spare := limit - charge(now)
				live := 0
				for _, g := range gs {
					if !g.done && g.until+w > now {
						live++
					}
				}
				wantN := int64(0)
				if spare > 0 && live < MaxGrants {
					wantN = min(want, spare-spare/2)
				}
				if err != nil || g.Granted != wantN {
					t.Fatalf("seed %d step %d: Grant(%d) = %+v, %v; model grants %d (spare %d)", seed, step, want, g, err, wantN, spare)
				}
				if wantN > 0 {
					gs = append(gs, &mgrant{id: nextID, from: now, until: now + lease, n: wantN})
				}
				nextID++
			case op < 8:
				// A grantee uses a right of a random grant inside its lease.
				if len(gs) == 0 {
					continue
				}
				g := gs[rng.IntN(len(gs))]
				if g.done || now > g.until || g.used >= g.n {
					continue
				}
				g.used++
				g.uses = append(g.uses, now)
				real = append(real, now)
			default:
				if len(gs) == 0 {
					continue
				}
				g := gs[rng.IntN(len(gs))]
				var runs []Run
				for _, u := range g.uses {
					runs = append(runs, Run{Age: time.Duration(now - u), Count: 1})
				}
				r, err := s.Return(grKey, p, g.id, runs, tm)
				wantFound := !g.done && g.until+w > now
				if err != nil || r.Found != wantFound || (wantFound && r.Used != g.used) {
					t.Fatalf("seed %d step %d: Return(%d) = %+v, %v; model: found %v, used %d", seed, step, g.id, r, err, wantFound, g.used)
				}
				if wantFound {
					recorded = append(recorded, g.uses...)
				}
				g.done = true
			}
			// No window ending at an admission holds more than limit.
			for _, x := range real {
				var c int64
				for _, y := range real {
					if y > x-w && y <= x {
						c++
					}
				}
				if c > limit {
					t.Fatalf("seed %d step %d: %d real admissions in the window ending %d, limit %d", seed, step, c, x, limit)
				}
			}
		}
	}
}
