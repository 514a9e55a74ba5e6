package ownlog

// Keep-alives (the ownership package's sessions) ride the raft transport
// as raft message types raft never sends from its own ReadIndex path: a
// MsgReadIndex or MsgReadIndexResp whose Context begins with kaMagic, or
// inside a voter's answer to the leader's heartbeat (carry), or answers
// inside the leader's next heartbeat to that voter (carryBack). The member
// intercepts them before raft sees them. The leader collects the
// requests that arrive and confirms, once a heartbeat, with one ReadIndex of
// its own that it still leads (a quorum heard from it after they
// arrived); once it has applied the log to that read's index, it answers
// every one of them from its table. Where a request travelled changes
// nothing of that: it is confirmed by a read issued after it arrived.
// But one: among at most three voters, a request a voter's heartbeat
// answer carried is confirmed by that answer (carrierConfirms).

import (
	"bytes"
	"encoding/binary"
	"slices"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/peer/internal/ownership"
)

// kaMagic marks a keep-alive's Context; kbMagic a batch of them that a
// relay forwards to the leader, or of answers the leader sends back;
// krMagic a voter's heartbeat answer that carries such a batch (carry)
// and takes answers back in the leader's heartbeats: kqMagic, the
// leader's heartbeat that carries a batch of answers back (carryBack).
// kpMagic is a heartbeat answer that carries a batch from a voter that
// predates carryBack, which takes its answers in a message of their own:
// in a rolling upgrade, a voter that did not know kqMagic would hand the
// heartbeat to raft whole and its answers would be lost.
var (
	kaMagic = []byte("rlka")
	kbMagic = []byte("rlkb")
	kpMagic = []byte("rlkp")
	kqMagic = []byte("rlkq")
	krMagic = []byte("rlkr")
	// carriers are the heartbeat answers' magics that carry a batch.
	carriers = [][]byte{krMagic, kpMagic}
)

// kaMax bounds the requests the leader holds for one read, and those a
// relay holds for its next tick: a member extends every ExtendEvery, so
// this many is thousands of members.
const kaMax = 1 << 14

// kaReq is one request waiting for the leader's read: from is the member
// that sent it (0 for the leader's own), via the relay it came through (0
// when it came directly).
type kaReq struct {
	from, via uint64
	req       ownership.KeepAliveRequest
	again     bool  // its first read was lost
	at        int64 // when it arrived here (0: this member's own, sent as it is answered)
}

// sessions is the leader's keep-alive state, and a relay's.
type sessions struct {
	wait []kaReq // arrived since the last read was issued
	// reads are the reads issued and not yet answered, oldest first: one
	// a tick while requests wait, so that a read whose heartbeats were
	// lost holds up nothing (a later read's quorum confirms it too).
	reads []*kaRead
	next  uint64
	// relay is, on a voter that does not lead, its own request and those
	// of learners, for the leader: carried by its next heartbeat answer
	// (carry), or in a message of their own once they waited relayBeats
	// heartbeat intervals more than that (forwardRelayed). relayFrom is
	// when the oldest of them arrived.
	relay     []relayed
	relayFrom int64
	// last is when the last read was issued (due).
	last int64
	// sent is the sequence number of this member's latest keep-alive
	// sent through a relay, answered that of the latest answer it had.
	sent, answered uint64
	// back is, on the leader, the answers to keep-alives that voters'
	// heartbeat answers carried and that were granted at once
	// (carrierConfirms), by voter, for the leader's next heartbeat to
	// that voter to carry back (carryBack); backFrom is when the oldest
	// of a voter's was granted (sendBack).
	back     map[uint64][]relayed
	backFrom map[uint64]int64
}

// kaRead is one read issued by the leader and the requests it covers.
type kaRead struct {
	ctx       uint64
	issued    int64
	index     uint64
	confirmed bool
	reqs      []kaReq
}

