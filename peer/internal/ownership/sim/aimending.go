package sim

import (
	"slices"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/ownership"
	"github.com/ringlimit/ringlimit/peer/internal/ownlog"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// FaultEndingRace races a holder's keep-alive against the End of its
// liveness: the leader must grant no keep-alive of a member whose End it
// has proposed and not yet applied (session.go of package ownership). A
// grant then extends a lease the End is about to hand on, and a holder
// that applies the End after its backup decides beside it.
//
// The window lasts a round trip, from the End's proposal to its commit,
// so the fault is aimed, as FaultSelfRemoval's pause. It is one link
// failing, the one between a voter that holds a partition and the
// leader: what the voter sends the leader is lost, but for its heartbeat
// answers that carry keep-alives (the last request in a socket's
// buffer), which wait. Its session lapses and the leader ends it; the
// instant the leader's append of that End goes out, the link heals and
// the waiting answers arrive, a round trip before the End commits: a
// voter's answer confirms what it carries by itself (ownlog's
// carrierConfirms), so the leader takes the keep-alive at once while the
// End is pending. The holder's newest keep-alive is at most a retry old,
// so a grant would extend its lease well past the End. The link's other
// way then stalls its appends (etcd's transport sends them on a stream
// of their own, apart from heartbeats) for 0.25-0.5 Liveness: the
// holder applies the End after its backup has taken over, as a slow
// holder may. Keeping the rule, the grant is refused and the holder's
// lease, lapsed before the End was proposed, stays lapsed: 300 of 300
// schedules pass, each reaching the state. With the rule broken
// (MutKeepAliveWhileEnding) 35 of the first 40 show two members deciding
// at once. Without the aim (the waiting keep-alives lost) none of 40
// reaches it; without the stall the holder applies the End as the answer
// reaches it, and none of 40 is caught.
//
// MutEndIgnoresVersion is not reached by it (0 of 40): an extension that
// moves a record's version is a command only when a member activates at
// an epoch (keep-alives never reach the log), and the leader ends an
// inactive member only once gossip says it is gone, when it extends no
// more.

// endingRace is FaultEndingRace's aim and what came of it.
type endingRace struct {
	lead, holder *member
	held         []*pb.Message // the holder's answers to lead that carry keep-alives, waiting
	holding      bool          // the holder's keep-alives to lead wait
	fired        bool          // lead's append of the holder's End went out
	epoch        uint64        // the holder's epoch that End names
	backups      []string      // the backups of what the holder held then
	until        int64         // appends from lead to the holder stall until then
	// taken: lead took a waiting keep-alive while the End was pending
	// there; answered: it answered the holder before the holder applied
	// the End; backupAt, holderAt: when a backup and the holder applied
	// the End (0: not yet).
	taken, answered    bool
	backupAt, holderAt int64
}

// reached reports whether the run reached the state the fault is for:
// the leader took the holder's keep-alive while its End was pending and
// answered it, and the holder applied the End after the answer and after
// a backup did.
func (er *endingRace) reached() bool {
	return er != nil && er.taken && er.answered && er.backupAt > 0 && (er.holderAt == 0 || er.holderAt > er.backupAt)
}

// endingRaceFault starts FaultEndingRace: the first voter (in ID order)
// other than the leader that holds a partition no longer reaches the
// leader. If its End has not gone out within 3 Livenesses, the link
// heals and nothing more happens.
func (s *sim) endingRaceFault() {
	lead := s.leader()
	holder := s.besideLeader(lead, func(m *member) bool {
		held, _ := m.own.Depends()
		return !m.crashed && m.log.Voter() && held > 0
	})
	if holder == nil {
		s.note("no leader, or no voter beside it that holds a partition")
		return
	}
	s.note("the keep-alives %s, a voter and holder, sends %s, the leader, wait", holder.id, lead.id)
	er := &endingRace{lead: lead, holder: holder, holding: true}
	s.er = er
	s.extendEnd(int64(4 * s.o.Liveness))
	s.at(int64(3*s.o.Liveness), func() {
		if !er.fired {
			er.held, er.holding = nil, false
			s.note("%s was not ended; its keep-alives go again, the waiting ones lost", holder.id)
		}
	})
}

// aimEndingRace, under FaultEndingRace, looks at the raft messages m is
// about to send and returns those to send now. The holder's answers to
// the leader that carry keep-alives wait; the leader's append of the
// holder's End fires the fault. It also notes who applied that End when.
func (s *sim) aimEndingRace(m *member, msgs []*pb.Message) []*pb.Message {
	er := s.er
	if er.fired {
		s.noteEndApplied(m)
	}
	if m == er.holder && er.holding {
		var now []*pb.Message
		for _, msg := range msgs {
			if msg.GetTo() != er.lead.raftID || !ownlog.CarriesRequests(msg) {
				now = append(now, msg)
				continue
			}
			er.held = append(er.held, msg)
			if len(er.held) > 8 {
				er.held = er.held[1:] // lost
			}
		}
		return now
	}
	if m != er.lead || m.crashed || !m.log.Leader() {
		return msgs
	}
	if !er.fired {
		e, ok := endOf(msgs, er.holder.id)
		if !ok {
			return msgs
		}
		s.fireEndingRace(e)
	}
	if er.holderAt == 0 && slices.ContainsFunc(msgs, func(msg *pb.Message) bool {
		return msg.GetTo() == er.holder.raftID && ownlog.CarriesAnswers(msg)
	}) {
		er.answered = true
	}
	if s.now >= er.until {
		return msgs
	}
	// The stalled stream: appends to the holder arrive at until, in order.
	var now []*pb.Message
	for _, msg := range msgs {
		if msg.GetTo() != er.holder.raftID || msg.GetType() != pb.MsgApp {
			now = append(now, msg)
			continue
		}
		s.deliverAt(er.until, m, er.holder, msg)
	}
	return now
}

// fireEndingRace heals the holder's link to the leader, whose append of
// the holder's End at epoch has just gone out, lets the waiting answers
// arrive and stalls the leader's appends to the holder.
func (s *sim) fireEndingRace(epoch uint64) {
	er := s.er
	er.fired, er.epoch = true, epoch
	for _, pt := range er.lead.own.Table().Parts {
		if pt.Holder == er.holder.id && pt.Backup != "" && !slices.Contains(er.backups, pt.Backup) {
			er.backups = append(er.backups, pt.Backup)
		}
	}
	d := int64(s.o.Liveness)/4 + s.rng.Int64N(int64(s.o.Liveness)/4)
	er.until = s.now + d
	er.holding = false
	s.note("%s proposed %s's End; %d keep-alive answers arrive, appends to %s stall for %v", er.lead.id, er.holder.id, len(er.held), er.holder.id, time.Duration(d))
	s.extendEnd(d + int64(2*s.o.Liveness))
	for _, msg := range er.held {
		lead := er.lead
		s.deliverAt(s.now+int64(100*time.Microsecond), er.holder, lead, msg)
		s.at(int64(100*time.Microsecond), func() {
			if rec := lead.own.Table().Members[er.holder.id]; !er.taken && !lead.crashed && lead.log.Leader() && rec != nil && rec.Epoch == epoch {
				er.taken = true
			}
		})
	}
	er.held = nil
}

// noteEndApplied notes when m, a backup of the holder's or the holder,
// has applied the holder's End.
func (s *sim) noteEndApplied(m *member) {
	er := s.er
	rec := m.own.Table().Members[er.holder.id]
	if rec == nil || rec.Epoch == er.epoch && !rec.Ended {
		return
	}
	switch {
	case m == er.holder && er.holderAt == 0:
		er.holderAt = s.now
		s.note("%s applied its own End", m.id)
	case er.backupAt == 0 && slices.Contains(er.backups, m.id):
		er.backupAt = s.now
		s.note("%s, a backup of %s's, applied its End", m.id, er.holder.id)
	}
}

// endOf returns the epoch of an End of member id that one of msgs, an
// append, carries.
func endOf(msgs []*pb.Message, id string) (uint64, bool) {
	for _, msg := range msgs {
		if msg.GetType() != pb.MsgApp {
			continue
		}
		for _, e := range msg.GetEntries() {
			if e.GetType() != pb.EntryNormal || len(e.GetData()) == 0 {
				continue
			}
			if c, err := ownership.Decode(e.GetData()); err == nil && c.Kind == ownership.End && c.Member == id {
				return c.Epoch, true
			}
		}
	}
	return 0, false
}

// deliverAt carries msg from one member to another, arriving at at.
func (s *sim) deliverAt(at int64, from, to *member, msg *pb.Message) {
	wire, err := proto.Marshal(msg)
	if err != nil {
		panic(err)
	}
	s.messages++
	s.sent(Raft, from, len(wire))
	s.at(max(at-s.now, 0), func() {
		s.deliver(to, func() {
			s.received(Raft, to, len(wire))
			in := &pb.Message{}
			if err := proto.Unmarshal(wire, in); err != nil {
				panic(err)
			}
			to.carry(to.log.Step(in, to.mono()))
		})
	})
}
