package ownlog

import (
	"bytes"
	"slices"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/ringlimit/ringlimit/peer/internal/ownership"
)

// atRest runs c for 10 s after a 5 s start and counts the messages the
// leader sent and received a second, and those that were raft's own
// heartbeats to a voter (no keep-alive in them) or reads (a heartbeat
// with raft's read context).
func atRest(t *testing.T, c *cluster) (leader, plain float64) {
	t.Helper()
	c.run(5 * time.Second)
	lead := c.leader()
	c.sent = nil
	c.run(10 * time.Second)
	n, p := 0, 0
	for _, msg := range c.sent {
		if msg.GetFrom() == lead || msg.GetTo() == lead {
			n++
		}
		if msg.GetType() == pb.MsgHeartbeat && !bytes.HasPrefix(msg.GetContext(), kyMagic) {
			p++
		}
	}
	return float64(n) / 10, float64(p) / 10
}

// TestQuietTraffic: of three voters at rest, the voters' keep-alives and
// their answers are all the leader exchanges, within issue 54's 2
// messages a second per member; raft's heartbeats (and reads) are gone.
// Without quiet sessions it exchanges 20 a second.
func TestQuietTraffic(t *testing.T) {
	lead, plain := atRest(t, newCluster(t, 3))
	if lead > 6 || plain > 0 {
		t.Errorf("at rest the leader of 3 exchanged %.1f messages a second (want at most 6), %.1f of raft's own heartbeats (want none)", lead, plain)
	}
	loud, loudPlain := atRest(t, newCluster(t, 3).noQuiet())
	if loud < 3*lead || loudPlain == 0 {
		t.Errorf("without quiet sessions the leader exchanged %.1f a second (%.1f heartbeats of raft's), with them %.1f: the count sees nothing", loud, loudPlain, lead)
	}
	t.Logf("the leader of 3 at rest: %.1f messages a second (%.1f without quiet sessions)", lead, loud)
}

// TestQuietLeaderLease: the leader of a quiet configuration counts its
// own lease from the send of an answer a voter acknowledged, never from
// a keep-alive's arrival (MutQuietOwnFromKeepAlive): with every answer to
// the voters lost from some instant on, their keep-alives still arrive,
// acknowledging only answers sent before it (no election: votes are lost
// too), and the leader's lease ends no later than HolderShare of a
// Liveness after that instant.
func TestQuietLeaderLease(t *testing.T) {
	for _, c := range []struct {
		mut     ownership.Mutation
		extends bool
	}{{ownership.MutNone, false}, {ownership.MutQuietOwnFromKeepAlive, true}} {
		cl := newCluster(t, 3)
		for _, m := range cl.members {
			m.cfg.Ownership.Mutation = c.mut // the rule is ownlog's
		}
		cl.run(5 * time.Second)
		lead := cl.leader()
		l := cl.members[lead]
		if !l.quiet() || l.q.from == 0 {
			t.Fatalf("%v: the leader m%d is not quiet or no answer was acknowledged (from %d)", c.mut, lead, l.q.from)
		}
		cut := cl.now
		share := int64(float64(2*time.Second) * ownership.HolderShare)
		cl.runDropping(3*time.Second, func(msg *pb.Message) bool {
			// Every answer, append and heartbeat lost; and no election,
			// so that the voters' keep-alives keep coming to the leader.
			return msg.GetFrom() == lead || msg.GetType() == pb.MsgPreVote || msg.GetType() == pb.MsgVote
		})
		over := l.Own().LiveUntil() > cut+share
		if over != c.extends {
			t.Errorf("%v: the leader's lease runs to %v after its answers stopped reaching anyone (share of a Liveness: %v); extends past it: %v, want %v",
				c.mut, time.Duration(l.Own().LiveUntil()-cut), time.Duration(share), over, c.extends)
		}
	}
}

// TestQuietLeaderCrash: when the leader of a quiet configuration
// crashes, the voters find out from their unanswered keep-alives and
// elect one of them about a keep-alive interval and a wait later, well
// within the election timeout raft's slowed clock keeps (slow): the
// median of 15 crashes within half of it. (Raft's votes split now and
// then, as without quiet sessions: then its randomized timer, on the
// fast clock, elects one a second or two later.)
func TestQuietLeaderCrash(t *testing.T) {
	var took []time.Duration
	var slowed time.Duration
	for range 15 {
		c := newCluster(t, 3)
		c.run(5 * time.Second)
		lead := c.leader()
		slowed = time.Duration(int64(c.members[lead].cfg.ElectionTicks*c.members[lead].slow()) * c.members[lead].tick)
		c.down[lead] = true
		crash := c.now
		c.until(3*slowed, func() bool {
			for id, m := range c.members {
				if id != lead && m.Leader() {
					return true
				}
			}
			return false
		}, func() string { return "no new leader" })
		took = append(took, time.Duration(c.now-crash))
	}
	slices.Sort(took)
	if med := took[len(took)/2]; med > slowed/2 {
		t.Errorf("a new leader %v after the crash (median of %v), not within half the slowed election timeout %v", med, took, slowed)
	}
	t.Logf("a new leader after the leader's crash: median %v, most %v (raft's slowed election timeout: %v)", took[len(took)/2], took[len(took)-1], slowed)
}

