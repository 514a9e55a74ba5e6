package ownlog

import (
	"fmt"
	"slices"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/peer/internal/ownership"
)

// confEntries returns, by index, the configuration changes the leader
// sent in appends since the last reset of c.sent: how many single
// changes each carried. It fails the test for a batch (a V2 change) that
// changes a voter.
func (c *cluster) confEntries(lead uint64) map[uint64]int {
	c.t.Helper()
	out := map[uint64]int{}
	for _, msg := range c.sent {
		if msg.GetFrom() != lead || msg.GetType() != pb.MsgApp {
			continue
		}
		for _, e := range msg.GetEntries() {
			switch e.GetType() {
			case pb.EntryConfChange:
				out[e.GetIndex()] = 1
			case pb.EntryConfChangeV2:
				cc := &pb.ConfChangeV2{}
				if err := proto.Unmarshal(e.GetData(), cc); err != nil {
					c.t.Fatal(err)
				}
				out[e.GetIndex()] = len(cc.GetChanges())
				for _, ch := range cc.GetChanges() {
					// A batch changes no voter: it adds learners, and
					// removes members the test made learners (4 and up).
					if ch.GetType() != pb.ConfChangeAddLearnerNode && (ch.GetType() != pb.ConfChangeRemoveNode || ch.GetNodeId() < 4) {
						c.t.Errorf("entry %d: %v of %d in a batch; want learners added or removed only", e.GetIndex(), ch.GetType(), ch.GetNodeId())
					}
				}
			}
		}
	}
	return out
}

// TestLearnersJoinAndGoInBatches: five new incarnations that gossip
// lists join a log of three voters as learners in one configuration
// change, not five; once gossip reports them gone they leave it in one
// too. No batch changes a voter (confEntries), the joiners catch up
// (they apply the table), and the log goes on committing.
func TestLearnersJoinAndGoInBatches(t *testing.T) {
	c := newCluster(t, 3)
	c.run(5 * time.Second)
	lead := c.leader()
	ids := []string{"m1", "m2", "m3"}
	for i := uint64(4); i <= 8; i++ {
		m, err := New(Config{RaftID: i, Ownership: ownership.Config{ID: fmt.Sprintf("m%d", i)}, Partitions: 4})
		if err != nil {
			t.Fatal(err)
		}
		c.members[i] = m
		ids = append(ids, m.Own().ID())
	}
	view := func(gone bool) {
		var roster []Peer
		var g []string
		for j, id := range ids {
			p := Peer{RaftID: uint64(j + 1), Member: id, Gone: gone && j >= 3}
			if p.Gone {
				g = append(g, id)
			}
			roster = append(roster, p)
		}
		for _, m := range c.members {
			m.SetView(ownership.View{Members: ids, Gone: g, Target: []string{"m1", "m2", "m3", "m1"}}, roster)
		}
	}
	view(false)
	c.sent = c.sent[:0]
	c.until(10*time.Second, func() bool {
		for i := uint64(4); i <= 8; i++ {
			if !slices.Contains(c.members[lead].conf.GetLearners(), i) || c.members[i].Own().Table().Members[ids[i-1]] == nil {
				return false
			}
		}
		return true
	}, func() string {
		return "the joiners are not all learners that applied their own join: " + c.members[lead].Describe()
	})
	changes := c.confEntries(lead)
	if n, singles := batches(changes); n > 2 || singles < 5 {
		t.Errorf("5 learners joined in configuration changes %v (index: single changes); want them in one or two", changes)
	}

	for i := uint64(4); i <= 8; i++ {
		c.down[i] = true
	}
	view(true)
	c.sent = c.sent[:0]
	c.until(10*time.Second, func() bool { return len(c.members[lead].conf.GetLearners()) == 0 },
		func() string { return "the gone learners are still in the log: " + c.members[lead].Describe() })
	if changes := c.confEntries(lead); func() bool { n, singles := batches(changes); return n > 2 || singles < 5 }() {
		t.Errorf("5 learners left in configuration changes %v (index: single changes); want them in one or two", changes)
	}
	before := c.members[1].Own().LiveUntil()
	c.run(3 * time.Second)
	if c.members[1].Own().LiveUntil() <= before {
		t.Errorf("m1's liveness no longer extends after the batches: %s", c.members[lead].Describe())
	}
}

