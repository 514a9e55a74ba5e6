package peer

// A member that crashes and restarts on the same address under the same
// name looks, to gossip, like the same member: memberlist may see nothing
// but an incarnation bump, and the ring (names and addresses) does not
// change. Our cached gRPC connection to it, though, has been failing since
// the crash and sits in gRPC's reconnect backoff (1 s, growing), so the
// first forwards after the restart would fail with "connection refused"
// although the member is serving. Each process therefore gossips a random
// start id (membership.Meta.Start); when a member's start id changes, or memberlist
// reports it joining (again), its client is dropped and the next forward
// dials afresh. The ring itself is left alone: the member set did not
// change, and handoff is decided by the ring, not by connections.

import "github.com/ringlimit/ringlimit/peer/internal/membership"

// noteRestarts compares the members' start ids with the last seen ones and
// drops the client of each member that restarted or (re)joined. Called by
// the rebuild goroutine with the pending events and the start ids of the
// members in the new view.
func (n *Node) noteRestarts(evs []membership.Event, starts map[string]uint64) {
	for name, s := range starts {
		if name == n.name {
			continue
		}
		if prev, ok := n.ops.starts[name]; ok && prev != s {
			n.resetClient(name)
			n.log.Info("peer restarted", "peer", name)
		}
	}
	for _, e := range evs {
		if e.Kind == "joined" && e.Name != n.name {
			n.resetClient(e.Name)
		}
	}
	n.ops.starts = starts
}

// resetClient stops and forgets the client of member name, if any: its
// connection may be stuck in reconnect backoff to a previous incarnation.
// Calls queued on it fail as unavailable; the next forward dials afresh.
func (n *Node) resetClient(name string) {
	n.links.dropMember(name)
}
