package sim

import (
	"slices"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// FaultSelfRemoval brings about what a peer-suite run under load once
// met: a leader that applies a configuration without itself. raft does
// not step such a leader down by itself (ownlog sets StepDownOnRemoval);
// left leading, it has every proposal dropped while its heartbeats keep
// the others from electing another, so a crashed holder is never ended.
//
// How a leader comes to commit its own removal: a removal an earlier
// leader proposed is still uncommitted when the removed voter is elected,
// and its first entry commits it. Autopilot proposes the removal of a
// voter that stays silent to it, so the fault makes one: what a voter
// sends the leader is lost (a link failing one way; the voter still
// hears everyone and the others hear it). Autopilot promotes a learner
// in its place and proposes its removal; the leader pauses (a
// stop-the-world pause) the instant its append of that removal has gone
// out to the removed voter alone, the rest of the batch lost with the
// pause. The removed voter's log is then the longest: of the voters
// still running only it can win the election, and it commits its own
// removal with its first entry. The pause is aimed, as FaultBehindBackup
// aims its crash, because the window lasts one round trip: 0 of 600
// schedules of the other faults reached that state, nor 40 of this one
// with the cut and no pause. Once the leader wakes and the link heals,
// a holder that is neither of the two (one that does not vote first)
// crashes: every voter runs and hears the others, so the crash is a
// single fault the promise covers, and the log must end its liveness
// (checkEnded).

// selfRemoval is FaultSelfRemoval's aim and what came of it.
type selfRemoval struct {
	lead, voter *member // the leader, and the voter whose messages to it are lost
	fired       bool    // the leader paused as the voter's removal went out
	// ledTerm is the last raft term the voter was seen leading in;
	// reached: it applied its own removal in that term.
	ledTerm uint64
	reached bool
}

// selfRemovalFault starts FaultSelfRemoval: the first voter (in ID
// order) other than the leader no longer reaches it. If its removal has
// not gone out within 6 s, the link heals and nothing more happens.
func (s *sim) selfRemovalFault() {
	lead := s.leader()
	voter := s.besideLeader(lead, func(m *member) bool { return m.log.Voter() })
	if voter == nil {
		s.note("no leader, or no voter beside it")
		return
	}
	s.note("what %s, a voter, sends %s, the leader, is lost", voter.id, lead.id)
	s.setCut(voter.name, lead.name, true)
	sr := &selfRemoval{lead: lead, voter: voter}
	s.sr = sr
	s.extendEnd(int64(10 * time.Second))
	s.at(int64(6*time.Second), func() {
		if !sr.fired {
			s.setCut(voter.name, lead.name, false)
			s.note("%s was not removed; %s reaches %s again", voter.id, voter.id, lead.id)
		}
	})
}

// aimSelfRemoval, under FaultSelfRemoval, looks at the raft messages m
// is about to send, and returns those to send. The leader's append of
// the voter's removal to that voter fires the fault: the leader pauses
// for 1.25-2 Liveness, this one append going out and the rest of the
// batch lost. It also notes the voter applying its own removal in the
// term it leads (Result.SelfRemoved).
func (s *sim) aimSelfRemoval(m *member, msgs []*pb.Message) []*pb.Message {
	sr := s.sr
	if m == sr.voter && sr.fired {
		if m.log.Leader() && m.log.Voter() {
			sr.ledTerm = m.log.Term()
		}
		if !sr.reached && sr.ledTerm != 0 && !m.log.Voter() && m.log.Term() == sr.ledTerm {
			sr.reached = true
			what := "and steps down"
			if m.log.Leader() {
				what = "and leads on"
			}
			s.note("%s, leading in term %d, applied its own removal %s", m.id, sr.ledTerm, what)
		}
	}
	if sr.fired || m != sr.lead || m.crashed || !m.log.Leader() {
		return msgs
	}
	to := sr.voter.raftID
	if !slices.ContainsFunc(msgs, func(msg *pb.Message) bool { return msg.GetTo() == to && removes(msg, to) }) {
		return msgs
	}
	sr.fired = true
	d := int64(s.o.Liveness)*5/4 + s.rng.Int64N(int64(s.o.Liveness)*3/4)
	m.paused = s.now + d
	s.note("%s, the leader, pauses for %v as its append of %s's removal has gone out to %s alone", m.id, time.Duration(d), sr.voter.id, sr.voter.id)
	s.extendEnd(d + int64(2*time.Second) + s.endedWithin())
	s.at(d, func() {
		s.setCut(sr.voter.name, m.name, false)
		s.note("%s reaches %s again", sr.voter.id, m.id)
	})
	s.at(d+int64(500*time.Millisecond)+s.rng.Int64N(int64(time.Second)), func() {
		if h := s.holderBesides(m, sr.voter); h != nil {
			s.note("crash %s, a holder", h.id)
			s.crash(h, false)
		}
	})
	var keep []*pb.Message
	for _, msg := range msgs {
		if msg.GetTo() == to {
			keep = append(keep, msg)
		}
	}
	return keep
}

// removes reports whether msg is an append carrying the removal of raft
// member id.
func removes(msg *pb.Message, id uint64) bool {
	if msg.GetType() != pb.MsgApp {
		return false
	}
	for _, e := range msg.GetEntries() {
		if e.GetType() != pb.EntryConfChange {
			continue
		}
		cc := &pb.ConfChange{}
		if proto.Unmarshal(e.GetData(), cc) == nil && cc.GetType() == pb.ConfChangeRemoveNode && cc.GetNodeId() == id {
			return true
		}
	}
	return false
}

// holderBesides returns a running member other than a and b that holds
// a partition, one that does not vote first (a removed leader that leads
// on keeps its heartbeats answered by a majority of the others only while
// they all run), and of those the first key's holder first (nil: none).
func (s *sim) holderBesides(a, b *member) *member {
	var pick *member
	for _, m := range append([]*member{s.target()}, s.all...) {
		if held, _ := m.own.Depends(); m == a || m == b || m.crashed || held == 0 {
			continue
		}
		if !m.log.Voter() {
			return m
		}
		if pick == nil {
			pick = m
		}
	}
	return pick
}

// besideLeader returns the first member in ID order, other than lead,
// that ok accepts (nil: no leader, or none).
func (s *sim) besideLeader(lead *member, ok func(*member) bool) *member {
	if lead == nil {
		return nil
	}
	for _, id := range s.sortedIDs() {
		if m := s.members[id]; m != lead && ok(m) {
			return m
		}
	}
	return nil
}
