package history

import (
	"strings"
	"testing"
	"time"
)

const ms = int64(time.Millisecond)

var t0 = int64(3 * time.Hour) // an arbitrary origin: every time below is t0 + offset

// op is an op on key "k", offsets in ms from t0.
func op(client int, out Outcome, hits, call, ret int64) Op {
	return Op{Key: "k", Client: client, Outcome: out, Hits: hits, Call: t0 + call*ms, Return: t0 + ret*ms}
}

func adm(client int, hits, call, ret int64) Op { return op(client, Admitted, hits, call, ret) }

// at is an admitted op decided and answered at one instant.
func at(client int, hits, instant int64) Op { return adm(client, hits, instant, instant) }

func limitsOf(L int64, W time.Duration) func(string) Limits {
	return func(string) Limits { return Limits{Limit: L, Window: W} }
}

// fullModelOps bounds the histories the full model is run on: with every
// rejected and unknown op in the search, proving an illegal history
// illegal is exponential in their number (an illegal history with 80
// rejected ops takes porcupine over 10 s), which is why CheckLinearizable
// leaves them out.
const fullModelOps = 30

// verdicts runs the direct rule, the linearizability check as shipped and
// the full nondeterministic model over every op.
func verdicts(t *testing.T, ops []Op, lim func(string) Limits) (window, lin, full []Violation) {
	t.Helper()
	window = CheckWindow(ops, lim)
	lin, to := CheckLinearizable(ops, lim, 10*time.Second)
	if len(to) > 0 {
		t.Fatalf("linearizability check timed out on %q", to)
	}
	keys, bad := byKey(ops, lim)
	full = bad
	if len(ops) > fullModelOps {
		return window, lin, lin
	}
	for _, k := range keys {
		v, to := k.checkLinearizable(10*time.Second, true)
		if to {
			t.Fatalf("full model timed out on %q", k.key)
		}
		full = append(full, v...)
	}
	return
}

type historyCase struct {
	name        string
	L           int64
	W           time.Duration
	ops         []Op
	window, lin bool // violation expected from CheckWindow / CheckLinearizable
}

func runCases(t *testing.T, cases []historyCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, l, f := verdicts(t, c.ops, limitsOf(c.L, c.W))
			if (len(w) > 0) != c.window {
				t.Errorf("CheckWindow: got %d violations %v, want violation=%v", len(w), w, c.window)
			}
			if (len(l) > 0) != c.lin {
				t.Errorf("CheckLinearizable: got %d violations %v, want violation=%v", len(l), l, c.lin)
			}
			if (len(f) > 0) != c.lin {
				t.Errorf("full nondeterministic model: got %d violations %v, want violation=%v", len(f), f, c.lin)
			}
			if c.window && !c.lin {
				t.Fatal("bad case: a window violation is always a linearizability violation")
			}
			for _, v := range append(w, l...) {
				if len(v.Ops) == 0 || v.Detail == "" {
					t.Errorf("violation without ops or detail: %v", v)
				}
			}
		})
	}
}

// seq100 is 100 sequential single-unit admissions at 59 801 … 59 900 ms.
func seq100() []Op {
	var ops []Op
	for i := int64(0); i < 100; i++ {
		ops = append(ops, at(int(i%8), 1, 59_801+i))
	}
	return ops
}

func TestBoundary(t *testing.T) {
	const W = 60 * time.Second
	first := at(0, 100, 59_900)
	runCases(t, []historyCase{
		{"100 at 59.9s", 100, W, []Op{first}, false, false},
		{"then 100 at 60.1s", 100, W, []Op{first, at(1, 100, 60_100)}, true, true},
		{"then 1 at 119.899s", 100, W, []Op{first, at(1, 1, 119_899)}, true, true},
		{"then 1 at 119.9s: the first expired exactly", 100, W, []Op{first, at(1, 1, 119_900)}, false, false},
		{"then 100 at 119.9s", 100, W, []Op{first, at(1, 100, 119_900)}, false, false},
		{"101 at once", 100, W, []Op{at(0, 101, 59_900)}, true, true},
		{"100 sequential ops", 100, W, seq100(), false, false},
		{"100 sequential ops, then 1 at 119.800s", 100, W, append(seq100(), at(1, 1, 119_800)), true, true},
		{"100 sequential ops, then 1 at 119.801s", 100, W, append(seq100(), at(1, 1, 119_801)), false, false},
		{"100 sequential ops, then 2 at 119.801s", 100, W, append(seq100(), at(1, 2, 119_801)), true, true},
		{"100 sequential ops, then 2 at 119.802s", 100, W, append(seq100(), at(1, 2, 119_802)), false, false},
		{"L=1: at 0 and 60s", 1, W, []Op{at(0, 1, 0), at(1, 1, 60_000)}, false, false},
		{"L=1: at 0 and 59.999s", 1, W, []Op{at(0, 1, 0), at(1, 1, 59_999)}, true, true},
		{"L=1: at 0, 60s, 120s", 1, W, []Op{at(0, 1, 0), at(1, 1, 60_000), at(2, 1, 120_000)}, false, false},
		{"L=1: at 0, 60s, 119.999s", 1, W, []Op{at(0, 1, 0), at(1, 1, 60_000), at(2, 1, 119_999)}, true, true},
		{"L=0: one admission", 0, W, []Op{at(0, 1, 0)}, true, true},
	})
}

