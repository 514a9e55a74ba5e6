package peer

import (
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/ring"
)

// TestFingerprintPlacementOnly checks that the gossiped fingerprint, which
// members must share, covers placement and not the policy table.
func TestFingerprintPlacementOnly(t *testing.T) {
	a := Config{Policies: map[string]PolicyConfig{"api": {Limit: 10, Window: time.Second}}}.withDefaults()
	b := Config{Policies: map[string]PolicyConfig{"api": {Limit: 99, Window: time.Hour}}}.withDefaults()
	if a.fingerprint() != b.fingerprint() {
		t.Error("fingerprint depends on the policy table")
	}
	c := Config{Ring: ring.Config{PartitionCount: 97}}.withDefaults()
	if c.fingerprint() == a.fingerprint() {
		t.Error("fingerprint ignores the partition count")
	}
}
