package wire

import (
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
	"time"

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
		b = AppendItem(b, it)
	}
	got, err := DecodeItems(nil, b)
	if err != nil {
		t.Fatalf("DecodeItems: %v", err)
	}
	for i, it := range items {
		want := Item{Key: shard.Key{Tenant: it.Key.Tenant, Subject: it.Key.Subject, Policy: it.Key.Policy}, Hits: it.Hits, Op: it.Op, Policies: it.Policies}
		if !reflect.DeepEqual(got[i], want) {
			t.Errorf("item %d: got %+v, want %+v", i, got[i], want)
		}
	}
	for n := range len(b) {
		if _, err := DecodeItems(nil, b[:n]); err == nil {
			t.Errorf("DecodeItems of the first %d of %d bytes succeeded", n, len(b))
		}
	}

	decs := []Decision{
		{Status: peerpb.Status_STATUS_OK, Allowed: true, Limit: 100, Remaining: 99, ResetAfterNs: int64(time.Second),
			Owner: "n1", RingVersion: 7, MembersHash: 1<<64 - 1, Reason: peerpb.Reason_REASON_ADMITTED, DecidedAtNs: 1_700_000_000_000_000_000},
		{Status: peerpb.Status_STATUS_NOT_OWNER, Owner: "n2", HolderEpoch: 9, RingVersion: 3},
		{Status: peerpb.Status_STATUS_OK, Owner: "n1", RefusedBy: "b", RetryAfterNs: -1, Limits: []Limit{
			{Policy: "a", Allowed: true, Limit: 5, Remaining: 4, ResetAfter: time.Minute},
			{Policy: "b", Limit: 1, RetryAfter: time.Second}}},
		{Status: peerpb.Status_STATUS_UNAVAILABLE, Err: "peer: limiter unavailable", Owner: "n1"},
	}
	b = binary.AppendUvarint(nil, uint64(len(decs)))
	for i := range decs {
		b = AppendDecision(b, &decs[i])
	}
	out := make([]Decision, len(decs))
	if err := DecodeDecisions(b, len(decs), "n1", out); err != nil {
		t.Fatalf("DecodeDecisions: %v", err)
	}
	if !reflect.DeepEqual(out, decs) {
		t.Errorf("decisions: got %+v, want %+v", out, decs)
	}
	if err := DecodeDecisions(b, len(decs)+1, "n1", out); err == nil {
		t.Error("DecodeDecisions accepted a count that differs from the batch's")
	}
	for n := range len(b) {
		if err := DecodeDecisions(b[:n], len(decs), "n1", make([]Decision, len(decs))); err == nil {
			t.Errorf("DecodeDecisions of the first %d of %d bytes succeeded", n, len(b))
		}
	}
}

// TestReaderBounds: a count larger than MaxBatch, or than what is left
// at its entries' least size, a string longer than what is left and an
// overlong varint are malformed; the first error sticks.
func TestReaderBounds(t *testing.T) {
	for name, tc := range map[string]struct {
		b    []byte
		read func(r *Reader)
	}{
		"count over MaxBatch": {binary.AppendUvarint(nil, MaxBatch+1), func(r *Reader) { r.Count(MaxBatch, 0) }},
		"count over size":     {[]byte{3, 0, 0}, func(r *Reader) { r.Count(MaxBatch, 1) }},
		"string over size":    {[]byte{5, 'a'}, func(r *Reader) { _ = r.Str() }},
		"overlong varint":     {[]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1}, func(r *Reader) { r.Uvarint() }},
		"bool past the end":   {nil, func(r *Reader) { r.Bool() }},
	} {
		r := NewReader(tc.b)
		tc.read(&r)
		if !errors.Is(r.Err(), ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, r.Err())
		}
		if r.Uvarint() != 0 || r.Str() != "" || !errors.Is(r.End(), ErrMalformed) {
			t.Errorf("%s: reads after the error returned values", name)
		}
	}
	r := NewReader(AppendString(AppendBool(binary.AppendVarint(nil, -3), true), "ok"))
	if v, ok, s := r.Varint(), r.Bool(), r.Str(); v != -3 || !ok || s != "ok" || r.End() != nil {
		t.Errorf("read %d %v %q, end %v", v, ok, s, r.End())
	}
}
