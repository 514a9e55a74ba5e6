package ownlog

// Quiet sessions: among three voters and no learners (three members, the
// usual small cluster), the voters' keep-alives are the log's heartbeats.
// Raft's own heartbeats and their answers, every heartbeat interval
// between the leader and each voter, cost 20 messages a second at the
// leader of three members at rest, for what a keep-alive and its answer
// every two thirds of ExtendEvery per voter say as well:
//
//   - A voter sends its keep-alive to the leader as a heartbeat answer of
//     its own (kzMagic) every quietEvery: its machine extends then
//     (slotQuiet), or it sends a bare one. Raft takes it as a heartbeat
//     answer: the leader counts the voter active (CheckQuorum) and sends
//     it what its log lacks.
//   - The leader grants what it carries at once (carrierConfirms: the
//     voter and the leader are a quorum) and answers with a heartbeat of
//     its own (kyMagic) carrying its sequence, which resets the voter's
//     election clock and is its contact with the leader (votes.go), as
//     raft's heartbeat is. Raft's answer to that heartbeat is not sent:
//     the voter's next keep-alive carries the sequence back.
//   - Raft's clock runs slower while a leader is known (slow), so that
//     an election timeout (and the leader's CheckQuorum) outlasts two
//     keep-alive intervals; the leader sends a voter no heartbeat of
//     raft's own while its keep-alives come.
//   - A leader's crash is found by the voters' keep-alives: one unanswered
//     for a wait (quietWait, a heartbeat interval) makes its voter
//     suspect the leader (suspect): the first voter campaigns at once;
//     the other, asked for its pre-vote, sends a keep-alive at once
//     (probeQuiet) unless one is unanswered already, and grants it once
//     that one went unanswered for the wait too. A leader that hears no voter's
//     keep-alive for an interval and a wait runs its clock out too
//     (quietOverdue), and CheckQuorum steps it down as soon as without
//     quiet sessions.
//
// Two messages a keep-alive interval per voter: 6 a second at the leader
// of three members at a 2 s Liveness (2 per member), 3 at a voter.
//
// The leader's own lease needs no read either. A voter that acknowledges
// an answer heard the leader after the leader sent it, so its contact,
// from which a later leader's election counts (with its vote, or with
// the old leader's own, votes.go), is after that send: the leader counts
// its own lease from the send of the latest answer acknowledged
// (ownership.Machine.KeptAliveFrom). Counted from a keep-alive's arrival
// instead (MutQuietOwnFromKeepAlive), it runs a keep-alive interval past
// the voter's last contact, and a new leader that the voters elect once
// the old one is cut off ends it while it still decides.
//
// Five voters keep raft's heartbeats (a voter and the leader are no
// quorum of five), and so does a log with learners, whose keep-alives a
// voter relays on raft's heartbeat answers.

import (
	"encoding/binary"
	"slices"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/peer/internal/ownership"
)

var (
	kzMagic = []byte("rlkz") // a voter's quiet keep-alive (a heartbeat answer)
	kyMagic = []byte("rlky") // the leader's answer to one (a heartbeat)
)

// quietKeep is how many answers the leader remembers per voter.
const quietKeep = 4

type quietSent struct {
	seq uint64
	at  int64
}

// quietState is a member's quiet-session state.
type quietState struct {
	// Of the configuration of: whether it is quiet for this member, and
	// since when (the now of the call that first saw it).
	of    *pb.ConfState
	is    bool
	since int64
	// On a voter: when its latest keep-alive went; whether those since
	// the last answer are unanswered, when the first of them went, and
	// whether it campaigned for them already; the sequence of the last
	// answer; drop, while raft's answer to it is to be dropped.
	sentAt     int64
	waiting    bool
	waitFrom   int64
	campaigned bool
	asked      bool // the other voter asked for its pre-vote meanwhile
	ranOut     bool // raft's clock was run out for them (runOut)
	// loud is the term in which its leader answered with raft's own
	// heartbeats instead (noteLoud).
	loud uint64
	ack  uint64
	drop bool
	// ticks counts the calls to Tick toward raft's next tick.
	ticks int
	// On the leader, in term: its latest answers to each voter, when it
	// last answered each, and from, the send of the latest answer a voter
	// acknowledged (0: none yet), and ackAt when that acknowledgement came.
	term     uint64
	seq      uint64
	sent     map[uint64][]quietSent
	answered map[uint64]int64
	from     int64
	ackAt    int64
	// heard is when a voter's keep-alive last came in term; overdue,
	// that the leader's clock ran out once since (quietOverdue).
	heard   int64
	overdue bool
}