// batches counts the changes that carried single changes, and those
// single changes.
func batches(changes map[uint64]int) (entries, singles int) {
	for _, n := range changes {
		if n > 0 {
			entries++
			singles += n
		}
	}
	return entries, singles
}

// TestRemovedVoterLearnsItsRemoval: voter m3, which gossip reports gone
// but which still runs (a leaver), is removed by autopilot (after m4 is
// promoted in its place), and every append that would tell m3 the
// removal committed is lost (and, in the second case, the append with
// the removal itself, so that m3 lacks the entry when it commits). raft
// sends a removed member nothing more once it applied the change, so m3
// listed itself a voter for good, and a leaver waits for that to end
// (peer's leave); the leader's own heartbeat, or append, for the change
// (tellRemoved) tells it.
func TestRemovedVoterLearnsItsRemoval(t *testing.T) {
	for _, lag := range []bool{false, true} {
		t.Run(fmt.Sprintf("lacks_the_entry=%v", lag), func(t *testing.T) { removedVoterLearns(t, lag) })
	}
}

func removedVoterLearns(t *testing.T, lag bool) {
	c := newClusterConf(t, 4, &pb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}})
	c.run(5 * time.Second)
	if c.leader() == 3 {
		c.members[3].TransferLeadership()
		c.run(2 * time.Second)
	}
	ids := []string{"m1", "m2", "m3", "m4"}
	var roster []Peer
	for j, id := range ids {
		roster = append(roster, Peer{RaftID: uint64(j + 1), Member: id, Gone: id == "m3"})
	}
	for _, m := range c.members {
		m.SetView(ownership.View{Members: ids, Gone: []string{"m3"}, Target: []string{"m1", "m2", "m4", "m1"}}, roster)
	}
	removal, lost := uint64(0), 0
	for end := c.now + int64(10*time.Second); c.members[3].Voter(); c.now += int64(100 * time.Millisecond) {
		if c.now > end {
			t.Fatalf("m3 still lists itself a voter 10 s after the removal at index %d (%d appends to it lost): m3 %s; leader %s",
				removal, lost, c.members[3].Describe(), c.members[c.leader()].Describe())
		}
		for id := uint64(1); id <= 4; id++ {
			c.carry(id, c.members[id].Tick(c.now))
		}
		for len(c.inbox) > 0 {
			msg := c.inbox[0]
			c.inbox = c.inbox[1:]
			if msg.GetTo() == 3 && msg.GetType() == pb.MsgApp {
				carries := false
				for _, e := range msg.GetEntries() {
					if e.GetType() == pb.EntryConfChange {
						cc := &pb.ConfChange{}
						if proto.Unmarshal(e.GetData(), cc) == nil && cc.GetType() == pb.ConfChangeRemoveNode && cc.GetNodeId() == 3 {
							removal, carries = e.GetIndex(), true
						}
					}
				}
				// Lost: what raft sends before the removal commits
				// with the entry (under lag), and what commits it
				// without the entry; an append with both is only
				// tellRemoved's, once applied.
				if removal != 0 && (carries && lag && msg.GetCommit() < removal || !carries && msg.GetCommit() >= removal) {
					lost++
					continue
				}
			}
			c.carry(msg.GetTo(), c.members[msg.GetTo()].Step(msg, c.now))
		}
	}
	if removal == 0 || lost == 0 {
		t.Fatalf("m3's removal (index %d) went through without an append to it lost (%d): the test lost nothing", removal, lost)
	}
	t.Logf("m3 applied its removal at index %d, %d appends to it lost", removal, lost)
}

