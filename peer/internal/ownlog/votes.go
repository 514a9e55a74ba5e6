package ownlog

// A new leader waits out the keep-alives earlier leaders granted before
// it ends anyone (rule 2 of package ownership): every grant was
// confirmed by a quorum of voters each of which had heard from the
// granting leader after the member sent the keep-alive, and one of them
// voted for the new leader. So each voter tells, with its vote, how long
// before it it last heard from a leader (or led, or started: contact);
// the new leader counts every record's whole Liveness from the latest of
// those contacts and its own (electedFrom), rather than from its
// election, which came an election timeout or more after it. A vote
// that tells nothing (a voter from before this rule) makes the new
// leader count from its election, as before.

import (
	"bytes"
	"encoding/binary"
	"math"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/peer/internal/ownership"
)

// kvMagic marks a granted vote's Context that carries the voter's
// contact age (ns on its clock), which raft ignores.
var kvMagic = []byte("rlkv")

// votes are the votes granted to a candidate in term: from is the
// latest contact they reported (on the candidate's clock), unknown that
// one reported none.
type votes struct {
	term    uint64
	from    int64
	unknown bool
}

// touch, at every call, sets the contact at the first and keeps it at
// now while this member leads (each acknowledgement it counts as its own
// is given while it leads) once its election was noted (elected).
func (m *Member) touch(now int64) {
	if !m.contactSet {
		m.contact, m.contactSet = now, true
	}
	m.elected(now)
	if m.Leader() {
		m.contact = now
	}
}

// elected notes, once per term in which this member leads, when the
// keep-alives earlier leaders granted were sent at the latest: before
// its own contact (as it was before it led) and every contact its voters
// reported; at now if any reported none.
func (m *Member) elected(now int64) {
	st := m.rn.BasicStatus()
	if st.RaftState != raft.StateLeader || st.GetTerm() == m.electedTerm {
		return
	}
	m.electedTerm, m.electedFrom = st.GetTerm(), m.contact
	switch {
	case m.cfg.Ownership.Mutation == ownership.MutLeaderOwnContact:
		// The broken rule: the voters' contacts ignored.
	case m.votes.term != st.GetTerm():
		// No vote: elected alone, the only voter.
	case m.votes.unknown:
		m.electedFrom = now
	default:
		m.electedFrom = max(m.electedFrom, m.votes.from)
	}
}

// noteVote notes a vote granted to this member, and returns it without
// the age it carries.
func (m *Member) noteVote(msg *pb.Message, now int64) *pb.Message {
	if msg.GetReject() {
		return msg
	}
	if m.votes.term != msg.GetTerm() {
		m.votes = votes{term: msg.GetTerm(), from: math.MinInt64}
	}
	c := msg.GetContext()
	age, k := uint64(0), 0
	if bytes.HasPrefix(c, kvMagic) {
		age, k = binary.Uvarint(c[len(kvMagic):])
	}
	if k <= 0 || age > math.MaxInt64/2 {
		m.votes.unknown = true
		return msg
	}
	// The voter's clock may run up to 10 % fast: count nine tenths of
	// its age on ours.
	m.votes.from = max(m.votes.from, now-int64(age)*9/10)
	msg = proto.Clone(msg).(*pb.Message)
	msg.Context = nil
	return msg
}

// tellAge puts this member's contact age into the votes it grants.
func (m *Member) tellAge(msgs []*pb.Message, now int64) {
	for i, msg := range msgs {
		if msg.GetType() != pb.MsgVoteResp || msg.GetReject() {
			continue
		}
		c := proto.Clone(msg).(*pb.Message)
		c.Context = binary.AppendUvarint(append([]byte(nil), kvMagic...), uint64(max(now-m.contact, 0)))
		msgs[i] = c
	}
}