// due reports whether beats heartbeat intervals passed since the last
// read, and if so starts the next: keep-alives are read once a heartbeat,
// which their lease does not notice (a keep-alive is answered within about
// three heartbeats, and the member counts 0.9·Liveness from its send),
// rather than once a tick; the reads' heartbeats are then the voters'.
func (s *sessions) due(now int64, m *Member, beats int) bool {
	if m.tick > 0 && now-s.last < int64(beats*m.cfg.HeartbeatTicks)*m.tick {
		return false
	}
	s.last = now
	return true
}

// relayBeats is how many heartbeat intervals a relay's requests wait,
// beyond the one in which the leader's next heartbeat normally comes to
// carry them back in its answer, before the relay sends them in a message
// of their own: a leader whose heartbeats stopped (an election), or a
// voter the leader sends none (its reads stopped, its plain heartbeats
// lost).
const relayBeats = 1

type relayed struct {
	from uint64
	body []byte
}

// IsKeepAlive reports whether a raft message is a keep-alive request or
// answer, or a relay's batch of them (for drivers that count traffic by
// kind).
func IsKeepAlive(msg *pb.Message) bool {
	t, c := msg.GetType(), msg.GetContext()
	return (t == pb.MsgReadIndex || t == pb.MsgReadIndexResp) && (bytes.HasPrefix(c, kaMagic) || bytes.HasPrefix(c, kbMagic))
}

// CarriesAnswers reports whether a raft message carries keep-alive
// answers: one of its own, a batch, or the leader's heartbeat that
// carries a batch back (carryBack); for drivers that delay or drop them.
func CarriesAnswers(msg *pb.Message) bool {
	return IsKeepAlive(msg) && msg.GetType() == pb.MsgReadIndexResp ||
		msg.GetType() == pb.MsgHeartbeat && (bytes.HasPrefix(msg.GetContext(), kqMagic) || bytes.HasPrefix(msg.GetContext(), kyMagic))
}

// CarriesRequests reports whether a raft message carries keep-alive
// requests: one of its own, a batch, or a voter's heartbeat answer that
// carries a batch (carry); for drivers that aim at them.
func CarriesRequests(msg *pb.Message) bool {
	if msg.GetType() == pb.MsgHeartbeatResp {
		return bytes.HasPrefix(msg.GetContext(), kzMagic) || slices.ContainsFunc(carriers, func(c []byte) bool { return bytes.HasPrefix(msg.GetContext(), c) })
	}
	return IsKeepAlive(msg) && msg.GetType() == pb.MsgReadIndex
}

// sendKeepAlive sends the machine's keep-alive toward the leader, or
// queues it here when this member leads. A voter holds it for its next
// answer to the leader's heartbeat to carry (carry; a heartbeat interval
// at most, the reads' heartbeats coming one a heartbeat while keep-alives
// wait); a learner sends it to one of the voters (by its raft ID), which
// relays the keep-alives it gets the same way: the leader then handles
// its voters' heartbeat answers and a few answers whatever the number of
// members, instead of two messages per member and extension. Without a
// known leader it is dropped: the machine extends again soon after one is
// elected (ExtendSoon).
func (m *Member) sendKeepAlive(r ownership.KeepAliveRequest) {
	lead := m.kaLead()
	if lead == 0 {
		return
	}
	if lead == m.cfg.RaftID {
		if m.Leader() {
			m.queueKeepAlive(kaReq{req: r})
		}
		return
	}
	if m.Voter() && m.quietVoter() {
		// Sent at once as the voter's keep-alive (quiet.go).
		m.queueRelay(relayed{from: m.cfg.RaftID, body: r.Encode(nil)}, m.now)
		m.sendQuiet(m.now)
		return
	}
	if m.Voter() {
		// Carried to the leader with the learners' by the next
		// heartbeat answer: no message of its own.
		m.queueRelay(relayed{from: m.cfg.RaftID, body: r.Encode(nil)}, m.lastTick)
		return
	}
	to := lead
	if m.ka.answered >= m.ka.sent {
		// A relay: one of the voters that do not lead, the same for
		// this member while the voters stay. Not when the last one
		// sent through it is unanswered: that relay may have crashed
		// (until autopilot replaces it, its learners' sessions would
		// lapse, ending holder and backup at once), so this one goes
		// to the leader itself.
		var relays []uint64
		for _, v := range m.conf.GetVoters() {
			if v != lead {
				relays = append(relays, v)
			}
		}
		if len(relays) > 0 {
			to = relays[m.cfg.RaftID%uint64(len(relays))]
			m.ka.sent = r.Seq
		}
	}
	ctx := r.Encode(append([]byte(nil), kaMagic...))
	m.out.Messages = append(m.out.Messages, &pb.Message{Type: pb.MsgReadIndex.Enum(), To: proto.Uint64(to), From: proto.Uint64(m.cfg.RaftID), Context: ctx})
}