// quiet reports whether the applied configuration is quiet for this
// member: three voters, this member one of them, no learners, not joint.
// With learners it is not: they are heard by the leader only when its
// heartbeats reach them, and autopilot, not hearing them, promoted none
// (in the simulator a member of five stayed a learner beside three
// voters, and the log stayed quiet).
func (m *Member) quiet() bool {
	if m.conf != m.q.of {
		c := m.conf
		m.q.of = c
		m.q.is = len(c.GetVoters()) == 3 && slices.Contains(c.GetVoters(), m.cfg.RaftID) && len(c.GetVotersOutgoing()) == 0 &&
			len(c.GetLearners()) == 0 && len(c.GetLearnersNext()) == 0 && !m.cfg.NoQuiet
		m.q.since = m.now
	}
	return m.q.is
}

// slow is how many times slower raft's clock runs: in a quiet
// configuration while a leader is known and not suspected, enough that
// an election timeout (and the leader's CheckQuorum) outlasts two
// keep-alive intervals and one more (4 at a 2 s Liveness with Timing's
// election timeout of Liveness/4: 2 s); else 1 (an election among
// members that know no leader, at the start say, runs on the fast
// clock).
func (m *Member) slow() int {
	if m.quietOverdue() || m.Leader() && !m.quietVoters() || !m.Leader() && m.q.loud == m.Term() {
		return 1
	}
	if m.quiet() && m.rn.BasicStatus().Lead != 0 && !m.q.campaigned && m.tick > 0 {
		election := int64(m.cfg.ElectionTicks) * m.tick
		return int((2*m.quietEvery()+election-1)/election) + 1
	}
	return 1
}

// quietOverdue reports whether this member leads a quiet configuration
// and no voter's keep-alive came for an interval and a wait: its raft
// clock then runs fast, and runs out an election timeout once (raftTick),
// so that CheckQuorum steps it down about as soon as without quiet
// sessions, an interval later.
func (m *Member) quietOverdue() bool {
	return m.quiet() && m.Leader() && m.now-m.quietHeard() > m.quietEvery()+m.quietWait()
}

// quietHeard is, on the leader of a quiet configuration, when a voter's
// keep-alive last came, or, if none came yet, when it began to lead or
// the configuration became quiet, whichever is later.
func (m *Member) quietHeard() int64 {
	at := max(m.ledAt, m.q.since)
	if m.q.term == m.Term() {
		at = max(at, m.q.heard)
	}
	return at
}

// answersWithin is how recently the leader must have heard from a voter
// for it to answer (autopilot, TransferLeadership): three heartbeat
// intervals, as followers answer every heartbeat; in a quiet
// configuration a keep-alive interval and a wait.
func (m *Member) answersWithin() int64 {
	d := int64(3*m.cfg.HeartbeatTicks) * m.tick
	if m.quiet() {
		d = max(d, m.quietEvery()+m.quietWait())
	}
	return d
}

// silentAfter is how long the leader must not have heard from a voter
// for it to count as silent (autopilot): an election timeout; in a quiet
// configuration two keep-alive intervals and a wait, if longer.
func (m *Member) silentAfter() int64 {
	d := int64(m.cfg.ElectionTicks) * m.tick
	if m.quiet() {
		d = max(d, 2*m.quietEvery()+m.quietWait())
	}
	return d
}

