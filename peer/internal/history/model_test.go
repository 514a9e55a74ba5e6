package history

import (
	"math/rand/v2"
	"testing"
	"time"
)

func st(lo int64, ents ...ent) *state { return (&state{lo: lo, ents: ents}).rehash() }

func TestCovers(t *testing.T) {
	m := model{L: 10, W: 10}
	cases := []struct {
		name string
		s, n *state
		want bool
	}{
		{"equal", st(5, ent{1, 2}, ent{5, 1}), st(5, ent{1, 2}, ent{5, 1}), true},
		{"earlier entry", st(5, ent{0, 1}), st(5, ent{3, 1}), true},
		{"later entry", st(5, ent{3, 1}), st(5, ent{0, 1}), false},
		{"fewer units", st(5, ent{3, 1}), st(5, ent{3, 2}), true},
		{"more units", st(5, ent{3, 2}), st(5, ent{3, 1}), false},
		{"later lo", st(6), st(5), false},
		{"earlier lo", st(4, ent{3, 1}), st(5, ent{3, 1}), true},
		{"split later", st(5, ent{1, 1}, ent{4, 1}), st(5, ent{2, 2}), false},
		{"split earlier", st(5, ent{1, 1}, ent{2, 1}), st(5, ent{2, 2}), true},
		// n.lo − W = 5: what lies at or before 5 can never count again after n.lo.
		{"expired for n's future", st(14, ent{5, 3}, ent{14, 1}), st(15, ent{15, 1}), true},
		{"not yet expired for n's future", st(14, ent{6, 3}, ent{14, 1}), st(15, ent{15, 1}), false},
	}
	for _, c := range cases {
		if got := m.covers(c.s, c.n); got != c.want {
			t.Errorf("%s: covers = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestAdmitStep(t *testing.T) {
	m := model{L: 3, W: 10}
	s := m.init()
	steps := []struct {
		call, ret, hits int64
		wantTau         int64 // -1: illegal
	}{
		{0, 0, 2, 0},
		{1, 100, 1, 1},
		{2, 100, 1, 10}, // the 2 from 0 expire at exactly 10
		{3, 100, 2, 11}, // lo is 10; at 11 the 1 from 1 is gone, the 1 from 10 counts
		{12, 19, 1, -1}, // 1 at 10 and 2 at 11: full until 20
		{12, 20, 1, 20},
		{0, 30, 4, -1}, // more than the limit at once
	}
	for i, c := range steps {
		n := m.admit(s, c.call, c.ret, c.hits)
		switch {
		case c.wantTau < 0 && n != nil:
			t.Fatalf("step %d: admitted at %d, want illegal", i, n.lo)
		case c.wantTau >= 0 && n == nil:
			t.Fatalf("step %d: illegal, want τ = %d", i, c.wantTau)
		case n != nil && n.lo != c.wantTau:
			t.Fatalf("step %d: τ = %d, want %d (state %+v)", i, n.lo, c.wantTau, *n)
		}
		if n != nil {
			if len(s.ents) > 0 && &s.ents[0] == &n.ents[0] {
				t.Fatalf("step %d: new state shares the old state's entries", i)
			}
			s = n
		}
	}
}

// TestWindowBruteForce compares CheckWindow with every subset of small
// random sets of admitted ops.
func TestWindowBruteForce(t *testing.T) {
	base := baseSeed(t)
	flagged := 0
	for i := uint64(0); i < 500; i++ {
		seed := base + i
		rng := rand.New(rand.NewPCG(seed, 3))
		L, W := 1+rng.Int64N(5), int64(10)
		n := 1 + rng.IntN(10)
		var ops []Op
		for j := 0; j < n; j++ {
			c := rng.Int64N(30)
			ops = append(ops, Op{Key: "k", Outcome: Admitted, Hits: 1 + rng.Int64N(3), Call: c, Return: c + rng.Int64N(12), Client: j})
		}
		want := false
		for set := 1; set < 1<<n; set++ {
			var sum int64
			lo, hi := int64(1<<62), int64(-1<<62)
			for j := 0; j < n; j++ {
				if set&(1<<j) != 0 {
					sum += ops[j].Hits
					lo, hi = min(lo, ops[j].Call), max(hi, ops[j].Return)
				}
			}
			if sum > L && hi-lo < W {
				want = true
				break
			}
		}
		got := CheckWindow(ops, limitsOf(L, time.Duration(W)))
		if (len(got) > 0) != want {
			t.Fatalf("seed %d: CheckWindow says %v, brute force %v: L=%d W=%d ops %v", seed, got, want, L, W, ops)
		}
		for _, v := range got {
			var sum int64
			lo, hi := int64(1<<62), int64(-1<<62)
			for _, o := range v.Ops {
				sum += o.Hits
				lo, hi = min(lo, o.Call), max(hi, o.Return)
			}
			if sum <= L || hi-lo >= W {
				t.Fatalf("seed %d: reported ops do not show the violation: %v", seed, v)
			}
		}
		if want {
			flagged++
		}
	}
	t.Logf("%d of 500 flagged", flagged)
}

// TestCoversAgreesWithExact compares the shipped search (the cache skips
// covered states) with the same search skipping only equal states, on
// random histories small enough for the latter, legal or not.
func TestCoversAgreesWithExact(t *testing.T) {
	base := baseSeed(t)
	decided := map[bool]int{}
	for i := uint64(0); i < 150; i++ {
		seed := base + i
		rng := rand.New(rand.NewPCG(seed, 4))
		g := gen{key: "k", L: 1 + rng.Int64N(8), W: int64(time.Second), clients: 2 + rng.IntN(7), perClient: 3 + rng.IntN(8),
			maxHits: 1 + rng.Int64N(3), maxLat: int64(time.Millisecond) * (1 + rng.Int64N(400)), slow: 0.1,
			think: int64(time.Millisecond) * rng.Int64N(300)}
		ops := g.history(rng)
		for j := range ops {
			if ops[j].Outcome != Admitted && rng.Float64() < 0.07 {
				ops[j].Outcome = Admitted
			}
		}
		keys, _ := byKey(ops, limitsOf(g.L, time.Duration(g.W)))
		k := keys[0]
		fast, to := k.checkModel(model{L: g.L, W: g.W}, 20*time.Second, false)
		if to {
			t.Fatalf("seed %d: timed out on %d admitted ops", seed, len(k.admitted))
		}
		exact, to := k.checkModel(model{L: g.L, W: g.W, exact: true}, 2*time.Second, false)
		if to {
			continue
		}
		if (len(fast) > 0) != (len(exact) > 0) {
			t.Fatalf("seed %d: with covers violation=%v, exact %v: L=%d ops %v", seed, len(fast) > 0, len(exact) > 0, g.L, k.admitted)
		}
		decided[len(fast) > 0]++
	}
	t.Logf("decided by both: %d violations, %d legal", decided[true], decided[false])
	if decided[true] < 20 || decided[false] < 20 {
		t.Errorf("too few decided to compare: %v", decided)
	}
}
