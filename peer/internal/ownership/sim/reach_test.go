package sim

import (
	"os"
	"testing"
)

// testReach runs the aimed fault f with every rule kept, each schedule's
// options first changed by tweak (nil: none): nothing over the limit,
// nothing lost, no two members deciding at once, every crashed member
// ended. At least share of the runs must reach the state the fault is
// for (reached), which the mutation catalogue breaks a rule in; what
// names that state in the messages. A share above what the fault gets
// unaimed makes the test fail without its aim. 40 schedules (4 under the
// race detector), or RINGLIMIT_SIM_SEEDS.
func testReach(t *testing.T, f Fault, tweak func(*Options), share float64, what string, reached func(Result) bool) {
	t.Helper()
	n := 40
	if raceOn {
		n = 4
	}
	if os.Getenv("RINGLIMIT_SIM_SEEDS") != "" {
		n = seeds(t)
	}
	got := 0
	for seed := uint64(1); seed <= uint64(n); seed++ {
		o := options(seed)
		if tweak != nil {
			tweak(&o)
		}
		o.Fault, o.NoFault = f, false
		r := run(t, o)
		if r.Failed() || r.Lost > 0 {
			t.Errorf("seed %d:\n%s", seed, r)
		}
		if reached(r) {
			got++
		}
		if testing.Verbose() && seed <= 3 {
			t.Log(r)
		}
	}
	t.Logf("%d schedules, %d with %s", n, got, what)
	if float64(got) < share*float64(n) {
		t.Errorf("%d of %d schedules with %s, want at least %.0f%%: the fault no longer reaches what it is for", got, n, what, 100*share)
	}
}
