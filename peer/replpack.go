package peer

// The packed admissions and windows of a replication request, in the
// layout of package wire: the holder packs them from its replication queue
// (packAdmits, replicate.go) and its policy table, and the backup applies
// them to its partitions (replicaApply.packed, backup.go).

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"iter"
	"slices"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/peer/internal/wire"
	"github.com/ringlimit/ringlimit/shard"
)

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

// packedAdmit is one decoded, valid key state with the policy it is
// imported under (importPolicy).
type packedAdmit struct {
	st shard.KeyState
	sp shard.Policy
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
		body = wire.AppendString(body, name)
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
	r := wire.NewReader(bytes.Clone(b)) // a copy: the windows outlive b
	n := r.Count(wire.MaxBatch, 2)
	out := make([]senderWindow, 0, n)
	for range n {
		name, w := r.Str(), r.Uvarint()
		if r.Err() == nil && (w == 0 || w > uint64(shard.MaxWindow)) {
			r.Fail()
		}
		out = append(out, senderWindow{policy: name, window: time.Duration(w)})
	}
	if err := r.End(); err != nil {
		return nil, fmt.Errorf("%w in windows at byte %d", err, r.Offset())
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
