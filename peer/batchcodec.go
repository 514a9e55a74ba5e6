package peer

// The packed batch codec: on CheckStream a batch's items and decisions
// travel as one bytes field each (CheckRequest.items_packed,
// CheckResponse.decisions_packed) instead of one nested message per item.
// Decoding nested messages costs several allocations per item (the item,
// its key, each string); a packed batch is decoded from one string per
// batch, its keys' parts are substrings of it, and decisions are plain
// values. The layout is a count, then per entry its fields in a fixed
// order: unsigned integers as uvarints, signed ones as zigzag varints,
// strings as a uvarint length and the bytes, booleans as one byte.
//
// Item:     tenant, subject, policy, hits, op, policy count, policies...
// Decision: status, allowed, limit, remaining, retry_after_ns,
//           reset_after_ns, owner, ring_version, members_hash, reason,
//           error, holder_epoch, decided_at_unix_ns, refused_by,
//           limit count, limits (policy, allowed, limit, remaining,
//           retry_after_ns, reset_after_ns)...
//
// A malformed batch is rejected as a whole (InvalidArgument): every
// length is checked against what is left, so no input can make the
// decoder allocate more than the batch's own size or index out of range.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/peer/internal/transport"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

var errPacked = errors.New("peer: malformed packed batch")

// wireItem is one decoded request of a batch.
type wireItem struct {
	key      Key
	hits     int64
	op       peerpb.Op
	policies []string
}

