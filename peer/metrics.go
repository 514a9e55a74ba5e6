package peer

import "time"

// Path says where a decision was made relative to the node that was asked.
type Path uint8

const (
	// PathLocal: this node owns the key and decided.
	PathLocal Path = iota
	// PathForwarded: the decision came from the owner over gRPC.
	PathForwarded
	// PathRemote: this node decided as owner for a peer's forwarded request.
	PathRemote
)

// String returns local, forwarded or remote.
func (p Path) String() string {
	switch p {
	case PathLocal:
		return "local"
	case PathForwarded:
		return "forwarded"
	default:
		return "remote"
	}
}

// Metrics receives a node's measurements. Implementations must be safe for
// concurrent use, cheap and never block: they are called on the decision
// path. Labels passed in are low-cardinality: policy names come from the
// server's table and peers are member names; keys never appear.
// peer/prommetrics is the Prometheus implementation.
type Metrics interface {
	// Decision counts one answer of this node's Allow, or one decision made
	// as owner for a peer (PathRemote).
	Decision(policy string, reason Reason, path Path)
	// Forward records one forwarded RPC to peer: its outcome ("ok",
	// "error", "not_owner") and duration. Outcome "resent" (duration 0)
	// counts a request sent on to another member after its forward to
	// peer failed with peer's port dead: peer may have decided it
	// already, so it may count twice (refusing more, never less).
	Forward(peer, outcome string, d time.Duration)
	// Batch records how many requests one forwarded RPC carried.
	Batch(peer string, size int)
	// Ring records the current ring version and member count.
	Ring(version uint64, members int)
	// Keys records the keys and bytes held by the local store.
	Keys(keys int, bytes int64)
	// Evicted counts idle keys reclaimed by a sweep.
	Evicted(n int)
	// Handoff counts keys moved on a membership change, by direction
	// ("sent", "received", "pulled") and outcome ("ok", "failed").
	Handoff(direction, outcome string, keys int)
	// Backup counts keys streamed to or received from backups, by
	// direction ("sent", "received", "restored") and outcome.
	Backup(direction, outcome string, keys int)
	// HotKeys replaces the exported hot-key view (at most Config.HotKeys).
	HotKeys(top []HotKey)
	// PeerRPCOpen reports, once from New, whether peer-only RPCs are open
	// to unauthenticated callers (no PeerSecret, GossipKey or required
	// client certificates).
	PeerRPCOpen(open bool)
	// Ready reports a readiness change (see Node.Ready): reason is "" when
	// ready, else one of ReadyReasonClosing, ReadyReasonAlone or
	// ReadyReasonIgnored. Called from New and the rebuild goroutine.
	Ready(ready bool, reason string)
	// PolicyTable reports the outcome of installing a policy table (New's,
	// and each Node.SetPolicies): ok with the new table's version, or not
	// ok (the table was refused) with the version still in force.
	PolicyTable(version uint64, ok bool)
}

type nopMetrics struct{}

func (nopMetrics) Decision(string, Reason, Path)         {}
func (nopMetrics) Forward(string, string, time.Duration) {}
func (nopMetrics) Batch(string, int)                     {}
func (nopMetrics) Ring(uint64, int)                      {}
func (nopMetrics) Keys(int, int64)                       {}
func (nopMetrics) Evicted(int)                           {}
func (nopMetrics) Handoff(string, string, int)           {}
func (nopMetrics) Backup(string, string, int)            {}
func (nopMetrics) HotKeys([]HotKey)                      {}
func (nopMetrics) PeerRPCOpen(bool)                      {}
func (nopMetrics) Ready(bool, string)                    {}
func (nopMetrics) PolicyTable(uint64, bool)              {}

// RaftTraffic is what the ownership log has cost this node since it
// started: counters that only grow. Node.RaftTraffic returns it, and
// peer/prommetrics exports it as the ringlimit_raft_* counters.
type RaftTraffic struct {
	// MessagesSent and BytesSent are the raft messages this node sent to
	// its peers and their marshalled size (gRPC framing aside);
	// MessagesDropped the ones dropped unsent (a full queue, a peer not
	// reached), which raft sends again.
	MessagesSent, BytesSent, MessagesDropped uint64
	// MessagesReceived and BytesReceived are the raft messages that
	// reached this node from its peers and their size, counted as they
	// arrive (shed ones too).
	MessagesReceived, BytesReceived uint64
	// MessagesShed are raft messages this node received and dropped
	// unread because its log's goroutine was that far behind; raft sends
	// again, but a count that keeps growing means a node too loaded for
	// its log's ticks.
	MessagesShed uint64
	// Proposals counts the ownership commands this node proposed (its
	// liveness extensions; as leader, grants, moves and takeovers);
	// ConfChanges the voter-set changes it proposed as leader.
	Proposals, ConfChanges uint64
	// Applied counts the ownership commands this node applied: every
	// member applies every committed command, so the cluster's commands
	// are one member's Applied, not the sum.
	Applied uint64
}

// RaftTrafficSource is an optional Metrics method, for a Metrics that
// exports RaftTraffic (peer/prommetrics has it): a node hands it the
// function that reads its counters, which the Metrics calls when scraped.
type RaftTrafficSource interface {
	RaftTrafficFrom(read func() RaftTraffic)
}

// HotKey is one of the heaviest keys this node decided for as owner.
type HotKey struct {
	Key Key
	// Rate is the decayed hit rate, in hits per second.
	Rate float64
}