// kaLead is where keep-alives go: the leader this member knows of, or,
// while it only pre-votes, the last it knew. A voter that missed a few
// heartbeats times out and pre-votes (PreVote), forgetting its leader until
// the next heartbeat, which the other voters, still hearing the leader,
// never let become an election: its keep-alives still reach the leader
// meanwhile (a request is granted only by a read the leader confirms,
// wherever it came from), instead of lapsing with a heartbeat every
// Liveness/10 and an election timeout of Liveness/4 (Timing). Once an
// election is under way (a candidate) they wait for its leader.
func (m *Member) kaLead() uint64 {
	st := m.rn.BasicStatus()
	if st.Lead != 0 {
		return st.Lead
	}
	if st.RaftState == raft.StatePreCandidate {
		return m.lastLead
	}
	return 0
}

func (m *Member) queueKeepAlive(q kaReq) {
	if len(m.ka.wait) < kaMax {
		m.ka.wait = append(m.ka.wait, q)
	}
}

// stepKeepAlive handles an intercepted keep-alive message.
func (m *Member) stepKeepAlive(msg *pb.Message, now int64) {
	if bytes.HasPrefix(msg.GetContext(), kbMagic) {
		m.stepBatch(msg, now)
		return
	}
	body := msg.GetContext()[len(kaMagic):]
	if msg.GetType() == pb.MsgReadIndexResp {
		m.keptAlive(body, now)
		return
	}
	switch {
	case m.Leader():
	case m.Voter() && m.kaLead() != 0:
		// A learner's, to relay with the next batch.
		m.queueRelay(relayed{from: msg.GetFrom(), body: body}, now)
		return
	default:
		return // no leader known: the member asks again
	}
	r, err := ownership.DecodeKeepAliveRequest(body)
	if err != nil {
		return
	}
	m.takeKeepAlive(kaReq{from: msg.GetFrom(), req: r, at: now}, now)
}

// takeKeepAlive queues a request on the leader for its next read.
func (m *Member) takeKeepAlive(q kaReq, now int64) {
	if m.cfg.Ownership.Mutation == ownership.MutKeepAliveUnconfirmed {
		// The broken rule: granted on this member's belief that it leads.
		m.answerAll([]kaReq{q}, now)
		return
	}
	// Alive, whatever the read that confirms it takes: the leader ends
	// it for no lapse meanwhile (ownership.Machine.Heard).
	m.own.Heard(q.req, now)
	m.queueKeepAlive(q)
}

