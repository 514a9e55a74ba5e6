package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/ownership"
)

// planFault schedules the run's one fault at a random instant after the
// warm-up, aimed where it hurts: at the holder (and backup) of the first
// key's partition as the table then names them.
func (s *sim) planFault(warm int64) {
	d := int64(s.o.Duration)
	at := warm + int64(time.Second) + s.rng.Int64N(max(d/2, 1))
	span := func(lo, hi time.Duration) int64 { return int64(lo) + s.rng.Int64N(int64(hi-lo)) }
	switch s.fault {
	case FaultDuplicate:
		s.dup = 0.3
		s.maxDelay = int64(20 * time.Millisecond) // and reorder
		s.note("duplicate 30%% of messages, delays up to 20ms, all run long")
		return
	}
	s.at(at-s.now, func() {
		victim := s.target()
		switch s.fault {
		case FaultCrash:
			if victim.log.Leader() {
				s.note("crash %s (it leads the log)", victim.id)
			} else {
				s.note("crash %s", victim.id)
			}
			s.crash(victim, false)
		case FaultLeaderCrash:
			if lead := s.leader(); lead != nil {
				s.note("crash %s, the leader", lead.id)
				s.leaderHeld, s.leaderAt = map[int]bool{}, s.now
				for p := range s.o.Partitions {
					if lead.own.Table().Holds(lead.id, p) {
						s.leaderHeld[p] = true
					}
				}
				s.crash(lead, false)
			}
		case FaultVoterCutCrash:
			s.voterCutCrash(victim, span)
		case FaultSelfRemoval:
			s.selfRemovalFault()
		case FaultEndingRace:
			s.endingRaceFault()
		case FaultKeepAliveCut:
			s.keepAliveCutFault()
		case FaultLateSetBackup:
			s.lateSetBackupFault()
		case FaultWholeRestart:
			s.wholeRestart(span)
		case FaultRestoredBackup:
			s.restoredBackup(victim, span)
		case FaultBehindBackup:
			s.behindBackup(victim, span)
		case FaultRestart:
			s.note("crash %s", victim.id)
			s.crash(victim, false)
			s.at(span(500*time.Millisecond, 5*time.Second), func() {
				m := s.start(victim.name, victim.inc+1, s.newRaftID(), nil)
				s.gone = append(s.gone, victim.id) // a later incarnation runs
				s.note("restart %s as %s", victim.id, m.id)
			})
		case FaultPause:
			d := span(time.Second, 40*time.Second)
			victim.paused = s.now + d
			s.note("pause %s for %v", victim.id, time.Duration(d))
			s.extendEnd(d)
		case FaultIsolate, FaultDeaf, FaultMute:
			d := span(time.Second, 15*time.Second)
			s.note("%s %s for %v", s.fault, victim.id, time.Duration(d))
			s.cutMember(victim.name, s.fault != FaultMute, s.fault != FaultDeaf, true)
			s.at(d, func() {
				s.cutMember(victim.name, true, true, false)
				s.note("heal %s", victim.id)
			})
		case FaultSplitRestart:
			d := span(3*time.Second, 15*time.Second)
			small := []string{victim.name}
			if b := s.backupOf(victim); b != nil && b.name != victim.name {
				small = append(small, b.name)
			}
			s.note("split %v | rest for %v", small, time.Duration(d))
			s.split(small, true)
			s.at(span(time.Second, time.Duration(d)), func() {
				s.note("crash %s", victim.id)
				s.crash(victim, false)
				m := s.start(victim.name, victim.inc+1, s.newRaftID(), nil)
				s.gone = append(s.gone, victim.id)
				s.note("restart %s as %s, in the split", victim.id, m.id)
			})
			s.at(d, func() {
				s.split(small, false)
				s.note("heal split")
			})
		case FaultSplit, FaultLongSplit:
			d := span(2*time.Second, 15*time.Second)
			if s.fault == FaultLongSplit {
				d = int64(s.o.FailedAfter) + span(time.Second, 15*time.Second)
				s.extendEnd(d)
			}
			small := []string{victim.name}
			if b := s.backupOf(victim); b != nil && b.name != victim.name {
				small = append(small, b.name)
			}
			s.note("split %v | rest for %v", small, time.Duration(d))
			s.split(small, true)
			s.at(d, func() {
				s.split(small, false)
				s.note("heal split")
			})
		case FaultLoss:
			d := span(2*time.Second, 10*time.Second)
			s.loss = 0.3
			s.note("lose 30%% of messages for %v", time.Duration(d))
			s.at(d, func() { s.loss = 0; s.note("loss ends") })
		case FaultDelay:
			d := span(2*time.Second, 10*time.Second)
			s.maxDelay = int64(1500 * time.Millisecond)
			s.note("delay messages up to 1.5s for %v", time.Duration(d))
			s.at(d, func() { s.maxDelay = int64(2 * time.Millisecond); s.note("delays end") })
		case FaultJoin:
			m := s.start(fmt.Sprintf("n%d", len(s.all)), 1, s.newRaftID(), nil)
			s.note("join %s", m.id)
		case FaultDouble:
			b := s.backupOf(victim)
			s.note("crash %s", victim.id)
			s.crash(victim, false)
			if b != nil && b != victim {
				s.note("crash %s, its backup", b.id)
				s.crash(b, false)
			}
		case FaultRaise:
			s.note("policy replication raised from off to each key's (the first key's to sync)")
			s.setPolicies(func(i int) policyState {
				if i == 0 {
					return policyState{present: true, mode: ModeSync}
				}
				return policyState{present: true, mode: s.o.mode(i)}
			})
			s.crashLater()
		case FaultReadd:
			s.note("policy of %s removed", s.keys[0])
			s.setPolicies(func(int) policyState { return policyState{} }, 0)
			s.at(span(300*time.Millisecond, time.Second), func() {
				m := s.start(fmt.Sprintf("n%d", len(s.all)), 1, s.newRaftID(), nil)
				s.note("join %s", m.id)
			})
			s.at(span(2*time.Second, 4*time.Second), func() {
				s.note("policy of %s added back with sync replication", s.keys[0])
				s.setPolicies(func(int) policyState { return policyState{present: true, mode: ModeSync} }, 0)
				s.crashLater()
			})
		case FaultLate:
			s.note("Move and SetBackup proposals held back 1.2-3s and everything heard up to 600ms late, for 10s")
			s.late = true
			for _, m := range s.all {
				s.slowIn[m.name] = int64(500 * time.Millisecond)
			}
			m := s.start(fmt.Sprintf("n%d", len(s.all)), 1, s.newRaftID(), nil)
			s.note("join %s", m.id)
			s.at(int64(10*time.Second), func() {
				s.late = false
				clear(s.slowIn)
				s.note("proposals and messages on time again")
				s.crashLater()
			})
		case FaultSlowCut:
			slow, d := span(300*time.Millisecond, 1500*time.Millisecond), span(2*time.Second, 5*time.Second)
			s.note("%s hears everything up to %v late for %v", victim.id, time.Duration(slow), time.Duration(d))
			s.slowIn[victim.name] = slow
			s.at(d, func() {
				delete(s.slowIn, victim.name)
				cut := span(3*time.Second, 10*time.Second)
				s.note("isolate %s for %v", victim.id, time.Duration(cut))
				s.cutMember(victim.name, true, true, true)
				s.at(cut, func() {
					s.cutMember(victim.name, true, true, false)
					s.note("heal %s", victim.id)
				})
			})
		case FaultStall:
			for _, id := range s.sortedIDs() {
				if m := s.members[id]; victim.log.Leader() && !m.log.Leader() {
					if held, _ := m.own.Depends(); held > 0 {
						victim = m
					}
				}
			}
			d := span(1700*time.Millisecond, 2700*time.Millisecond)
			s.note("what %s sends is held for %v; it hears up to 600ms late for 5s", victim.id, time.Duration(d))
			s.stallTo[victim.name] = s.now + d
			s.slowIn[victim.name] = int64(500 * time.Millisecond)
			s.at(int64(5*time.Second), func() {
				delete(s.slowIn, victim.name)
				delete(s.stallTo, victim.name)
			})
		case FaultLeaderSplit:
			lead := s.leader()
			if lead == nil || lead == victim {
				s.note("no leader apart from %s to cut off with it", victim.id)
				break
			}
			d := span(3*time.Second, 15*time.Second)
			small := []string{lead.name, victim.name}
			s.note("split %v (leader %s and holder %s) | rest for %v", small, lead.id, victim.id, time.Duration(d))
			s.split(small, true)
			s.at(d, func() {
				s.split(small, false)
				s.note("heal split")
			})
		case FaultLeaderChange:
			s.note("crash %s", victim.id)
			s.crash(victim, false)
			s.at(span(200*time.Millisecond, 2*time.Second), func() {
				if lead := s.leader(); lead != nil {
					s.note("crash %s, the leader", lead.id)
					s.crash(lead, false)
				}
			})
		case FaultLateAnswer:
			late := span(s.o.Liveness, 2*s.o.Liveness)
			s.note("keep-alive answers to %s arrive %v-%v late for 3s, then it is muted", victim.id, time.Duration(late), time.Duration(2*late))
			s.lateAnswer[victim.name] = late
			s.at(int64(3*time.Second), func() {
				delete(s.lateAnswer, victim.name)
				d := span(3*time.Second, 8*time.Second)
				s.note("mute %s for %v", victim.id, time.Duration(d))
				s.cutMember(victim.name, false, true, true)
				s.at(d, func() {
					s.cutMember(victim.name, false, true, false)
					s.note("heal %s", victim.id)
				})
			})
		case FaultLeaderPause:
			lead := s.leader()
			if lead == nil {
				s.note("no leader to pause")
				break
			}
			d := span(s.o.Liveness/2, 3*s.o.Liveness)
			lead.paused = s.now + d
			s.note("pause %s, the leader, for %v", lead.id, time.Duration(d))
			s.extendEnd(d)
		case FaultLateCopy:
			s.note("copies held back 1.2-3s for 10s")
			s.lateCopy = true
			m := s.start(fmt.Sprintf("n%d", len(s.all)), 1, s.newRaftID(), nil)
			s.note("join %s", m.id)
			s.at(int64(10*time.Second), func() {
				s.lateCopy = false
				s.note("copies on time again")
				s.crashLater()
			})
		case FaultBlip:
			b := s.backupOf(victim)
			if b == nil || b == victim {
				s.note("%s has no backup to blip", victim.id)
				break
			}
			d := span(100*time.Millisecond, 600*time.Millisecond)
			s.note("replication %s → %s vanishes for %v", victim.id, b.id, time.Duration(d))
			s.blip[[2]string{victim.name, b.name}] = true
			s.at(d, func() {
				delete(s.blip, [2]string{victim.name, b.name})
				s.note("replication %s → %s works again", victim.id, b.id)
			})
			s.at(d+span(time.Second, 5*time.Second), func() {
				if !victim.crashed {
					s.note("crash %s", victim.id)
					s.crash(victim, false)
				}
			})
		case FaultLeavePause:
			if b := s.backupOf(victim); b != nil && b != victim {
				d := span(time.Second, 40*time.Second)
				b.paused = s.now + d
				s.note("pause %s, the backup, for %v", b.id, time.Duration(d))
				s.extendEnd(d)
			}
			victim.leaving = true
			s.note("leave %s (gracefully: its partitions move first)", victim.id)
			s.drain(victim, s.now)
		case FaultLeaverPause:
			// A voter that holds partitions, not the leader: its
			// replacement is promoted as it leaves, and with a voter
			// more than wanted a silent one is removed first.
			for _, id := range s.sortedIDs() {
				m := s.members[id]
				held, _ := m.own.Depends()
				if m.log.Voter() && !m.log.Leader() && held > 0 {
					victim = m
					break
				}
			}
			victim.leaving = true
			s.note("leave %s (gracefully: its partitions move first)", victim.id)
			s.drain(victim, s.now)
			s.at(span(10*time.Millisecond, 150*time.Millisecond), func() {
				d := span(time.Second, 3*time.Second)
				victim.paused = s.now + d
				s.note("pause %s, draining, for %v", victim.id, time.Duration(d))
				s.extendEnd(d)
			})
		case FaultBackupLeave:
			b := s.backupOf(victim)
			if b == nil || b == victim {
				s.note("%s has no backup to leave", victim.id)
				break
			}
			d := span(2*time.Second, 8*time.Second)
			s.deaf[b.name] = true
			s.note("%s hears no gossip for %v", b.id, time.Duration(d))
			s.at(d, func() {
				delete(s.deaf, b.name)
				s.note("%s hears gossip again", b.id)
			})
			s.note("crash %s", victim.id)
			s.crash(victim, true)
			m := s.start(victim.name, victim.inc+1, s.newRaftID(), nil)
			s.note("restart %s as %s", victim.id, m.id)
			b.leaving, b.closeIn = true, int64(15*time.Second)
			s.note("leave %s, its backup (gracefully)", b.id)
			s.drain(b, s.now)
			s.extendEnd(int64(7 * time.Second))
		case FaultLeave:
			victim.leaving = true
			s.note("leave %s (gracefully: its partitions move first)", victim.id)
			s.drain(victim, s.now)
		}
	})
}

