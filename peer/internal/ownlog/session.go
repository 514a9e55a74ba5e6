package ownlog

// Keep-alives (the ownership package's sessions) ride the raft transport
// as raft message types raft never sends from its own ReadIndex path: a
// MsgReadIndex or MsgReadIndexResp whose Context begins with kaMagic. The
// member intercepts them before raft sees them. The leader collects the
// requests that arrive and confirms, once per tick, with one ReadIndex of
// its own that it still leads (a quorum heard from it after they
// arrived); once it has applied the log to that read's index, it answers
// every one of them from its table.

import (
	"bytes"
	"encoding/binary"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/peer/internal/ownership"
)

// kaMagic marks a keep-alive's Context.
var kaMagic = []byte("rlka")

// kaMax bounds the requests the leader holds for one read: a member
// extends every ExtendEvery, so this many is thousands of members.
const kaMax = 1 << 14

// kaReq is one request waiting for the leader's read; from is 0 for the
// leader's own.
type kaReq struct {
	from uint64
	req  ownership.KeepAliveRequest
}

// sessions is the leader's keep-alive state.
type sessions struct {
	wait      []kaReq // arrived since the outstanding read was issued
	read      []kaReq // covered by the outstanding read
	ctx       uint64  // the outstanding read's context (0: none)
	next      uint64
	issued    int64 // when the outstanding read was issued
	index     uint64
	confirmed bool
}

// IsKeepAlive reports whether a raft message is a keep-alive request or
// answer (for drivers that count traffic by kind).
func IsKeepAlive(msg *pb.Message) bool {
	t := msg.GetType()
	return (t == pb.MsgReadIndex || t == pb.MsgReadIndexResp) && bytes.HasPrefix(msg.GetContext(), kaMagic)
}

// sendKeepAlive sends the machine's keep-alive to the leader, or queues it
// here when this member leads. Without a known leader it is dropped: the
// machine extends again soon after one is elected (ExtendSoon).
func (m *Member) sendKeepAlive(r ownership.KeepAliveRequest) {
	lead := m.Lead()
	switch lead {
	case 0:
	case m.cfg.RaftID:
		m.queueKeepAlive(kaReq{req: r})
	default:
		ctx := r.Encode(append([]byte(nil), kaMagic...))
		m.out.Messages = append(m.out.Messages, &pb.Message{Type: pb.MsgReadIndex.Enum(), To: proto.Uint64(lead), From: proto.Uint64(m.cfg.RaftID), Context: ctx})
	}
}

func (m *Member) queueKeepAlive(q kaReq) {
	if len(m.ka.wait) < kaMax {
		m.ka.wait = append(m.ka.wait, q)
	}
}

// stepKeepAlive handles an intercepted keep-alive message.
func (m *Member) stepKeepAlive(msg *pb.Message, now int64) {
	body := msg.GetContext()[len(kaMagic):]
	if msg.GetType() == pb.MsgReadIndexResp {
		a, err := ownership.DecodeKeepAliveAnswer(body)
		if err == nil {
			m.own.KeptAlive(a, now)
		}
		return
	}
	r, err := ownership.DecodeKeepAliveRequest(body)
	if err != nil || !m.Leader() {
		return // a follower answers nothing; the member asks the leader again
	}
	q := kaReq{from: msg.GetFrom(), req: r}
	if m.cfg.Ownership.Mutation == ownership.MutKeepAliveUnconfirmed {
		// The broken rule: granted on this member's belief that it leads.
		m.answer(q, now)
		return
	}
	m.queueKeepAlive(q)
}

// readKeepAlives, at a tick, issues the read that confirms the waiting
// requests, unless one is outstanding; a read outstanding for an election
// timeout was lost with the leadership.
func (m *Member) readKeepAlives(now int64) {
	if !m.Leader() {
		m.ka = sessions{next: m.ka.next}
		return
	}
	if m.ka.ctx != 0 && m.tick > 0 && now-m.ka.issued > int64(m.cfg.ElectionTicks)*m.tick {
		m.ka.read, m.ka.ctx, m.ka.confirmed = nil, 0, false
	}
	if m.ka.ctx != 0 || len(m.ka.wait) == 0 {
		return
	}
	m.ka.next++
	m.ka.ctx, m.ka.issued = m.ka.next, now
	m.ka.read, m.ka.wait = m.ka.wait, nil
	m.rn.ReadIndex(binary.BigEndian.AppendUint64(append([]byte(nil), kaMagic...), m.ka.ctx))
}

// readState notes a confirmed read.
func (m *Member) readState(rs []raft.ReadState) {
	for _, s := range rs {
		c := s.RequestCtx
		if m.ka.ctx != 0 && len(c) == len(kaMagic)+8 && bytes.HasPrefix(c, kaMagic) && binary.BigEndian.Uint64(c[len(kaMagic):]) == m.ka.ctx {
			m.ka.index, m.ka.confirmed = s.Index, true
		}
	}
}

// answerKeepAlives answers the requests a confirmed read covers once the
// log is applied to its index.
func (m *Member) answerKeepAlives(now int64) {
	if !m.ka.confirmed || m.applied < m.ka.index {
		return
	}
	for _, q := range m.ka.read {
		m.answer(q, now)
	}
	m.ka.read, m.ka.ctx, m.ka.confirmed = nil, 0, false
}

func (m *Member) answer(q kaReq, now int64) {
	a := m.own.KeepAlive(q.req, now)
	if q.from == 0 || q.from == m.cfg.RaftID {
		m.own.KeptAlive(a, now)
		return
	}
	ctx := a.Encode(append([]byte(nil), kaMagic...))
	m.out.Messages = append(m.out.Messages, &pb.Message{Type: pb.MsgReadIndexResp.Enum(), To: proto.Uint64(q.from), From: proto.Uint64(m.cfg.RaftID), Context: ctx})
}
