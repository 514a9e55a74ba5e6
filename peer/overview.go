package peer

import (
	"context"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"
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
	// Gossip is its state here: "alive", "leaving" (alive, announced a
	// graceful leave: no longer a target), "failed" (out of gossip but
	// kept on the ring while its liveness holds) or "ignored" (alive in
	// gossip but left out of the ring: see Ignored).
	Gossip string
	// Ignored says why this node leaves a live gossip member out of its
	// ring (another placement fingerprint, unreadable metadata, another
	// cluster); "" for the others.
	Ignored string
	// LivenessEpoch is its liveness epoch in the ownership table this
	// node applied, and LivenessEnded whether that record ended for good;
	// both zero when the table has no record (or did not answer in time).
	LivenessEpoch uint64
	LivenessEnded bool
	// PolicyVersion is the policy table version it gossips (0 from an
	// older member, or one out of gossip).
	PolicyVersion uint64
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

	// Every source read here is a copy or published state: memberlist's
	// own Node values are rewritten by its goroutines without a lock.
	byName := map[string]*MemberView{}
	add := func(name string) *MemberView {
		m := byName[name]
		if m == nil {
			m = &MemberView{Name: name, Gossip: "failed"}
			byName[name] = m
		}
		return m
	}
	v := n.view.Load()
	for _, name := range v.snap.Members() {
		add(name)
	}
	for name, addr := range v.alive {
		m := add(name)
		m.RPCAddr, m.Gossip = addr, "alive"
		if !v.snap.Has(name) {
			m.Gossip = "leaving"
		}
	}
	n.ops.ready.mu.Lock()
	for name, why := range n.ops.ready.ignored {
		m := add(name)
		m.Gossip, m.Ignored = "ignored", why
	}
	n.ops.ready.mu.Unlock()
	for _, g := range n.gossiper.events.GossipAddrs() {
		if m := byName[g.Name]; m != nil {
			m.GossipAddr = net.JoinHostPort(g.Addr.String(), strconv.Itoa(int(g.Port)))
		}
	}
	pvs := n.MemberPolicyVersions()
	for name, m := range byName {
		m.PolicyVersion = pvs[name]
		m.Incarnation = lo.incarnation(name)
	}
	if m := byName[n.name]; m != nil {
		m.Incarnation = lo.self
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
	snap := v.snap
	for p := range n.pt.parts {
		ps := lo.run.Part(p)
		out := PartitionView{Partition: p, Holder: memberName(ps.Holder), Backup: memberName(ps.Backup), Epoch: ps.Epoch,
			Target: snap.PartitionOwner(p)}
		if ps.Holder == lo.self {
			out.Deciding = lo.run.MayDecide(p, mono)
			out.Fenced = !out.Deciding
			pt := &n.pt.parts[p]
			pt.Mu.RLock()
			if pt.Store != nil {
				out.Keys = pt.Store.Len()
			}
			pt.Mu.RUnlock()
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
