package sim

import (
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/ownlog"
	pb "go.etcd.io/raft/v3/raftpb"
)

// FaultKeepAliveCut aims FaultLeaderSplit's cut at the instant that makes
// a cut-off leader take a keep-alive late: the log's leader and a holder
// that does not vote (of three voters, a voter and the leader would still
// be a quorum) are cut off from everyone else, both ways, for 6-10 s, a
// single fault. The cut is timed by the holder's keep-alives: it comes
// 250 ms after one goes out to the leader, so the next one goes out 750
// ms into the cut (ExtendEvery later), past the tenth of a Liveness by
// which a grant then outlasts the other side's wait, while the leader may
// still believe it leads (CheckQuorum steps it down one or two election
// timeouts into the cut). It must grant nothing it cannot confirm
// (MutKeepAliveUnconfirmed); the other side elects a leader that ends the
// holder, and its backup takes over.

// keepAliveCut is FaultKeepAliveCut's aim and what came of it.
type keepAliveCut struct {
	lead, holder *member
	cutAt        int64 // virtual ns the cut began (0: not yet)
	// reached: the holder sent the cut-off leader a keep-alive while it
	// still led and another member led in a later term.
	reached bool
}

// keepAliveCutFault starts FaultKeepAliveCut: it picks the leader and a
// holder that does not vote, and waits for the holder's next keep-alive.
func (s *sim) keepAliveCutFault() {
	lead := s.leader()
	var h *member
	if lead != nil {
		h = s.holderBesides(lead, lead)
	}
	if h == nil || h.log.Voter() {
		s.note("no leader, or no holder beside it that does not vote")
		return
	}
	s.kc = &keepAliveCut{lead: lead, holder: h}
	s.extendEnd(int64(12 * time.Second))
	s.note("wait for %s's keep-alive to %s, the leader", h.id, lead.id)
}

// aimKeepAliveCut, under FaultKeepAliveCut, looks at the raft messages m
// is about to send. The holder's first keep-alive (to its relay, a voter
// that does not lead) starts the cut at once, so that it is lost: the
// holder sends it again every KeepAliveRetry, now to the leader itself.
// Those the leader gets while it still leads, sent far enough into the
// cut, are the state the fault is for.
func (s *sim) aimKeepAliveCut(m *member, msgs []*pb.Message) {
	kc := s.kc
	if m != kc.holder || m.crashed {
		return
	}
	var to uint64
	for _, msg := range msgs {
		if ownlog.IsKeepAlive(msg) && msg.GetType() == pb.MsgReadIndex {
			to = msg.GetTo()
		}
	}
	if to == 0 {
		return
	}
	if kc.cutAt == 0 {
		if kc.lead.crashed || !kc.lead.log.Leader() {
			s.note("%s no longer leads: no cut", kc.lead.id)
			kc.cutAt = -1
			return
		}
		kc.cutAt = s.now
		small := []string{kc.lead.name, kc.holder.name}
		d := int64(6*time.Second) + s.rng.Int64N(int64(4*time.Second))
		s.note("split %v (leader %s and holder %s) | rest for %v as %s sends a keep-alive", small, kc.lead.id, kc.holder.id, time.Duration(d), m.id)
		s.split(small, true)
		s.at(d, func() {
			s.split(small, false)
			s.note("heal split")
		})
		return
	}
	if kc.cutAt <= 0 || to != kc.lead.raftID || !kc.lead.log.Leader() {
		return
	}
	into := s.now - kc.cutAt
	s.note("%s sends %s, still leading, a keep-alive %v into the cut", m.id, kc.lead.id, time.Duration(into))
	if into >= int64(s.o.Liveness)/5 {
		kc.reached = true
	}
}