// TestQuietAnswerOutsideConfiguration: a keep-alive from a member the
// leader's configuration no longer lists (removed before it heard so)
// gets no answer: raft's heartbeat to it would carry a commit index past
// its log, which raft panics on, as the simulator found.
func TestQuietAnswerOutsideConfiguration(t *testing.T) {
	c := newCluster(t, 3)
	c.run(5 * time.Second)
	l := c.members[c.leader()]
	ctx := withSeq(kzMagic, 0, nil)
	out := l.Step(&pb.Message{Type: pb.MsgHeartbeatResp.Enum(), From: ptr(uint64(9)), To: ptr(l.cfg.RaftID), Term: ptr(l.Term()), Context: ctx}, c.now)
	for _, msg := range out.Messages {
		if msg.GetTo() == 9 {
			t.Errorf("the leader answered a member outside its configuration: %v", msg)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestQuietBesideAnOlderRelease: quiet sessions in a rolling upgrade.
// Beside a leader of a release before them (it hands a voter's quiet
// keep-alive to raft and answers none, and keeps raft's heartbeats), the
// voters find it out (noteLoud) and carry their keep-alives on raft's
// heartbeat answers for the term; beside a voter of that release (no
// quiet keep-alives), the leader keeps raft's clock and heartbeats. Either
// way no voter's election clock runs out, and every lease keeps
// extending.
func TestQuietBesideAnOlderRelease(t *testing.T) {
	for _, oldLeader := range []bool{true, false} {
		// A node's timing (Timing at a 2 s Liveness, 100 ms ticks): a
		// heartbeat every 200 ms, an election after 0.5-1 s.
		c := newClusterConf(t, 3, &pb.ConfState{Voters: []uint64{1, 2, 3}}, func(cfg *Config) {
			cfg.HeartbeatTicks, cfg.ElectionTicks = Timing(2*time.Second, 100*time.Millisecond)
		})
		c.run(5 * time.Second)
		lead := c.leader()
		old := lead
		if !oldLeader {
			old = lead%3 + 1
		}
		if !oldLeader {
			// Restarted as the older release: down for a while first
			// (with its data directory, the same raft member).
			c.runDropping(2*time.Second, func(msg *pb.Message) bool { return msg.GetFrom() == old || msg.GetTo() == old })
		}
		c.members[old].cfg.NoQuiet, c.members[old].q.of = true, nil
		term := c.members[lead].Term()
		before := map[uint64]int64{}
		for id, m := range c.members {
			before[id] = m.Own().LiveUntil()
		}
		prevotes, late, start := 0, 0, c.now
		c.runDropping(10*time.Second, func(msg *pb.Message) bool {
			if msg.GetTo() == old && bytes.HasPrefix(msg.GetContext(), kzMagic) {
				msg.Context = nil // an older release knows no quiet keep-alive
				if c.now-start > int64(5*time.Second) {
					late++
				}
			}
			if msg.GetType() == pb.MsgPreVote && c.now-start > int64(time.Second) {
				prevotes++ // (not the restarted voter's first, from its time down)
			}
			return false
		})
		if late > 0 {
			t.Errorf("old leader %v: %d quiet keep-alives sent to it in the last 5 s: the voters never found out", oldLeader, late)
		}
		if prevotes > 0 {
			t.Errorf("old leader %v: %d pre-votes asked: a voter's election clock ran out", oldLeader, prevotes)
		}
		for id, m := range c.members {
			if m.Term() != term {
				t.Errorf("old leader %v: m%d at term %d, was %d: an election", oldLeader, id, m.Term(), term)
			}
			if until := m.Own().LiveUntil(); until <= c.now || until <= before[id]+int64(8*time.Second) {
				t.Errorf("old leader %v: m%d's lease stopped extending: until %v, was %v", oldLeader, id, time.Duration(until), time.Duration(before[id]))
			}
		}
	}
}
