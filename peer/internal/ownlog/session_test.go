package ownlog

import (
	"bytes"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/peer/internal/ownership"

	pb "go.etcd.io/raft/v3/raftpb"
)

// TestKeepAliveAroundADeadRelay: a learner sends its keep-alives through
// a voter that relays them; when its relays never answer (a crashed
// voter that autopilot has not replaced yet), the learner's retries go to
// the leader itself, so its session, and its holdings, last.
func TestKeepAliveAroundADeadRelay(t *testing.T) {
	c := newClusterConf(t, 4, &pb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}})
	c.run(5 * time.Second)
	learner := c.members[4]
	lead := c.leader()
	rec := learner.Own().Table().Members[learner.Own().ID()]
	if rec == nil || !rec.Active || learner.Own().LiveUntil() <= c.now {
		t.Fatalf("the learner is not live after the founding: %+v, lease until %d at %d", rec, learner.Own().LiveUntil(), c.now)
	}
	epoch := rec.Epoch
	relayed, direct := 0, 0
	for end := c.now + int64(4*time.Second); c.now < end; c.now += int64(100 * time.Millisecond) {
		for id := uint64(1); id <= 4; id++ {
			c.carry(id, c.members[id].Tick(c.now))
		}
		for len(c.inbox) > 0 {
			msg := c.inbox[0]
			c.inbox = c.inbox[1:]
			if msg.GetFrom() == 4 && IsKeepAlive(msg) {
				if msg.GetTo() != lead {
					relayed++
					continue // every relay is dead to it
				}
				direct++
			}
			c.carry(msg.GetTo(), c.members[msg.GetTo()].Step(msg, c.now))
		}
	}
	if relayed == 0 || direct == 0 {
		t.Fatalf("%d keep-alives to relays, %d to the leader: want both", relayed, direct)
	}
	rec = c.members[lead].Own().Table().Members[learner.Own().ID()]
	if rec == nil || rec.Epoch != epoch || rec.Ended || learner.Own().LiveUntil() <= c.now {
		t.Fatalf("the learner's session lapsed while its relays were dead: record %+v (epoch was %d), lease until %d at %d", rec, epoch, learner.Own().LiveUntil(), c.now)
	}
}

// TestTiming: a heartbeat every Liveness/10 and an election timeout of
// Liveness/4, in ticks, whatever the tick: the same times in a node (50 ms
// ticks) and in the simulator (100 ms); never faster than 100 ms and
// 0.5 s, nor an election within two heartbeats.
func TestTiming(t *testing.T) {
	for _, c := range []struct {
		live, tick     time.Duration
		beat, election int
	}{
		{2 * time.Second, 50 * time.Millisecond, 4, 10},
		{2 * time.Second, 100 * time.Millisecond, 2, 5},
		{10 * time.Second, 50 * time.Millisecond, 20, 50},
		// Shorter leases keep the floors: 100 ms and 0.5 s.
		{time.Second, 50 * time.Millisecond, 2, 10},
		{200 * time.Millisecond, 50 * time.Millisecond, 2, 10},
		{200 * time.Millisecond, 300 * time.Millisecond, 1, 2},
		{2 * time.Second, 0, 1, 10},
	} {
		beat, election := Timing(c.live, c.tick)
		if beat != c.beat || election != c.election {
			t.Errorf("Timing(%v, %v) = %d, %d ticks; want %d, %d", c.live, c.tick, beat, election, c.beat, c.election)
		}
	}
}

