package ownlog

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/peer/internal/ownership"
)

// cluster is members wired to each other by an in-memory, lossless,
// in-order network: enough to test the glue; faults are the simulator's.
type cluster struct {
	t       *testing.T
	members map[uint64]*Member
	now     int64
	inbox   []*pb.Message
	down    map[uint64]bool // crashed: not ticked, sent nothing, told nothing
	sent    []*pb.Message   // every message delivered, for tests that count them
}

func newCluster(t *testing.T, n int) *cluster {
	t.Helper()
	cs := &pb.ConfState{}
	for i := 1; i <= n; i++ {
		cs.Voters = append(cs.Voters, uint64(i))
	}
	return newClusterConf(t, n, cs)
}

// newClusterConf is newCluster with the founding configuration cs, and
// each member's configuration changed by opts.
func newClusterConf(t *testing.T, n int, cs *pb.ConfState, opts ...func(*Config)) *cluster {
	t.Helper()
	c := &cluster{t: t, members: map[uint64]*Member{}, down: map[uint64]bool{}}
	var ids []string
	for i := 1; i <= n; i++ {
		ids = append(ids, fmt.Sprintf("m%d", i))
	}
	for i := 1; i <= n; i++ {
		cfg := Config{RaftID: uint64(i), Ownership: ownership.Config{ID: ids[i-1]}, Partitions: 4, Bootstrap: cs}
		for _, o := range opts {
			o(&cfg)
		}
		m, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		var roster []Peer
		for j, id := range ids {
			roster = append(roster, Peer{RaftID: uint64(j + 1), Member: id})
		}
		m.SetView(ownership.View{Members: ids, Target: []string{ids[0], ids[1%n], ids[2%n], ids[0]}}, roster)
		c.members[uint64(i)] = m
	}
	return c
}

// noQuiet turns quiet sessions off on every member (quiet.go): for the
// tests of what three voters do without them (as with learners).
func (c *cluster) noQuiet() *cluster {
	for _, m := range c.members {
		m.cfg.NoQuiet, m.q.of = true, nil
	}
	return c
}

// runDropping is run, but every message drop reports true for is lost
// (c.down is not consulted).
func (c *cluster) runDropping(d time.Duration, drop func(*pb.Message) bool) {
	for end := c.now + int64(d); c.now < end; c.now += int64(100 * time.Millisecond) {
		for id := uint64(1); id <= uint64(len(c.members)); id++ {
			c.carry(id, c.members[id].Tick(c.now))
		}
		for len(c.inbox) > 0 {
			msg := c.inbox[0]
			c.inbox = c.inbox[1:]
			if !drop(msg) {
				c.carry(msg.GetTo(), c.members[msg.GetTo()].Step(msg, c.now))
			}
		}
	}
}

func (c *cluster) carry(from uint64, out Output) {
	for _, msg := range out.Messages {
		c.inbox = append(c.inbox, msg)
		if msg.GetType() == pb.MsgSnap {
			c.members[from].ReportSnapshot(msg.GetTo(), true, c.now)
		}
	}
	for _, a := range out.Actions {
		if a.Kind == ownership.SendCopy {
			to := c.byMember(a.To)
			if to.Own().OfferCopy(a.P, c.members[from].Own().ID(), a.Epoch, a.Seq) {
				c.carry(from, c.members[from].CopyAcked(a.P, a.To, a.Epoch, a.Seq, c.now))
			}
		}
	}
}

// leaveThenCheckMajority has member id leave gracefully, asking Leave
// again until it is no voter (as Runner.Leave does: a proposal made while
// the log elects a leader is dropped), within 10 s; then stops it and
// checks that member other's liveness still extends: the log kept a
// majority without it.
func (c *cluster) leaveThenCheckMajority(id, other uint64) {
	c.t.Helper()
	for end, i := c.now+int64(10*time.Second), 0; c.members[id].Voter(); i++ {
		if c.now > end {
			c.t.Fatalf("m%d is still a voter 10 s after it left: %s", id, c.members[other].Describe())
		}
		if i%4 == 0 {
			c.carry(id, c.members[id].Leave(c.now))
		}
		c.run(100 * time.Millisecond)
	}
	c.down[id] = true
	before := c.members[other].Own().LiveUntil()
	c.run(5 * time.Second)
	if after := c.members[other].Own().LiveUntil(); after <= before {
		c.t.Fatalf("m%d's liveness no longer extends once m%d left (the log lost its majority): %s", other, id, c.members[other].Describe())
	}
}

