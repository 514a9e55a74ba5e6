package ownlog

import (
	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// catchUpEntries bounds how far behind its applied index the leader keeps
// the log for a follower that answers (compactTo).
const catchUpEntries = 1024

// compactTo is the index the log may be compacted to: SnapshotEvery/2
// entries behind the applied index, and on the leader no further than
// what a follower it heard from lately still lacks, up to catchUpEntries
// behind, or two snapshots' worth of entries (snapshotEvery) when that is
// more: a snapshot of a table of 1 024 members costs its receiver a
// restore of raft's configuration, members² work when it is not joint,
// and a fleet's founding sent its lagging learners 1 193 of them in
// 1.3 s of virtual time. A follower a few appends behind then catches up from the log,
// not from a snapshot of the whole table: in a fleet's founding or
// deploy (hundreds of commands a second, 32 entries kept) most learners
// were sent one, each with every member and partition, and each costing
// its receiver a restore of raft's configuration (members² work in etcd
// raft's confchange.Restore, half a second at 1 024 members).
func (m *Member) compactTo() uint64 {
	keep := m.cfg.SnapshotEvery / 2
	if m.applied <= keep {
		return 0
	}
	to := m.applied - keep
	if !m.Leader() || m.tick == 0 {
		return to
	}
	floor := m.applied - min(m.applied, max(catchUpEntries, 2*m.snapshotEvery()))
	m.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		// Heard from within two learner heartbeats: a learner at rest
		// answers only those.
		at, ok := m.heard[id]
		if id == m.cfg.RaftID || !ok || m.lastTick-at > 2*m.learnerBeat() {
			return
		}
		if pr.Match >= floor && pr.Match < to {
			to = pr.Match
		}
	})
	return to
}

// snapshotEvery is how many applied entries between snapshots:
// Config.SnapshotEvery, or the table's members and partitions when they
// are more. Every member snapshots, and a snapshot marshals the whole
// table: every 64 entries, a fleet's deploy (a command or more per
// member, each of a member or a partition) cost each member members²
// work, a tenth of a 256-member fleet run's CPU. Counted by the table's
// size, a snapshot costs each entry the same at any size, and the log
// between two is about as large as one. A small cluster's cadence is
// unchanged.
func (m *Member) snapshotEvery() uint64 {
	t := m.own.Table()
	return max(m.cfg.SnapshotEvery, uint64(len(t.Parts)+len(t.Members)))
}

// noteRefused, on the leader, owes a learner that refused an append a
// heartbeat at the next heartbeat tick (thin sends a learner one only
// every learnerBeats otherwise). An append that only carries the commit
// can reach a learner before the one with the entries it commits (the
// network reordered them, or lost the first): the learner refuses it,
// then acknowledges the entries, and raft, which has its Match, sends
// nothing more while the log is quiet. A heartbeat carries the commit
// (up to the Match); without one the learner applied a partition handed
// to it only at the next learner heartbeat, 10 s later (a simulated
// fleet's churn: its keys unavailable for 9.7 s).
func (m *Member) noteRefused(msg *pb.Message) {
	if msg.GetType() != pb.MsgAppResp || !msg.GetReject() || !m.learner(msg.GetFrom()) {
		return
	}
	if m.owed == nil {
		m.owed = map[uint64]bool{}
	}
	m.owed[msg.GetFrom()] = true
}
