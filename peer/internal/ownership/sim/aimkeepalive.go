package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/ownership"
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
// HolderShare of a Liveness from its sending, less the clock margin).
// FaultLeaderSplit cuts at a random instant and leaves the holder's
// keep-alive cadence to chance (0 of 60 schedules got one in).
//
// Of three voters the holder is one that does not vote (a voter and the
// leader would still be a quorum), and the cut comes as its keep-alive
// goes out: 227 of 300 schedules reach the state, and
// MutKeepAliveUnconfirmed (grants without a read) is caught in 9 of the
// first 20, the first at once. Of five voters the holder is a voter, its
// keep-alives riding its heartbeat answers, and the cut comes after the
// leader's first heartbeat since a CheckQuorum, which leaves it leading
// longest, when a voter's keep-alive is due in time (keepAliveCutAt):
// 299 of 300 reach the state (timed by the keep-alive alone, a quarter of
// a Liveness after one, 167 did: the leader often stepped down first),
// and MutCarrierIsQuorum (grants on that answer alone) is caught in 11 of
// the first 20 (that aim: 4), the first at the fourth. Cut when the fault
// starts instead, 122 and 160 of 300 reach it (three and five voters),
// and the mutants are caught in 3 and 1 of 20.

// keepAliveCut is FaultKeepAliveCut's aim and what came of it.
type keepAliveCut struct {
	lead   *member
	holder *member // of five voters chosen at the cut (nil till then)
	start  int64   // virtual ns the fault started
	cutAt  int64   // virtual ns the cut began (0: not yet; -1: never)
	// Five voters: checkAt is when the leader last ran CheckQuorum, armed
	// till its first heartbeat since; next is each voter's mono ns from
	// which its next keep-alive goes (0: not known), lease its lease as
	// last seen (nil maps: three voters).
	checkAt     int64
	armed       bool
	next, lease map[*member]int64
	// reached: the holder sent the cut-off leader, still leading, a
	// keep-alive a fifth of a Liveness or more into the cut.
	reached bool
}

// keepAliveCutFault starts FaultKeepAliveCut. Of three voters it picks
// the holder (keepAliveHolder) and waits for its next keep-alive; of
// five it waits for the leader's CheckQuorum (keepAliveCutAt).
func (s *sim) keepAliveCutFault() {
	lead := s.leader()
	h := s.keepAliveHolder(lead)
	if h == nil {
		s.note("no leader, or no holder beside it of the kind sought")
		return
	}
	kc := &keepAliveCut{lead: lead, start: s.now}
	if h.log.Voter() {
		kc.next, kc.lease = map[*member]int64{}, map[*member]int64{}
		s.note("wait for %s's heartbeat after a CheckQuorum", lead.id)
	} else {
		kc.holder = h
		s.note("wait for %s's keep-alive to %s, the leader", h.id, lead.id)
	}
	s.kc = kc
	s.extendEnd(int64(12 * time.Second))
}

// aimKeepAliveCut, under FaultKeepAliveCut, looks at the raft messages m
// is about to send. A learner's first keep-alive starts the cut: it goes
// to its relay, a voter that does not lead, and is lost, and the learner
// sends it again every KeepAliveRetry, now to the leader itself. Of five
// voters, the leader's first heartbeat since a CheckQuorum starts it once
// the answers are in, if a voter's keep-alive then comes in time
// (keepAliveCutAt); a voter's lease tells when it sent the keep-alive
// last granted, and so when the next goes (nextKeepAlive). Keep-alives
// sent to the leader while it still leads, a fifth of a Liveness or more
// into the cut, are the state the fault is for.
func (s *sim) aimKeepAliveCut(m *member, msgs []*pb.Message) {
	kc := s.kc
	if m.crashed {
		return
	}
	if kc.cutAt == 0 {
		switch {
		case kc.next == nil:
			if m == kc.holder && slices.ContainsFunc(msgs, ownlog.CarriesRequests) {
				s.cutLeader("as a keep-alive of " + m.id + " goes out") // which is lost
			}
		case m == kc.lead:
			voters := 0
			for _, msg := range msgs {
				if to := s.byRaft[msg.GetTo()]; to != nil && to.log.Voter() && (msg.GetType() == pb.MsgHeartbeat || msg.GetType() == pb.MsgApp) {
					voters++
				}
			}
			if kc.armed && voters >= 2 {
				kc.armed = false
				s.at(cutSettle, s.keepAliveCutAt)
			}
		case m.log.Voter():
			s.nextKeepAlive(m)
		}
		return
	}
	toLead := slices.ContainsFunc(msgs, func(msg *pb.Message) bool { return msg.GetTo() == kc.lead.raftID && ownlog.CarriesRequests(msg) })
	if m != kc.holder || kc.cutAt <= 0 || !toLead || !kc.lead.log.Leader() {
		return
	}
	into := s.now - kc.cutAt
	s.note("%s sends %s, still leading, a keep-alive %v into the cut", m.id, kc.lead.id, time.Duration(into))
	if into >= int64(s.o.Liveness)/5 {
		kc.reached = true
	}
}

// cutSettle is how long after the leader's heartbeat the cut comes: its
// answers are in (messages take up to a few ms).
const cutSettle = int64(10 * time.Millisecond)

// keepAliveCutTick, under FaultKeepAliveCut, runs before each raft tick
// of m: it counts m's ticks since it became leader, and on the leader's
// ticks that run CheckQuorum (one an election timeout) arms the cut.
func (s *sim) keepAliveCutTick(m *member) {
	if t := m.log.Term(); m.log.Leader() && t != m.ledTerm {
		m.ledTerm, m.ledTicks = t, 0
	}
	m.ledTicks++
	kc := s.kc
	if kc == nil || kc.next == nil || m != kc.lead || kc.cutAt != 0 || !m.log.Leader() {
		return
	}
	if _, election := s.raftTicks(); m.ledTicks%election == 0 {
		kc.checkAt, kc.armed = s.now, true
	}
}