// TestVoterKeepAlivesRideHeartbeats: at rest a voter's keep-alive, and
// the learners' it relays, reach the leader in its heartbeat answers, not
// in messages of their own, their answers come back in the leader's
// heartbeats, and every lease keeps extending; when the
// leader's heartbeats stop reaching one voter, that voter sends them in a
// message of their own and its lease still extends.
func TestVoterKeepAlivesRideHeartbeats(t *testing.T) {
	// 3 voters (VotersFor), where answers ride heartbeats without quiet
	// sessions (quiet.go, where they are the heartbeats: quiet_test.go).
	const n = 13
	cs := &pb.ConfState{Voters: []uint64{1, 2, 3}}
	for i := uint64(4); i <= n; i++ {
		cs.Learners = append(cs.Learners, i)
	}
	c := newClusterConf(t, n, cs).noQuiet()
	c.run(5 * time.Second)
	lead := c.leader()
	var voter uint64
	for i := uint64(1); i <= n; i++ {
		if i != lead && c.members[i].Voter() {
			voter = i
			break
		}
	}
	if lead == 0 || voter == 0 {
		t.Fatalf("leader %d, another voter %d", lead, voter)
	}
	// step delivers one message, or drops it when drop says so.
	step := func(drop func(*pb.Message) bool) (standalone, carried int) {
		for len(c.inbox) > 0 {
			msg := c.inbox[0]
			c.inbox = c.inbox[1:]
			if drop(msg) {
				continue
			}
			if msg.GetTo() == lead && c.members[msg.GetFrom()].Voter() {
				switch {
				case IsKeepAlive(msg):
					standalone++
				case msg.GetType() == pb.MsgHeartbeatResp && bytes.HasPrefix(msg.GetContext(), krMagic):
					carried++
				}
			}
			c.carry(msg.GetTo(), c.members[msg.GetTo()].Step(msg, c.now))
		}
		return standalone, carried
	}
	rest := func(d time.Duration, drop func(*pb.Message) bool) (standalone, carried int) {
		for end := c.now + int64(d); c.now < end; c.now += int64(100 * time.Millisecond) {
			for id := uint64(1); id <= n; id++ {
				c.carry(id, c.members[id].Tick(c.now))
			}
			s, k := step(drop)
			standalone, carried = standalone+s, carried+k
		}
		return standalone, carried
	}
	before := map[uint64]int64{}
	for i := uint64(1); i <= n; i++ {
		before[i] = c.members[i].Own().LiveUntil()
	}
	// Answers back: of three voters, the leader and the carrier are a
	// quorum, so the leader grants at once and its next heartbeat to the
	// voter carries the answers (carryBack).
	back, backCarried := 0, 0
	countBack := func(msg *pb.Message) bool {
		if msg.GetFrom() == lead && c.members[msg.GetTo()].Voter() {
			switch {
			case IsKeepAlive(msg):
				back++
			case msg.GetType() == pb.MsgHeartbeat && bytes.HasPrefix(msg.GetContext(), kqMagic):
				backCarried++
			}
		}
		return false
	}
	standalone, carried := rest(5*time.Second, countBack)
	if standalone != 0 || carried == 0 {
		t.Fatalf("at rest: %d keep-alive messages from voters to the leader, %d heartbeat answers carrying them; want none and some", standalone, carried)
	}
	if back != 0 || backCarried == 0 {
		t.Fatalf("at rest: %d keep-alive answers from the leader to voters in messages of their own, %d heartbeats carrying them; want none and some", back, backCarried)
	}
	for i := uint64(1); i <= n; i++ {
		if until := c.members[i].Own().LiveUntil(); until <= before[i]+int64(4*time.Second) {
			t.Fatalf("m%d's lease stopped extending: until %d, was %d", i, until, before[i])
		}
		before[i] = c.members[i].Own().LiveUntil()
	}
	// The leader's heartbeats to one voter are lost: it hears nothing to
	// answer, and sends what it holds on its own; for 3 s, past its
	// election timeout, so that it pre-votes (the others, hearing the
	// leader, refuse) and knows no leader, and its keep-alives still go
	// to the last it knew.
	standalone, _ = rest(3*time.Second, func(msg *pb.Message) bool {
		return msg.GetFrom() == lead && msg.GetTo() == voter && msg.GetType() == pb.MsgHeartbeat
	})
	if standalone == 0 {
		t.Fatalf("no keep-alive message from a voter whose heartbeats were lost")
	}
	if st := c.members[voter].rn.BasicStatus(); st.RaftState != raft.StatePreCandidate || c.leader() != lead {
		t.Fatalf("m%d is %v, the leader m%d; want a pre-candidate beside the same leader m%d", voter, st.RaftState, c.leader(), lead)
	}
	if until := c.members[voter].Own().LiveUntil(); until <= c.now {
		t.Fatalf("m%d's lease lapsed while it pre-voted without heartbeats: until %d at %d", voter, until, c.now)
	}
}