// keptAlive hands an answer to the machine, and asks the leader for what
// its log lacks when the answer says the leader is ahead.
func (m *Member) keptAlive(body []byte, now int64) {
	a, err := ownership.DecodeKeepAliveAnswer(body)
	if err != nil {
		return
	}
	m.ka.answered = max(m.ka.answered, a.Seq)
	m.own.KeptAlive(a, now)
	if last, _ := m.storage.LastIndex(); a.Index > last && m.Lead() != 0 && m.Lead() != m.cfg.RaftID {
		// Behind the leader, which sends a learner few heartbeats
		// (thin): answer as to one, so that it sends what we lack.
		m.out.Messages = append(m.out.Messages, &pb.Message{Type: pb.MsgHeartbeatResp.Enum(), To: proto.Uint64(m.Lead()),
			From: proto.Uint64(m.cfg.RaftID), Term: m.rn.BasicStatus().Term})
	}
}

// stepBatch handles a relay's batch: on the leader, requests to queue; on
// a relay, answers to hand on.
func (m *Member) stepBatch(msg *pb.Message, now int64) {
	items, ok := decodeBatch(msg.GetContext()[len(kbMagic):])
	if !ok {
		return
	}
	if msg.GetType() == pb.MsgReadIndexResp {
		m.handOn(items, now)
		return
	}
	if !m.Leader() {
		return
	}
	for _, it := range items {
		if r, err := ownership.DecodeKeepAliveRequest(it.body); err == nil {
			m.takeKeepAlive(kaReq{from: it.from, via: msg.GetFrom(), req: r, at: now}, now)
		}
	}
}

// handOn hands a batch of answers from the leader to the machine (this
// member's own) and to the learners they are for.
func (m *Member) handOn(items []relayed, now int64) {
	for _, it := range items {
		if it.from == m.cfg.RaftID {
			m.keptAlive(it.body, now)
			continue
		}
		ctx := append(append([]byte(nil), kaMagic...), it.body...)
		m.out.Messages = append(m.out.Messages, &pb.Message{Type: pb.MsgReadIndexResp.Enum(), To: proto.Uint64(it.from), From: proto.Uint64(m.cfg.RaftID), Context: ctx})
	}
}

// queueRelay holds a request for the leader on a voter.
func (m *Member) queueRelay(r relayed, now int64) {
	if len(m.ka.relay) >= kaMax {
		return
	}
	if len(m.ka.relay) == 0 {
		m.ka.relayFrom = now
	}
	m.ka.relay = append(m.ka.relay, r)
}

// forwardRelayed sends, at a tick, the requests this voter holds to the
// leader in one message, once they waited relayBeats heartbeat intervals
// more than a heartbeat answer normally takes to carry them.
func (m *Member) forwardRelayed(now int64) {
	if len(m.ka.relay) == 0 {
		return
	}
	if m.tick > 0 && now-m.ka.relayFrom < int64((1+relayBeats)*m.cfg.HeartbeatTicks)*m.tick {
		return
	}
	lead := m.kaLead()
	if lead != 0 && lead != m.cfg.RaftID && m.Voter() {
		ctx := encodeBatch(append([]byte(nil), kbMagic...), m.ka.relay)
		m.out.Messages = append(m.out.Messages, &pb.Message{Type: pb.MsgReadIndex.Enum(), To: proto.Uint64(lead), From: proto.Uint64(m.cfg.RaftID), Context: ctx})
	}
	m.ka.relay = m.ka.relay[:0]
}

// carry puts the requests this voter holds for the leader into msg, its
// answer to the leader's heartbeat (raft sends one a heartbeat interval,
// a read's while keep-alives wait): kpMagic, the answer's own context
// (length first), then the batch. The leader takes them out before raft
// sees the answer (uncarry), so a voter's keep-alive and its learners'
// cost no message of their own. It returns msg, or a copy that carries.
func (m *Member) carry(msg *pb.Message) *pb.Message {
	if msg.GetType() == pb.MsgHeartbeat {
		return m.carryBack(msg)
	}
	if len(m.ka.relay) == 0 || msg.GetType() != pb.MsgHeartbeatResp || msg.GetTo() != m.Lead() || !m.Voter() {
		return msg
	}
	c := withBatch(msg, krMagic, m.ka.relay)
	m.ka.relay = m.ka.relay[:0]
	return c
}

