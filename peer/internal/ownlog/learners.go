package ownlog

import (
	pb "go.etcd.io/raft/v3/raftpb"
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

// leavesJoint reports whether a configuration change entry only leaves a
// joint configuration: it adds nobody, so the leader takes no snapshot
// for it (apply), and the latest stays the joint one, which a joiner
// restores in one step.
func leavesJoint(cc pb.ConfChangeI) bool {
	v2, ok := cc.(*pb.ConfChangeV2)
	return ok && v2.LeaveJoint()
}