// wireDecision is one answer of a batch, the packed form of
// peerpb.Decision.
type wireDecision struct {
	status       peerpb.Status
	allowed      bool
	limit        int64
	remaining    int64
	retryAfterNs int64
	resetAfterNs int64
	owner        string
	ringVersion  uint64
	membersHash  uint64
	reason       peerpb.Reason
	err          string
	holderEpoch  uint64
	decidedAtNs  int64
	refusedBy    string
	limits       []PolicyDecision
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

// appendItem appends one request of a batch.
func appendItem(b []byte, it *peerpb.CheckItem) []byte {
	k := it.GetKey()
	b = appendStr(b, k.GetTenant())
	b = appendStr(b, k.GetSubject())
	b = appendStr(b, k.GetPolicy())
	b = binary.AppendVarint(b, it.GetHits())
	b = binary.AppendUvarint(b, uint64(it.GetOp()))
	b = binary.AppendUvarint(b, uint64(len(it.GetPolicies())))
	for _, p := range it.GetPolicies() {
		b = appendStr(b, p)
	}
	return b
}

// appendDecision appends one answer of a batch.
func appendDecision(b []byte, d *wireDecision) []byte {
	b = binary.AppendUvarint(b, uint64(d.status))
	b = appendBool(b, d.allowed)
	b = binary.AppendVarint(b, d.limit)
	b = binary.AppendVarint(b, d.remaining)
	b = binary.AppendVarint(b, d.retryAfterNs)
	b = binary.AppendVarint(b, d.resetAfterNs)
	b = appendStr(b, d.owner)
	b = binary.AppendUvarint(b, d.ringVersion)
	b = binary.AppendUvarint(b, d.membersHash)
	b = binary.AppendUvarint(b, uint64(d.reason))
	b = appendStr(b, d.err)
	b = binary.AppendUvarint(b, d.holderEpoch)
	b = binary.AppendVarint(b, d.decidedAtNs)
	b = appendStr(b, d.refusedBy)
	b = binary.AppendUvarint(b, uint64(len(d.limits)))
	for _, l := range d.limits {
		b = appendStr(b, l.Policy)
		b = appendBool(b, l.Allowed)
		b = binary.AppendVarint(b, l.Limit)
		b = binary.AppendVarint(b, l.Remaining)
		b = binary.AppendVarint(b, int64(l.RetryAfter))
		b = binary.AppendVarint(b, int64(l.ResetAfter))
	}
	return b
}

// packedReader decodes a packed batch. Strings are substrings of s, the
// batch converted once; the first error sticks.
type packedReader struct {
	s   string
	off int
	err error
}

func (r *packedReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	var v uint64
	for shift := uint(0); ; shift += 7 {
		if r.off >= len(r.s) || shift > 63 {
			r.err = errPacked
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

func (r *packedReader) varint() int64 {
	u := r.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

func (r *packedReader) bool() bool {
	if r.err != nil {
		return false
	}
	if r.off >= len(r.s) {
		r.err = errPacked
		return false
	}
	c := r.s[r.off]
	r.off++
	return c != 0
}

func (r *packedReader) str() string {
	n := r.uvarint()
	if r.err != nil {
		return ""
	}
	if n > uint64(len(r.s)-r.off) {
		r.err = errPacked
		return ""
	}
	s := r.s[r.off : r.off+int(n)]
	r.off += int(n)
	return s
}

// count reads an entry count; each entry takes at least min bytes.
func (r *packedReader) count(limit, min int) int {
	n := r.uvarint()
	if r.err == nil && (n > uint64(limit) || n*uint64(min) > uint64(len(r.s)-r.off)) {
		r.err = errPacked
	}
	if r.err != nil {
		return 0
	}
	return int(n)
}

// decodeItems decodes a packed request batch into dst's memory.
func decodeItems(dst []wireItem, b []byte) ([]wireItem, error) {
	// The keys are substrings of b: a request's bytes are its own (decoding
	// copies them out of the frame) and nothing writes them afterwards.
	r := &packedReader{s: unsafeString(b)}
	n := r.count(maxWireBatch, 6)
	if r.err != nil {
		return nil, fmt.Errorf("%w: item count", errPacked)
	}
	items := slices.Grow(dst[:0], n)[:n]
	for i := range items {
		it := &items[i]
		*it = wireItem{}
		it.key = Key{Tenant: r.str(), Subject: r.str(), Policy: r.str()}
		it.hits = r.varint()
		it.op = peerpb.Op(r.uvarint())
		if np := r.count(maxWireBatch, 1); np > 0 {
			it.policies = make([]string, np)
			for j := range it.policies {
				it.policies[j] = r.str()
			}
		}
	}
	if r.err == nil && r.off != len(r.s) {
		r.err = errPacked
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w at byte %d", r.err, r.off)
	}
	return items, nil
}

// decodeDecisions decodes a packed answer of want decisions into out.
// from, the receiver's name, is the usual owner: it is reused rather
// than allocated per decision.
func decodeDecisions(b []byte, want int, from string, out []wireDecision) error {
	r := &packedReader{s: unsafeString(b)}
	n := r.count(maxWireBatch, 16)
	if r.err == nil && n != want {
		return fmt.Errorf("peer: %s answered %d decisions for %d requests", from, n, want)
	}
	intern := func(s string) string {
		if s == from {
			return from
		}
		return clone(s)
	}
	for i := 0; i < n && r.err == nil; i++ {
		d := &out[i]
		d.status = peerpb.Status(r.uvarint())
		d.allowed = r.bool()
		d.limit = r.varint()
		d.remaining = r.varint()
		d.retryAfterNs = r.varint()
		d.resetAfterNs = r.varint()
		d.owner = intern(r.str())
		d.ringVersion = r.uvarint()
		d.membersHash = r.uvarint()
		d.reason = peerpb.Reason(r.uvarint())
		d.err = clone(r.str())
		d.holderEpoch = r.uvarint()
		d.decidedAtNs = r.varint()
		d.refusedBy = clone(r.str())
		d.limits = nil
		if nl := r.count(maxWireBatch, 6); nl > 0 {
			d.limits = make([]PolicyDecision, nl)
			for j := range d.limits {
				d.limits[j] = PolicyDecision{Policy: clone(r.str()), Allowed: r.bool(), Limit: r.varint(), Remaining: r.varint(),
					RetryAfter: time.Duration(r.varint()), ResetAfter: time.Duration(r.varint())}
			}
		}
	}
	if r.err == nil && r.off != len(r.s) {
		r.err = errPacked
	}
	if r.err != nil {
		return fmt.Errorf("%w: from %s at byte %d", r.err, from, r.off)
	}
	return nil
}

// clone copies s out of the buffer it aliases (nothing for "").
func clone(s string) string {
	if s == "" {
		return ""
	}
	return string([]byte(s))
}

// decisionFromPB converts a nested wire decision.
func decisionFromPB(d *peerpb.Decision) wireDecision {
	out := wireDecision{
		status: d.GetStatus(), allowed: d.GetAllowed(), limit: d.GetLimit(), remaining: d.GetRemaining(),
		retryAfterNs: d.GetRetryAfterNs(), resetAfterNs: d.GetResetAfterNs(), owner: d.GetOwner(),
		ringVersion: d.GetRingVersion(), membersHash: d.GetMembersHash(), reason: d.GetReason(), err: d.GetError(),
		holderEpoch: d.GetHolderEpoch(), decidedAtNs: d.GetDecidedAtUnixNs(), refusedBy: d.GetRefusedBy(),
	}
	for _, l := range d.GetLimits() {
		out.limits = append(out.limits, PolicyDecision{Policy: l.GetPolicy(), Allowed: l.GetAllowed(), Limit: l.GetLimit(), Remaining: l.GetRemaining(),
			RetryAfter: time.Duration(l.GetRetryAfterNs()), ResetAfter: time.Duration(l.GetResetAfterNs())})
	}
	return out
}

// toPB converts a decision to its nested wire form (unary Check).
func (d *wireDecision) toPB() *peerpb.Decision {
	out := &peerpb.Decision{
		Status: d.status, Allowed: d.allowed, Limit: d.limit, Remaining: d.remaining,
		RetryAfterNs: d.retryAfterNs, ResetAfterNs: d.resetAfterNs, Owner: d.owner,
		RingVersion: d.ringVersion, MembersHash: d.membersHash, Reason: d.reason, Error: d.err,
		HolderEpoch: d.holderEpoch, DecidedAtUnixNs: d.decidedAtNs, RefusedBy: d.refusedBy,
	}
	for _, l := range d.limits {
		out.Limits = append(out.Limits, &peerpb.PolicyDecision{Policy: l.Policy, Allowed: l.Allowed, Limit: l.Limit, Remaining: l.Remaining,
			RetryAfterNs: int64(l.RetryAfter), ResetAfterNs: int64(l.ResetAfter)})
	}
	return out
}

// unsafeString views b as a string without copying. b must not change
// while the string is in use: it is a received message's own bytes field.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// Packed admissions (ReplicateRequest.admits_packed): an operation count,
// then per operation its partition, epoch and entry count, then per entry
// tenant, subject, policy, algorithm, age_ns, count. The answer
// (results_packed) is a count, then per operation status,
// holder, epoch, accepted.

// replOp names one operation of a replication request: its partition and
// epoch, which its result applies to.
type replOp struct {
	part  uint32
	epoch uint64
	// keys is how many key states the operation carries; a backup that
	// records them all answers as many accepted. Set once the operations
	// are grouped (a replOp is a map key while they are).
	keys uint32
}

// packScratch is packAdmits's memory, reused by later batches: what it
// returns is valid until then.
type packScratch struct {
	ints []int
	ops  []replOp
	buf  []byte
}

// packAdmits packs batch, all of it KIND_ADMIT, with ages made relative to
// now, into sc. It returns the operations in packed order and, per item,
// its operation's index.
func packAdmits(sc *packScratch, batch []*replItem, now time.Time) (b []byte, ops []replOp, opOf []int) {
	// One slice for the four index slices: opOf (kept by the caller until
	// the answer), then scratch for the counting sort.
	need := 4*len(batch) + 2
	if cap(sc.ints) < need {
		sc.ints = make([]int, need)
	}
	ints := sc.ints[:need]
	clear(ints)
	opOf, ints = ints[:len(batch):len(batch)], ints[len(batch):]
	ops = sc.ops[:0]
	// A batch spans few partitions as a rule: a linear search finds an
	// operation faster than a map costs to build, up to a few dozen.
	var index map[replOp]int
	if len(batch) > 32 {
		index = make(map[replOp]int, len(batch))
	}
	for i, it := range batch {
		o := replOp{part: it.part, epoch: it.epoch}
		j := -1
		if index != nil {
			if k, ok := index[o]; ok {
				j = k
			}
		} else {
			for k := range ops {
				if ops[k] == o {
					j = k
					break
				}
			}
		}
		if j < 0 {
			j = len(ops)
			if index != nil {
				index[o] = j
			}
			ops = append(ops, o)
		}
		opOf[i] = j
	}
	// Items in operation order, by counting sort: start[j] is where
	// operation j's items begin in order.
	start, ints := ints[:len(ops)+1], ints[len(ops)+1:]
	for _, j := range opOf {
		start[j+1]++
	}
	for j := range ops {
		start[j+1] += start[j]
	}
	order, next := ints[:len(batch)], ints[len(batch):len(batch)+len(ops)]
	copy(next, start[:len(ops)])
	for i, j := range opOf {
		order[next[j]] = i
		next[j]++
	}
	for j := range ops {
		ops[j].keys = uint32(start[j+1] - start[j])
	}
	b = sc.buf[:0]
	if cap(b) < 8+48*len(batch) {
		b = make([]byte, 0, 8+48*len(batch))
	}
	b = binary.AppendUvarint(b, uint64(len(ops)))
	for j, o := range ops {
		b = binary.AppendUvarint(b, uint64(o.part))
		b = binary.AppendUvarint(b, o.epoch)
		b = binary.AppendUvarint(b, uint64(start[j+1]-start[j]))
		for _, i := range order[start[j]:start[j+1]] {
			it := batch[i]
			run := it.run
			if it.alg != shard.TokenBucket {
				// Ages are relative to now, when the message is built.
				run.Age += now.Sub(it.at)
			}
			b = appendStr(b, it.key.Tenant)
			b = appendStr(b, it.key.Subject)
			b = appendStr(b, it.key.Policy)
			b = binary.AppendUvarint(b, uint64(it.alg))
			b = binary.AppendVarint(b, int64(run.Age))
			b = binary.AppendVarint(b, run.Count)
		}
	}
	if cap(b) <= transport.KeepBuf {
		sc.buf = b
	}
	sc.ops = ops
	return b, ops, opOf
}

// packedAdmit is one decoded, valid key state with the policy it is
// imported under (importPolicy).
type packedAdmit struct {
	st shard.KeyState
	sp shard.Policy
}

// admitScratch is applyPackedAdmits's scratch.
type admitScratch struct {
	runs []shard.Run
	ents []packedAdmit
}

var admitScratchPool = sync.Pool{New: func() any { return new(admitScratch) }}

// put drops the keys and policies sc points to and pools it, unless it
// grew large.
func (sc *admitScratch) put() {
	if cap(sc.ents) > maxReplBatch || cap(sc.runs) > maxReplBatch {
		return
	}
	clear(sc.ents[:cap(sc.ents)])
	admitScratchPool.Put(sc)
}

// applyPackedAdmits applies a packed admissions request from sender (sw:
// what it tells of its policy table) and returns the packed answer.
func (n *Node) applyPackedAdmits(out []byte, sender string, seq uint64, sw senderTable, b []byte, closing bool) ([]byte, error) {
	r := &packedReader{s: unsafeString(b)} // see decodeItems
	tab := n.table.Load()                  // once per request
	nops := r.count(maxWireBatch, 3)
	out = binary.AppendUvarint(slices.Grow(out[:0], 8+16*nops), uint64(nops))
	// Scratch shared by the operations, and reused by later requests:
	// applyOpKeys keeps neither (Import copies the runs it merges).
	sc := admitScratchPool.Get().(*admitScratch)
	defer sc.put()
	runs, ents := sc.runs[:0], sc.ents[:0]
	defer func() { sc.runs, sc.ents = runs, ents }()
	for range nops {
		part, epoch := r.uvarint(), r.uvarint()
		ne := r.count(len(r.s), 6)
		// Import copies the runs it merges: one slice serves every
		// operation.
		if cap(runs) < ne {
			runs = make([]shard.Run, 0, ne)
		}
		if cap(ents) < ne {
			ents = make([]packedAdmit, 0, ne)
		}
		runs = runs[:0]
		ents = ents[:0]
		for range ne {
			k := Key{Tenant: r.str(), Subject: r.str(), Policy: r.str()}
			alg := r.uvarint()
			runs = append(runs, shard.Run{Age: time.Duration(r.varint()), Count: r.varint()})
			st := shard.KeyState{Key: k, Algorithm: shard.Algorithm(alg), Runs: runs[len(runs)-1 : len(runs) : len(runs)]}
			if alg > 255 || st.Validate() != nil {
				continue // malformed: skipped, as applyOp skips it
			}
			if p := tab.Lookup(k.Policy); p != nil && p.Shard.Algorithm == st.Algorithm {
				ents = append(ents, packedAdmit{st: st, sp: importPolicy(p, sw)})
			}
		}
		if r.err != nil {
			break
		}
		if part > uint64(^uint32(0)) {
			part = uint64(len(n.pt.parts)) // refused below
		}
		res := n.applyOpKeys(sender, opHead{kind: peerpb.PartitionOp_KIND_ADMIT, part: uint32(part), epoch: epoch, carried: ne, seq: seq}, ents, closing)
		out = binary.AppendUvarint(out, uint64(res.status))
		out = appendStr(out, res.holder)
		out = binary.AppendUvarint(out, res.epoch)
		out = binary.AppendUvarint(out, uint64(res.accepted))
	}
	if r.err == nil && r.off != len(r.s) {
		r.err = errPacked
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w at byte %d", r.err, r.off)
	}
	return out, nil
}

// decodeOpResults decodes a packed replication answer of want results,
// appended to dst.
func decodeOpResults(dst []peerpb.OpResult, b []byte, want int, from string) ([]peerpb.OpResult, error) {
	r := &packedReader{s: unsafeString(b)}
	n := r.count(maxWireBatch, 4)
	if r.err == nil && n != want {
		return nil, fmt.Errorf("peer: %s answered %d results for %d operations", from, n, want)
	}
	out := slices.Grow(dst[:0], n)[:n]
	for i := range out {
		o := &out[i]
		o.Reset()
		o.Status = peerpb.OpStatus(r.uvarint())
		o.Holder = clone(r.str())
		o.Epoch = r.uvarint()
		o.Accepted = uint32(r.uvarint())
	}
	if r.err == nil && r.off != len(r.s) {
		r.err = errPacked
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w: from %s at byte %d", r.err, from, r.off)
	}
	return out, nil
}

// Windows: ReplicateRequest.windows_packed, the sender's window of each
// policy its keys name, sent while the tables may differ (a change rolling
// out): a count, then per policy its name and window (ns, uvarint).

// senderWindow is one policy's window in the sender's table.
type senderWindow struct {
	policy string
	window time.Duration
}

// packWindows returns the windows_packed field for the policies names
// yields (each once), as tab has them; nil when tab has none of them.
func packWindows(tab *policy.Table, names iter.Seq[string]) []byte {
	var seen []string // the names tab has, in body's order
	var body []byte
	for name := range names {
		p := tab.Lookup(name)
		// A calendar policy has no window (its period is the calendar's,
		// and the receiver does not widen it, see importPolicy); its zero
		// would be a malformed window to the receiver.
		if p == nil || p.Shard.Algorithm == shard.Calendar || slices.Contains(seen, name) {
			continue
		}
		seen = append(seen, name)
		body = appendStr(body, name)
		body = binary.AppendUvarint(body, uint64(p.Shard.Window))
	}
	if body == nil {
		return nil
	}
	return append(binary.AppendUvarint(make([]byte, 0, 2+len(body)), uint64(len(seen))), body...)
}

// decodeWindows decodes a windows_packed field; nil for an empty one. A
// window outside (0, MaxWindow] is malformed.
func decodeWindows(b []byte) ([]senderWindow, error) {
	if len(b) == 0 {
		return nil, nil
	}
	r := &packedReader{s: string(b)}
	n := r.count(maxWireBatch, 2)
	out := make([]senderWindow, 0, n)
	for range n {
		name, w := r.str(), r.uvarint()
		if r.err == nil && (w == 0 || w > uint64(shard.MaxWindow)) {
			r.err = errPacked
		}
		out = append(out, senderWindow{policy: name, window: time.Duration(w)})
	}
	if r.err == nil && r.off != len(r.s) {
		r.err = errPacked
	}
	if r.err != nil {
		return nil, fmt.Errorf("%w in windows at byte %d", r.err, r.off)
	}
	return out, nil
}

// senderTable is what a replication message tells of its sender's policy
// table.
type senderTable struct {
	windows []senderWindow // its windows, when it sent them
	// unknown: its table differs from this node's, and it sent no windows
	// (its gossiped view of this node is behind).
	unknown bool
}

// importPolicy is the policy a copied key state of p is imported under:
// p's, except that a sliding_log or fixed_window key keeps its admissions
// for the sender's window when that is longer (st.windows). A raised
// window that reaches the holder before this node would otherwise lose,
// here, the admissions older than this node's window; on a takeover the
// new window would then count from less than the old holder counted. A
// shorter sender window changes nothing: keeping more only refuses more,
// and a decision counts only its own window. When the sender's window is
// unknown (st.unknown) such a key keeps every admission it is sent
// (shard.MaxWindow) until a later message says more: a fixed_window count
// may then add up windows that have ended, which refuses more, never
// admits more.
func importPolicy(p *policy.Entry, st senderTable) shard.Policy {
	sp := p.Shard
	if sp.Algorithm != shard.SlidingLog && sp.Algorithm != shard.FixedWindow {
		return sp
	}
	if st.unknown {
		sp.Window = shard.MaxWindow
		return sp
	}
	for _, w := range st.windows {
		if w.policy == p.Name && w.window > sp.Window {
			sp.Window = w.window
		}
	}
	return sp
}
