package sim

import (
	"os"
	"testing"
)

// TestKeepAliveCut runs FaultKeepAliveCut with the rule kept (a cut-off
// leader grants no keep-alive it cannot confirm): nothing over the limit,
// nothing lost. Most runs must reach the state the fault is for, the
// holder's keep-alive reaching the cut-off leader once another leads; the
// mutation catalogue breaks the rule on it. 40 schedules (4 under the
// race detector), or RINGLIMIT_SIM_SEEDS.
func TestKeepAliveCut(t *testing.T) {
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
		o.Fault, o.NoFault = FaultKeepAliveCut, false
		r := run(t, o)
		if r.Failed() || r.Lost > 0 {
			t.Errorf("seed %d:\n%s", seed, r)
		}
		if r.KeptAliveCut {
			reached++
		}
		if testing.Verbose() && seed <= 3 {
			t.Log(r)
		}
	}
	t.Logf("%d schedules, %d with a keep-alive to the cut-off leader once another led", n, reached)
	if reached < n/2 {
		t.Errorf("%d of %d schedules had a keep-alive reach the cut-off leader once another led, want at least half: the fault no longer reaches what it is for", reached, n)
	}
}
