package history

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"
)

var seedFlag = flag.Uint64("history.seed", 0, "base seed for the randomized history tests (0: from the clock)")

func baseSeed(t testing.TB) uint64 {
	s := *seedFlag
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("base seed %d (rerun with -history.seed=%d)", s, s)
	return s
}

// gen describes a random load on one key.
type gen struct {
	key       string
	L         int64
	W         int64 // ns
	clients   int
	perClient int
	maxHits   int64
	maxLat    int64   // ns, an op's latency is uniform in [1, maxLat]
	slow      float64 // probability an op's latency is up to W/2 instead
	think     int64   // ns, a client waits uniform [0, think] between its ops
}

// history generates a legal history: each client runs its ops one after
// another; every op is decided at a random instant τ inside its interval by
// a reference sliding log taking the decisions in τ order; then some answers
// are lost (Unknown) or replaced by Unavailable. The reference admissions
// are a witness, so the history satisfies the promise.
func (g gen) history(rng *rand.Rand) []Op {
	type dec struct {
		op  Op
		tau int64
	}
	var ds []dec
	for c := 0; c < g.clients; c++ {
		t := t0 + rng.Int64N(g.maxLat+1)
		for i := 0; i < g.perClient; i++ {
			lat := 1 + rng.Int64N(g.maxLat)
			if rng.Float64() < g.slow {
				lat = 1 + rng.Int64N(g.W/2)
			}
			tau := t + rng.Int64N(lat+1)
			ds = append(ds, dec{Op{Key: g.key, Client: c, Hits: 1 + rng.Int64N(g.maxHits), Call: t, Return: t + lat}, tau})
			t += lat + rng.Int64N(g.think+1)
		}
	}
	sort.SliceStable(ds, func(i, j int) bool { return ds[i].tau < ds[j].tau })
	type ent struct{ tau, hits int64 }
	var log []ent
	ops := make([]Op, 0, len(ds))
	for _, d := range ds {
		var n int64
		for _, e := range log {
			if e.tau > d.tau-g.W {
				n += e.hits
			}
		}
		o := d.op
		o.DecidedAt = d.tau
		if n+o.Hits <= g.L {
			log = append(log, ent{d.tau, o.Hits})
			o.Outcome = Admitted
			if rng.Float64() < 0.1 {
				o.Outcome = Unknown // the answer was lost
			}
		} else {
			switch r := rng.Float64(); {
			case r < 0.05:
				o.Outcome = Unknown
			case r < 0.15:
				o.Outcome = Unavailable
			default:
				o.Outcome = Rejected
			}
		}
		ops = append(ops, o)
	}
	rng.Shuffle(len(ops), func(i, j int) { ops[i], ops[j] = ops[j], ops[i] })
	return ops
}

// inject returns one extra admission that breaks the promise for sure: it
// finds the earliest call c of an admitted op maximizing the units of the
// admitted ops that lie inside [c, c+W), and adds a point admission inside
// that span asking for one unit more than the rest of the limit.
func (g gen) inject(ops []Op) (Op, int64) {
	var a []Op
	for _, o := range ops {
		if o.Key == g.key && o.Outcome == Admitted {
			a = append(a, o)
		}
	}
	bestSum, bestAt := int64(-1), int64(0)
	for _, first := range a {
		c := first.Call
		var sum int64
		end := c
		for _, o := range a {
			if o.Call >= c && o.Return < c+g.W {
				sum += o.Hits
				end = max(end, o.Return)
			}
		}
		if sum > bestSum {
			bestSum, bestAt = sum, end
		}
	}
	return Op{Key: g.key, Client: g.clients, Hits: g.L - bestSum + 1, Call: bestAt, Return: bestAt, Outcome: Admitted}, bestSum
}

func randomGen(rng *rand.Rand, key string) gen {
	g := gen{key: key, L: 2 + rng.Int64N(40), W: int64(time.Second), clients: 8, perClient: 10 + rng.IntN(40),
		maxHits: 1 + rng.Int64N(3), maxLat: int64(time.Millisecond) * (1 + rng.Int64N(150)), slow: 0.03}
	// Ask for about 1.5 times the limit: saturated, but most ops admitted.
	perOp := float64(g.W) * float64(g.clients) * float64(g.maxHits+1) / 2 / (1.5 * float64(g.L))
	g.think = max(0, 2*(int64(perOp)-g.maxLat/2))
	return g
}