// quietEvery is the keep-alive interval: two thirds of ExtendEvery, so
// that the leader's own lease, counted from an answer acknowledged an
// interval later, outlasts the next acknowledgement by a third of a
// Liveness (HolderShare of it less two intervals).
func (m *Member) quietEvery() int64 {
	e := m.cfg.Ownership.ExtendEvery
	if e <= 0 {
		e = m.cfg.Ownership.Liveness / 2
	}
	if e <= 0 {
		e = time.Second // ownership's default Liveness is 2 s
	}
	return int64(e) * 2 / 3
}

// raftTick ticks raft, every slow-th call.
func (m *Member) raftTick() {
	if m.quietOverdue() && !m.q.overdue {
		m.q.overdue = true
		for range m.cfg.ElectionTicks - 1 {
			m.rn.Tick()
		}
	}
	m.q.ticks++
	if m.q.ticks >= m.slow() {
		m.q.ticks = 0
		m.rn.Tick()
	}
}

// quietVoter reports whether this member is a voter of a quiet
// configuration that does not lead, with a leader to send to.
func (m *Member) quietVoter() bool {
	return m.quiet() && !m.Leader() && m.tick > 0 && m.kaLead() != 0 && m.kaLead() != m.cfg.RaftID && m.q.loud != m.Term()
}

// quietVoters reports, on the leader of a quiet configuration, whether
// both other voters sent a quiet keep-alive in its term within two
// intervals: only then does
// its raft clock run slower, and raft's heartbeats stop. A voter of a
// release before quiet sessions answers raft's heartbeats, which must
// come as often as ever; so must a voter's that crashed or was cut off.
func (m *Member) quietVoters() bool {
	if m.q.term != m.Term() {
		return false
	}
	n := 0
	for _, at := range m.q.answered {
		if m.now-at <= 2*m.quietEvery() {
			n++
		}
	}
	return n >= len(m.conf.GetVoters())-1
}

// noteLoud, on a voter of a quiet configuration, notes a heartbeat of
// raft's own from its leader that came while its keep-alive waited for
// an answer longer than quietWait: a leader of a release before quiet
// sessions, which hands the keep-alive to raft and answers none (a quiet
// leader answers at once, and sends raft's heartbeats to a voter only
// until its keep-alives come). For the rest of the term the voter
// keeps raft's clock and carries its keep-alives on raft's heartbeat
// answers, as that leader expects (a quiet leader takes those too).
func (m *Member) noteLoud(msg *pb.Message, now int64) {
	if msg.GetType() == pb.MsgHeartbeat && msg.GetFrom() == m.Lead() && msg.GetTerm() == m.Term() && m.q.waiting &&
		now-m.q.waitFrom >= m.quietWait() && m.quietVoter() {
		m.q.loud = m.Term()
	}
}

// slotQuiet, before the machine's periodic step on a voter of a quiet
// configuration, asks the machine to extend when a keep-alive is due and
// the last was answered, so that each keep-alive carries a fresh
// extension. While they go unanswered the machine keeps its own pace
// (Machine.extendInterval: retries, then one every 2·Liveness once it
// hears nothing, so that the others see it expire).
func (m *Member) slotQuiet(now int64) {
	if m.quietVoter() && !m.q.waiting && now-m.q.sentAt >= m.quietEvery() {
		m.own.ExtendSoon()
	}
}

// sendQuiet sends, on a voter of a quiet configuration, what it holds
// for the leader (its own keep-alive) as a keep-alive of its own, with
// the sequence of the last answer it had.
func (m *Member) sendQuiet(now int64) {
	lead := m.kaLead()
	if lead == 0 || lead == m.cfg.RaftID {
		return
	}
	b := withSeq(kzMagic, m.q.ack, m.ka.relay)
	m.ka.relay = m.ka.relay[:0]
	m.out.Messages = append(m.out.Messages, &pb.Message{Type: pb.MsgHeartbeatResp.Enum(), To: proto.Uint64(lead),
		From: proto.Uint64(m.cfg.RaftID), Term: proto.Uint64(m.Term()), Context: b})
	if !m.q.waiting {
		m.q.waiting, m.q.waitFrom = true, now
	}
	m.q.sentAt = now
}