// TestLearnerGetsTheCommitItRefused: the append that commits an entry
// reaches learner m4 before the append with the entry (reordered), so m4
// refuses it, then takes the entry, and its answers reach the leader in
// the other order too; raft, which has m4's Match, sends it
// nothing more while the log is quiet, and learners get a heartbeat only
// every learnerBeats. The refusal owes m4 one at the next heartbeat tick
// (noteRefused), which commits the entry there within a second.
func TestLearnerGetsTheCommitItRefused(t *testing.T) {
	c := newClusterConf(t, 4, &pb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}})
	c.run(5 * time.Second)
	lead := c.leader()
	l := c.members[lead]
	// Just after a learner heartbeat: the next is learnerBeats away.
	last := l.beat[4]
	c.until(10*time.Second, func() bool { return l.beat[4] != last }, func() string { return "no heartbeat to learner m4 in 10 s" })
	if err := l.rn.Propose([]byte{0xff}); err != nil { // refused alike by every member when applied
		t.Fatal(err)
	}
	c.carry(lead, l.ready(c.now))
	var held []*pb.Message
	swapped := false
	for len(c.inbox) > 0 {
		msg := c.inbox[0]
		c.inbox = c.inbox[1:]
		if msg.GetTo() == 4 && msg.GetType() == pb.MsgApp && !swapped {
			if len(msg.GetEntries()) > 0 {
				held = append(held, msg) // the entries, delivered after the commit
				continue
			}
			if len(held) > 0 {
				// m4 refuses the commit, then takes the entry; its two
				// answers reach the leader in the other order, the
				// refusal last (stale by then: raft ignores it).
				var answers []*pb.Message
				for _, in := range append([]*pb.Message{msg}, held...) {
					answers = append(answers, c.members[4].Step(in, c.now).Messages...)
				}
				slices.Reverse(answers)
				for _, a := range answers {
					c.carry(lead, l.Step(a, c.now))
				}
				swapped = true
				continue
			}
		}
		c.carry(msg.GetTo(), c.members[msg.GetTo()].Step(msg, c.now))
	}
	if !swapped {
		t.Fatal("no append with the entry followed by one with its commit went to m4: the test reordered nothing")
	}
	want := l.rn.BasicStatus().HardState.GetCommit()
	if got := c.members[4].rn.BasicStatus().HardState.GetCommit(); got >= want {
		t.Fatalf("m4 committed %d after the reorder, the leader %d: the test lost no commit", got, want)
	}
	c.until(time.Second, func() bool { return c.members[4].rn.BasicStatus().HardState.GetCommit() >= want },
		func() string {
			return fmt.Sprintf("m4 did not commit %d within a second: %s", want, c.members[4].Describe())
		})
}

// TestJointConfigurationLeft: a log whose configuration is joint and that
// raft will not leave by itself (its leave was dropped during a leadership
// transfer, and the log is quiet; here, a joint configuration without
// AutoLeave) is left by autopilot, which changes nothing while it is joint.
func TestJointConfigurationLeft(t *testing.T) {
	voters := []uint64{1, 2, 3}
	c := newClusterConf(t, 4, &pb.ConfState{Voters: voters, VotersOutgoing: voters, Learners: []uint64{4}})
	c.until(5*time.Second, func() bool {
		for _, m := range c.members {
			if len(m.conf.GetVotersOutgoing()) > 0 {
				return false
			}
		}
		return true
	}, func() string {
		return fmt.Sprintf("the configuration is still joint after 5 s: %v", c.members[1].conf)
	})
	if got := c.members[1].conf.GetVoters(); !slices.Equal(got, voters) {
		t.Errorf("voters %v after leaving the joint configuration, want %v", got, voters)
	}
}