// drain is a graceful leave as peer's drain does it: once the machine
// says it may (Machine.MayLeave, with a backup wait of 2 s), it ends its
// own liveness for good and stops half a second later; at its close
// deadline (closeIn, 4 s unless the fault set one) it stops whatever it
// holds.
func (s *sim) drain(m *member, since int64) {
	if m.crashed {
		return
	}
	if m.paused > s.now {
		// A paused process does not run its drain; its deadline, a
		// caller's context, is pushed back by the pause here, so that
		// what is checked is whether the leave finishes once it runs.
		d := m.paused - s.now
		s.at(d, func() { s.drain(m, since+d) })
		return
	}
	const backupWait = 2 * time.Second
	var v ownership.LeaveVerdict
	var held, backed int
	if s.o.Mutation == MutLeaveOnGossip {
		held, backed = m.own.Depends()
		v = ownership.Stay
		if m.alive <= 1 || held == 0 && (backed == 0 || s.now-since >= int64(backupWait)) {
			v = ownership.Go
		}
	} else {
		v, held, backed = m.own.MayLeave(ownership.Drain{Since: m.monoAt(since), Alive: m.alive, BackupWait: backupWait}, m.mono())
	}
	closeIn := m.closeIn
	if closeIn == 0 {
		closeIn = int64(4 * time.Second)
	}
	switch {
	case v != ownership.Stay:
		s.note("%s ends its liveness (%v; holds %d, backs %d, gossip lists %d)", m.id, v, held, backed, m.alive)
		if m.leaveLog != nil {
			m.leaveLog() // a fleet run's leave, as peer's leaveLog does it
			return
		}
		m.carry(m.log.Leave(m.mono()))
		s.at(int64(500*time.Millisecond), func() {
			s.note("%s stops", m.id)
			s.crash(m, true)
		})
	case s.now-since >= closeIn:
		s.note("%s stops at its close deadline, holding %d", m.id, held)
		if held > 0 {
			s.stalled++
		}
		s.crash(m, true)
	default:
		s.at(int64(50*time.Millisecond), func() { s.drain(m, since) })
	}
}

