package sim

import (
	"os"
	"testing"
)

// TestEndingRace runs FaultEndingRace with the rule kept (no keep-alive
// granted while the member's End is pending): nothing over the limit,
// nothing lost, no two members deciding at once. Most runs must reach
// the state the fault is for, the leader taking and answering the
// holder's keep-alive while its End is pending and the holder applying
// the End after the answer and after its backup; the mutation catalogue
// breaks the rule on it. 40 schedules (4 under the race detector), or
// RINGLIMIT_SIM_SEEDS.
func TestEndingRace(t *testing.T) {
	n := 40
	if raceOn {
		n = 4
	}
	if os.Getenv("RINGLIMIT_SIM_SEEDS") != "" {
		n = seeds(t)
	}
	reached := 0
	for seed := uint64(1); seed <= uint64(n); seed++ {
		o := options(seed)
		o.Fault, o.NoFault = FaultEndingRace, false
		r := run(t, o)
		if r.Failed() || r.Lost > 0 {
			t.Errorf("seed %d:\n%s", seed, r)
		}
		if r.EndingRace {
			reached++
		}
		if testing.Verbose() && seed <= 3 {
			t.Log(r)
		}
	}
	t.Logf("%d schedules, %d with a keep-alive answered while its End was pending", n, reached)
	if reached < n/2 {
		t.Errorf("%d of %d schedules had a keep-alive answered while its End was pending, want at least half: the fault no longer reaches what it is for", reached, n)
	}
}