// tickQuiet, after the machine's periodic step on a voter of a quiet
// configuration: a bare keep-alive when the machine sent none and one is
// due; and once those sent went unanswered for quietWait, the voter
// suspects the leader (suspect).
func (m *Member) tickQuiet(now int64) {
	if !m.quietVoter() {
		return
	}
	if at := m.heard[m.kaLead()]; m.q.waiting && now-m.q.waitFrom >= m.quietWait() && at < m.q.waitFrom {
		// Nothing at all from the leader since: not a leader of an
		// older release, whose heartbeats still come (noteLoud).
		m.suspect()
	}
	if now-m.q.sentAt >= m.quietEvery() {
		m.sendQuiet(now)
	}
}

// suspect, once per stretch of unanswered keep-alives, puts raft on the
// fast clock (slow) until an answer comes and runs raft's election clock
// out (runOut), and, on the first of the two voters that do not lead
// (quietRank), campaigns at once. The other campaigns at once too if the first
// asked for its pre-vote meanwhile (the first then waits for raft's
// timer), else on raft's own timer, on the fast clock, should the first
// not be elected; asked for its pre-vote once its own keep-alive went
// unanswered too, it grants it (probeQuiet). The voters' keep-alives go together after an election
// (each extends at once), and campaigning together they split their
// votes, again and again.
func (m *Member) suspect() {
	if m.q.campaigned {
		return
	}
	m.q.campaigned = true
	m.runOut()
	if m.quietRank() == 0 || m.q.asked {
		_ = m.rn.Campaign()
	}
}

// runOut runs raft's election clock out, once: the member no longer
// counts the leader's lease, and grants pre-votes and votes. A follower's
// clock is first set back to the leader's last heartbeat (raft restarts
// it at each), so that it runs out exactly: raft then campaigns on its
// randomized timer, within an election timeout more, rather than at
// once (both voters' clocks ran since the same answer, and both
// campaigning at once split their votes). Contact (votes.go) is not
// touched: nothing was heard.
func (m *Member) runOut() {
	if m.q.ranOut {
		return
	}
	m.q.ranOut = true
	st := m.rn.BasicStatus()
	if st.RaftState == raft.StateFollower && st.Lead != 0 {
		_ = m.rn.Step(&pb.Message{Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(st.Lead), To: proto.Uint64(m.cfg.RaftID), Term: proto.Uint64(st.GetTerm())})
		m.q.drop = true // raft's answer to it goes nowhere
	}
	for range m.cfg.ElectionTicks {
		m.rn.Tick()
	}
}

// quietRank is 0 for the first of the voters that do not lead (by raft
// ID), 1 for the other.
func (m *Member) quietRank() int {
	lead := m.kaLead()
	for _, v := range m.conf.GetVoters() {
		if v != lead && v < m.cfg.RaftID {
			return 1
		}
	}
	return 0
}

// quietWait is how long a voter's keep-alive waits for its answer
// before the voter suspects the leader: a heartbeat interval, at least a
// quarter of a keep-alive interval (many round trips either way; 200 ms
// at a 2 s Liveness).
func (m *Member) quietWait() int64 {
	return max(int64(m.cfg.HeartbeatTicks)*m.tick, m.quietEvery()/4)
}

// probeQuiet, on a voter of a quiet configuration that follows a leader,
// when the other voter asks for its pre-vote (its keep-alive went
// unanswered, so the leader may have crashed): if its own went
// unanswered for quietWait too, it runs raft's election clock out, so
// that it grants the pre-vote; if none of its own is unanswered, it sends
// one at once, and finds out within quietWait rather than after its next
// keep-alive (the other asks again on raft's timer).
func (m *Member) probeQuiet(msg *pb.Message, now int64) {
	if msg.GetType() != pb.MsgPreVote || !m.quietVoter() {
		return
	}
	switch {
	case now-m.q.waitFrom >= m.quietWait() && m.q.waiting:
		m.suspect()
	case !m.q.waiting:
		m.sendQuiet(now)
		fallthrough
	default:
		m.q.asked = true
	}
}

