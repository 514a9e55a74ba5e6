package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"
	"unsafe"

	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// ErrMalformed is what every decoder returns, wrapped, for a batch that
// does not follow its layout.
var ErrMalformed = errors.New("peer: malformed packed batch")

// MaxBatch is the most entries a packed batch may count; more is
// malformed.
const MaxBatch = 4096

// Item is one decoded request of a batch.
type Item struct {
	Key      shard.Key
	Hits     int64
	Op       peerpb.Op
	Policies []string
}

// Limit is one policy's part of a multi-policy decision.
type Limit struct {
	Policy                 string
	Allowed                bool
	Limit, Remaining       int64
	RetryAfter, ResetAfter time.Duration
}

// Decision is one answer of a batch, the packed form of peerpb.Decision.
type Decision struct {
	Status       peerpb.Status
	Allowed      bool
	Limit        int64
	Remaining    int64
	RetryAfterNs int64
	ResetAfterNs int64
	Owner        string
	RingVersion  uint64
	MembersHash  uint64
	Reason       peerpb.Reason
	Err          string
	HolderEpoch  uint64
	DecidedAtNs  int64
	RefusedBy    string
	Limits       []Limit
}

// AppendString appends s as a uvarint length and its bytes.
func AppendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// AppendBool appends v as one byte.
func AppendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

// AppendItem appends one request of a batch.
func AppendItem(b []byte, it *peerpb.CheckItem) []byte {
	k := it.GetKey()
	b = AppendString(b, k.GetTenant())
	b = AppendString(b, k.GetSubject())
	b = AppendString(b, k.GetPolicy())
	b = binary.AppendVarint(b, it.GetHits())
	b = binary.AppendUvarint(b, uint64(it.GetOp()))
	b = binary.AppendUvarint(b, uint64(len(it.GetPolicies())))
	for _, p := range it.GetPolicies() {
		b = AppendString(b, p)
	}
	return b
}

// AppendDecision appends one answer of a batch.
func AppendDecision(b []byte, d *Decision) []byte {
	b = binary.AppendUvarint(b, uint64(d.Status))
	b = AppendBool(b, d.Allowed)
	b = binary.AppendVarint(b, d.Limit)
	b = binary.AppendVarint(b, d.Remaining)
	b = binary.AppendVarint(b, d.RetryAfterNs)
	b = binary.AppendVarint(b, d.ResetAfterNs)
	b = AppendString(b, d.Owner)
	b = binary.AppendUvarint(b, d.RingVersion)
	b = binary.AppendUvarint(b, d.MembersHash)
	b = binary.AppendUvarint(b, uint64(d.Reason))
	b = AppendString(b, d.Err)
	b = binary.AppendUvarint(b, d.HolderEpoch)
	b = binary.AppendVarint(b, d.DecidedAtNs)
	b = AppendString(b, d.RefusedBy)
	b = binary.AppendUvarint(b, uint64(len(d.Limits)))
	for _, l := range d.Limits {
		b = AppendString(b, l.Policy)
		b = AppendBool(b, l.Allowed)
		b = binary.AppendVarint(b, l.Limit)
		b = binary.AppendVarint(b, l.Remaining)
		b = binary.AppendVarint(b, int64(l.RetryAfter))
		b = binary.AppendVarint(b, int64(l.ResetAfter))
	}
	return b
}

// Reader decodes a packed batch. Its strings are substrings of the batch
// (see NewReader); the first error sticks.
type Reader struct {
	s   string
	off int
	err error
}

// NewReader reads b without copying it: b must not change while the
// strings read from it are in use (it is a received message's own bytes
// field, which nothing writes afterwards).
func NewReader(b []byte) Reader {
	return Reader{s: unsafe.String(unsafe.SliceData(b), len(b))}
}

// Uvarint reads an unsigned integer.
func (r *Reader) Uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	var v uint64
	for shift := uint(0); ; shift += 7 {
		if r.off >= len(r.s) || shift > 63 {
			r.err = ErrMalformed
			return 0
		}
		c := r.s[r.off]
		r.off++
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v
		}
	}
}