// leader returns the raft ID of the member that leads, failing the test
// when none does.
func (c *cluster) leader() uint64 {
	c.t.Helper()
	for id, m := range c.members {
		if m.Leader() {
			return id
		}
	}
	c.t.Fatal("no leader")
	return 0
}

// until runs the cluster 100 ms at a time until cond holds, failing the
// test with why() after d of virtual time.
func (c *cluster) until(d time.Duration, cond func() bool, why func() string) {
	c.t.Helper()
	for end := c.now + int64(d); !cond(); {
		if c.now > end {
			c.t.Fatal(why())
		}
		c.run(100 * time.Millisecond)
	}
}

// roster is every member, none gone or leaving.
func (c *cluster) roster() []Peer {
	var r []Peer
	for id := uint64(1); id <= uint64(len(c.members)); id++ {
		r = append(r, Peer{RaftID: id, Member: c.members[id].Own().ID()})
	}
	return r
}

func (c *cluster) byMember(id string) *Member {
	for _, m := range c.members {
		if m.Own().ID() == id {
			return m
		}
	}
	c.t.Fatalf("no member %s", id)
	return nil
}

// run ticks every member every 100 ms of virtual time for d, delivering
// messages between ticks.
func (c *cluster) run(d time.Duration) {
	for end := c.now + int64(d); c.now < end; c.now += int64(100 * time.Millisecond) {
		for id := uint64(1); id <= uint64(len(c.members)); id++ {
			if !c.down[id] {
				c.carry(id, c.members[id].Tick(c.now))
			}
		}
		for len(c.inbox) > 0 {
			msg := c.inbox[0]
			c.inbox = c.inbox[1:]
			if to := c.members[msg.GetTo()]; to != nil && !c.down[msg.GetTo()] && !c.down[msg.GetFrom()] {
				c.sent = append(c.sent, msg)
				c.carry(msg.GetTo(), to.Step(msg, c.now))
			}
		}
	}
}

// TestFounding: three members elect a leader, join, extend their
// liveness, and every partition gets exactly one holder, which decides,
// with a backup; all members apply the same table.
func TestFounding(t *testing.T) {
	c := newCluster(t, 3)
	c.run(5 * time.Second)
	leaders := 0
	for _, m := range c.members {
		if m.Leader() {
			leaders++
		}
	}
	if leaders != 1 {
		t.Fatalf("%d leaders", leaders)
	}
	first := c.members[1].Own().Table()
	for p := range first.Parts {
		pt := first.Parts[p]
		deciders := 0
		for _, m := range c.members {
			if m.Own().MayDecide(p, c.now) {
				deciders++
			}
			if got := m.Own().Table().Parts[p]; got != pt {
				t.Errorf("p%d: %s applied %+v, %s %+v", p, m.Own().ID(), got, c.members[1].Own().ID(), pt)
			}
		}
		if pt.Holder == "" || pt.Backup == "" || deciders != 1 {
			t.Errorf("p%d: %+v, %d members decide", p, pt, deciders)
		}
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	for _, cfg := range []Config{{}, {RaftID: 1, Partitions: 4}, {RaftID: 1, Ownership: ownership.Config{ID: "a"}}} {
		if _, err := New(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("New(%+v): %v, want ErrConfig", cfg, err)
		}
	}
}

// TestLeavingVoterReplacedFirst: of voters m1, m2, m3 and learner m4, m3
// has crashed unnoticed (no roster says it is gone) and m2 leaves
// gracefully while its gossip is cut (no roster says it is leaving
// either). Once its Leave has ended it for good, autopilot must promote
// m4 and then remove m2: keeping m2 a voter after it has gone, or
// removing it before m4 votes, leaves voters of whom only m1 is up, and
// nothing commits again (the log stops every holder).
func TestLeavingVoterReplacedFirst(t *testing.T) {
	c := newClusterConf(t, 4, &pb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}})
	c.run(5 * time.Second)
	c.down[3] = true
	ids := []string{"m1", "m2", "m3", "m4"}
	var roster []Peer
	for j, id := range ids {
		roster = append(roster, Peer{RaftID: uint64(j + 1), Member: id})
	}
	for _, m := range c.members {
		m.SetView(ownership.View{Members: ids, Target: []string{"m1", "m4", "m1", "m4"}}, roster)
	}
	c.run(3 * time.Second) // m2's partitions and backups move off it
	c.leaveThenCheckMajority(2, 1)
	if !c.members[4].Voter() {
		t.Errorf("m4 was not promoted in m2's place: %s", c.members[4].Describe())
	}
}