// TestHeldKeepAliveKeepsItsMember: a keep-alive the leader took in and
// holds for a read that does not come (on a starved machine reads took
// seconds) keeps its member from being ended for a Liveness from its
// arrival (ownership.Machine.Heard, from takeKeepAlive); once that has
// passed with nothing granted, the member is ended as before.
func TestHeldKeepAliveKeepsItsMember(t *testing.T) {
	c := newCluster(t, 3)
	c.run(5 * time.Second)
	lead := c.leader()
	var b uint64
	for id := uint64(1); id <= 3 && b == 0; id++ {
		if id != lead {
			b = id
		}
	}
	bID := c.members[b].Own().ID()
	rec := c.members[lead].Own().Table().Members[bID]
	if rec == nil || !rec.Active || rec.Ended {
		t.Fatalf("%s is not live after the founding: %+v", bID, rec)
	}
	epoch, live := rec.Epoch, int64(2*time.Second) // ownership's default Liveness, which newCluster keeps
	ended := func() bool {
		r := c.members[lead].Own().Table().Members[bID]
		return r == nil || r.Ended || r.Epoch != epoch
	}
	// From now on b's keep-alives reach nobody (nor ride its heartbeat
	// answers), but for one the leader takes in at held and never reads.
	start, held := c.now, c.now+live/2
	for end := start + 2*live; c.now < end && !ended(); c.now += int64(100 * time.Millisecond) {
		if c.now >= held && c.now < held+int64(100*time.Millisecond) {
			l := c.members[lead]
			l.takeKeepAlive(kaReq{from: b, req: ownership.KeepAliveRequest{Member: bID, Epoch: epoch, Seq: 1 << 40}, at: c.now}, c.now)
			l.ka.wait = l.ka.wait[:len(l.ka.wait)-1] // its read never comes
		}
		for id := uint64(1); id <= 3; id++ {
			c.carry(id, c.members[id].Tick(c.now))
		}
		for len(c.inbox) > 0 {
			msg := c.inbox[0]
			c.inbox = c.inbox[1:]
			if msg.GetFrom() == b && CarriesRequests(msg) {
				continue
			}
			c.carry(msg.GetTo(), c.members[msg.GetTo()].Step(msg, c.now))
		}
	}
	if !ended() {
		t.Fatalf("%s not ended 2 Livenesses after its keep-alives stopped", bID)
	}
	if at := c.now - held; at < live {
		t.Fatalf("%s ended %v after the leader took in its keep-alive, within a Liveness (%v)", bID, time.Duration(at), time.Duration(live))
	}
}

// answers counts the keep-alive answers msg carries: one in a message of
// its own, those of a relay's batch, those a heartbeat carries back (or
// a quiet answer: quiet.go).
func answers(msg *pb.Message) int {
	ctx := msg.GetContext()
	switch {
	case IsKeepAlive(msg) && msg.GetType() == pb.MsgReadIndexResp && bytes.HasPrefix(ctx, kbMagic):
		items, _ := decodeBatch(ctx[len(kbMagic):])
		return len(items)
	case IsKeepAlive(msg) && msg.GetType() == pb.MsgReadIndexResp:
		return 1
	case msg.GetType() == pb.MsgHeartbeat && bytes.HasPrefix(ctx, kqMagic):
		_, items, _ := withoutBatch(msg, kqMagic)
		return len(items)
	case msg.GetType() == pb.MsgHeartbeat && bytes.HasPrefix(ctx, kyMagic):
		_, _, items, _ := withoutSeq(msg, kyMagic)
		return len(items)
	}
	return 0
}