// stepQuiet handles, on the leader, a voter's quiet keep-alive, and
// returns the heartbeat answer it is to raft; ok is false for a
// malformed one, dropped whole.
func (m *Member) stepQuiet(msg *pb.Message, now int64) (*pb.Message, bool) {
	c, ack, items, ok := withoutSeq(msg, kzMagic)
	if !ok {
		return nil, false
	}
	st := m.rn.BasicStatus()
	if st.RaftState != raft.StateLeader || msg.GetTerm() != st.GetTerm() {
		return c, true
	}
	if m.q.term != st.GetTerm() {
		m.q.term, m.q.sent, m.q.answered, m.q.from, m.q.ackAt = st.GetTerm(), map[uint64][]quietSent{}, map[uint64]int64{}, 0, 0
	}
	v := msg.GetFrom()
	m.q.heard, m.q.overdue = now, false
	if m.cfg.Ownership.Mutation == ownership.MutQuietOwnFromKeepAlive {
		// The broken rule: from the keep-alive's arrival.
		m.confirmOwn(now, now)
	} else if i := slices.IndexFunc(m.q.sent[v], func(s quietSent) bool { return s.seq == ack }); ack != 0 && i >= 0 {
		m.confirmOwn(m.q.sent[v][i].at, now)
	}
	m.ownWaits(now)
	confirmed := m.carrierConfirms(msg)
	var answers []relayed
	for _, it := range items {
		r, err := ownership.DecodeKeepAliveRequest(it.body)
		if err != nil {
			continue
		}
		q := kaReq{from: it.from, via: v, req: r, at: now}
		if !confirmed {
			m.takeKeepAlive(q, now)
			continue
		}
		a := m.own.KeepAlive(r, now, now)
		a.Index = m.applied
		answers = append(answers, relayed{from: it.from, body: a.Encode(nil)})
	}
	m.quietAnswer(v, answers, now)
	return c, true
}

// quietAnswer sends voter v the leader's answer: a heartbeat carrying
// the answer's sequence and the keep-alives' answers.
func (m *Member) quietAnswer(v uint64, answers []relayed, now int64) {
	// Raft's heartbeat commits no further than the follower's match: one
	// that is not in the configuration (removed before it heard so) has
	// none, and gets no answer (its keep-alives wait for a read).
	commit, in := m.rn.BasicStatus().HardState.GetCommit(), false
	m.rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
		if id == v {
			commit, in = min(commit, pr.Match), true
		}
	})
	if !in {
		return
	}
	m.q.seq++
	b := withSeq(kyMagic, m.q.seq, answers)
	m.out.Messages = append(m.out.Messages, &pb.Message{Type: pb.MsgHeartbeat.Enum(), To: proto.Uint64(v), From: proto.Uint64(m.cfg.RaftID),
		Term: proto.Uint64(m.q.term), Commit: proto.Uint64(commit), Context: b})
	s := append(m.q.sent[v], quietSent{seq: m.q.seq, at: now})
	if len(s) > quietKeep {
		s = s[len(s)-quietKeep:]
	}
	m.q.sent[v] = s
	m.q.answered[v] = now
}

// confirmOwn, on the leader of a quiet configuration, learns that a
// voter's contact was at or after from: it grants its own latest waiting
// keep-alive sent by then, counting its lease from there
// (ownership.Machine.KeptAliveFrom).
func (m *Member) confirmOwn(from, now int64) {
	if !m.quiet() {
		return
	}
	m.q.from, m.q.ackAt = max(m.q.from, from), now
	own := func(q kaReq) bool { return q.from == 0 || q.from == m.cfg.RaftID }
	var done uint64
	for i := len(m.ka.wait) - 1; i >= 0 && done == 0; i-- {
		if q := m.ka.wait[i]; own(q) && m.own.KeptAliveFrom(q.req, m.q.from, now) {
			done = q.req.Seq
		}
	}
	if done == 0 {
		return
	}
	m.ka.wait = slices.DeleteFunc(m.ka.wait, func(q kaReq) bool { return own(q) && q.req.Seq <= done })
}