// A message addressed to an earlier incarnation at this member's address
// (a restarted process reusing the port) is dropped: its leader's progress
// for that incarnation, here a commit past this member's empty log, would
// make raft panic.
func TestStepDropsMessagesForAnotherMember(t *testing.T) {
	m, err := New(Config{RaftID: 7, Ownership: ownership.Config{ID: "m7"}, Partitions: 4})
	if err != nil {
		t.Fatal(err)
	}
	hb := &pb.Message{Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(1), To: proto.Uint64(6), Term: proto.Uint64(3), Commit: proto.Uint64(789)}
	m.Step(hb, 0)
	if d := m.Describe(); !strings.Contains(d, "term 0") {
		t.Fatalf("after a heartbeat for raft ID 6: %s; want it ignored", d)
	}
	hb.To = proto.Uint64(7)
	hb.Commit = proto.Uint64(0)
	m.Step(hb, 0)
	if d := m.Describe(); !strings.Contains(d, "term 3") {
		t.Fatalf("after a heartbeat for this member: %s; want term 3", d)
	}
}

// TestRestAppendsNothing: at rest the log stays quiet. Members keep their
// liveness through keep-alives the leader answers (sessions), not through
// commands, so the leader appends no entry in 10 s while every member's
// lease keeps extending; before sessions every member appended an
// extension every Liveness/3 and each went to every member (N² a second).
func TestRestAppendsNothing(t *testing.T) {
	c := newCluster(t, 5)
	c.run(5 * time.Second)
	c.sent = c.sent[:0]
	lead := c.leader()
	entries, kas := 0, 0
	before := map[uint64]int64{}
	for i := uint64(1); i <= 5; i++ {
		before[i] = c.members[i].Own().LiveUntil()
	}
	for range 100 { // 10 s at rest
		c.run(100 * time.Millisecond)
		for _, msg := range c.sent {
			if msg.GetFrom() == lead && msg.GetType() == pb.MsgApp {
				for _, e := range msg.GetEntries() {
					if len(e.GetData()) > 0 {
						entries++
					}
				}
			}
			kas += answers(msg)
		}
		c.sent = c.sent[:0]
	}
	if entries != 0 {
		t.Fatalf("at rest the leader appended %d entries in 10 s; want none", entries)
	}
	for i := uint64(1); i <= 5; i++ {
		if until := c.members[i].Own().LiveUntil(); until <= before[i]+int64(9*time.Second) {
			t.Fatalf("m%d's lease stopped extending at rest: until %d, was %d", i, until, before[i])
		}
	}
	// Four members, each every Liveness/2 (2 s): about 40 answers.
	if kas < 30 {
		t.Fatalf("%d keep-alive answers in 10 s; want about 40", kas)
	}
	t.Logf("%d keep-alive answers, no entry", kas)
}

// TestLeaverKeepsTheMajority: of voters m1, m2 and m3 (no learner to
// promote), m3 has crashed unnoticed (no roster says it is gone) and m2
// leaves gracefully. Removing m2 once its Leave ended it left voters m1
// and m3, of whom only m1 is up, and nothing committed again. Autopilot
// removes m3, which does not answer, in its place first, then m2; m1
// goes on alone.
func TestLeaverKeepsTheMajority(t *testing.T) {
	c := newCluster(t, 3)
	c.run(5 * time.Second)
	c.down[3] = true
	ids := []string{"m1", "m2", "m3"}
	for _, m := range c.members {
		m.SetView(ownership.View{Members: ids, Target: []string{"m1", "m1", "m1", "m1"}}, c.roster())
	}
	c.run(3 * time.Second) // the partitions and backups move off m2
	c.leaveThenCheckMajority(2, 1)
	if !c.members[1].Voter() || slices.Contains(c.members[1].conf.GetVoters(), 3) {
		t.Errorf("voters %v; want m1 alone", c.members[1].conf.GetVoters())
	}
}

