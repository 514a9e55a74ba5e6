package durable

import (
	"encoding/binary"
	"hash/crc32"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// The decision path logs each admission of a policy kept on disk: one
// KIND_REPLACE peerpb.PartitionOp with the key's state. Built as messages
// and marshalled, that cost an allocation per run of the state, per key
// and per record; appendReplace writes the same bytes (proto.Marshal's,
// fields in number order, zero scalars left out; TestAppendReplace
// compares them) straight into the log's buffer, from a shard.KeyState
// the caller reuses (shard.Store.ExportInto), and allocates nothing.

// Field numbers of peerpb.PartitionOp, KeyState, Key and Run.
const (
	fOpKind, fOpPartition, fOpEpoch, fOpKeys                  = 1, 2, 3, 4
	fKSKey, fKSAlgorithm, fKSRuns, fKSReservations, fKSGrants = 1, 2, 3, 4, 5
	fKeyTenant, fKeySubject, fKeyPolicy                       = 1, 2, 3
	fRunAge, fRunCount, fRunID                                = 1, 2, 3
)

// LogKeys appends a KIND_REPLACE operation for partition part at epoch,
// holding keys (ages relative to wall), and returns its index, like Log
// with the operation a copy would send, without allocating.
func (p *Parts) LogKeys(wall int64, part uint32, epoch uint64, keys []shard.KeyState) uint64 {
	return p.wal.appendWith(func(b []byte) []byte {
		b = binary.LittleEndian.AppendUint64(b, uint64(wall))
		return appendReplace(b, part, epoch, keys)
	})
}

// appendWith appends a record whose payload enc appends to its argument,
// straight into the buffer (no copy), and returns its index.
func (w *WAL) appendWith(enc func([]byte) []byte) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	off := len(w.buf)
	w.buf = append(w.buf, make([]byte, recHeader)...) // no allocation: a constant size
	w.buf = enc(w.buf)
	rec := w.buf[off+recHeader:]
	binary.LittleEndian.PutUint32(w.buf[off:], uint32(len(rec)))
	binary.LittleEndian.PutUint32(w.buf[off+4:], ^uint32(len(rec)))
	binary.LittleEndian.PutUint32(w.buf[off+8:], crc32.Checksum(rec, crcTable))
	i := w.next
	w.next++
	return i
}

// appendReplace appends the KIND_REPLACE peerpb.PartitionOp of keys.
func appendReplace(b []byte, part uint32, epoch uint64, keys []shard.KeyState) []byte {
	b = appendVarintField(b, fOpKind, uint64(peerpb.PartitionOp_KIND_REPLACE))
	b = appendVarintField(b, fOpPartition, uint64(part))
	b = appendVarintField(b, fOpEpoch, epoch)
	for i := range keys {
		ks := &keys[i]
		b = protowire.AppendTag(b, fOpKeys, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(keyStateSize(ks)))
		b = appendKeyState(b, ks)
	}
	return b
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func varintFieldSize(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
}

func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func stringFieldSize(s string) int {
	if s == "" {
		return 0
	}
	return 1 + protowire.SizeBytes(len(s))
}

func keySize(k *shard.Key) int {
	return stringFieldSize(k.Tenant) + stringFieldSize(k.Subject) + stringFieldSize(k.Policy)
}

func runSize(r *shard.Run) int {
	return varintFieldSize(uint64(r.Age)) + varintFieldSize(uint64(r.Count)) + varintFieldSize(r.ID)
}

func runsSize(rs []shard.Run) int {
	n := 0
	for i := range rs {
		n += 1 + protowire.SizeBytes(runSize(&rs[i]))
	}
	return n
}

func keyStateSize(ks *shard.KeyState) int {
	return 1 + protowire.SizeBytes(keySize(&ks.Key)) +
		varintFieldSize(uint64(int64(int32(ks.Algorithm)))) +
		runsSize(ks.Runs) + runsSize(ks.Reservations) + runsSize(ks.Grants)
}

func appendKeyState(b []byte, ks *shard.KeyState) []byte {
	b = protowire.AppendTag(b, fKSKey, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(keySize(&ks.Key)))
	b = appendStringField(b, fKeyTenant, ks.Key.Tenant)
	b = appendStringField(b, fKeySubject, ks.Key.Subject)
	b = appendStringField(b, fKeyPolicy, ks.Key.Policy)
	b = appendVarintField(b, fKSAlgorithm, uint64(int64(int32(ks.Algorithm))))
	b = appendRuns(b, fKSRuns, ks.Runs)
	b = appendRuns(b, fKSReservations, ks.Reservations)
	return appendRuns(b, fKSGrants, ks.Grants)
}

func appendRuns(b []byte, num protowire.Number, rs []shard.Run) []byte {
	for i := range rs {
		r := &rs[i]
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(runSize(r)))
		b = appendVarintField(b, fRunAge, uint64(r.Age))
		b = appendVarintField(b, fRunCount, uint64(r.Count))
		b = appendVarintField(b, fRunID, r.ID)
	}
	return b
}
