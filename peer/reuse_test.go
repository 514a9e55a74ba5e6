package peer

import (
	"context"
	"encoding/binary"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/wire"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// TestPackedCodecsReuseMemory checks that the packed codecs of the
// forward and replication pipes work in memory reused from batch to batch:
// once warm they allocate nothing, and what they produce in reused memory
// equals what they produce in fresh memory.
func TestPackedCodecsReuseMemory(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	now := time.Unix(1_700_000_000, 0)
	batch := make([]*replItem, 40) // above 32: packAdmits indexes operations with a map
	for i := range batch {
		batch[i] = &replItem{kind: peerpb.PartitionOp_KIND_ADMIT, part: uint32(i % 7), epoch: 3, at: now.Add(-time.Duration(i) * time.Millisecond),
			run: shard.Run{Count: 1}, key: Key{Tenant: "t", Subject: fmt.Sprintf("user-%d", i), Policy: "p"}, alg: shard.SlidingLog}
	}
	small := batch[:9]

	var sc packScratch
	for _, b := range [][]*replItem{batch, small} {
		wantB, wantOps, wantOpOf := packAdmits(new(packScratch), b, now)
		gotB, gotOps, gotOpOf := packAdmits(&sc, b, now)
		if !reflect.DeepEqual(gotB, wantB) || !reflect.DeepEqual(gotOps, wantOps) || !reflect.DeepEqual(gotOpOf, wantOpOf) {
			t.Fatalf("packAdmits of %d items in reused memory differs from fresh memory", len(b))
		}
	}
	if a := testing.AllocsPerRun(100, func() { packAdmits(&sc, small, now) }); a != 0 {
		t.Errorf("packAdmits of %d items in reused memory allocates %.0f times, want 0", len(small), a)
	}

	// Replication answers: decoded into the previous answer's memory.
	appendResult := func(b []byte, st peerpb.OpStatus, holder string) []byte {
		b = binary.AppendUvarint(b, uint64(st))
		b = wire.AppendString(b, holder)
		b = binary.AppendUvarint(b, 4)
		return binary.AppendUvarint(b, 1)
	}
	results := binary.AppendUvarint(nil, 2)
	results = appendResult(results, peerpb.OpStatus_OP_STATUS_OK, "")
	results = appendResult(results, peerpb.OpStatus_OP_STATUS_STALE, "n2")
	var rs resultScratch
	c := &peerLink{name: "n1"}
	resp := &peerpb.ReplicateResponse{ResultsPacked: results}
	for range 2 {
		got, err := c.replResults(resp, 2, &rs)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[0].Status != peerpb.OpStatus_OP_STATUS_OK || got[0].Holder != "" ||
			got[1].Status != peerpb.OpStatus_OP_STATUS_STALE || got[1].Holder != "n2" || got[1].Epoch != 4 {
			t.Fatalf("replResults = %v", got)
		}
	}
	okOnly := appendResult(binary.AppendUvarint(nil, 1), peerpb.OpStatus_OP_STATUS_OK, "")
	resp = &peerpb.ReplicateResponse{ResultsPacked: okOnly}
	if a := testing.AllocsPerRun(100, func() {
		if _, err := c.replResults(resp, 1, &rs); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("replResults in reused memory allocates %.0f times, want 0", a)
	}

	// Forwarded items: decoded into the previous batch's memory.
	items := binary.AppendUvarint(nil, 3)
	for i := range 3 {
		items = wire.AppendItem(items, &peerpb.CheckItem{Key: &peerpb.Key{Tenant: "t", Subject: fmt.Sprint("s", i), Policy: "p"}, Hits: 1})
	}
	dst, err := wire.DecodeItems(nil, items)
	if err != nil {
		t.Fatal(err)
	}
	dst[0].Policies = []string{"left over"}
	if a := testing.AllocsPerRun(100, func() {
		if dst, err = wire.DecodeItems(dst, items); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("decodeItems in reused memory allocates %.0f times, want 0", a)
	}
	if dst[0].Policies != nil || dst[2].Key.Subject != "s2" {
		t.Errorf("decodeItems in reused memory kept the last batch's fields: %+v", dst)
	}
}

// TestPipeMessageOutlivesAnswer checks the rule that lets a pipe's
// messages be pooled: the answer (or the pipe's failure) may come while
// the sender is still encoding the message, so a message is pooled, and
// its memory cleared, only once both are done with it.
func TestPipeMessageOutlivesAnswer(t *testing.T) {
	c := &peerLink{name: "n1"}
	f := getFwdSend(c)
	k := &call{}
	f.batch = append(f.batch, k)
	f.req.ItemsPacked = []byte{1, 2, 3}
	f.refs.Store(2) // sent: the sender and the answer
	f.release()     // the answer came first
	if len(f.batch) != 1 || f.batch[0] != k || len(f.req.ItemsPacked) != 3 || f.c != c {
		t.Fatal("a forward batch was cleared while its sender still had it")
	}
	f.release() // the sender is done
	if len(f.batch) != 0 || f.req.ItemsPacked != nil || f.c != nil {
		t.Fatal("a forward batch was not cleared once both were done with it")
	}

	rs := getReplSend(c)
	it := &replItem{}
	rs.batch = append(rs.batch, it)
	rs.packed.AdmitsPacked = []byte{1}
	rs.req = &rs.packed
	rs.refs.Store(2)
	rs.release()
	if len(rs.batch) != 1 || rs.req == nil || len(rs.packed.AdmitsPacked) != 1 {
		t.Fatal("a replication message was cleared while its sender still had it")
	}
	rs.release()
	if len(rs.batch) != 0 || rs.req != nil || rs.packed.AdmitsPacked != nil {
		t.Fatal("a replication message was not cleared once both were done with it")
	}
}

// TestCheckInReusedMemory decides batches as a CheckStream worker does, in
// one scratch: the decisions equal those of a fresh Check, and once warm
// a batch of refusals allocates nothing.
func TestCheckInReusedMemory(t *testing.T) {
	c := startCluster(t, 1, Config{Policies: map[string]PolicyConfig{"p": {Limit: 2, Window: time.Hour, Replication: ReplicateOff}}})
	s := &limiterService{n: c.nodes[0]}
	items := binary.AppendUvarint(nil, 4)
	for i := range 4 {
		items = wire.AppendItem(items, &peerpb.CheckItem{Key: &peerpb.Key{Tenant: "t", Subject: fmt.Sprint("s", i%2), Policy: "p"}, Hits: 1})
	}
	req := &peerpb.CheckRequest{Sender: "x", ItemsPacked: items}
	ctx := context.Background()
	var sc checkScratch
	decode := func(resp *peerpb.CheckResponse) []wire.Decision {
		t.Helper()
		out := make([]wire.Decision, 4)
		if err := wire.DecodeDecisions(resp.GetDecisionsPacked(), 4, "n0", out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	for round := range 3 {
		resp, err := s.check(ctx, req, &sc)
		if err != nil {
			t.Fatal(err)
		}
		got := decode(resp)
		sc.reset()
		// Limit 2 per key, two of the four items per key: the first round
		// admits all four, later rounds refuse all.
		for i, d := range got {
			if d.Status != peerpb.Status_STATUS_OK || d.Allowed != (round == 0) {
				t.Fatalf("round %d item %d: %+v", round, i, d)
			}
		}
	}
	if raceEnabled {
		return // the race detector allocates
	}
	if a := testing.AllocsPerRun(100, func() {
		if _, err := s.check(ctx, req, &sc); err != nil {
			t.Fatal(err)
		}
		sc.reset()
	}); a != 0 {
		t.Errorf("a batch of 4 refusals in reused memory allocates %.0f times, want 0", a)
	}
}
