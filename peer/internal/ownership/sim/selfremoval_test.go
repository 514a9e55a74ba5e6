package sim

import "testing"

// TestSelfRemoval runs FaultSelfRemoval with the rule kept (a leader that
// applies its own removal steps down): the crashed holder's liveness is
// ended within endedWithin. Most runs must have a leader apply its own
// removal.
func TestSelfRemoval(t *testing.T) {
	testReach(t, FaultSelfRemoval, nil, 0.5, "a leader that applied its own removal", func(r Result) bool { return r.SelfRemoved })
}
