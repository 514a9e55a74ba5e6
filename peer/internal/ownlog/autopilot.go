package ownlog

import (
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"
)

// autopilot keeps the voter set, one change at a time (raft refuses a
// second pending one): new incarnations in the table join as learners,
// and done ones leave, in batches (learnerChange); a learner that has caught up is promoted while voters are
// short; then a voter gossip reports gone, or leaving with its liveness
// ended, is removed. Promoting first replaces a voter before it goes: a
// voter leaving while another is dead but not yet removed would
// otherwise leave the log without a majority. With no learner to
// promote, a leaver that still answers is removed only while the voters
// left keep a majority that answers, and a silent voter is removed in
// its place first. The voters wanted (VotersFor) count every member not
// done, a leaver still draining among them; a staying voter that fell
// silent does not count as one, so a learner that answers is promoted in
// its place and the silent one is then trimmed.
func (m *Member) autopilot(now int64) {
	if now-m.lastConf < int64(100*time.Millisecond) {
		return
	}
	st := m.rn.Status()
	if len(st.Config.Voters[1]) > 0 {
		m.leaveJoint(now)
		return
	}
	voters, learners := st.Config.Voters.IDs(), st.Config.Learners
	in := func(id uint64) bool {
		_, v := voters[id]
		_, l := learners[id]
		return v || l
	}
	propose := func(t pb.ConfChangeType, id uint64) {
		m.lastConf = now
		if m.rn.ProposeConfChange(&pb.ConfChange{Type: t.Enum(), NodeId: proto.Uint64(id)}) == nil {
			m.out.ConfChanges++
		}
	}
	// A leaving member stays in the log until its liveness has ended: it
	// must still learn that its holdings and backups moved off it, and
	// it ends its own liveness last. An incarnation the table ended for
	// good is done whatever gossip says (a leaver whose gossip is cut).
	done := func(p Peer) bool {
		rec := m.own.Table().Members[p.Member]
		return p.Gone || rec != nil && rec.Ended || p.Leaving && rec == nil
	}
	// Learners join and go once the voters need no change (learnerChange,
	// at the end): a deploy wave of a fleet brings dozens of each, and
	// when they went one change at a time, replacing the voters it stops
	// came after all of them; a wave that held three of five voters stopped them (peer's
	// leave waits four Livenesses for its vote to go) before their
	// replacements, and the log lost its majority for good (a simulated
	// fleet of 128).
	byID := map[uint64]Peer{}
	var addLearners, dropLearners []uint64
	for _, p := range m.roster {
		byID[p.RaftID] = p
		// Every member the table lists and that is not done is in the
		// log, a leaver too: one removed as a silent voter (paused,
		// cut off) while it drained would otherwise never see its moves
		// commit nor anyone extend, and its leave would stall.
		if len(addLearners) < learnerBatch && !done(p) && !in(p.RaftID) && m.own.Table().Members[p.Member] != nil {
			addLearners = append(addLearners, p.RaftID)
		}
	}
	for _, id := range sorted(learners) {
		if p, ok := byID[id]; ok && done(p) && len(dropLearners) < learnerBatch {
			dropLearners = append(dropLearners, id)
		}
	}
	defer func() {
		if m.lastConf == now {
			return // a voter change was proposed (or leadership handed on)
		}
		m.learnerChange(now, addLearners, dropLearners)
	}()
	// How many voters the log wants counts every member not done, a
	// leaver still draining too: it still holds or backs partitions, and
	// its vote is what lets the others commit its moves if one of them
	// crashes. Counting only those staying made a three-member log
	// with one leaving want a single voter: under load, voters that
	// fell silent for an election timeout were trimmed down to one,
	// and when that one crashed nothing committed again.
	live := 0
	for _, p := range m.roster {
		if !done(p) {
			live++
		}
	}
	// A voter that answers is one this leader had a message from within
	// three heartbeats (followers answer every heartbeat); a silent one
	// it has had none from for an election timeout. Ticks not yet
	// measured: nobody is silent, and only this member answers.
	heardWithin := func(id uint64, d int64) bool {
		at, ok := m.heard[id]
		return ok && m.tick > 0 && now-at <= d
	}
	answers := func(id uint64) bool {
		return id == m.cfg.RaftID || heardWithin(id, m.answersWithin())
	}
	// Silent only once this member has led for an election timeout: a
	// follower hears nothing from the other followers, so a new leader
	// had heard none of them lately but those that voted for it, and
	// removed the others as silent at once. A leaving voter so removed
	// lacked the entries that would tell it (tellRemoved), listed itself
	// a voter and stayed its bound of four Liveness (a 32-member deploy
	// wave 8 s longer).
	silent := func(id uint64) bool {
		return id != m.cfg.RaftID && m.tick > 0 && !heardWithin(id, m.silentAfter()) && now-m.ledAt >= m.silentAfter()
	}
	// Voters that stay: a leaving voter is replaced before it goes, so
	// that the last voter of a log never leaves with it. One that stays
	// but fell silent (crashed, a new incarnation this leader has not
	// heard of yet, cut off) is replaced too, by a learner that answers;
	// then it is trimmed as one voter more than wanted. Kept, it was one
	// of three voters with a leaver that went at its close deadline, and
	// the one voter left had no majority.
	staying, silentStaying := 0, 0
	for id := range voters {
		if p, ok := byID[id]; !ok || !p.Leaving && !done(p) {
			staying++
			if silent(id) {
				silentStaying++
			}
		}
	}
	want := m.voters(live)
	if staying-silentStaying < want {
		for _, id := range sorted(learners) {
			p, ok := byID[id]
			// Caught up to within a snapshot's worth of entries: a
			// learner that has to catch up from further back would hold
			// commits up once it votes. And one that has acknowledged
			// something (Match > 0): early in a log's life a learner
			// that never answered is "within a snapshot" too, and
			// promoted it made a log of two voters, one of which had no
			// configuration and never voted, so nothing committed again.
			pr := st.Progress[id]
			if !ok || p.Gone || p.Leaving || pr.Match == 0 || pr.Match+m.cfg.SnapshotEvery < st.HardState.GetCommit() {
				continue
			}
			if staying < want || answers(id) {
				propose(pb.ConfChangeAddNode, id)
				return
			}
		}
	}
	// keeps reports whether the voters other than id still have a
	// majority that answers.
	keeps := func(id uint64) bool {
		n, up := 0, 0
		for v := range voters {
			if v != id {
				n++
				if answers(v) {
					up++
				}
			}
		}
		return up > n/2
	}
	// Never the last voter: raft cannot run without one, and a log whose
	// every member leaves ends with them. Done voters that no longer
	// answer go first. One that still answers (a member leaving) goes
	// only while the voters left keep a majority that answers: removing
	// a leaver while another voter is down leaves voters of whom too few
	// are up, and nothing commits again. While it cannot go, a voter that
	// does not answer (down, not yet known gone) is removed in its place
	// first: the change commits with the majority that answers now, and a
	// member that was only cut off comes back as a learner.
	// More voters than wanted (a leaver's replacement promoted before it
	// goes): one that does not answer goes first, while the rest keep a
	// majority that answers. Four voters of whom one is dead and one
	// leaving are two of four once the leaver is cut off, and nothing
	// commits again; three without the dead one keep two of three.
	if len(voters) > m.voters(live) {
		for _, id := range sorted(voters) {
			if silent(id) && keeps(id) {
				propose(pb.ConfChangeRemoveNode, id)
				return
			}
		}
	}
	waiting := uint64(0)
	for _, id := range sorted(voters) {
		p, ok := byID[id]
		if !ok || !done(p) || len(voters) == 1 {
			continue
		}
		if !silent(id) && !keeps(id) {
			if waiting == 0 {
				waiting = id
			}
			continue
		}
		if id == m.cfg.RaftID {
			// The leader leaving hands leadership on first; its
			// successor removes it.
			m.lastConf = now
			m.TransferLeadership()
			return
		}
		if !silent(id) && st.Progress[id].State != tracker.StateReplicate {
			// It answers, but this leader does not know its log yet (a
			// new leader probes each follower, one append at a time):
			// removed now, raft would not send it the commit of its
			// removal, nor could tellRemoved, and a leaver lists itself
			// a voter until its bound of four Liveness. Once one of
			// this leader's appends reached it, it goes.
			continue
		}
		propose(pb.ConfChangeRemoveNode, id)
		return
	}
	if waiting != 0 {
		for _, id := range sorted(voters) {
			if id != waiting && silent(id) {
				propose(pb.ConfChangeRemoveNode, id)
				return
			}
		}
	}
	// Still more voters than wanted, every one answering and none
	// leaving (the leaver whose replacement was promoted is gone, or a
	// silent voter came back after its replacement): one goes, not this
	// leader, the highest raft ID, while the rest keep a majority
	// that answers. Left, a rolling deploy of 32 members ended with 6
	// voters of 5 wanted, for good.
	settled := true
	for id := range voters {
		if p, ok := byID[id]; ok && (p.Leaving || done(p)) {
			settled = false // the loops above remove it first
		}
	}
	if settled && len(voters) > m.voters(live) {
		ids := sorted(voters)
		for i := len(ids) - 1; i >= 0; i-- {
			id := ids[i]
			if p, ok := byID[id]; id == m.cfg.RaftID || !ok || p.Leaving || done(p) {
				continue
			}
			if keeps(id) {
				propose(pb.ConfChangeRemoveNode, id)
				return
			}
		}
	}
}
