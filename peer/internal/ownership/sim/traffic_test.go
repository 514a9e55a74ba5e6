package sim

import (
	"math"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
)

// TestTrafficAccounting: every message is counted once for the network
// as sent, once for its sender (the leader's share or its member's) and
// at most once for its receiver per copy delivered; raft bytes are the
// marshalled messages; ownership figures leave the data plane out.
func TestTrafficAccounting(t *testing.T) {
	for c := range numCategories {
		if c.String() == "" {
			t.Errorf("category %d has no name in categories", c)
		}
	}
	o := Options{Seed: 1, NoFault: true, Members: 5, Duration: 5 * time.Second}
	r := run(t, o)
	o.defaults()
	tr := r.Traffic
	// Keep-alives ride the raft transport: the run's raft bytes are both.
	raftMsgs := tr.Total[Raft].Msgs + tr.Total[KeepAlive].Msgs
	if got := tr.Total[Raft].Bytes + tr.Total[KeepAlive].Bytes; got != int64(r.RaftBytes) {
		t.Errorf("raft and keep-alive bytes counted %d, the run marshalled %d", got, r.RaftBytes)
	}
	if tr.Total[KeepAlive].Msgs == 0 {
		t.Error("no keep-alive counted: members keep their liveness through them")
	}
	var msgs int64
	for c := range numCategories {
		sent, recv := tr.Leader.Sent[c], tr.Leader.Received[c]
		for i := range tr.Members {
			sent.Msgs += tr.Members[i].Sent[c].Msgs
			sent.Bytes += tr.Members[i].Sent[c].Bytes
			recv.Msgs += tr.Members[i].Received[c].Msgs
		}
		if sent != tr.Total[c] {
			t.Errorf("%s: the senders counted %+v, the network %+v", c, sent, tr.Total[c])
		}
		if recv.Msgs > sent.Msgs || recv.Msgs == 0 && c != Rights {
			t.Errorf("%s: %d received of %d sent, want some and no more (no duplication in this run)", c, recv.Msgs, sent.Msgs)
		}
		if !c.Ownership() && tr.Total[c].Bytes != 0 {
			t.Errorf("%s: %d bytes, want 0 (the data plane's bytes are not modelled)", c, tr.Total[c].Bytes)
		}
		msgs += tr.Total[c].Msgs
	}
	if msgs != int64(r.Messages) {
		t.Errorf("categories sum to %d messages, the run sent %d", msgs, r.Messages)
	}
	rt := tr.Rates()
	if want := float64(raftMsgs) / tr.Seconds; math.Abs(rt.OwnMsgs-want) > 1e-6 {
		t.Errorf("ownership messages/s %v, want the raft and keep-alive ones only, %v", rt.OwnMsgs, want)
	}
	// Every member followed before the first election: five count.
	if rt.LeaderMsgs == 0 || rt.MemberMsgs == 0 || rt.Members != 5 {
		t.Errorf("rates %+v: want the leader's traffic and five members'", rt)
	}
	// Every voter counts as one (the leader too: it followed before the
	// first election), and the other members as learners.
	if rt.Voters != o.Voters || rt.MaxLearnerMsgs == 0 || o.Voters >= o.Members {
		t.Errorf("rates %+v: want %d voting members and learners' figures", rt, o.Voters)
	}
	var typed int64
	for _, f := range tr.RaftTypes {
		typed += f.Msgs
	}
	if typed != raftMsgs || tr.RaftTypes[pb.MsgApp].Msgs == 0 {
		t.Errorf("raft messages by type %v sum to %d, want all %d, appends among them", tr.RaftTypes, typed, raftMsgs)
	}
}