func TestRandomHistories(t *testing.T) {
	base := baseSeed(t)
	for i := uint64(0); i < 30; i++ {
		seed := base + i
		rng := rand.New(rand.NewPCG(seed, 0))
		var gens []gen
		var ops []Op
		for k := 0; k < 3; k++ {
			g := randomGen(rng, fmt.Sprintf("key%d", k))
			gens = append(gens, g)
			ops = append(ops, g.history(rng)...)
		}
		lims := func(key string) Limits {
			for _, g := range gens {
				if g.key == key {
					return Limits{Limit: g.L, Window: time.Duration(g.W)}
				}
			}
			panic(key)
		}
		r := Check(ops, lims, 20*time.Second)
		if err := r.Err(); err != nil || len(r.TimedOut) > 0 {
			t.Fatalf("seed %d: legal history rejected (%v): %v", seed, r, err)
		}
		if i == 0 {
			t.Logf("seed %d legal: %v", seed, r)
		}
		// One extra admission on one key.
		g := gens[rng.IntN(len(gens))]
		extra, had := g.inject(ops)
		bad := append(append([]Op(nil), ops...), extra)
		w := CheckWindow(bad, lims)
		l, to := CheckLinearizable(bad, lims, 20*time.Second)
		if len(to) > 0 {
			t.Fatalf("seed %d: timed out on %q after injecting %v (limit %d, %d already in its span)", seed, to, extra, g.L, had)
		}
		for name, vs := range map[string][]Violation{"CheckWindow": w, "CheckLinearizable": l} {
			found := false
			for _, v := range vs {
				if v.Key != g.key {
					t.Fatalf("seed %d: %s flagged key %q, only %q was broken: %v", seed, name, v.Key, g.key, v)
				}
				found = true
			}
			if !found {
				t.Fatalf("seed %d: %s missed the injected %v (limit %d, %d already in its span)", seed, name, extra, g.L, had)
			}
		}
		if i == 0 {
			t.Logf("seed %d: injected %v (limit %d, %d already in its span): %v", seed, extra, g.L, had, w[0].Detail)
		}
	}
}

// TestRandomSmallFullModel compares, on small random histories (legal or
// not), the shipped check (admitted ops only, split into stretches) with
// the full nondeterministic model over every op: doc.go argues they agree.
func TestRandomSmallFullModel(t *testing.T) {
	base := baseSeed(t)
	verdicts := map[bool]int{}
	for i := uint64(0); i < 300; i++ {
		seed := base + i
		rng := rand.New(rand.NewPCG(seed, 1))
		g := gen{key: "k", L: 1 + rng.Int64N(4), W: int64(time.Second), clients: 1 + rng.IntN(4), perClient: 1 + rng.IntN(5),
			maxHits: 1 + rng.Int64N(2), maxLat: int64(time.Millisecond) * (1 + rng.Int64N(900)), slow: 0.2,
			think: int64(time.Millisecond) * rng.Int64N(500)}
		ops := g.history(rng)
		// Break it at random: turn some rejections into admissions.
		for j := range ops {
			if ops[j].Outcome != Admitted && rng.Float64() < 0.3 {
				ops[j].Outcome = Admitted
			}
		}
		lim := limitsOf(g.L, time.Duration(g.W))
		keys, _ := byKey(ops, lim)
		fast, to1 := keys[0].checkLinearizable(10*time.Second, false)
		full, to2 := keys[0].checkLinearizable(10*time.Second, true)
		if to1 || to2 {
			t.Fatalf("seed %d: timed out", seed)
		}
		if (len(fast) > 0) != (len(full) > 0) {
			t.Fatalf("seed %d: shipped check says violation=%v, full model %v; ops %v", seed, len(fast) > 0, len(full) > 0, ops)
		}
		// Rule 1 is sound: it never flags what rule 2 accepts.
		if w := keys[0].checkWindow(); len(w) > 0 && len(fast) == 0 {
			t.Fatalf("seed %d: window rule flagged a linearizable history: %v", seed, w)
		}
		verdicts[len(fast) > 0]++
	}
	t.Logf("violations in %d of %d histories", verdicts[true], verdicts[true]+verdicts[false])
	if verdicts[true] < 30 || verdicts[false] < 30 {
		t.Errorf("too one-sided to compare anything: %v", verdicts)
	}
}