// ownWaits makes sure, on the leader of a quiet configuration, that one
// of its own keep-alives waits, sent by now: the answer it is about to
// send, once acknowledged, confirms it (confirmOwn). The machine sends
// one at once if none waits.
func (m *Member) ownWaits(now int64) {
	if !m.quiet() || slices.ContainsFunc(m.ka.wait, func(q kaReq) bool { return q.from == 0 || q.from == m.cfg.RaftID }) {
		return
	}
	m.own.ExtendSoon()
	m.do(m.own.Tick(now))
}

// unquietAnswer, on a voter, hands on the answers the leader's quiet
// answer carries and returns the heartbeat as raft is to see it; ok is
// false for a malformed one, dropped whole.
func (m *Member) unquietAnswer(msg *pb.Message, now int64) (*pb.Message, bool) {
	c, seq, items, ok := withoutSeq(msg, kyMagic)
	if !ok {
		return nil, false
	}
	m.handOn(items, now)
	m.q.ack, m.q.waiting, m.q.campaigned, m.q.asked, m.q.ranOut, m.q.drop = seq, false, false, false, false, true
	return c, true
}

// withSeq is a quiet keep-alive's or answer's context: magic, a
// sequence (the answer acknowledged, or the answer's own), then items.
func withSeq(magic []byte, seq uint64, items []relayed) []byte {
	return encodeBatch(binary.AppendUvarint(append([]byte(nil), magic...), seq), items)
}

// withoutSeq undoes withSeq on msg: it returns msg without its context,
// the sequence and the items; ok is false for a malformed one, dropped
// whole.
func withoutSeq(msg *pb.Message, magic []byte) (c *pb.Message, seq uint64, items []relayed, ok bool) {
	b := msg.GetContext()[len(magic):]
	seq, k := binary.Uvarint(b)
	if k <= 0 {
		return nil, 0, nil, false
	}
	if items, ok = decodeBatch(b[k:]); !ok {
		return nil, 0, nil, false
	}
	c = proto.Clone(msg).(*pb.Message)
	c.Context = nil
	return c, seq, items, true
}

// dropQuietAnswer reports whether msg is raft's answer to a quiet answer
// just stepped, which is not sent (the next keep-alive acknowledges it).
func (m *Member) dropQuietAnswer(msg *pb.Message) bool {
	if !m.q.drop || msg.GetType() != pb.MsgHeartbeatResp || len(msg.GetContext()) > 0 {
		return false
	}
	m.q.drop = false
	return true
}

// quietOwnWaits reports whether, on the leader of a quiet
// configuration, every waiting keep-alive is its own and an
// acknowledgement came within one and a half intervals, so that the next
// one, not a read, confirms them (confirmOwn).
func (m *Member) quietOwnWaits(now int64) bool {
	if !m.quiet() || m.q.from == 0 || m.q.term != m.Term() || now-m.q.ackAt >= m.quietEvery()*3/2 {
		return false
	}
	return !slices.ContainsFunc(m.ka.wait, func(q kaReq) bool { return q.from != 0 && q.from != m.cfg.RaftID })
}

// quietHeartbeat reports whether msg, raft's own heartbeat to a voter,
// is one the leader of a quiet configuration does not send: that voter's
// keep-alives come, the latest answered within an interval and an
// election timeout, and so did the other's (quietVoters: else raft's
// clock runs fast, and its CheckQuorum needs the heartbeats' answers).
func (m *Member) quietHeartbeat(msg *pb.Message, now int64) bool {
	if !m.quiet() || msg.GetType() != pb.MsgHeartbeat || len(msg.GetContext()) > 0 || m.q.term != msg.GetTerm() || !m.quietVoters() {
		return false
	}
	at, ok := m.q.answered[msg.GetTo()]
	return ok && now-at < m.quietEvery()+int64(m.cfg.ElectionTicks)*m.tick
}
