package sim

import (
	"slices"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/ownlog"
	pb "go.etcd.io/raft/v3/raftpb"
)

// FaultKeepAliveCut aims FaultLeaderSplit's cut at the instant that has
// a cut-off leader take a keep-alive late. The log's leader and a holder
// are cut off from everyone else, both ways, for 6-10 s: one fault. The
// leader believes it leads until CheckQuorum steps it down, one or two
// election timeouts into the cut, while the other side's new leader
// counts its wait from when its voters last heard the old one, the cut:
// a grant on the old leader's belief outlasts that wait when the
// keep-alive went out late enough into the cut (a holder counts
// HolderShare of a Liveness from its sending, less the clock margin). FaultLeaderSplit cuts at a random instant and leaves the
// holder's keep-alive cadence to chance (0 of 60 schedules got one in);
// this cut is timed by the holder's keep-alives (aimKeepAliveCut).
//
// Of three voters the holder is one that does not vote (a voter and the
// leader would still be a quorum): 227 of 300 schedules reach the state,
// and MutKeepAliveUnconfirmed (grants without a read) is caught in 9 of
// the first 20, the first at once. Of five voters it is a voter, its
// keep-alives riding its heartbeat answers: 167 of 300 reach it (the rest
// cut off a leader that steps down before the keep-alive comes), and
// MutCarrierIsQuorum (grants on that answer alone) is caught in 4 of 20,
// the first at the fourth. Cut when the fault starts instead, untimed,
// 14 of 40 reach it of three voters, and the mutants are caught in 3
// and 1 of 20.

// keepAliveCut is FaultKeepAliveCut's aim and what came of it.
type keepAliveCut struct {
	lead, holder *member
	cutAt        int64 // virtual ns the cut began (0: not yet)
	// reached: the holder sent the cut-off leader, still leading, a
	// keep-alive a fifth of a Liveness or more into the cut.
	reached bool
}

// keepAliveCutFault starts FaultKeepAliveCut: it picks the leader and a
// holder (keepAliveHolder), and waits for the holder's next keep-alive.
func (s *sim) keepAliveCutFault() {
	lead := s.leader()
	h := s.keepAliveHolder(lead)
	if h == nil {
		s.note("no leader, or no holder beside it of the kind sought")
		return
	}
	s.kc = &keepAliveCut{lead: lead, holder: h}
	s.extendEnd(int64(12 * time.Second))
	s.note("wait for %s's keep-alive to %s, the leader", h.id, lead.id)
}

// aimKeepAliveCut, under FaultKeepAliveCut, looks at the raft messages m
// is about to send. The holder's first keep-alive starts the cut. A
// learner's goes to its relay, a voter that does not lead: the cut begins
// at once and loses it, and the holder sends it again every
// KeepAliveRetry, now to the leader itself. A voter's (five voters) rides
// its heartbeat answer to the leader, which takes it: the cut begins a
// quarter of a Liveness later, so that the next comes well into it.
// Keep-alives sent to the leader while it still leads, a fifth of a
// Liveness or more into the cut, are the state the fault is for.
func (s *sim) aimKeepAliveCut(m *member, msgs []*pb.Message) {
	kc := s.kc
	if m != kc.holder || m.crashed || !slices.ContainsFunc(msgs, ownlog.CarriesRequests) {
		return
	}
	if kc.cutAt == 0 {
		kc.cutAt = -1
		after := int64(0)
		if m.log.Voter() {
			after = int64(s.o.Liveness) / 4
		}
		cut := func() {
			if kc.lead.crashed || !kc.lead.log.Leader() {
				s.note("%s no longer leads: no cut", kc.lead.id)
				return
			}
			kc.cutAt = s.now
			small := []string{kc.lead.name, kc.holder.name}
			d := int64(6*time.Second) + s.rng.Int64N(int64(4*time.Second))
			s.note("split %v (leader %s and holder %s) | rest for %v, %v after a keep-alive of %s", small, kc.lead.id, kc.holder.id, time.Duration(d), time.Duration(after), m.id)
			s.split(small, true)
			s.at(d, func() {
				s.split(small, false)
				s.note("heal split")
			})
		}
		if after == 0 {
			cut() // before this keep-alive goes out, which is lost
		} else {
			s.at(after, cut)
		}
		return
	}
	toLead := slices.ContainsFunc(msgs, func(msg *pb.Message) bool { return msg.GetTo() == kc.lead.raftID && ownlog.CarriesRequests(msg) })
	if kc.cutAt <= 0 || !toLead || !kc.lead.log.Leader() {
		return
	}
	into := s.now - kc.cutAt
	s.note("%s sends %s, still leading, a keep-alive %v into the cut", m.id, kc.lead.id, time.Duration(into))
	if into >= int64(s.o.Liveness)/5 {
		kc.reached = true
	}
}

// keepAliveHolder picks FaultKeepAliveCut's holder besides lead, the first
// key's first: of three voters one that does not vote (a voter and the
// leader would be a quorum), of more a voter, whose keep-alives ride its
// heartbeat answers to the leader (nil: none).
func (s *sim) keepAliveHolder(lead *member) *member {
	if lead == nil {
		return nil
	}
	for _, m := range append([]*member{s.target()}, s.all...) {
		if held, _ := m.own.Depends(); m != lead && !m.crashed && held > 0 && m.log.Voter() == (s.o.Voters > 3) {
			return m
		}
	}
	return nil
}
