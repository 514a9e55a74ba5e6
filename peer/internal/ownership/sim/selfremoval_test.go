package sim

import (
	"os"
	"testing"
)

// TestSelfRemoval runs FaultSelfRemoval with the rule kept (a leader that
// applies its own removal steps down): nothing over the limit, nothing
// lost, and the crashed holder's liveness ended within endedWithin. Most
// runs must reach the state the fault is for, a leader applying its own
// removal; the mutation catalogue breaks the rule on it. 40 schedules (4
// under the race detector), or RINGLIMIT_SIM_SEEDS.
func TestSelfRemoval(t *testing.T) {
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
		o.Fault, o.NoFault = FaultSelfRemoval, false
		r := run(t, o)
		if r.Failed() || r.Lost > 0 {
			t.Errorf("seed %d:\n%s", seed, r)
		}
		if r.SelfRemoved {
			reached++
		}
		if testing.Verbose() && seed <= 3 {
			t.Log(r)
		}
	}
	t.Logf("%d schedules, %d with a leader that applied its own removal", n, reached)
	if reached < n/2 {
		t.Errorf("%d of %d schedules had a leader apply its own removal, want at least half: the fault no longer reaches what it is for", reached, n)
	}
}
