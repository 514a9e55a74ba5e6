package sim

import "testing"

// TestKeepAliveCut runs FaultKeepAliveCut with the rules kept (a cut-off
// leader grants no keep-alive it cannot confirm, nor one a voter carried
// when they are not a quorum), of three voters and of five voters of six
// members: nothing over the limit, nothing lost. The runs must reach the
// state the fault is for, the holder's keep-alive reaching the cut-off
// leader, still leading, a fifth of a Liveness or more into the cut, in
// at least share of them: between what the cut at the fault's start gets
// and what the aim gets, so that the test fails without the aim. Of 300
// schedules, three voters: 122 unaimed, 227 aimed; five voters: 160 and
// 299. The mutation catalogue breaks the rules on it.
func TestKeepAliveCut(t *testing.T) {
	for _, c := range []struct {
		name            string
		voters, members int
		share           float64
	}{{"voters=3", 3, 5, 0.6}, {"voters=5", 5, 6, 0.8}} {
		t.Run(c.name, func(t *testing.T) {
			testReach(t, FaultKeepAliveCut, func(o *Options) { o.Voters, o.Members = c.voters, c.members }, c.share,
				"a keep-alive reaching the cut-off leader, still leading, a fifth of a Liveness into the cut", func(r Result) bool { return r.KeptAliveCut })
		})
	}
}
