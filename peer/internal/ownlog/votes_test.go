package ownlog

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/peer/internal/ownership"
)

// voter is member id of a log of voters 1, 2 and 3, without quiet
// sessions (a quiet voter's keep-alives are contact too: quiet_test.go).
func voter(t *testing.T, id uint64, mut ownership.Mutation) *Member {
	t.Helper()
	m, err := New(Config{RaftID: id, Ownership: ownership.Config{ID: "m", Mutation: mut}, Partitions: 4, NoQuiet: true,
		Bootstrap: &pb.ConfState{Voters: []uint64{1, 2, 3}}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func msgOf(out Output, typ pb.MessageType) *pb.Message {
	for _, msg := range out.Messages {
		if msg.GetType() == typ {
			return msg
		}
	}
	return nil
}

// TestVoteTellsContactAge: a granted vote carries how long before it its
// voter last heard from a leader.
func TestVoteTellsContactAge(t *testing.T) {
	m := voter(t, 2, ownership.MutNone)
	ms := int64(time.Millisecond)
	m.Step(&pb.Message{Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(1), To: proto.Uint64(2), Term: proto.Uint64(1)}, 100*ms)
	// A transfer's vote, granted whatever the leader's lease.
	out := m.Step(&pb.Message{Type: pb.MsgVote.Enum(), From: proto.Uint64(3), To: proto.Uint64(2), Term: proto.Uint64(2),
		LogTerm: proto.Uint64(1), Index: proto.Uint64(1), Context: []byte("CampaignTransfer")}, 700*ms)
	v := msgOf(out, pb.MsgVoteResp)
	if v == nil || v.GetReject() {
		t.Fatalf("no vote granted: %v", out.Messages)
	}
	c := v.GetContext()
	if !bytes.HasPrefix(c, kvMagic) {
		t.Fatalf("vote context %q: want the contact age", c)
	}
	if age, _ := binary.Uvarint(c[len(kvMagic):]); int64(age) != 600*ms {
		t.Errorf("contact age %v, want 600ms", time.Duration(age))
	}
}

// elect makes m (voter 1) campaign and win with voter 2's vote, whose
// context is ctx, at now; it returns when m leads.
func elect(t *testing.T, m *Member, ctx []byte, now int64) {
	t.Helper()
	ms := int64(time.Millisecond)
	var pre *pb.Message
	for i := int64(1); i <= 100 && pre == nil; i++ {
		pre = msgOf(m.Tick(now-time.Second.Nanoseconds()+i*10*ms), pb.MsgPreVote)
	}
	if pre == nil {
		t.Fatal("no pre-vote")
	}
	out := m.Step(&pb.Message{Type: pb.MsgPreVoteResp.Enum(), From: proto.Uint64(2), To: proto.Uint64(1), Term: proto.Uint64(pre.GetTerm())}, now)
	vote := msgOf(out, pb.MsgVote)
	if vote == nil {
		t.Fatalf("no vote asked: %v", out.Messages)
	}
	m.Step(&pb.Message{Type: pb.MsgVoteResp.Enum(), From: proto.Uint64(2), To: proto.Uint64(1), Term: proto.Uint64(vote.GetTerm()), Context: ctx}, now)
	if m.rn.BasicStatus().RaftState != raft.StateLeader {
		t.Fatalf("not elected: %s", m.Describe())
	}
}

// TestElectedFromItsVoters: a new leader counts from the latest contact
// among itself and its voters, as they told it (nine tenths of a voter's
// age, its clock perhaps fast); from its election when a vote tells none.
func TestElectedFromItsVoters(t *testing.T) {
	s := time.Second.Nanoseconds()
	age := func(d time.Duration) []byte {
		return binary.AppendUvarint(append([]byte(nil), kvMagic...), uint64(d))
	}
	for _, c := range []struct {
		name string
		ctx  []byte
		mut  ownership.Mutation
		want int64
	}{
		// Voter 1 heard its leader last at 5 s; voter 2, 100 ms before
		// its vote at 10 s.
		{"the voter heard the leader later", age(100 * time.Millisecond), ownership.MutNone, 10*s - 90*time.Millisecond.Nanoseconds()},
		{"the candidate heard it later", age(8 * time.Second), ownership.MutNone, 5 * s},
		{"a vote that tells nothing", nil, ownership.MutNone, 10 * s},
		{"the broken rule", age(100 * time.Millisecond), ownership.MutLeaderOwnContact, 5 * s},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := voter(t, 1, c.mut)
			m.Step(&pb.Message{Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(3), To: proto.Uint64(1), Term: proto.Uint64(1)}, 5*s)
			elect(t, m, c.ctx, 10*s)
			if m.electedFrom != c.want {
				t.Errorf("counts from %v, want %v", time.Duration(m.electedFrom), time.Duration(c.want))
			}
		})
	}
}