func (s *sim) newRaftID() uint64 {
	s.nextRaft++
	return s.nextRaft
}

// extendEnd lets a long pause end, and the run observe its aftermath.
func (s *sim) extendEnd(d int64) {
	if e := s.now + d + int64(8*time.Second); e > s.end {
		s.end = e
	}
}

// behindBackup is FaultBehindBackup's schedule: the log falls silent to
// victim's backup, victim copies its partitions again and crashes as the
// backup installs one; the log reaches the backup again 3-6 s later,
// long after it ended victim, with a snapshot.
func (s *sim) behindBackup(victim *member, span func(lo, hi time.Duration) int64) {
	b := s.backupOf(victim)
	if b == nil || b == victim || b.log.Leader() {
		s.note("%s has no backup the log can fall silent to", victim.id)
		return
	}
	s.behind, s.behindFrom, s.behindWas = b, victim, b
	s.note("the log falls silent to %s, the backup; %s copies its partitions again", b.id, victim.id)
	victim.carry(victim.log.Raise(victim.mono()))
	s.at(span(3*time.Second, 6*time.Second), func() {
		s.behind, s.behindFrom = nil, nil
		s.note("the log reaches %s again", b.id)
	})
}

// snapshotEvery is how many applied entries each member's log snapshots
// after: 4 under FaultBehindBackup, so that a member the log fell silent
// to for a few seconds is caught up by snapshot; else ownlog's default.
func (s *sim) snapshotEvery() uint64 {
	if s.fault == FaultBehindBackup {
		return 4
	}
	return 0
}