// TestLeaderLeavingPastADeadVoter: of voters m1, m2, m3 and learner m4,
// the leader leaves while a follower has crashed unnoticed (no roster
// says it is gone), and autopilot promotes m4 in the leaver's place:
// four voters, one dead. Once the others cut the leaver off (gossip
// declared it failed), two of four were up and nothing committed again.
// Autopilot removes the dead voter first, so the survivors keep two of
// three.
func TestLeaderLeavingPastADeadVoter(t *testing.T) {
	c := newClusterConf(t, 4, &pb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}})
	c.run(5 * time.Second)
	lead := c.leader()
	dead := lead%3 + 1
	live := dead%3 + 1
	c.down[dead] = true
	c.run(3 * time.Second) // the dead voter falls silent
	roster := c.roster()
	roster[lead-1].Leaving = true
	for _, m := range c.members {
		m.SetView(ownership.View{Members: []string{"m1", "m2", "m3", "m4"}, Target: []string{"m4", "m4", "m4", "m4"}}, roster)
	}
	c.until(5*time.Second, c.members[4].Voter, func() string { return "m4 not promoted in the leaver's place: " + c.members[lead].Describe() })
	c.run(2 * time.Second)
	c.down[lead] = true // the others declare the leaver failed
	before := c.members[live].Own().LiveUntil()
	c.run(5 * time.Second)
	if after := c.members[live].Own().LiveUntil(); after <= before {
		t.Fatalf("m%d's liveness no longer extends once the leaver m%d is cut off beside dead m%d: %s", live, lead, dead, c.members[live].Describe())
	}
}

// TestLeaverCutOffComesBack: of voters m1, m2, m3 and learner m4, m2
// leaves gracefully and autopilot promotes m4 in its place: four voters,
// one more than wanted. Then m2, still draining, falls silent for a while
// (a loaded machine, a stream that broke) and autopilot removes it as the
// silent voter. Once it answers again it must come back as a learner:
// until its liveness ends it still holds partitions, and a member the log
// no longer sends anything never sees its moves commit nor anyone extend,
// so its graceful leave stalls until its deadline.
func TestLeaverCutOffComesBack(t *testing.T) {
	c := newClusterConf(t, 4, &pb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}})
	c.run(5 * time.Second)
	var leaver uint64
	for id := uint64(1); id <= 3; id++ {
		if !c.members[id].Leader() {
			leaver = id
			break
		}
	}
	roster := c.roster()
	roster[leaver-1].Leaving = true
	for _, m := range c.members {
		m.SetView(ownership.View{Members: []string{"m1", "m2", "m3", "m4"}, Target: []string{"m4", "m4", "m4", "m4"}}, roster)
	}
	c.until(5*time.Second, c.members[4].Voter, func() string { return "m4 not promoted in the leaver's place: " + c.members[1].Describe() })
	c.down[leaver] = true
	other := leaver%4 + 1
	in := func(id uint64) bool {
		cs := c.members[other].conf
		return slices.Contains(cs.GetVoters(), id) || slices.Contains(cs.GetLearners(), id)
	}
	for end := c.now + int64(5*time.Second); in(leaver); {
		if c.now > end {
			t.Fatalf("the silent leaver m%d was not removed: %s", leaver, c.members[other].Describe())
		}
		c.run(100 * time.Millisecond)
	}
	c.down[leaver] = false
	lv := c.members[leaver]
	for end := c.now + int64(5*time.Second); !in(leaver) || !lv.Own().Fresh("m"+fmt.Sprint(other), c.now); {
		if c.now > end {
			t.Fatalf("m%d, leaving, answers again but is not back in the log (or does not see m%d extend): %s; its own: %s", leaver, other, c.members[other].Describe(), lv.Describe())
		}
		c.run(100 * time.Millisecond)
	}
	if lv.Voter() {
		t.Errorf("the leaver came back as a voter: %s", lv.Describe())
	}
}

// TestDrainingLeaverKeepsThreeVoters: of voters m1, m2, m3, a member that
// is not the leader leaves gracefully (still draining: its liveness holds)
// and the third falls silent for a while (a loaded machine). The log must
// keep three voters: counting only the members that stay, it wanted one,
// removed the silent voter and then the leaver, and when the one voter
// left crashed, nothing committed again while the leaver still held
// partitions.
func TestDrainingLeaverKeepsThreeVoters(t *testing.T) {
	c := newCluster(t, 3)
	c.run(5 * time.Second)
	lead := c.leader()
	leaver, quiet := lead%3+1, (lead+1)%3+1
	roster := c.roster()
	roster[leaver-1].Leaving = true
	for _, m := range c.members {
		m.SetView(ownership.View{Members: []string{"m1", "m2", "m3"}, Target: []string{"m1", "m2", "m3", "m1"}}, roster)
	}
	c.down[quiet] = true
	c.run(5 * time.Second)
	if v := len(c.members[lead].conf.GetVoters()); v != 3 {
		t.Fatalf("with m%d leaving and m%d silent, the leader m%d keeps %d voters, want 3: %s", leaver, quiet, lead, v, c.members[lead].Describe())
	}
}

