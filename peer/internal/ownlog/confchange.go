package ownlog

import (
	"slices"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"
)

// learnerBatch bounds the learners one configuration change adds, and
// those it removes: a fleet's deploy wave of 256 of 1 024 members brings
// 256 of each.
const learnerBatch = 256

// learnerChange proposes, as one configuration change, that the learners
// add join the log and the learners drop leave it. autopilot made one
// change at a time, at most one every 100 ms: a deploy wave of 256
// members, 256 leavers and 256 joiners, took 51 s of changes before the
// wave settled, and every member applied each change at a cost that grows
// with the members (etcd raft copies the whole configuration for each),
// members² work a change, the most of a 256-member fleet run's CPU.
//
// Why a batch is safe: it changes no voter. It goes as a ConfChangeV2,
// which etcd raft applies by joint consensus (every change but a single
// one does; the leader leaves the joint configuration itself once it
// applied the entry): the incoming voters are the outgoing ones, so a
// majority of the joint configuration is a majority of the voters as
// before, and a learner counts in no majority. Nothing else changes: a
// learner is added only once the table lists its incarnation, and removed
// only once it is done (its liveness ended for good, or gossip reports it
// gone), as one at a time did; voter changes stay one at a time (V1,
// autopilot), made before any learner change.
//
// A single change goes joint too: the leader snapshots at each change
// (apply) and a joiner restores that snapshot's configuration; etcd raft
// restores a joint one in one step and a plain one a member at a time,
// copying it at each (members² work: 0.9 s at 1 024 members,
// BenchmarkConfRestore), which every restarted member of a fleet paid.
func (m *Member) learnerChange(now int64, add, drop []uint64) {
	if len(add)+len(drop) == 0 {
		return
	}
	cc := &pb.ConfChangeV2{Transition: pb.ConfChangeTransitionJointImplicit.Enum()}
	for _, id := range add {
		cc.Changes = append(cc.Changes, &pb.ConfChangeSingle{Type: pb.ConfChangeAddLearnerNode.Enum(), NodeId: proto.Uint64(id)})
	}
	for _, id := range drop {
		cc.Changes = append(cc.Changes, &pb.ConfChangeSingle{Type: pb.ConfChangeRemoveNode.Enum(), NodeId: proto.Uint64(id)})
	}
	m.lastConf = now
	if m.rn.ProposeConfChange(cc) == nil {
		m.out.ConfChanges++
	}
}

// leaveJoint is autopilot in a joint configuration (a batch of learner
// changes, or a fleet's founding): raft refuses any change but the leave,
// which raft's leader proposes itself once it applied the entry; but a
// proposal made during a leadership transfer is dropped, and raft makes it
// again only when more entries apply, which on a quiet log is never: the
// configuration stayed joint and autopilot changed nothing more. So after
// an election timeout in it, autopilot proposes the leave (an empty
// ConfChangeV2), at most once an election timeout; raft refuses it while
// one is pending.
func (m *Member) leaveJoint(now int64) {
	if m.tick == 0 || now-m.lastConf < int64(m.cfg.ElectionTicks)*m.tick {
		return
	}
	m.lastConf = now
	if m.rn.ProposeConfChange(&pb.ConfChangeV2{}) == nil {
		m.out.ConfChanges++
	}
}

// leavesJoint reports whether a configuration change entry only leaves a
// joint configuration: it adds nobody, so the leader takes no snapshot
// for it (apply), and the latest stays the joint one, which a joiner
// restores in one step.
func leavesJoint(cc pb.ConfChangeI) bool {
	v2, ok := cc.(*pb.ConfChangeV2)
	return ok && v2.LeaveJoint()
}

// tellRemoved, on the leader, tells each voter that the committed
// configuration change cc at index removes that index is committed, so
// that it applies its own removal. raft stops sending to a member once it
// applied the change that removes it, and the commit of that change may
// not have reached it first (it went in an append the network reordered
// behind the next one, which the member refused; or the member had not
// acknowledged the entry yet): a leaving voter waits until its log no
// longer lists it (peer's leave, the simulator's leaveLog), and then
// waited out its bound of four Liveness (a deploy wave of 32 members took
// 9.9 s instead of 2.6 s). A member that has the entry (its Match) gets a
// heartbeat committing it; one behind gets an append of the entries from
// its Match, as raft would send it, while the log still has them. Never
// a commit past what it has: that makes raft panic.
func (m *Member) tellRemoved(cc pb.ConfChangeI, index uint64) {
	for _, ch := range cc.AsV2().GetChanges() {
		if ch.GetType() == pb.ConfChangeRemoveNode {
			delete(m.owed, ch.GetNodeId()) // noteRefused's, for a member gone
		}
	}
	if !m.Leader() {
		return
	}
	for _, ch := range cc.AsV2().GetChanges() {
		id := ch.GetNodeId()
		if ch.GetType() != pb.ConfChangeRemoveNode || id == m.cfg.RaftID || !slices.Contains(m.conf.GetVoters(), id) {
			continue
		}
		var match uint64
		m.rn.WithProgress(func(pid uint64, _ raft.ProgressType, pr tracker.Progress) {
			if pid == id {
				match = pr.Match
			}
		})
		msg := &pb.Message{Type: pb.MsgHeartbeat.Enum(), To: proto.Uint64(id), From: proto.Uint64(m.cfg.RaftID),
			Term: proto.Uint64(m.rn.BasicStatus().GetTerm()), Commit: proto.Uint64(index)}
		if match < index {
			// Its log is known to match this one up to match (raft's
			// own appends probe until they find where).
			if match == 0 {
				continue
			}
			term, err := m.storage.Term(match)
			if err != nil {
				continue // compacted: raft would send it a snapshot
			}
			ents, err := m.storage.Entries(match+1, index+1, 1<<20)
			if err != nil || uint64(len(ents)) != index-match {
				continue
			}
			msg.Type, msg.Index, msg.LogTerm, msg.Entries = pb.MsgApp.Enum(), proto.Uint64(match), proto.Uint64(term), ents
		}
		m.out.Messages = append(m.out.Messages, msg)
	}
}