// target is the member the fault hits: the first key's holder, if any.
func (s *sim) target() *member {
	p := s.partition(s.keys[0])
	for _, id := range s.sortedIDs() {
		m := s.members[id]
		if !m.crashed && m.own.Table().Holds(m.id, p) {
			return m
		}
	}
	ids := s.sortedIDs()
	return s.members[ids[s.rng.IntN(len(ids))]]
}

// leader returns the member that leads the log, nil for none.
func (s *sim) leader() *member {
	for _, id := range s.sortedIDs() {
		if m := s.members[id]; !m.crashed && m.log.Leader() {
			return m
		}
	}
	return nil
}

func (s *sim) backupOf(m *member) *member {
	p := s.partition(s.keys[0])
	return s.members[m.own.Table().Parts[p].Backup]
}

// crash stops m for good. gone: gossip learns at once that it is gone
// for good (it left); otherwise its peers find out only when a later
// incarnation runs, or give it up after FailedAfter (Failed).
func (s *sim) crash(m *member, gone bool) {
	m.crashed = true
	delete(s.members, m.id)
	s.ids = nil
	if gone {
		s.gone = append(s.gone, m.id)
	}
	if s.fleet == nil {
		s.at(s.endedWithin(), func() { s.checkEnded(m) })
	}
}

