package durable

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// TestAppendReplace: the hand-written encoding of a KIND_REPLACE operation
// is byte for byte proto.Marshal's of the same peerpb message (so Log and
// LogKeys records are one format, read back by the same decoder), for
// random states: every algorithm, empty and long strings, negative and
// extreme ages and counts, lease ids, reservations and grants, several
// keys per operation, and none.
func TestAppendReplace(t *testing.T) {
	rng := rand.New(rand.NewPCG(57, 1))
	str := func() string {
		return string(bytes.Repeat([]byte{'a' + byte(rng.IntN(26))}, []int{0, 1, 5, 200}[rng.IntN(4)]))
	}
	i64 := func() int64 {
		return []int64{0, 1, -1, rng.Int64(), -rng.Int64(), math.MaxInt64, math.MinInt64}[rng.IntN(7)]
	}
	runs := func() []shard.Run {
		var rs []shard.Run
		for range rng.IntN(4) {
			rs = append(rs, shard.Run{Age: time.Duration(i64()), Count: i64(), ID: []uint64{0, 1, rng.Uint64()}[rng.IntN(3)]})
		}
		return rs
	}
	for i := range 2000 {
		var keys []shard.KeyState
		for range rng.IntN(4) {
			keys = append(keys, shard.KeyState{
				Key:       shard.Key{Tenant: str(), Subject: str(), Policy: str()},
				Algorithm: shard.Algorithm(rng.IntN(5)),
				Runs:      runs(), Reservations: runs(), Grants: runs(),
			})
		}
		part, epoch := uint32([]int{0, 1, 4095}[rng.IntN(3)]), []uint64{0, 1, rng.Uint64()}[rng.IntN(3)]
		op := &peerpb.PartitionOp{Kind: peerpb.PartitionOp_KIND_REPLACE, Partition: part, Epoch: epoch}
		for _, ks := range keys {
			op.Keys = append(op.Keys, KeyToWire(ks))
		}
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(op)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendReplace(nil, part, epoch, keys); !bytes.Equal(got, want) {
			t.Fatalf("case %d: %x\nproto.Marshal: %x", i, got, want)
		}
	}
}

// TestLogKeys: records LogKeys appends read back (OpenParts) as the
// operations Log would have written, and LogKeys allocates nothing once
// the log's buffer has grown.
func TestLogKeys(t *testing.T) {
	dir := t.TempDir()
	p, _, err := OpenParts(dir, "c", 0)
	if err != nil {
		t.Fatal(err)
	}
	st := newStore(t)
	k := shard.Key{Tenant: "t", Subject: "s", Policy: "slide"}
	for i := range 2 {
		if _, err := st.Allow(k, policies["slide"], 1, t0.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	now := t0.Add(2 * time.Second)
	var ks shard.KeyState
	if !st.ExportInto(k, now, &ks) {
		t.Fatal("not held")
	}
	keys := []shard.KeyState{ks}
	idx := p.LogKeys(now.UnixNano(), 1, 4, keys)
	if err := p.Sync(idx); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(1000, func() { p.LogKeys(now.UnixNano(), 1, 4, keys) }); n != 0 {
		t.Fatalf("LogKeys allocates %v times per record", n)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// Read back: the last record (the others are the same) is the state.
	var last []byte
	if _, err := OpenWAL(dir, partsPrefix, "c", 0, func(_ uint64, rec []byte) error {
		last = append(last[:0], rec...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	o, err := decodeOp(last)
	if err != nil {
		t.Fatal(err)
	}
	want := &peerpb.PartitionOp{Kind: peerpb.PartitionOp_KIND_REPLACE, Partition: 1, Epoch: 4, Keys: []*peerpb.KeyState{KeyToWire(ks)}}
	if o.Wall != now.UnixNano() || !proto.Equal(o.Op, want) {
		t.Fatalf("read back wall %d %v, want %d %v", o.Wall, o.Op, now.UnixNano(), want)
	}
	if got := binary.LittleEndian.Uint64(last); got != uint64(now.UnixNano()) {
		t.Fatalf("wall %d", got)
	}
	// And restored by a restart, as Log's records are.
	p2, rec, err := OpenParts(dir, "c", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	st2 := newStore(t)
	if n, _, err := rec.Part(1).Restore(st2, policyOf, now); err != nil || n == 0 {
		t.Fatalf("restore: %d keys, %v", n, err)
	}
	if d, err := st2.Peek(k, policies["slide"], 1, now); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("restored key: %+v, %v; want 2 of 3 used (a peek of 1 admitted, 0 left)", d, err)
	}
}
