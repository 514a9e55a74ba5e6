package sim

import (
	"fmt"
	"slices"
	"time"
)

// This file is the oracles beside the windows. The windows alone miss a
// stale holder whenever its decisions happen to fit under the limit, or
// whenever replication refuses its work; so every holder's decision is
// recorded with its member, partition, partition epoch and the true
// (virtual) time, and every admission with the policy it was replicated
// under, and a run fails when:
//
//   - two members decided for one partition at overlapping instants of
//     true time (the invariant leases exist to keep);
//   - a new decider's state lacked an admission that was acknowledged
//     under sync, or that a move (not a takeover) should have carried;
//   - it lacked an async admission made more than ReplicaTimeout before
//     its holder stopped deciding: more than what was in flight;
//   - it lacked an admission after an aged grant that could still count
//     in a window;
//   - a crashed member's liveness was still active in every running
//     member's table endedWithin after the crash (checkEnded).
//
// Losses within those bounds (async in flight, off, a counted restart
// after a double fault) are allowed, counted, and added to their key's
// limit for the window checker: a key may go over by exactly what was
// lost, never more.

// probeEvery is how often (true time) the authority probe asks every
// running member whether it may decide for each partition.
const probeEvery = 5 * time.Millisecond

// probe asks every running member, for every partition, whether it may
// decide now (the decision path's one question), and records a
// partition two members may decide for at the same instant: a stale
// holder shows even when no client happened to ask it, and even when
// replication would refuse its work. A paused member is not asked: it
// decides nothing until it runs, and then asks with its clock moved on.
func (s *sim) probe() {
	if s.now > s.end {
		return
	}
	// Each member is asked only for the partitions its table names it
	// holder of (candidates): no other may answer yes.
	who, touched := s.who, s.touched[:0]
	if who == nil {
		who = make([][]string, s.o.Partitions)
		s.who = who
	}
	for _, id := range s.sortedIDs() {
		m := s.members[id]
		if m.crashed || m.paused > s.now {
			continue
		}
		for _, p := range m.candidates() {
			if m.mayDecide(p) {
				if len(who[p]) == 0 {
					touched = append(touched, p)
				}
				who[p] = append(who[p], id)
			}
		}
	}
	slices.Sort(touched)
	for _, p := range touched {
		if len(who[p]) > 1 {
			s.overlaps++
			if len(s.overlapAt) < 3 {
				s.overlapAt = append(s.overlapAt, fmt.Sprintf("p%d: %v may all decide at %v", p, who[p], dur(s.now)))
			}
		}
		who[p] = who[p][:0]
	}
	s.touched = touched
	s.probes++
	if s.probes%10 == 0 {
		s.checkBackups()
	}
	s.at(int64(probeEvery), s.probe)
}

// checkBackups checks, for every partition whose holder may decide and
// whose backup has applied the same epoch and has its state, that the
// backup has every admission the holder acknowledged under sync and
// every async one no longer in flight: what a takeover would start
// from. A backup named with a stale copy shows here at once, not only
// if its holder happens to crash later.
func (s *sim) checkBackups() {
	for _, id := range s.sortedIDs() {
		h := s.members[id]
		if h.crashed || h.paused > s.now {
			continue
		}
		for _, p := range h.candidates() {
			if !h.mayDecide(p) {
				continue
			}
			bid, epoch := h.own.Backup(p)
			b := s.members[bid]
			if b == nil || b.crashed || b.own.Table().Parts[p].Epoch != epoch || !b.own.Has(p) {
				continue
			}
			for key, log := range h.stores[p] {
				for _, e := range log {
					a := s.adms[e.id]
					if a == nil || a.mode == ModeOff || h.policies[key].mode == ModeOff {
						continue
					}
					if _, ok := h.pending[e.id]; ok {
						continue
					}
					if _, ok := h.asyncPending[e.id]; ok {
						continue
					}
					if a.mode == ModeSync && !a.acked {
						continue // never acknowledged
					}
					if !slices.ContainsFunc(b.stores[p][key], func(x entry) bool { return x.id == e.id }) {
						s.stale++
						if len(s.staleAt) < 3 {
							s.staleAt = append(s.staleAt, fmt.Sprintf("p%d epoch %d: backup %s lacks %s admission %d of %s (by %s at %v) at %v",
								p, epoch, b.id, a.mode, e.id, key, a.by, dur(a.at), dur(s.now)))
						}
					}
				}
			}
		}
	}
}