// TestCarrierConfirms: a voter's heartbeat answer confirms the keep-alives
// it carries by itself only on the leader, in the leader's term, from a
// voter, among at most three voters (the leader and the carrier are then
// a quorum); of five voters it takes a read, unless the rule is broken
// (MutCarrierIsQuorum).
func TestCarrierConfirms(t *testing.T) {
	for _, tc := range []struct {
		name   string
		voters int
		mut    ownership.Mutation
		edit   func(msg *pb.Message, lead, other uint64)
		onLead bool
		want   bool
	}{
		{"of three voters, in the term", 3, ownership.MutNone, nil, true, true},
		{"of an earlier term", 3, ownership.MutNone, func(msg *pb.Message, _, _ uint64) { msg.Term = proto.Uint64(msg.GetTerm() - 1) }, true, false},
		{"from a member that does not vote", 3, ownership.MutNone, func(msg *pb.Message, _, _ uint64) { msg.From = proto.Uint64(9) }, true, false},
		{"on a member that does not lead", 3, ownership.MutNone, nil, false, false},
		{"of five voters", 5, ownership.MutNone, nil, true, false},
		{"of five voters, the rule broken", 5, ownership.MutCarrierIsQuorum, nil, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, tc.voters)
			for _, m := range c.members {
				m.cfg.Voters = tc.voters
				m.cfg.Ownership.Mutation = tc.mut
			}
			c.run(5 * time.Second)
			lead := c.leader()
			other := lead%uint64(tc.voters) + 1
			to := c.members[lead]
			if !tc.onLead {
				to = c.members[other]
			}
			msg := &pb.Message{Type: pb.MsgHeartbeatResp.Enum(), From: proto.Uint64(other), To: proto.Uint64(lead), Term: proto.Uint64(c.members[lead].rn.BasicStatus().HardState.GetTerm())}
			if tc.edit != nil {
				tc.edit(msg, lead, other)
			}
			if got := to.carrierConfirms(msg); got != tc.want {
				t.Fatalf("carrierConfirms = %v, want %v (leader m%d, voters %v)", got, tc.want, lead, c.members[lead].conf.GetVoters())
			}
		})
	}
}

// TestVoterBeforeCarryBack: a voter that predates carryBack carries its
// keep-alive in a heartbeat answer marked kpMagic and would hand a
// heartbeat that carries answers to raft whole, losing them: the leader
// sends it its answers in a message of their own, and its lease keeps
// extending.
func TestVoterBeforeCarryBack(t *testing.T) {
	c := newCluster(t, 3).noQuiet()
	c.run(5 * time.Second)
	lead := c.leader()
	old := lead%3 + 1
	before := c.members[old].Own().LiveUntil()
	back, kq := 0, 0
	for end := c.now + int64(5*time.Second); c.now < end; c.now += int64(100 * time.Millisecond) {
		for id := uint64(1); id <= 3; id++ {
			c.carry(id, c.members[id].Tick(c.now))
		}
		for len(c.inbox) > 0 {
			msg := c.inbox[0]
			c.inbox = c.inbox[1:]
			if msg.GetFrom() == old && bytes.HasPrefix(msg.GetContext(), krMagic) {
				msg.Context = append(append([]byte(nil), kpMagic...), msg.GetContext()[len(krMagic):]...)
			}
			if msg.GetFrom() == lead && msg.GetTo() == old {
				switch {
				case msg.GetType() == pb.MsgHeartbeat && bytes.HasPrefix(msg.GetContext(), kqMagic):
					kq++
				case CarriesAnswers(msg):
					back += answers(msg)
				}
			}
			c.carry(msg.GetTo(), c.members[msg.GetTo()].Step(msg, c.now))
		}
	}
	if kq != 0 || back == 0 {
		t.Fatalf("to the voter m%d before carryBack, the leader m%d sent %d heartbeats carrying answers and %d answers in messages; want none and some", old, lead, kq, back)
	}
	if until := c.members[old].Own().LiveUntil(); until <= before+int64(4*time.Second) {
		t.Fatalf("m%d's lease stopped extending: until %d, was %d", old, until, before)
	}
}