// TestSilentVoterReplacedByLearner: of voters m1, m2, m3 and learner m4,
// a voter that is not the leader falls silent (crashed, and nobody has
// told the log it is gone). The learner, which answers, must take its
// vote: kept, the silent voter was one of three with the leader, and
// when the leader then went without a word (a leave cut short by its
// deadline, or a crash) the one voter left had no majority.
func TestSilentVoterReplacedByLearner(t *testing.T) {
	c := newClusterConf(t, 4, &pb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}})
	c.run(5 * time.Second)
	lead := c.leader()
	quiet, other := lead%3+1, (lead+1)%3+1
	c.down[quiet] = true
	c.run(5 * time.Second)
	voters := c.members[lead].conf.GetVoters()
	if !slices.Contains(voters, 4) || slices.Contains(voters, quiet) || len(voters) != 3 {
		t.Fatalf("with m%d silent, the leader m%d has voters %v; want the learner m4 in its place: %s", quiet, lead, voters, c.members[lead].Describe())
	}
	c.down[lead] = true
	before := c.members[other].Own().LiveUntil()
	c.run(5 * time.Second)
	if after := c.members[other].Own().LiveUntil(); after <= before {
		t.Fatalf("m%d's liveness no longer extends once the leader m%d is gone too: %s", other, lead, c.members[other].Describe())
	}
}

// TestLearnersKeepAliveThroughRelays: learners send their keep-alives to
// a voter, which relays them to the leader in one message a tick, and
// hands the answers back: no learner's keep-alive reaches the leader
// directly, the leader sends learners no heartbeat of a read and few
// others, and every learner's lease keeps extending.
func TestLearnersKeepAliveThroughRelays(t *testing.T) {
	const n = 9
	cs := &pb.ConfState{Voters: []uint64{1, 2, 3}}
	for i := uint64(4); i <= n; i++ {
		cs.Learners = append(cs.Learners, i)
	}
	c := newClusterConf(t, n, cs)
	c.run(5 * time.Second)
	c.sent = c.sent[:0]
	lead := c.leader()
	before := map[uint64]int64{}
	for i := uint64(1); i <= n; i++ {
		before[i] = c.members[i].Own().LiveUntil()
	}
	direct, batches, learnerBeats := 0, 0, 0
	for range 100 { // 10 s at rest
		c.run(100 * time.Millisecond)
		for _, msg := range c.sent {
			// Autopilot keeps three voters for 9 members (VotersFor).
			isLearner := func(id uint64) bool { return !c.members[id].Voter() }
			learner := isLearner(msg.GetFrom()) || isLearner(msg.GetTo())
			switch {
			case !IsKeepAlive(msg):
				if msg.GetType() == pb.MsgHeartbeat && msg.GetFrom() == lead && isLearner(msg.GetTo()) {
					learnerBeats++
				}
			case learner && (msg.GetFrom() == lead || msg.GetTo() == lead):
				direct++
			case msg.GetFrom() == lead || msg.GetTo() == lead:
				batches++
			}
		}
		c.sent = c.sent[:0]
	}
	if direct != 0 {
		t.Fatalf("%d keep-alives between learners and the leader directly; want all relayed", direct)
	}
	for i := uint64(1); i <= n; i++ {
		if until := c.members[i].Own().LiveUntil(); until <= before[i]+int64(9*time.Second) {
			t.Fatalf("m%d's lease stopped extending: until %d, was %d", i, until, before[i])
		}
	}
	// 4 learners a heartbeat every 5 s each: about 8 in 10 s (not 400).
	if learnerBeats > 20 {
		t.Fatalf("the leader sent learners %d heartbeats in 10 s; want about 8", learnerBeats)
	}
	t.Logf("leader: %d keep-alive messages (relayed batches and voters'), %d heartbeats to learners in 10 s", batches, learnerBeats)
}