// key2000 is one key, 8 clients running 250 ops each back to back (so 8
// ops are in flight nearly all the time), asking for about 1.6 times the limit.
func key2000(rng *rand.Rand) gen {
	return gen{key: "hot", L: 100, W: int64(time.Second), clients: 8, perClient: 250, maxHits: 1,
		maxLat: int64(100 * time.Millisecond), slow: 0.01, think: int64(5 * time.Millisecond)}
}

func TestTiming2000(t *testing.T) {
	seed := baseSeed(t)
	rng := rand.New(rand.NewPCG(seed, 2))
	g := key2000(rng)
	ops := g.history(rng)
	lim := limitsOf(g.L, time.Duration(g.W))
	start := time.Now()
	w := CheckWindow(ops, lim)
	tw := time.Since(start)
	start = time.Now()
	l, to := CheckLinearizable(ops, lim, time.Minute)
	tl := time.Since(start)
	r := Check(ops, lim, time.Minute)
	if len(w)+len(l)+len(to) > 0 {
		t.Fatalf("seed %d: legal history: window %v, linearizable %v, timed out %v", seed, w, l, to)
	}
	t.Logf("seed %d: %v: CheckWindow %v, CheckLinearizable %v", seed, r, tw, tl)

	extra, had := g.inject(ops)
	bad := append(ops, extra)
	start = time.Now()
	w = CheckWindow(bad, lim)
	tw = time.Since(start)
	start = time.Now()
	l, to = CheckLinearizable(bad, lim, time.Minute)
	tl = time.Since(start)
	if len(w) == 0 || len(l) == 0 || len(to) > 0 {
		t.Fatalf("seed %d: injected %v (%d already in its span): window %v, linearizable %v, timed out %v", seed, extra, had, w, l, to)
	}
	t.Logf("seed %d: with one extra admission: CheckWindow %v, CheckLinearizable %v", seed, tw, tl)
	if len(l[0].Ops) == 0 || len(l[0].Ops) > reportOps {
		t.Errorf("linearizable violation lists %d ops", len(l[0].Ops))
	}
	t.Logf("%v", l[0])
}

func BenchmarkCheck2000(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	g := key2000(rng)
	ops := g.history(rng)
	lim := limitsOf(g.L, time.Duration(g.W))
	for b.Loop() {
		if r := Check(ops, lim, time.Minute); r.Err() != nil || len(r.TimedOut) > 0 {
			b.Fatal(r)
		}
	}
}

// TestTimeoutIsNotAViolation gives the search for a 2 000-op illegal key
// no time: the key must come back timed out (or, on a machine fast enough
// to finish anyway, flagged), never silently passed.
func TestTimeoutIsNotAViolation(t *testing.T) {
	seed := baseSeed(t)
	rng := rand.New(rand.NewPCG(seed, 5))
	g := key2000(rng)
	ops := g.history(rng)
	extra, _ := g.inject(ops)
	ops = append(ops, extra)
	r := Check(ops, limitsOf(g.L, time.Duration(g.W)), time.Nanosecond)
	lin := 0
	for _, v := range r.Violations {
		if v.Rule == RuleLinearizable {
			lin++
		}
	}
	switch {
	case len(r.TimedOut) == 1 && lin == 0:
	case len(r.TimedOut) == 0 && lin == 1:
		t.Logf("seed %d: finished within 1 ns of budget", seed)
	default:
		t.Fatalf("seed %d: %v: %v", seed, r, r.Err())
	}
	if len(r.Violations) == lin {
		t.Fatalf("seed %d: the window rule does not depend on the search and must still flag it: %v", seed, r)
	}
}
