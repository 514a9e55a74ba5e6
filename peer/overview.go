package peer

import (
	"context"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/peer/internal/membership"
)

// MemberView is one member as this node sees it, for status pages
// (peer/console). Read-only: building it changes nothing.
type MemberView struct {
	// Name is the member's name; Incarnation its member ID in the
	// ownership log (name@start), "" when gossip never said.
	Name, Incarnation string
	// RPCAddr and GossipAddr are the addresses gossip lists for it; ""
	// once gossip no longer lists it.
	RPCAddr, GossipAddr string
	// Gossip is its gossip state here: "alive", "suspect", "failed" (out
	// of gossip but kept on the ring while its liveness holds) or
	// "leaving" (it announced a graceful leave).
	Gossip string
	// LivenessEpoch is its liveness epoch in the ownership table this
	// node applied, and LivenessEnded whether that record ended for good;
	// both zero when the table has no record (or did not answer in time).
	LivenessEpoch uint64
	LivenessEnded bool
	// PolicyVersion is the policy table version it gossips (0 from an
	// older member); SameFingerprint whether its placement fingerprint is
	// this node's (a member that differs is ignored, never on the ring).
	PolicyVersion   uint64
	SameFingerprint bool
}

// Overview is this node's own state and its view of the members, for
// status pages: what /debug/ring and /debug/ownership show, plus the
// facts only this node knows about itself (voter, its liveness left).
type Overview struct {
	Name    string
	RPCAddr string
	// Ready and NotReady are Node.Ready's answer.
	Ready    bool
	NotReady string
	// Voter reports whether this node votes in the ownership log (else it
	// is a learner); Term is the log's term it knows (0 when the log did
	// not answer in time), Leader the leader's member name ("" for none).
	Voter  bool
	Term   uint64
	Leader string
	// Commit and Applied are the log's commit index and the index this
	// node applied: Commit − Applied is how far its table lags the log.
	Commit, Applied uint64
	// LivenessLeft is how long this node's own liveness lease still holds
	// on its own clock; zero once lapsed.
	LivenessLeft time.Duration
	// Fingerprint is the placement fingerprint; PolicyVersion the policy
	// table version in force here.
	Fingerprint   uint64
	PolicyVersion uint64
	RingVersion   uint64
	// Members are the ring's members and every other member gossip lists,
	// sorted by name.
	Members []MemberView
	// Partitions is every partition, in order, as this node's applied
	// table and ring say.
	Partitions []PartitionView
}

// PartitionView is one partition in Overview.
type PartitionView struct {
	Partition int
	// Holder and Backup are member names from the ownership table ("" for
	// none: Holder "" is a vacant partition); Epoch its partition epoch.
	Holder, Backup string
	Epoch          uint64
	// Target is the member the ring places the partition on: a Holder
	// that differs is being moved there.
	Target string
	// Deciding: this node holds it and may decide now. Fenced: this node
	// holds it but may not decide (a move's copy in flight, or its lease
	// lapsed).
	Deciding, Fenced bool
	// Keys is the partition's key count when this node holds it, else 0.
	Keys int
}

// Overview returns the node's overview. It asks the ownership log's goroutine
// for the table and the term, waiting at most until ctx ends (those
// fields are then zero); everything else is read from published state.
func (n *Node) Overview(ctx context.Context) Overview {
	lo, mono := n.lo, n.mono()
	ready, why := n.Ready()
	st := Overview{
		Name: n.name, RPCAddr: n.RPCAddr(), Ready: ready, NotReady: why,
		Voter: lo.run.Voter(), Fingerprint: n.fp, PolicyVersion: n.PolicyVersion(), RingVersion: n.RingVersion(),
	}
	if left := lo.run.LiveUntil() - mono; left > 0 {
		st.LivenessLeft = time.Duration(left)
	}
	if id := lo.run.Lead(); id != 0 {
		st.Leader = lo.peers.Load().raft[id]
		if id == n.ops.start {
			st.Leader = n.name
		}
	}
	desc := lo.run.Describe(ctx)
	st.Term, st.Commit, st.Applied = logField(desc, "term"), logField(desc, "commit"), logField(desc, "applied")
	table, _ := lo.run.Table(ctx)

	byName := map[string]*MemberView{}
	add := func(name string) *MemberView {
		m := byName[name]
		if m == nil {
			m = &MemberView{Name: name, Gossip: "failed", SameFingerprint: true}
			byName[name] = m
		}
		return m
	}
	for _, name := range n.Members() {
		add(name)
	}
	for _, node := range n.ml.Members() {
		m := add(node.Name)
		m.GossipAddr = net.JoinHostPort(node.Addr.String(), strconv.Itoa(int(node.Port)))
		m.Gossip = "alive"
		if node.State == memberlist.StateSuspect {
			m.Gossip = "suspect"
		}
		md, err := membership.DecodeMeta(node.Meta)
		if err != nil {
			m.SameFingerprint = false
			continue
		}
		m.RPCAddr, m.PolicyVersion, m.SameFingerprint = md.RPCAddr, md.Policies, md.Fingerprint == n.fp
		if md.Draining {
			m.Gossip = "leaving"
		}
		if md.Start != 0 {
			m.Incarnation = incarnationID(node.Name, md.Start)
		}
	}
	if m := byName[n.name]; m != nil {
		m.Incarnation, m.PolicyVersion = lo.self, st.PolicyVersion
	}
	if table != nil {
		// A member out of gossip is found in the table by name: its
		// newest record not ended, else its newest.
		for id, l := range table.Members {
			m := byName[memberName(id)]
			if m == nil || (m.Incarnation != "" && m.Incarnation != id) || (m.Incarnation == "" && l.Ended && m.LivenessEpoch != 0) {
				continue
			}
			m.LivenessEpoch, m.LivenessEnded = l.Epoch, l.Ended
		}
	}
	snap := n.view.Load().snap
	for p := range n.pt.parts {
		ps := lo.run.Part(p)
		out := PartitionView{Partition: p, Holder: memberName(ps.Holder), Backup: memberName(ps.Backup), Epoch: ps.Epoch,
			Target: snap.PartitionOwner(p)}
		if ps.Holder == lo.self {
			out.Deciding = lo.run.MayDecide(p, mono)
			out.Fenced = !out.Deciding
			pt := &n.pt.parts[p]
			pt.mu.RLock()
			if pt.store != nil {
				out.Keys = pt.store.Len()
			}
			pt.mu.RUnlock()
		}
		st.Partitions = append(st.Partitions, out)
	}
	for _, m := range byName {
		st.Members = append(st.Members, *m)
	}
	sort.Slice(st.Members, func(i, j int) bool { return st.Members[i].Name < st.Members[j].Name })
	return st
}

// logField reads the number after name in the log's one-line summary
// ("... term 7 leader 1 commit 40 applied 40 ..."): the runner answers the
// summary, not the numbers, and ownlog is not this file's to change. 0
// when it says none.
func logField(describe, name string) uint64 {
	_, rest, ok := strings.Cut(describe, " "+name+" ")
	if !ok {
		return 0
	}
	num, _, _ := strings.Cut(rest, " ")
	t, _ := strconv.ParseUint(num, 10, 64)
	return t
}