// withBatch returns a copy of msg whose context is magic, msg's own
// context (length first), then items.
func withBatch(msg *pb.Message, magic []byte, items []relayed) *pb.Message {
	c := proto.Clone(msg).(*pb.Message)
	b := append([]byte(nil), magic...)
	b = binary.AppendUvarint(b, uint64(len(msg.GetContext())))
	b = append(b, msg.GetContext()...)
	c.Context = encodeBatch(b, items)
	return c
}

// withoutBatch undoes withBatch: it returns msg as raft sent it and the
// batch; ok is false for a malformed one, which is dropped whole.
func withoutBatch(msg *pb.Message, magic []byte) (*pb.Message, []relayed, bool) {
	b := msg.GetContext()[len(magic):]
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return nil, nil, false
	}
	ctx, rest := b[k:k+int(n)], b[k+int(n):]
	items, ok := decodeBatch(rest)
	if !ok {
		return nil, nil, false
	}
	c := proto.Clone(msg).(*pb.Message)
	c.Context = nil
	if len(ctx) > 0 {
		c.Context = append([]byte(nil), ctx...)
	}
	return c, items, true
}

// carrierConfirms reports whether msg, a voter's answer to this leader's
// heartbeat, confirms the keep-alives it carries by itself. It does when
// the leader and that voter are a quorum of the configuration (at most
// three voters, none outgoing) and the answer is of the leader's term:
// the voter sent it after the requests it carries were sent (its own, or
// a learner's it relays), still in this term, and the leader took it
// while it still leads, so neither had voted for a later leader when the
// requests were sent, and any later leader's election needs one of their
// votes. That is what a read confirms (session.go of package ownership,
// rule 2), a heartbeat interval sooner. As a read, the grant answers from
// the table applied up to the commit index, once an entry of this term is
// committed; until then the requests wait for a read.
func (m *Member) carrierConfirms(msg *pb.Message) bool {
	st := m.rn.BasicStatus()
	if st.RaftState != raft.StateLeader || msg.GetTerm() != st.HardState.GetTerm() {
		return false
	}
	voters := m.conf.GetVoters()
	if !slices.Contains(voters, msg.GetFrom()) || !slices.Contains(voters, m.cfg.RaftID) || len(m.conf.GetVotersOutgoing()) > 0 {
		return false
	}
	if len(voters) > 3 && m.cfg.Ownership.Mutation != ownership.MutCarrierIsQuorum {
		return false
	}
	commit := st.HardState.GetCommit()
	if t, err := m.storage.Term(commit); err != nil || t != st.HardState.GetTerm() {
		return false
	}
	return m.applied >= commit
}

// grantCarried answers at once a keep-alive that a voter's heartbeat
// answer carried (carrierConfirms). The answer waits for the leader's
// next heartbeat to that voter, a heartbeat interval at most (carryBack),
// so that it costs no message of its own: the request then took as long
// as one a read confirms and answers in a message of its own.
func (m *Member) grantCarried(q kaReq, now int64) {
	a := m.own.KeepAlive(q.req, q.at, now)
	a.Index = m.applied
	if m.ka.back == nil {
		m.ka.back, m.ka.backFrom = map[uint64][]relayed{}, map[uint64]int64{}
	}
	if len(m.ka.back[q.via]) == 0 {
		m.ka.backFrom[q.via] = now
	}
	if len(m.ka.back[q.via]) < kaMax {
		m.ka.back[q.via] = append(m.ka.back[q.via], relayed{from: q.from, body: a.Encode(nil)})
	}
}

