package peer

import (
	"encoding/binary"
	"reflect"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// TestBatchCodecRoundTrip packs items and decisions and reads them back
// unchanged; every truncation of a packed batch is rejected, never a panic.
func TestBatchCodecRoundTrip(t *testing.T) {
	items := []*peerpb.CheckItem{
		{Key: &peerpb.Key{Tenant: "t", Subject: "s", Policy: "p"}, Hits: 3, Op: peerpb.Op_OP_CHECK},
		{Key: &peerpb.Key{Tenant: "tenant-2", Subject: "user/42"}, Hits: 0, Op: peerpb.Op_OP_PEEK, Policies: []string{"a", "b"}},
		{Key: &peerpb.Key{}, Hits: -7, Op: peerpb.Op_OP_RESET},
	}
	b := binary.AppendUvarint(nil, uint64(len(items)))
	for _, it := range items {
		b = appendItem(b, it)
	}
	got, err := decodeItems(b)
	if err != nil {
		t.Fatalf("decodeItems: %v", err)
	}
	for i, it := range items {
		want := wireItem{key: Key{Tenant: it.Key.Tenant, Subject: it.Key.Subject, Policy: it.Key.Policy}, hits: it.Hits, op: it.Op, policies: it.Policies}
		if !reflect.DeepEqual(got[i], want) {
			t.Errorf("item %d: got %+v, want %+v", i, got[i], want)
		}
	}
	for n := range len(b) {
		if _, err := decodeItems(b[:n]); err == nil {
			t.Errorf("decodeItems of the first %d of %d bytes succeeded", n, len(b))
		}
	}

	decs := []wireDecision{
		{status: peerpb.Status_STATUS_OK, allowed: true, limit: 100, remaining: 99, resetAfterNs: int64(time.Second),
			owner: "n1", ringVersion: 7, membersHash: 1<<64 - 1, reason: peerpb.Reason_REASON_ADMITTED, decidedAtNs: 1_700_000_000_000_000_000},
		{status: peerpb.Status_STATUS_NOT_OWNER, owner: "n2", holderEpoch: 9, ringVersion: 3},
		{status: peerpb.Status_STATUS_OK, owner: "n1", refusedBy: "b", retryAfterNs: -1, limits: []PolicyDecision{
			{Policy: "a", Allowed: true, Limit: 5, Remaining: 4, ResetAfter: time.Minute},
			{Policy: "b", Limit: 1, RetryAfter: time.Second}}},
		{status: peerpb.Status_STATUS_UNAVAILABLE, err: "peer: limiter unavailable", owner: "n1"},
	}
	b = binary.AppendUvarint(nil, uint64(len(decs)))
	for i := range decs {
		b = appendDecision(b, &decs[i])
	}
	out := make([]wireDecision, len(decs))
	if err := decodeDecisions(b, len(decs), "n1", out); err != nil {
		t.Fatalf("decodeDecisions: %v", err)
	}
	if !reflect.DeepEqual(out, decs) {
		t.Errorf("decisions: got %+v, want %+v", out, decs)
	}
	if err := decodeDecisions(b, len(decs)+1, "n1", out); err == nil {
		t.Error("decodeDecisions accepted a count that differs from the batch's")
	}
	for n := range len(b) {
		if err := decodeDecisions(b[:n], len(decs), "n1", make([]wireDecision, len(decs))); err == nil {
			t.Errorf("decodeDecisions of the first %d of %d bytes succeeded", n, len(b))
		}
	}
}
