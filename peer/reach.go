package peer

import (
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/ringlimit/ringlimit/peer/internal/membership"
)

// reachability is this node's marks on members whose gRPC port does not
// answer although gossip lists them (a "ghost": a blocked port, a wedged
// server). Requests for a partition whose holder is not known go past a
// marked ring target to its backup; a mark older than hold is probed
// again (probe, on a goroutine the node owns), and cleared when the
// member answers. Times are the caller's: node monotonic ns.
type reachability struct {
	hold  int64               // ns after which a mark is probed again
	probe func(member string) // asks member's gRPC health, then marks or clears
	log   *slog.Logger

	mu sync.Mutex
	// marks is when each marked member was last seen not answering.
	marks map[string]int64
	// marked is len(marks), readable without mu: the request path asks
	// about unreachable members only when there are any.
	marked   atomic.Int32
	checking map[string]bool // probes in flight
	// starts is each member's last seen process start id: a new one means
	// a new process, whose port says nothing of the old one's.
	starts map[string]uint64
}

func newReachability(hold int64, probe func(string), log *slog.Logger) *reachability {
	return &reachability{hold: hold, probe: probe, log: log, marks: map[string]int64{}, checking: map[string]bool{}, starts: map[string]uint64{}}
}

// mark records (or renews) that member's gRPC port did not answer at now.
func (r *reachability) mark(member string, now int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, known := r.marks[member]
	if known || len(r.marks) < membership.MaxEvents {
		r.marks[member] = now
		r.marked.Store(int32(len(r.marks)))
	}
	if !known {
		r.log.Warn("member unreachable over gRPC although gossip lists it: requests for partitions whose holder is not known go past it", "peer", member)
	}
}

// clear records that member answered (or is a new process, whose port
// says nothing of the old one's).
func (r *reachability) clear(member string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.marks, member)
	r.marked.Store(int32(len(r.marks)))
}

// is reports whether member is marked. A mark older than hold at now
// starts a probe (an empty health check, which fences nothing) and stays
// until the member answers it.
func (r *reachability) is(member string, now int64) bool {
	if r.marked.Load() == 0 {
		return false
	}
	r.mu.Lock()
	at, ok := r.marks[member]
	r.mu.Unlock()
	if ok && now-at > r.hold {
		r.probe(member)
	}
	return ok
}

// claim takes member's probe slot: false while a probe of it is in
// flight. done gives it back.
func (r *reachability) claim(member string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.checking[member] {
		return false
	}
	r.checking[member] = true
	return true
}

func (r *reachability) done(member string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.checking, member)
}

// noteStarts takes every live member's process start id (self's
// skipped): a member seen with a new one is a new process, and its mark,
// if any, goes (usable at once, not after the next probe ten leases
// later). Called by the node's rebuild goroutine.
func (r *reachability) noteStarts(starts map[string]uint64, self string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for name, s := range starts {
		if name == self || s == 0 {
			continue
		}
		prev, ok := r.starts[name]
		if ok && prev != s {
			delete(r.marks, name)
			r.marked.Store(int32(len(r.marks)))
		}
		if ok || len(r.starts) < membership.MaxEvents {
			r.starts[name] = s
		}
	}
}
