package membership

import (
	"net"
	"sync"

	"github.com/hashicorp/memberlist"
)

// Event is one membership notification from memberlist, as the driver
// logs it.
type Event struct {
	Kind string // joined, left, failed, updated
	Name string
	Addr string
}

// MaxEvents bounds what a Queue keeps beside the member list: pending
// events (past it the oldest is dropped and counted), leaving notices and
// the metadata of failed members.
const MaxEvents = 1024

// Queue collects memberlist notifications without blocking memberlist,
// and keeps the member list the rebuild reads: each member's metadata is
// copied inside the callback, because memberlist rewrites its own Node
// values after the callback returns. Log detail is bounded: past
// MaxEvents the oldest event is dropped (the member list itself is always
// complete). The zero Queue is empty and ready.
type Queue struct {
	mu      sync.Mutex
	evs     []Event
	dropped int
	members map[string][]byte          // member name -> copy of its metadata
	addrs   map[string]memberlist.Node // member name -> copy of its gossip address
	leaving map[string]bool            // members that said they are leaving
	// failed keeps the metadata of members memberlist declared dead
	// (those that said they were leaving too: they may still be
	// draining) until they come back or the rebuild lets them go
	// (ForgetFailed).
	failed map[string][]byte
}

// ForgetFailed drops name's metadata kept since gossip declared it dead.
func (q *Queue) ForgetFailed(name string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.failed, name)
}

// GossipAddrs returns copies of the members' gossip addresses. memberlist's
// own Node values are rewritten by its goroutines, so they are copied inside
// the callbacks and never read later.
func (q *Queue) GossipAddrs() []memberlist.Node {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]memberlist.Node, 0, len(q.addrs))
	for _, a := range q.addrs {
		out = append(out, a)
	}
	return out
}

// MarkLeaving notes a member's own "leaving" message.
func (q *Queue) MarkLeaving(name string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.leaving == nil {
		q.leaving = make(map[string]bool)
	}
	if len(q.leaving) < MaxEvents {
		q.leaving[name] = true
	}
}

// Apply records one memberlist notification (kind joined, left or
// updated) and returns the event to log: a member that disappears
// without having said it leaves (a leaving notice, or its draining flag)
// failed.
func (q *Queue) Apply(kind string, m *memberlist.Node) Event {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.members == nil {
		q.members = make(map[string][]byte)
		q.addrs = make(map[string]memberlist.Node)
	}
	e := Event{Kind: kind, Name: m.Name, Addr: m.Address()}
	switch kind {
	case "left":
		// A member that announced its leave left; any other disappearance
		// is a failure (memberlist declared it dead).
		md, err := DecodeMeta(q.members[m.Name])
		if !q.leaving[m.Name] && (err != nil || !md.Draining) {
			e.Kind = "failed"
		}
		// Either way its metadata is kept for the rebuild, which asks
		// the ownership log whether its liveness still holds: a member
		// that said it was leaving may still be draining, cut off from
		// gossip only; it has left once its liveness ended.
		if q.failed == nil {
			q.failed = make(map[string][]byte)
		}
		if raw, ok := q.members[m.Name]; ok && len(q.failed) < MaxEvents {
			q.failed[m.Name] = raw
		}
		delete(q.members, m.Name)
		delete(q.addrs, m.Name)
		delete(q.leaving, m.Name)
	default:
		delete(q.failed, m.Name)
		q.members[m.Name] = append([]byte(nil), m.Meta...)
		q.addrs[m.Name] = memberlist.Node{Name: m.Name, Addr: append(net.IP(nil), m.Addr...), Port: m.Port}
	}
	if len(q.evs) >= MaxEvents {
		q.evs = q.evs[1:]
		q.dropped++
	}
	q.evs = append(q.evs, e)
	return e
}

// Take returns the pending events and how many were dropped, a copy of
// the member list (name to metadata), and a copy of the metadata of
// members declared dead since (nil if none). The maps are the caller's;
// the metadata bytes are shared and must not be written (the Queue never
// writes them either: a change replaces them).
func (q *Queue) Take() (evs []Event, dropped int, members, failed map[string][]byte) {
	q.mu.Lock()
	defer q.mu.Unlock()
	evs, dropped = q.evs, q.dropped
	q.evs, q.dropped = nil, 0
	members = make(map[string][]byte, len(q.members))
	for k, v := range q.members {
		members[k] = v
	}
	if len(q.failed) > 0 {
		failed = make(map[string][]byte, len(q.failed))
		for k, v := range q.failed {
			failed[k] = v
		}
	}
	return evs, dropped, members, failed
}

// Delegate receives memberlist's callbacks (it is both its Delegate and
// its EventDelegate). They never block: each notes the change in Queue
// and calls OnEvent, which must not block either.
type Delegate struct {
	Queue   *Queue
	OnEvent func(Event)
	// OnConflict, if set, hears of two members claiming one name
	// (memberlist's ConflictDelegate); it must not block.
	OnConflict func(existing, other *memberlist.Node)
	// OnMerge, if set, sees the member list of each push/pull made to
	// join, this node's or a joiner's (memberlist's MergeDelegate), before
	// it is merged: an error refuses the merge, and the join fails.
	OnMerge func(peers []*memberlist.Node) error

	mu   sync.Mutex
	meta []byte
}

// NodeMeta is this node's encoded Meta (nil if over limit).
func (d *Delegate) NodeMeta(limit int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.meta) > limit {
		return nil
	}
	return d.meta
}

// SetMeta sets what NodeMeta answers from now on.
func (d *Delegate) SetMeta(m Meta) {
	d.mu.Lock()
	d.meta = m.Encode()
	d.mu.Unlock()
}

// NotifyMsg receives a member's "leaving" notice (LeavingMsg).
func (d *Delegate) NotifyMsg(b []byte) {
	if len(b) > 1 && b[0] == msgLeaving {
		d.Queue.MarkLeaving(string(b[1:]))
	}
}

// msgLeaving tags the message a node sends each member before it leaves.
const msgLeaving = 'L'

// LeavingMsg is the message a node named name sends each member, over
// memberlist's reliable channel and before the gossip leave, so that
// their logs say "left" rather than "failed".
func LeavingMsg(name string) []byte { return append([]byte{msgLeaving}, name...) }

// NotifyConflict implements memberlist.ConflictDelegate.
func (d *Delegate) NotifyConflict(existing, other *memberlist.Node) {
	if d.OnConflict != nil {
		d.OnConflict(existing, other)
	}
}

// NotifyMerge implements memberlist.MergeDelegate.
func (d *Delegate) NotifyMerge(peers []*memberlist.Node) error {
	if d.OnMerge != nil {
		return d.OnMerge(peers)
	}
	return nil
}

func (d *Delegate) GetBroadcasts(int, int) [][]byte { return nil }
func (d *Delegate) LocalState(bool) []byte          { return nil }
func (d *Delegate) MergeRemoteState([]byte, bool)   {}

func (d *Delegate) NotifyJoin(m *memberlist.Node)   { d.note("joined", m) }
func (d *Delegate) NotifyLeave(m *memberlist.Node)  { d.note("left", m) }
func (d *Delegate) NotifyUpdate(m *memberlist.Node) { d.note("updated", m) }

func (d *Delegate) note(kind string, m *memberlist.Node) {
	e := d.Queue.Apply(kind, m)
	if d.OnEvent != nil {
		d.OnEvent(e)
	}
}