func TestOrders(t *testing.T) {
	const W = 10 * time.Second
	runCases(t, []historyCase{
		// Call order fails (A at 0 leaves no room for B); B then A at 10 s works.
		{"legal only with the later call first", 1, W,
			[]Op{adm(0, 1, 0, 100_000), adm(1, 1, 5_000, 6_000)}, false, false},
		// Only B at 5 s, C at 15 s, A at 25 s: A is decided after C's whole interval.
		{"legal only with the first call last", 1, W,
			[]Op{adm(0, 1, 0, 30_000), adm(1, 1, 5_000, 6_000), adm(2, 1, 15_000, 16_000)}, false, false},
		{"... and illegal when that op returns 1 ms too early", 1, W,
			[]Op{adm(0, 1, 0, 24_999), adm(1, 1, 5_000, 6_000), adm(2, 1, 15_000, 16_000)}, false, true},
		// Three decisions 10 s apart need 20 s; 15 s spans more than W, so rule 1 cannot see it.
		// X fills the window until 10 s. Call order (A at 10 s, B at 20 s) leaves B's 2 units
		// in C's window; B at 10 s, A at 20 s reaches the same set of ops in a better state
		// (the search must not skip it as covered by the worse one), and C fits at 21 s.
		// C is called after A returned, so C cannot go between B and A.
		{"the same ops in a better state later in the search", 2, W,
			[]Op{at(0, 2, 0), adm(1, 1, 1_000, 20_000), adm(2, 2, 2_000, 24_000), adm(3, 1, 21_000, 25_000)}, false, false},
		{"... illegal when A returns 1 ms before B's units expire", 2, W,
			[]Op{at(0, 2, 0), adm(1, 1, 1_000, 19_999), adm(2, 2, 2_000, 24_000), adm(3, 1, 21_000, 25_000)}, false, true},
		{"illegal under every order, wider than W", 1, W,
			[]Op{adm(0, 1, 0, 15_000), adm(1, 1, 0, 15_000), adm(2, 1, 0, 15_000)}, false, true},
		{"three in [0, 20s] fit exactly", 1, W,
			[]Op{adm(0, 1, 0, 20_000), adm(1, 1, 0, 20_000), adm(2, 1, 0, 20_000)}, false, false},
		{"two in [0, 9.999s]", 1, W, []Op{adm(0, 1, 0, 9_999), adm(1, 1, 0, 9_999)}, true, true},
		{"two in [0, 10s] fit exactly", 1, W, []Op{adm(0, 1, 0, 10_000), adm(1, 1, 0, 10_000)}, false, false},
		{"3+3 units, limit 5", 5, W, []Op{adm(0, 3, 0, 5_000), adm(1, 3, 1_000, 4_000)}, true, true},
		{"3+3 units, limit 6", 6, W, []Op{adm(0, 3, 0, 5_000), adm(1, 3, 1_000, 4_000)}, false, false},
		// 4 units at 0 and 4 at 5 s: a third ×4 fits only at 10 s or later, its interval ends at 9.999 s;
		// the three intervals span 9.999 s < W, so rule 1 sees it too.
		{"4+4+4 units, limit 8", 8, W,
			[]Op{at(0, 4, 0), at(1, 4, 5_000), adm(2, 4, 1_000, 9_999)}, true, true},
		{"4+4+4 units, limit 8, last may wait to 10s", 8, W,
			[]Op{at(0, 4, 0), at(1, 4, 5_000), adm(2, 4, 1_000, 10_000)}, false, false},
		// Partly expired: at 12 s the 4 from 0 s are gone, the 4 from 5 s count.
		{"expiry walk: 4 at 0, 4 at 5s, 4 at 12s", 8, W,
			[]Op{at(0, 4, 0), at(1, 4, 5_000), at(2, 4, 12_000)}, false, false},
		{"expiry walk: 4 at 0, 4 at 5s, 5 at 12s", 8, W,
			[]Op{at(0, 4, 0), at(1, 4, 5_000), at(2, 5, 12_000)}, true, true},
	})
}