// keepAliveCutAt, of five voters, runs as the answers to the leader's
// first heartbeat since a CheckQuorum are in. The leader steps down at
// its second CheckQuorum from that one (the first counts these answers),
// the longest it can lead into a cut. It cuts now if a voter's next
// keep-alive then goes to the leader a fifth of a Liveness or more into
// the cut and a heartbeat interval and a half before that step, or, lost
// in the cut, its retry does; that voter is the holder. Else it waits for
// the next CheckQuorum, 6 s at most, then cuts with keepAliveHolder's.
func (s *sim) keepAliveCutAt() {
	kc, lead := s.kc, s.kc.lead
	if kc.cutAt != 0 || lead.crashed || !lead.log.Leader() {
		return
	}
	beat, election := s.raftTicks()
	d := int64(float64(tick) / lead.rate)
	down := kc.checkAt + 2*int64(election)*d
	lo, hi := s.now+int64(s.o.Liveness)/5, down-int64(beat)*d*3/2
	_, retry := s.keepAliveEvery()
	var pick *member
	how := ""
	for _, try := range []string{"its keep-alive", "the retry of its keep-alive"} {
		for _, m := range append([]*member{s.target()}, s.all...) {
			next := kc.next[m]
			if held, _ := m.own.Depends(); pick != nil || m == lead || m.crashed || !m.log.Voter() || held == 0 || next == 0 {
				continue
			}
			from, to := m.goes(next), m.tickFrom(next)
			if from <= s.now {
				continue
			}
			if try != "its keep-alive" {
				from, to = m.goes(m.monoAt(from)+int64(retry)), m.tickFrom(m.monoAt(to)+int64(retry))
			}
			if from >= lo && to <= hi {
				pick, how = m, fmt.Sprintf("%s due %v-%v into the cut", try, time.Duration(from-s.now), time.Duration(to-s.now))
			}
		}
	}
	if pick == nil {
		if s.now-kc.start < int64(6*time.Second) {
			return
		}
		if pick, how = s.keepAliveHolder(lead), "no keep-alive due in time"; pick == nil {
			kc.cutAt = -1
			s.note("no holder beside %s: no cut", lead.id)
			return
		}
	}
	kc.holder = pick
	s.cutLeader(fmt.Sprintf("%v after %s's first heartbeat since a CheckQuorum, %s", time.Duration(cutSettle), lead.id, how))
}

// nextKeepAlive notes, when the lease of m, a voter, has moved, from when
// m sends its next keep-alive: ExtendEvery after the one granted, when
// the grant came before a retry was due (KeepAliveRetry). A lease runs
// HolderShare of a Liveness from its keep-alive's sending (ownership's
// KeptAlive).
func (s *sim) nextKeepAlive(m *member) {
	kc := s.kc
	lease := m.own.LiveUntil()
	if lease == kc.lease[m] {
		return
	}
	kc.lease[m] = lease
	every, retry := s.keepAliveEvery()
	sent := lease - int64(float64(s.o.Liveness)*ownership.HolderShare)
	kc.next[m] = 0
	if m.mono() < sent+int64(retry) {
		kc.next[m] = sent + int64(every)
	}
}

// keepAliveEvery returns the members' ExtendEvery and KeepAliveRetry,
// as the machine defaults them.
func (s *sim) keepAliveEvery() (every, retry time.Duration) {
	every = s.o.ExtendEvery
	if every == 0 {
		every = s.o.Liveness / 2
	}
	return every, min(s.o.Liveness/5, every)
}

// goes returns the virtual time m's clock reaches mono: a keep-alive due
// then goes at m's next periodic step, a poke or at the latest a tick
// (tickFrom).
func (m *member) goes(mono int64) int64 {
	return m.born + int64(float64(mono)/m.rate) + 1
}

// tickFrom returns the virtual time of m's first tick at or after mono
// on m's clock (schedTick: one every tick/rate from its start).
func (m *member) tickFrom(mono int64) int64 {
	d := int64(float64(tick) / m.rate)
	n := max(int64(float64(mono)/m.rate)/d-1, 0)
	for m.monoAt(m.born+n*d) < mono {
		n++
	}
	return m.born + n*d
}

// cutLeader cuts the leader and the holder off from the rest, both ways,
// for 6-10 s; why says when.
func (s *sim) cutLeader(why string) {
	kc := s.kc
	if kc.lead.crashed || !kc.lead.log.Leader() {
		kc.cutAt = -1
		s.note("%s no longer leads: no cut", kc.lead.id)
		return
	}
	kc.cutAt = s.now
	small := []string{kc.lead.name, kc.holder.name}
	d := int64(6*time.Second) + s.rng.Int64N(int64(4*time.Second))
	s.note("split %v (leader %s and holder %s) | rest for %v, %s", small, kc.lead.id, kc.holder.id, time.Duration(d), why)
	s.split(small, true)
	s.extendEnd(d)
	s.at(d, func() {
		s.split(small, false)
		s.note("heal split")
	})
}

// keepAliveHolder picks FaultKeepAliveCut's holder besides lead, the first
// key's first: of three voters one that does not vote (a voter and the
// leader would be a quorum), of more a voter, whose keep-alives ride its
// heartbeat answers to the leader (nil: none). Of five voters
// keepAliveCutAt picks another voter whose keep-alive is due in time.
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
