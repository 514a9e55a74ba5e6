package peer

import (
	"testing"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// TestPartitionMirrors pins what package peer converts by a cast: every
// wire operation is the table's operation of the same value, and every
// Reason is internal/partition's of the same value.
func TestPartitionMirrors(t *testing.T) {
	for v, name := range peerpb.Op_name {
		op := opFromWire(peerpb.Op(v))
		if !op.Valid() || int32(op) != v {
			t.Errorf("wire op %s (%d) is not the table's operation %d", name, v, op)
		}
	}
	for _, v := range []peerpb.Op{-1, 9, 256, 1 << 20} {
		if opFromWire(v).Valid() {
			t.Errorf("wire op %d is read as %v", v, opFromWire(v))
		}
	}
	pairs := []struct {
		peer Reason
		part partition.Reason
	}{
		{ReasonAdmitted, partition.ReasonAdmitted}, {ReasonOverLimit, partition.ReasonOverLimit},
		{ReasonShadow, partition.ReasonShadow}, {ReasonFailedOpen, partition.ReasonFailedOpen},
		{ReasonFallback, partition.ReasonFallback}, {ReasonUnavailable, partition.ReasonUnavailable},
		{ReasonPeek, partition.ReasonPeek}, {ReasonRefunded, partition.ReasonRefunded},
		{ReasonReset, partition.ReasonReset}, {ReasonUnlimited, partition.ReasonUnlimited},
		{ReasonReleased, partition.ReasonReleased}, {ReasonSettled, partition.ReasonSettled},
		{ReasonSpread, partition.ReasonSpread}, {ReasonCapacity, partition.ReasonCapacity},
	}
	if len(pairs) != len(reasonNames)-1 {
		t.Fatalf("%d reasons paired, peer has %d", len(pairs), len(reasonNames)-1)
	}
	for _, p := range pairs {
		if uint8(p.peer) != uint8(p.part) {
			t.Errorf("Reason %v is %d in peer, %d in internal/partition", p.peer, p.peer, p.part)
		}
	}
}