// carryBack puts the answers the leader holds for a voter into msg, its
// heartbeat to that voter: kqMagic, the heartbeat's own context (length
// first), then the batch. The voter takes them out before raft sees the
// heartbeat (Step). It returns msg, or a copy that carries.
func (m *Member) carryBack(msg *pb.Message) *pb.Message {
	items := m.ka.back[msg.GetTo()]
	if len(items) == 0 || !m.Leader() {
		return msg
	}
	c := withBatch(msg, kqMagic, items)
	delete(m.ka.back, msg.GetTo())
	delete(m.ka.backFrom, msg.GetTo())
	return c
}

// sendBack sends, at a tick, the answers held for a voter in a message of
// their own once they waited relayBeats heartbeat intervals more than
// the next heartbeat normally takes to carry them: a voter the leader
// sends no heartbeat (demoted to a learner meanwhile, say).
func (m *Member) sendBack(now int64) {
	if len(m.ka.back) == 0 {
		return
	}
	for _, via := range sorted(keys(m.ka.back)) {
		if m.tick > 0 && now-m.ka.backFrom[via] < int64((1+relayBeats)*m.cfg.HeartbeatTicks)*m.tick {
			continue
		}
		m.sendBackTo(via)
	}
}

// sendBackTo sends the answers held for voter via in a message of their
// own.
func (m *Member) sendBackTo(via uint64) {
	if len(m.ka.back[via]) == 0 {
		return
	}
	ctx := encodeBatch(append([]byte(nil), kbMagic...), m.ka.back[via])
	m.out.Messages = append(m.out.Messages, &pb.Message{Type: pb.MsgReadIndexResp.Enum(), To: proto.Uint64(via), From: proto.Uint64(m.cfg.RaftID), Context: ctx})
	delete(m.ka.back, via)
	delete(m.ka.backFrom, via)
}

// uncarry, on the leader, takes the requests a voter's heartbeat answer
// carries (carry, under magic: krMagic or kpMagic) and returns the answer
// as raft sent it; ok is false for a malformed one, which is dropped
// whole.
func (m *Member) uncarry(msg *pb.Message, magic []byte, now int64) (*pb.Message, bool) {
	c, items, ok := withoutBatch(msg, magic)
	if !ok {
		return nil, false
	}
	if bytes.Equal(magic, kpMagic) {
		// A voter that takes no answers back in heartbeats.
		defer m.sendBackTo(msg.GetFrom())
	}
	if m.Leader() {
		confirmed := m.carrierConfirms(msg)
		for _, it := range items {
			r, err := ownership.DecodeKeepAliveRequest(it.body)
			if err != nil {
				continue
			}
			q := kaReq{from: it.from, via: msg.GetFrom(), req: r, at: now}
			if confirmed {
				m.grantCarried(q, now)
			} else {
				m.takeKeepAlive(q, now)
			}
		}
	}
	return c, true
}

// uncarryBack, on a voter, hands on the answers the leader's heartbeat
// carries (carryBack) and returns the heartbeat as raft sent it; ok is
// false for a malformed one, which is dropped whole.
func (m *Member) uncarryBack(msg *pb.Message, now int64) (*pb.Message, bool) {
	c, items, ok := withoutBatch(msg, kqMagic)
	if !ok {
		return nil, false
	}
	m.handOn(items, now)
	return c, true
}

func encodeBatch(b []byte, items []relayed) []byte {
	b = binary.AppendUvarint(b, uint64(len(items)))
	for _, it := range items {
		b = binary.AppendUvarint(b, it.from)
		b = binary.AppendUvarint(b, uint64(len(it.body)))
		b = append(b, it.body...)
	}
	return b
}

func decodeBatch(b []byte) ([]relayed, bool) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > kaMax {
		return nil, false
	}
	b = b[k:]
	items := make([]relayed, 0, n)
	for range n {
		from, k := binary.Uvarint(b)
		if k <= 0 {
			return nil, false
		}
		b = b[k:]
		l, k := binary.Uvarint(b)
		if k <= 0 || l > uint64(len(b)-k) {
			return nil, false
		}
		b = b[k:]
		items = append(items, relayed{from: from, body: b[:l]})
		b = b[l:]
	}
	return items, len(b) == 0
}