// TestCutOffLeaderGrantsNothing: a leader cut off from the voters but
// one, which still reaches it with keep-alives, grants that one nothing:
// it cannot confirm a read. It believes it leads for up to two election
// timeouts (CheckQuorum), and a later leader's wait counts only from its
// own election, so a grant on that belief (MutKeepAliveUnconfirmed)
// would outlast it; so would one on the heartbeat answer that carried the
// keep-alive, the leader and the carrier being two of five voters
// (MutCarrierIsQuorum). With either mutation the member's lease keeps
// growing.
func TestCutOffLeaderGrantsNothing(t *testing.T) {
	for _, mut := range []ownership.Mutation{ownership.MutNone, ownership.MutKeepAliveUnconfirmed, ownership.MutCarrierIsQuorum} {
		c := newCluster(t, 5)
		for _, m := range c.members {
			m.cfg.Ownership.Mutation = mut
			m.cfg.Voters = 5 // VotersFor(5) is 3
		}
		c.run(5 * time.Second)
		lead := c.leader()
		x := lead%5 + 1
		for id := uint64(1); id <= 5; id++ {
			if id != lead && id != x {
				c.down[id] = true
			}
		}
		c.run(300 * time.Millisecond) // reads begun before the cut finish
		before := c.members[x].Own().LiveUntil()
		// Keep-alives go every second: send one now, while the leader
		// still believes it leads (CheckQuorum steps it down after an
		// election timeout or two).
		c.members[x].Own().ExtendSoon()
		c.run(700 * time.Millisecond)
		if v := c.members[lead].conf.GetVoters(); len(v) != 5 || !slices.Contains(v, x) {
			t.Fatalf("voters %v, want five with m%d", v, x)
		}
		grew := c.members[x].Own().LiveUntil() > before
		if grew != (mut != ownership.MutNone) {
			t.Fatalf("%v: m%d's lease grew %v while its leader m%d was cut off from the other voters", mut, x, grew, lead)
		}
	}
}

// TestNeverAnsweringLearnerNotPromoted: a log's only voter keeps
// committing alone while its learners have never answered (their
// processes still starting, or cut off): autopilot promotes a learner
// only once it acknowledged something. Promoted at once (early in a
// log, "within a snapshot's entries" holds for a learner at Match 0), it
// made two voters of whom one never voted, and nothing committed again.
func TestNeverAnsweringLearnerNotPromoted(t *testing.T) {
	c := newClusterConf(t, 3, &pb.ConfState{Voters: []uint64{1}, Learners: []uint64{2, 3}})
	c.down[2], c.down[3] = true, true
	c.run(5 * time.Second)
	if v := c.members[1].conf.GetVoters(); len(v) != 1 {
		t.Fatalf("m1 promoted learners that never answered: voters %v: %s", v, c.members[1].Describe())
	}
	before := c.members[1].Own().LiveUntil()
	c.run(3 * time.Second)
	if after := c.members[1].Own().LiveUntil(); after <= before {
		t.Fatalf("m1 alone no longer extends its liveness: %s", c.members[1].Describe())
	}
	c.down[2], c.down[3] = false, false
	c.run(5 * time.Second)
	if v := c.members[1].conf.GetVoters(); len(v) != 3 {
		t.Fatalf("learners that answer are not promoted: voters %v: %s", v, c.members[1].Describe())
	}
}

// TestReachesMajority: a member reaches a majority of the voters while it
// (if a voter) and those it had a message from within the window are
// more than half of them: each of three members with all up, each of the
// two left after one crashed, and not the one left after two crashed,
// once a window has passed since it last heard from them.
func TestReachesMajority(t *testing.T) {
	c := newCluster(t, 3)
	c.run(5 * time.Second)
	window := int64(time.Second)
	reach := func(id uint64) bool { return c.members[id].ReachesMajority(c.now - window) }
	for id := uint64(1); id <= 3; id++ {
		if !reach(id) {
			t.Fatalf("m%d, all three up, reaches no majority: %s", id, c.members[id].Describe())
		}
	}
	c.down[3] = true
	c.run(3 * time.Second)
	// Once the two left have a leader: during a split vote both are
	// candidates that may send nothing for up to two election timeouts
	// (2 s here), longer than the window (it failed 3 in 300 runs).
	c.until(20*time.Second, func() bool { return c.members[1].Leader() || c.members[2].Leader() },
		func() string { return "m1 and m2 elect no leader: " + c.members[1].Describe() })
	c.run(time.Second)
	for id := uint64(1); id <= 2; id++ {
		if !reach(id) {
			t.Fatalf("m%d, m3 down, reaches no majority: %s", id, c.members[id].Describe())
		}
	}
	c.down[2] = true
	c.run(2 * time.Second)
	if reach(1) {
		t.Fatalf("m1, m2 and m3 down, reaches a majority: %s", c.members[1].Describe())
	}
}