func TestUnknownRejected(t *testing.T) {
	const W = 10 * time.Second
	unk := func(client int, hits, call int64) Op { return op(client, Unknown, hits, call, call) }
	var rejected []Op
	for i := int64(0); i < 40; i++ {
		rejected = append(rejected, op(int(i%8), Rejected, 1+i%3, i*200, i*200+3_000))
		rejected = append(rejected, op(int(i%8), Unavailable, 5, i*200, i*200+1))
	}
	runCases(t, []historyCase{
		// Had U been admitted inside the [0, 5 s] it was recorded with, A could not be.
		{"unknown did not happen within its interval", 1, W,
			[]Op{op(0, Unknown, 1, 0, 5_000), adm(1, 1, 1_000, 2_000)}, false, false},
		{"unknown that could never have been admitted", 1, W,
			[]Op{unk(0, 2, 0), at(1, 1, 1_000), at(2, 1, 11_000)}, false, false},
		{"unknown squeezed between saturated windows", 1, W,
			[]Op{at(0, 1, 0), unk(1, 1, 1_000), at(2, 1, 10_000), at(3, 1, 20_000), at(4, 1, 30_000)}, false, false},
		{"L admissions and one unknown", 3, W,
			[]Op{at(0, 1, 0), at(1, 1, 1_000), at(2, 1, 2_000), unk(3, 1, 3_000)}, false, false},
		{"unknowns do not hide a violation", 1, W,
			[]Op{unk(0, 1, 0), at(1, 1, 1_000), unk(2, 1, 1_500), at(3, 1, 2_000)}, true, true},
		{"rejected and unavailable in a full window", 1, W,
			append([]Op{at(0, 1, 0)}, rejected...), false, false},
		{"only rejected and unavailable", 1, W, rejected, false, false},
		{"rejections do not hide a violation", 1, W,
			append([]Op{at(0, 1, 0), at(1, 1, 9_000)}, rejected...), true, true},
	})
}

func TestMalformedAndUnchecked(t *testing.T) {
	ops := []Op{
		{Key: "a", Hits: 0, Outcome: Admitted, Call: 1, Return: 2},
		{Key: "a", Hits: 1, Outcome: Admitted, Call: 3, Return: 2},
		{Key: "a", Hits: 1, Call: 3, Return: 4},
		{Key: "a", Hits: 1, Outcome: Unknown, Call: 5, Return: 0}, // fine: Return ignored
		{Key: "free", Hits: 1000, Outcome: Admitted, Call: 1, Return: 2},
	}
	lim := func(k string) Limits {
		if k == "free" {
			return Limits{}
		}
		return Limits{Limit: 1, Window: time.Second}
	}
	r := Check(ops, lim, time.Second)
	if len(r.Violations) != 3 {
		t.Fatalf("want 3 malformed violations, got %v", r.Err())
	}
	for _, v := range r.Violations {
		if v.Rule != RuleMalformed {
			t.Errorf("want %s, got %v", RuleMalformed, v)
		}
	}
	if len(r.Unchecked) != 1 || r.Unchecked[0] != "free" || r.Keys != 2 || r.Ops != 5 || r.Admitted != 3 || r.Unknown != 1 {
		t.Errorf("report %v", r)
	}
}

func TestReportShape(t *testing.T) {
	ops := []Op{at(0, 1, 0), at(1, 1, 9_000), at(2, 1, 50_000)}
	ops = append(ops, Op{Key: "other", Hits: 1, Outcome: Rejected, Call: t0, Return: t0})
	r := Check(ops, limitsOf(1, 10*time.Second), time.Second)
	if r.Keys != 2 || r.Ops != 4 || r.Admitted != 3 || r.Rejected != 1 || len(r.TimedOut) != 0 {
		t.Errorf("report %v", r)
	}
	rules := map[string]int{}
	for _, v := range r.Violations {
		rules[v.Rule]++
		if v.Key != "k" {
			t.Errorf("violation on key %q", v.Key)
		}
	}
	if rules[RuleWindow] != 1 || rules[RuleLinearizable] != 1 || len(r.Violations) != 2 {
		t.Fatalf("want one violation per rule, got %v", r.Err())
	}
	err := r.Err()
	if err == nil || !strings.Contains(err.Error(), "client 1") {
		t.Errorf("error does not name the ops: %v", err)
	}
	t.Log(err)
}