// crashLater crashes the first key's holder 0.5-4 s from now.
func (s *sim) crashLater() {
	s.at(int64(500*time.Millisecond)+s.rng.Int64N(int64(3500*time.Millisecond)), func() {
		if v := s.target(); v != nil {
			s.note("crash %s", v.id)
			s.crash(v, false)
		}
	})
}

// setPolicies changes the policies of keys (all when none are named) to
// what next says for each key's index, in every running member, at
// slightly different times as a policy table's reload reaches them. A
// member whose change replicates some key more strongly than before (a
// policy that was absent counts as off) raises (Machine.Raise): its held
// partitions are copied again before they decide again.
func (s *sim) setPolicies(next func(i int) policyState, keys ...int) {
	if len(keys) == 0 {
		for i := range s.keys {
			keys = append(keys, i)
		}
	}
	strength := func(st policyState) int {
		if !st.present {
			return 0
		}
		return 2 - int(st.mode) // off 0, async 1, sync 2
	}
	for _, id := range s.sortedIDs() {
		m := s.members[id]
		s.at(s.rng.Int64N(int64(300*time.Millisecond)), func() {
			s.deliver(m, func() {
				raised, readded := false, false
				for _, i := range keys {
					k := s.keys[i]
					old, st := m.policies[k], next(i)
					if strength(st) > strength(old) {
						raised = true
						readded = readded || !old.present
					}
					m.policies[k], m.policyAt[k] = st, s.now
				}
				switch {
				case !raised, s.o.Mutation == MutNoRecopy, readded && s.o.Mutation == MutReaddNoRaise:
				default:
					m.carry(m.log.Raise(m.mono()))
				}
			})
		})
	}
}

// voterCutCrash is FaultVoterCutCrash, h the first key's holder: if it
// votes, another holder that does not (a voter cut off would leave the
// log without a majority).
func (s *sim) voterCutCrash(h *member, span func(lo, hi time.Duration) int64) {
	lead := s.leader()
	var cut *member
	if lead != nil && h.log.Voter() {
		h = nil
		for _, id := range s.sortedIDs() {
			if m := s.members[id]; !m.log.Voter() && slices.ContainsFunc(m.own.Table().Parts, func(p ownership.Partition) bool { return p.Holder == m.id }) {
				h = m
				break
			}
		}
	}
	for _, id := range s.sortedIDs() {
		if m := s.members[id]; lead != nil && m != lead && m != h && m.log.Voter() {
			cut = m
			break
		}
	}
	if cut == nil || h == nil || h == lead {
		s.note("no leader, no holder that does not vote, or no voter to cut")
		return
	}
	s.note("%s hears nothing from %s, the leader", cut.id, lead.id)
	s.setCut(lead.name, cut.name, true)
	s.at(span(time.Second, 2500*time.Millisecond), func() {
		s.note("crash %s, the leader; cut %s, a holder, off for 5s", lead.id, h.id)
		s.setCut(lead.name, cut.name, false)
		s.crash(lead, false)
		s.cutMember(h.name, true, true, true)
		s.at(int64(5*time.Second), func() {
			s.cutMember(h.name, true, true, false)
			s.note("heal %s", h.id)
		})
	})
}

// cutMember drops messages to (in) and from (out) the member's name.
func (s *sim) cutMember(name string, in, out, on bool) {
	for _, m := range s.all {
		if m.name == name {
			continue
		}
		if in {
			s.setCut(m.name, name, on)
		}
		if out {
			s.setCut(name, m.name, on)
		}
	}
}

func (s *sim) setCut(from, to string, on bool) {
	if on {
		s.cut[[2]string{from, to}] = true
	} else {
		delete(s.cut, [2]string{from, to})
	}
}

func (s *sim) split(small []string, on bool) {
	inSmall := map[string]bool{}
	for _, n := range small {
		inSmall[n] = true
	}
	for _, a := range s.all {
		for _, b := range s.all {
			if inSmall[a.name] != inSmall[b.name] {
				s.setCut(a.name, b.name, on)
			}
		}
	}
}