// policyState is one key's policy in a member's table.
type policyState struct {
	present bool
	mode    Mode
}

// asyncItem is an async replica waiting for its backup's answer.
type asyncItem struct {
	p     int
	epoch uint64
}

// spanKey names one member's decisions for a partition at one epoch.
type spanKey struct {
	p      int
	member string
	epoch  uint64
}

// span is the true-time interval of one spanKey's decisions.
type span struct {
	first, last int64
	n           int
}

// admission is one admission a holder decided.
type admission struct {
	key      string
	p        int
	by       string
	epoch    uint64 // partition epoch
	liveness uint64 // the holder's liveness epoch
	at       int64  // true time
	mode     Mode
	op       int // index in ops (-1: not a client's)
	holder   *member
	// acked: the holder answered this admission admitted (one client
	// request may be decided twice, when the network duplicates it).
	acked bool
}

// loss is an admission a new decider's state lacked when it first decided.
type loss struct {
	a     *admission
	taker string
	at    int64
	// counted: the new decider's holding began with a counted restart
	// (a double fault's, outside the promise); aged: with an aged grant.
	counted, aged bool
	// ended: the admission's holder's liveness had ended when its state
	// was lost (a takeover, not a move).
	ended bool
	// mode is the stronger of the key's replication when it was
	// admitted and in its holder's table when it last decided for the
	// partition at that epoch: an admission made under off and raised to
	// sync since must be on the backup (the raise re-copies), one made
	// under async is then bound only by what was in flight.
	mode Mode
}

// decided records one decision of holder m for p at partition epoch e, at
// the true time now. A member's first decision at an epoch compares its
// state with every admission made before (lost).
func (s *sim) decided(m *member, p int, e uint64) {
	k := spanKey{p, m.id, e}
	sp := s.spans[k]
	if sp == nil {
		sp = &span{first: s.now}
		s.spans[k] = sp
		s.lost(m, p)
	}
	sp.last = s.now
	sp.n++
}

// admitted records an admission of key decided by m for the client's
// operation op.
func (s *sim) admitted(m *member, p int, e uint64, key string, id uint64, mode Mode, op int) *admission {
	le, _ := m.own.Table().Live(m.id)
	a := &admission{key: key, p: p, by: m.id, epoch: e, liveness: le, at: s.now, mode: mode, op: op, holder: m}
	s.adms[id] = a
	return a
}

