package peer

import (
	"encoding/binary"
	"reflect"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
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
	got, err := decodeItems(nil, b)
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
		if _, err := decodeItems(nil, b[:n]); err == nil {
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

// TestWindowsCodec packs a sender's windows and reads them back; every
// truncation, a zero window, one beyond shard.MaxWindow and trailing
// bytes are rejected. importPolicy takes the longer window, for
// sliding_log and fixed_window only, and only of the same policy.
func TestWindowsCodec(t *testing.T) {
	tab := policy.New(map[string]PolicyConfig{
		"a": {Limit: 5, Window: time.Hour},
		"b": {Limit: 5, Window: time.Second},
	})
	names := func(ns ...string) func(func(string) bool) {
		return func(yield func(string) bool) {
			for _, n := range ns {
				if !yield(n) {
					return
				}
			}
		}
	}
	b := packWindows(tab, names("a", "missing", "b", "a"))
	got, err := decodeWindows(b)
	want := []senderWindow{{"a", time.Hour}, {"b", time.Second}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("decodeWindows = %v, %v; want %v", got, err, want)
	}
	if b := packWindows(tab, names("missing")); b != nil {
		t.Errorf("packWindows of unknown policies = %x, want nil", b)
	}
	for n := 1; n < len(b); n++ {
		if _, err := decodeWindows(b[:n]); err == nil {
			t.Errorf("decodeWindows of the first %d of %d bytes succeeded", n, len(b))
		}
	}
	bad := map[string][]byte{
		"zero window":     binary.AppendUvarint(appendStr([]byte{1}, "a"), 0),
		"beyond maximum":  binary.AppendUvarint(appendStr([]byte{1}, "a"), uint64(shard.MaxWindow)+1),
		"trailing bytes":  append(binary.AppendUvarint(appendStr([]byte{1}, "a"), 5), 0),
		"count too large": binary.AppendUvarint(appendStr([]byte{3}, "a"), 5),
	}
	for name, b := range bad {
		if _, err := decodeWindows(b); err == nil {
			t.Errorf("%s: decodeWindows succeeded", name)
		}
	}

	sw := []senderWindow{{"p", time.Hour}, {"q", 2 * time.Hour}}
	for _, tc := range []struct {
		alg  Algorithm
		own  time.Duration
		want time.Duration
	}{
		{SlidingLog, time.Minute, time.Hour},
		{FixedWindow, time.Minute, time.Hour},
		{SlidingLog, 3 * time.Hour, 3 * time.Hour}, // shorter: keeps its own
		{TokenBucket, time.Minute, time.Minute},    // a rate, not a retention
	} {
		p := policy.New(map[string]PolicyConfig{"p": {Limit: 5, Window: tc.own, Algorithm: tc.alg}}).Lookup("p")
		if got := importPolicy(p, senderTable{windows: sw}).Window; got != tc.want {
			t.Errorf("%v with own window %v: import window %v, want %v", tc.alg, tc.own, got, tc.want)
		}
		// A sender whose table differs and whose windows are unknown:
		// sliding_log and fixed_window keep everything they are sent.
		want := shard.MaxWindow
		if tc.alg == TokenBucket {
			want = tc.own
		}
		if got := importPolicy(p, senderTable{unknown: true}).Window; got != want {
			t.Errorf("%v with own window %v, sender's unknown: import window %v, want %v", tc.alg, tc.own, got, want)
		}
	}
}