// TestRemovedLeaderStepsDown: a leader that applies a configuration
// without itself (a removal a previous leader proposed and this one
// committed with its first entry, say) must step down. raft drops every
// proposal of a leader outside the configuration, and its followers,
// which still get its heartbeats, never elect another: seen under load,
// a crashed holder's liveness was never ended (its End dropped) for the
// 30 s the test waited. With StepDownOnRemoval the others elect a
// leader, which commits again: m1..m3 less the old leader extend.
func TestRemovedLeaderStepsDown(t *testing.T) {
	c := newCluster(t, 3)
	c.run(5 * time.Second)
	old := c.leader()
	if err := c.members[old].rn.ProposeConfChange(&pb.ConfChange{Type: pb.ConfChangeRemoveNode.Enum(), NodeId: proto.Uint64(old)}); err != nil {
		t.Fatal(err)
	}
	c.until(5*time.Second, func() bool { return !slices.Contains(c.members[old].conf.GetVoters(), old) },
		func() string { return "the leader has not applied its own removal: " + c.members[old].Describe() })
	var rest []uint64
	for id := range c.members {
		if id != old {
			rest = append(rest, id)
		}
	}
	c.until(10*time.Second, func() bool {
		return !c.members[old].Leader() && (c.members[rest[0]].Leader() || c.members[rest[1]].Leader())
	}, func() string {
		return fmt.Sprintf("the removed leader m%d still leads, or nobody else does: %s", old, c.members[old].Describe())
	})
	lead := c.leader()
	other := rest[0]
	if other == lead {
		other = rest[1]
	}
	before := c.members[other].Own().LiveUntil()
	c.run(3 * time.Second)
	if c.members[other].Own().LiveUntil() <= before {
		t.Errorf("m%d's liveness no longer extends under the new leader m%d: %s", other, lead, c.members[lead].Describe())
	}
}

// TestNewLearnerHeardFromSoon: learner m4 drops everything the leader
// sends it for its first 2 s (a member that just joined, whose view does
// not list the leader yet, drops its messages), so the append that would
// bring it up to date is lost, and raft sends it nothing more until it
// answers. A learner never heard from gets every heartbeat (thin), so m4
// answers one within a heartbeat of listening and catches up; thinned
// to one every learnerBeats, it waited for the next.
func TestNewLearnerHeardFromSoon(t *testing.T) {
	c := newClusterConf(t, 4, &pb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}})
	deafUntil := c.now + int64(2*time.Second)
	dropped := 0
	step := func() {
		for id := uint64(1); id <= 4; id++ {
			c.carry(id, c.members[id].Tick(c.now))
		}
		for len(c.inbox) > 0 {
			msg := c.inbox[0]
			c.inbox = c.inbox[1:]
			if msg.GetTo() == 4 && c.now < deafUntil {
				dropped++
				continue
			}
			c.carry(msg.GetTo(), c.members[msg.GetTo()].Step(msg, c.now))
		}
		c.now += int64(100 * time.Millisecond)
	}
	for c.now < deafUntil {
		step()
	}
	lead := c.leader()
	want := c.members[lead].rn.BasicStatus().HardState.GetCommit()
	if dropped == 0 || c.members[4].rn.BasicStatus().HardState.GetCommit() >= want {
		t.Fatalf("m4 dropped %d messages and is at commit %d of %d: the test lost nothing", dropped, c.members[4].rn.BasicStatus().HardState.GetCommit(), want)
	}
	from := c.now
	for c.members[4].rn.BasicStatus().HardState.GetCommit() < want {
		if c.now-from > int64(time.Second) {
			t.Fatalf("m4 at commit %d of %d a second after it listened (%d messages dropped before): %s",
				c.members[4].rn.BasicStatus().HardState.GetCommit(), want, dropped, c.members[4].Describe())
		}
		step()
	}
	t.Logf("m4 dropped %d messages, then caught up to commit %d in %v", dropped, want, time.Duration(c.now-from))
}
