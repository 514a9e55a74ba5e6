package sim

import "testing"

// TestKeepAliveCut runs FaultKeepAliveCut with the rules kept (a cut-off
// leader grants no keep-alive it cannot confirm, nor one a voter carried
// when they are not a quorum), of three voters and of five voters of six
// members: nothing over the limit, nothing lost. Most runs must reach the
// state the fault is for, the holder's keep-alive reaching the cut-off
// leader, still leading, a fifth of a Liveness or more into the cut; the
// mutation catalogue breaks the rules on it.
func TestKeepAliveCut(t *testing.T) {
	for _, c := range []struct {
		name            string
		voters, members int
	}{{"voters=3", 3, 5}, {"voters=5", 5, 6}} {
		t.Run(c.name, func(t *testing.T) {
			testReach(t, FaultKeepAliveCut, func(o *Options) { o.Voters, o.Members = c.voters, c.members },
				"a keep-alive reaching the cut-off leader, still leading, a fifth of a Liveness into the cut", func(r Result) bool { return r.KeptAliveCut })
		})
	}
}