// readKeepAlives, at a tick, issues a read that confirms the waiting
// requests. A read unanswered for an election timeout was lost with the
// leadership or its heartbeats: its requests wait for the next read, once;
// the member extends again soon anyway.
func (m *Member) readKeepAlives(now int64) {
	if !m.Leader() {
		m.ka = sessions{next: m.ka.next, relay: m.ka.relay, relayFrom: m.ka.relayFrom, last: m.ka.last, sent: m.ka.sent, answered: m.ka.answered}
		return
	}
	if m.tick > 0 {
		live := m.ka.reads[:0]
		for _, r := range m.ka.reads {
			if now-r.issued > int64(m.cfg.ElectionTicks)*m.tick {
				for _, q := range r.reqs {
					if !q.again && len(m.ka.wait) < kaMax {
						q.again = true
						m.ka.wait = append(m.ka.wait, q)
					}
				}
				continue
			}
			live = append(live, r)
		}
		clear(m.ka.reads[len(live):])
		m.ka.reads = live
	}
	if len(m.ka.wait) == 0 || len(m.ka.reads) >= 2*m.cfg.ElectionTicks || m.quietOwnWaits(now) || !m.ka.due(now, m, 1) {
		return
	}
	m.ka.next++
	m.ka.reads = append(m.ka.reads, &kaRead{ctx: m.ka.next, issued: now, reqs: m.ka.wait})
	m.ka.wait = nil
	m.rn.ReadIndex(binary.BigEndian.AppendUint64(append([]byte(nil), kaMagic...), m.ka.next))
}

// readState notes confirmed reads.
func (m *Member) readState(rs []raft.ReadState) {
	for _, s := range rs {
		c := s.RequestCtx
		if len(c) != len(kaMagic)+8 || !bytes.HasPrefix(c, kaMagic) {
			continue
		}
		ctx := binary.BigEndian.Uint64(c[len(kaMagic):])
		for _, r := range m.ka.reads {
			if r.ctx == ctx {
				r.index, r.confirmed = s.Index, true
			}
		}
	}
}

// answerKeepAlives answers the requests of every confirmed read once the
// log is applied to its index.
func (m *Member) answerKeepAlives(now int64) {
	live := m.ka.reads[:0]
	for _, r := range m.ka.reads {
		if r.confirmed && m.applied >= r.index {
			m.answerAll(r.reqs, now)
			continue
		}
		live = append(live, r)
	}
	clear(m.ka.reads[len(live):])
	m.ka.reads = live
}

// answerAll answers requests: its own to the machine, direct ones each in
// a message, relayed ones in one message per relay.
func (m *Member) answerAll(qs []kaReq, now int64) {
	var vias map[uint64][]relayed
	for _, q := range qs {
		at := q.at
		if at == 0 {
			at = now
		}
		a := m.own.KeepAlive(q.req, at, now)
		a.Index = m.applied
		switch {
		case q.from == 0 || q.from == m.cfg.RaftID:
			m.own.KeptAlive(a, now)
		case q.via != 0:
			if vias == nil {
				vias = map[uint64][]relayed{}
			}
			vias[q.via] = append(vias[q.via], relayed{from: q.from, body: a.Encode(nil)})
		default:
			ctx := a.Encode(append([]byte(nil), kaMagic...))
			m.out.Messages = append(m.out.Messages, &pb.Message{Type: pb.MsgReadIndexResp.Enum(), To: proto.Uint64(q.from), From: proto.Uint64(m.cfg.RaftID), Context: ctx})
		}
	}
	for _, via := range sorted(keys(vias)) {
		ctx := encodeBatch(append([]byte(nil), kbMagic...), vias[via])
		m.out.Messages = append(m.out.Messages, &pb.Message{Type: pb.MsgReadIndexResp.Enum(), To: proto.Uint64(via), From: proto.Uint64(m.cfg.RaftID), Context: ctx})
	}
}

