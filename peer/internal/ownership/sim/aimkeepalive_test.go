package sim

import (
	"os"
	"testing"
)

// TestKeepAliveCut runs FaultKeepAliveCut with the rules kept (a cut-off
// leader grants no keep-alive it cannot confirm, nor one a voter carried
// when they are not a quorum), of three voters and of five voters of six
// members: nothing over the limit, nothing lost. Most runs must reach the
// state the fault is for, the holder's keep-alive reaching the cut-off
// leader, still leading, a fifth of a Liveness or more into the cut; the
// mutation catalogue breaks the rules on it. 40 schedules each (4 under
// the race detector), or RINGLIMIT_SIM_SEEDS.
func TestKeepAliveCut(t *testing.T) {
	n := 40
	if raceOn {
		n = 4
	}
	if os.Getenv("RINGLIMIT_SIM_SEEDS") != "" {
		n = seeds(t)
	}
	for _, c := range []struct {
		name            string
		voters, members int
	}{{"voters=3", 3, 5}, {"voters=5", 5, 6}} {
		t.Run(c.name, func(t *testing.T) {
			reached := 0
			for seed := uint64(1); seed <= uint64(n); seed++ {
				o := options(seed)
				o.Fault, o.NoFault = FaultKeepAliveCut, false
				o.Voters, o.Members = c.voters, c.members
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
			t.Logf("%d schedules, %d with a keep-alive to the cut-off leader well into the cut", n, reached)
			if reached < n/2 {
				t.Errorf("%d of %d schedules had a keep-alive reach the cut-off leader, still leading, a fifth of a Liveness into the cut, want at least half: the fault no longer reaches what it is for", reached, n)
			}
		})
	}
}