// Varint reads a signed (zigzag) integer.
func (r *Reader) Varint() int64 {
	u := r.Uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

// Bool reads a boolean.
func (r *Reader) Bool() bool {
	if r.err != nil {
		return false
	}
	if r.off >= len(r.s) {
		r.err = ErrMalformed
		return false
	}
	c := r.s[r.off]
	r.off++
	return c != 0
}

// Str reads a string: a substring of the batch.
func (r *Reader) Str() string {
	n := r.Uvarint()
	if r.err != nil {
		return ""
	}
	if n > uint64(len(r.s)-r.off) {
		r.err = ErrMalformed
		return ""
	}
	s := r.s[r.off : r.off+int(n)]
	r.off += int(n)
	return s
}

// Count reads an entry count of at most limit, each entry taking at least
// min bytes of what is left.
func (r *Reader) Count(limit, min int) int {
	n := r.Uvarint()
	if r.err == nil && (n > uint64(limit) || n*uint64(min) > uint64(len(r.s)-r.off)) {
		r.err = ErrMalformed
	}
	if r.err != nil {
		return 0
	}
	return int(n)
}

// Fail marks the batch malformed (a value out of its range).
func (r *Reader) Fail() {
	if r.err == nil {
		r.err = ErrMalformed
	}
}

// Err is the first error, if any.
func (r *Reader) Err() error { return r.err }

// Offset is how many bytes were read.
func (r *Reader) Offset() int { return r.off }

// Size is the batch's length.
func (r *Reader) Size() int { return len(r.s) }

// End checks that the whole batch was read and returns the first error.
func (r *Reader) End() error {
	if r.err == nil && r.off != len(r.s) {
		r.err = ErrMalformed
	}
	return r.err
}

// DecodeItems decodes a packed request batch into dst's memory.
func DecodeItems(dst []Item, b []byte) ([]Item, error) {
	r := NewReader(b)
	n := r.Count(MaxBatch, 6)
	if r.err != nil {
		return nil, fmt.Errorf("%w: item count", ErrMalformed)
	}
	items := slices.Grow(dst[:0], n)[:n]
	for i := range items {
		it := &items[i]
		*it = Item{}
		it.Key = shard.Key{Tenant: r.Str(), Subject: r.Str(), Policy: r.Str()}
		it.Hits = r.Varint()
		it.Op = peerpb.Op(r.Uvarint())
		if np := r.Count(MaxBatch, 1); np > 0 {
			it.Policies = make([]string, np)
			for j := range it.Policies {
				it.Policies[j] = r.Str()
			}
		}
	}
	if err := r.End(); err != nil {
		return nil, fmt.Errorf("%w at byte %d", err, r.off)
	}
	return items, nil
}

// DecodeDecisions decodes a packed answer of want decisions into out.
// from, the receiver's name, is the usual owner: it is reused rather
// than allocated per decision.
func DecodeDecisions(b []byte, want int, from string, out []Decision) error {
	r := NewReader(b)
	n := r.Count(MaxBatch, 16)
	if r.err == nil && n != want {
		return fmt.Errorf("peer: %s answered %d decisions for %d requests", from, n, want)
	}
	intern := func(s string) string {
		if s == from {
			return from
		}
		return Clone(s)
	}
	for i := 0; i < n && r.err == nil; i++ {
		d := &out[i]
		d.Status = peerpb.Status(r.Uvarint())
		d.Allowed = r.Bool()
		d.Limit = r.Varint()
		d.Remaining = r.Varint()
		d.RetryAfterNs = r.Varint()
		d.ResetAfterNs = r.Varint()
		d.Owner = intern(r.Str())
		d.RingVersion = r.Uvarint()
		d.MembersHash = r.Uvarint()
		d.Reason = peerpb.Reason(r.Uvarint())
		d.Err = Clone(r.Str())
		d.HolderEpoch = r.Uvarint()
		d.DecidedAtNs = r.Varint()
		d.RefusedBy = Clone(r.Str())
		d.Limits = nil
		if nl := r.Count(MaxBatch, 6); nl > 0 {
			d.Limits = make([]Limit, nl)
			for j := range d.Limits {
				d.Limits[j] = Limit{Policy: Clone(r.Str()), Allowed: r.Bool(), Limit: r.Varint(), Remaining: r.Varint(),
					RetryAfter: time.Duration(r.Varint()), ResetAfter: time.Duration(r.Varint())}
			}
		}
	}
	if err := r.End(); err != nil {
		return fmt.Errorf("%w: from %s at byte %d", err, from, r.off)
	}
	return nil
}

// DecodeOpResults decodes a packed replication answer of want results
// into dst's memory.
func DecodeOpResults(dst []peerpb.OpResult, b []byte, want int, from string) ([]peerpb.OpResult, error) {
	r := NewReader(b)
	n := r.Count(MaxBatch, 4)
	if r.err == nil && n != want {
		return nil, fmt.Errorf("peer: %s answered %d results for %d operations", from, n, want)
	}
	out := slices.Grow(dst[:0], n)[:n]
	for i := range out {
		o := &out[i]
		o.Reset()
		o.Status = peerpb.OpStatus(r.Uvarint())
		o.Holder = Clone(r.Str())
		o.Epoch = r.Uvarint()
		o.Accepted = uint32(r.Uvarint())
	}
	if err := r.End(); err != nil {
		return nil, fmt.Errorf("%w: from %s at byte %d", err, from, r.off)
	}
	return out, nil
}

// Clone copies s out of the batch it aliases (nothing for "").
func Clone(s string) string {
	if s == "" {
		return ""
	}
	return string([]byte(s))
}

// DecisionFromPB converts a nested wire decision.
func DecisionFromPB(d *peerpb.Decision) Decision {
	out := Decision{
		Status: d.GetStatus(), Allowed: d.GetAllowed(), Limit: d.GetLimit(), Remaining: d.GetRemaining(),
		RetryAfterNs: d.GetRetryAfterNs(), ResetAfterNs: d.GetResetAfterNs(), Owner: d.GetOwner(),
		RingVersion: d.GetRingVersion(), MembersHash: d.GetMembersHash(), Reason: d.GetReason(), Err: d.GetError(),
		HolderEpoch: d.GetHolderEpoch(), DecidedAtNs: d.GetDecidedAtUnixNs(), RefusedBy: d.GetRefusedBy(),
	}
	for _, l := range d.GetLimits() {
		out.Limits = append(out.Limits, Limit{Policy: l.GetPolicy(), Allowed: l.GetAllowed(), Limit: l.GetLimit(), Remaining: l.GetRemaining(),
			RetryAfter: time.Duration(l.GetRetryAfterNs()), ResetAfter: time.Duration(l.GetResetAfterNs())})
	}
	return out
}

// ToPB converts a decision to its nested wire form (unary Check).
func (d *Decision) ToPB() *peerpb.Decision {
	out := &peerpb.Decision{
		Status: d.Status, Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining,
		RetryAfterNs: d.RetryAfterNs, ResetAfterNs: d.ResetAfterNs, Owner: d.Owner,
		RingVersion: d.RingVersion, MembersHash: d.MembersHash, Reason: d.Reason, Error: d.Err,
		HolderEpoch: d.HolderEpoch, DecidedAtUnixNs: d.DecidedAtNs, RefusedBy: d.RefusedBy,
	}
	for _, l := range d.Limits {
		out.Limits = append(out.Limits, &peerpb.PolicyDecision{Policy: l.Policy, Allowed: l.Allowed, Limit: l.Limit, Remaining: l.Remaining,
			RetryAfterNs: int64(l.RetryAfter), ResetAfterNs: int64(l.ResetAfter)})
	}
	return out
}