func keys[V any](mp map[uint64]V) map[uint64]struct{} {
	set := make(map[uint64]struct{}, len(mp))
	for k := range mp {
		set[k] = struct{}{}
	}
	return set
}

// learnerBeats is how many heartbeat intervals apart the leader sends a
// learner a heartbeat. A learner neither votes nor counts in a quorum, and
// every commit reaches it in an append: a heartbeat only tells it the
// leader is there and lets the leader resend what it lost, which its
// keep-alive answers do too (they carry the leader's index; a learner
// behind it answers as to a heartbeat). Once liveness left the log, a
// heartbeat every other tick to every learner was most of the log's
// traffic at rest (members² bytes); one every 10 s (at a 2 s Liveness) is
// a fallback.
const learnerBeats = 50

// learnerBeat is learnerBeats heartbeat intervals in ns, 0 while the tick
// is not measured yet.
func (m *Member) learnerBeat() int64 {
	return int64(learnerBeats*m.cfg.HeartbeatTicks) * m.tick
}

// thin appends to out the messages raft wants sent but the heartbeats to
// learners beyond one every learnerBeats heartbeats, and every heartbeat of a
// read (one with a context): a learner's acknowledgement counts in no
// quorum. A learner never heard from gets every heartbeat: a member that
// just joined drops its first append or snapshot when its view does not
// list the leader yet, and raft sends it nothing more until it answers
// (joins to a 64-member cluster waited for the next learner heartbeat,
// 9-11 s, in about half the runs). Nor does it send a voter a plain
// heartbeat within a heartbeat interval of a read's (in the same batch or
// since): the read's heartbeat carries the same commit index, resets the
// same election timer and is answered as one, so the plain one repeats
// it. The leader issues a read a heartbeat while keep-alives wait, which
// is always in a fleet, so the reads are the voters' heartbeats; raft's
// own, on its own phase, went out beside them, twice what a voter needs.
// A voter still hears from the leader within two heartbeat intervals,
// well within an election timeout (Timing). Raft's safety never rests on
// a heartbeat arriving.
func (m *Member) thin(out, msgs []*pb.Message, now int64) []*pb.Message {
	for _, msg := range msgs {
		if msg.GetType() == pb.MsgHeartbeat && len(msg.GetContext()) > 0 && !m.learner(msg.GetTo()) {
			m.readBeat[msg.GetTo()] = now
		}
	}
	beat := int64(m.cfg.HeartbeatTicks) * m.tick
	for _, msg := range msgs {
		if m.quietHeartbeat(msg, now) || m.dropQuietAnswer(msg) {
			continue
		}
		if msg.GetType() == pb.MsgHeartbeat && len(msg.GetContext()) == 0 {
			if at, ok := m.readBeat[msg.GetTo()]; ok && (at == now || now-at < beat) {
				continue
			}
		}
		if msg.GetType() == pb.MsgHeartbeat && m.learner(msg.GetTo()) {
			if len(msg.GetContext()) > 0 {
				continue
			}
			_, answered := m.heard[msg.GetTo()]
			if at, ok := m.beat[msg.GetTo()]; ok && m.tick > 0 && now-at < m.learnerBeat() && !m.owed[msg.GetTo()] && answered {
				continue
			}
			delete(m.owed, msg.GetTo())
			m.beat[msg.GetTo()] = now
		}
		out = append(out, m.carry(msg))
	}
	return out
}

// learner reports whether the applied configuration lists id as a
// learner.
func (m *Member) learner(id uint64) bool {
	if m.conf != m.learnersOf {
		m.learnersOf = m.conf
		clear(m.learners)
		for _, l := range m.conf.GetLearners() {
			m.learners[l] = true
		}
	}
	return m.learners[id]
}