// lost compares new decider m's state of p with every admission of p that
// could still count in a window, and records those it lacks.
func (s *sim) lost(m *member, p int) {
	pt := m.own.Table().Parts[p]
	counted := pt.Restarts > s.restarts[p]
	s.restarts[p] = pt.Restarts
	aged := pt.Aged > s.aged[p]
	s.aged[p] = pt.Aged
	have := map[uint64]bool{}
	for _, log := range m.stores[p] {
		for _, e := range log {
			have[e.id] = true
		}
	}
	// An admission no clock (rate ≤ 1 + RateBound) can have trimmed.
	horizon := s.now - int64(float64(s.o.Window)/(1+s.o.RateBound))
	ids := make([]uint64, 0)
	for id, a := range s.adms {
		if a.p == p && a.at > horizon && !have[id] && !s.lostSeen[id] {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	t := m.own.Table()
	for _, id := range ids {
		a := s.adms[id]
		s.lostSeen[id] = true
		rec := t.Members[a.by]
		ended := rec == nil || rec.Ended || rec.Epoch > a.liveness
		s.losses = append(s.losses, loss{a: a, taker: m.id, at: s.now, counted: counted, aged: aged, ended: ended, mode: a.mode})
	}
}

// checkOracles runs the oracles over the run's records: overlapping
// deciders and losses beyond their bounds. It fills the keys' slack.
func (s *sim) checkOracles() (bad []string, decisions int) {
	if s.stale > 0 {
		bad = append(bad, fmt.Sprintf("%d admissions a working backup lacked; first: %v", s.stale, s.staleAt))
	}
	if s.overlaps > 0 {
		bad = append(bad, fmt.Sprintf("%d probes found two members that may decide for one partition at once; first: %v", s.overlaps, s.overlapAt))
	}
	byP := map[int][]spanKey{}
	for k, sp := range s.spans {
		byP[k.p] = append(byP[k.p], k)
		decisions += sp.n
	}
	for p := range s.o.Partitions {
		ks := byP[p]
		slices.SortFunc(ks, func(a, b spanKey) int {
			if c := s.spans[a].first - s.spans[b].first; c != 0 {
				if c < 0 {
					return -1
				}
				return 1
			}
			return cmpStr(a.member, b.member)
		})
		for i, a := range ks {
			for _, b := range ks[i+1:] {
				if a.member == b.member {
					continue
				}
				x, y := s.spans[a], s.spans[b]
				if x.first <= y.last && y.first <= x.last {
					bad = append(bad, fmt.Sprintf("p%d decided by %s (epoch %d) in [%v, %v] and by %s (epoch %d) in [%v, %v]: two deciders at once",
						p, a.member, a.epoch, dur(x.first), dur(x.last), b.member, b.epoch, dur(y.first), dur(y.last)))
				}
			}
		}
	}
	for _, l := range s.losses {
		a := l.a
		stop := s.spans[spanKey{a.p, a.by, a.epoch}].last
		if st := a.holder.policies[a.key]; st.present && st.mode < l.mode && a.holder.policyAt[a.key] <= stop {
			l.mode = st.mode // ModeSync < ModeAsync < ModeOff
		}
		acked := a.acked
		what := fmt.Sprintf("%s admission of %s by %s at %v (p%d epoch %d, %s when lost), missing at %s's first decision at %v", a.mode, a.key, a.by, dur(a.at), a.p, a.epoch, l.mode, l.taker, dur(l.at))
		switch {
		case l.counted:
			// A double fault's restart: counted in Result.Lost, which
			// a single fault must never show; the windows may show
			// it too.
		case l.aged:
			bad = append(bad, what+": an aged grant restarted the partition while it could still count")
		case !l.ended:
			bad = append(bad, what+": lost without a takeover (a move or a backup change must carry it)")
		case l.mode == ModeSync:
			if acked {
				bad = append(bad, what+": acknowledged, and sync when lost")
			}
		case l.mode == ModeAsync:
			if a.at+int64(ReplicaTimeout)+int64(time.Millisecond) < stop {
				bad = append(bad, what+fmt.Sprintf(": more than in flight (its holder decided on until %v)", dur(stop)))
			}
			s.slack[a.key]++
			s.lostAsync++
		default:
			s.slack[a.key]++
			s.lostOff++
		}
	}
	return bad, decisions
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func dur(ns int64) time.Duration { return time.Duration(ns).Round(time.Microsecond) }

// endedWithin is how long after a crash the member's liveness may still
// be active (checkEnded), in virtual ns. DESIGN's price is the liveness's
// expiry and a commit; this allows a Liveness for the lease last granted
// to lapse, a Liveness for a new leader's wait when the leader went too
// (votes.go), four election timeouts for its election (a split vote
// doubles two), and a Liveness of margin for pauses and lost messages:
// 8 s at a 2 s Liveness.
func (s *sim) endedWithin() int64 {
	_, election := s.raftTicks()
	return int64(3*s.o.Liveness) + 4*int64(election)*int64(tick)
}

// checkEnded, endedWithin after c crashed, records c (Result.Unended)
// when every running member whose table has its record lists it active:
// no leader ended it, so what it held is unavailable and stays so. (A
// removed leader that kept leading did that: raft dropped its End while
// its heartbeats kept the others from electing another.) A member whose
// table does not know c yet has no say; a run with no member that knows
// it checks nothing, nor does a crash within endedWithin of the run's
// end, nor a fleet run (crash does not schedule it: each phase's settle
// check covers it). Double faults may leave c active (a lost majority
// ends nobody): the tests of them do not look at Result.Unended.
func (s *sim) checkEnded(c *member) {
	knows := 0
	for _, id := range s.sortedIDs() {
		rec := s.members[id].own.Table().Members[c.id]
		if rec == nil {
			continue
		}
		if rec.Ended || !rec.Active {
			return
		}
		knows++
	}
	if knows > 0 {
		s.unended = append(s.unended, fmt.Sprintf("%s crashed at %v and was still active in every running member's table at %v (%d know it)",
			c.id, dur(s.now-s.endedWithin()), dur(s.now), knows))
	}
}
