package sim

import "testing"

// TestEndingRace runs FaultEndingRace with the rule kept (no keep-alive
// granted while the member's End is pending). Most runs must have the
// leader take and answer the holder's keep-alive while its End is
// pending, and the holder apply the End after the answer and after its
// backup.
func TestEndingRace(t *testing.T) {
	testReach(t, FaultEndingRace, nil, 0.5, "a keep-alive answered while its End was pending", func(r Result) bool { return r.EndingRace })
}
