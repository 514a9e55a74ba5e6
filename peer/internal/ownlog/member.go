// Package ownlog runs the ownership protocol over a replicated log: one
// member's etcd raft node (go.etcd.io/raft/v3) beside its ownership
// Machine, glued so that every committed command is applied to the
// machine in log order, snapshots carry the table, and the leader keeps
// the voter set (autopilot).
//
// Members keep their liveness through keep-alives (session.go), which ride
// the raft transport but never enter the log: a learner sends its own to
// one of the voters, and a voter carries its own and the learners' to the
// leader in its next answer to a heartbeat. The leader answers a batch
// once a read of its own (raft's ReadIndex) confirms it still leads; its
// reads' heartbeats are the voters' heartbeats, one every Liveness/10
// (Timing). Of at most three voters (VotersFor: up to 63 members) the
// heartbeat answer that carries a batch confirms it, and the answers ride
// the leader's next heartbeat back. So the leader's messages grow with
// its voters and ticks, not with the members, and every member, learners
// included, still receives every command: few, since only ownership
// changes are commands. Why not
// keep learners out of raft and send them the table another way: a
// learner is how a member becomes a voter when one is lost, raft already
// brings a lagging one up to date (from a snapshot if need be), and at
// rest a learner now receives nothing but one heartbeat every 10 s and its
// keep-alive answers.
//
// Like the two state machines it joins, a Member starts no goroutine,
// reads no clock and touches no socket: each call takes the member's
// monotonic time and returns an Output (raft messages to send, data
// actions to carry out). The simulator drives it in virtual time; a node
// drives it from one goroutine with a real transport. Not safe for
// concurrent use.
//
// Why etcd's raft and not hashicorp/raft: etcd's is itself a pure state
// machine (Tick, Step, Ready, Advance), so the simulator steps the very
// code a node runs, message by message; hashicorp/raft runs its own
// goroutines and timers. Its log lives in memory unless Config.Disk
// keeps it in a data directory (disk.go; the member then writes and
// fsyncs it in each call, before the messages it returns may be sent):
// without one, a member that restarts is a new incarnation and a new raft
// member, catching up from a snapshot; with one, it resumes as the same
// raft member under a new ownership incarnation (disk.go says why).
package ownlog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/peer/internal/ownership"
)

// Config configures one member.
type Config struct {
	// RaftID is the member incarnation's raft ID: unique per process
	// start, never reused.
	RaftID uint64
	// Ownership is the machine's configuration; Ownership.ID is the
	// member incarnation's ID.
	Ownership  ownership.Config
	Partitions int
	// Bootstrap is the founding configuration; nil for a member that
	// joins a running log (the leader adds it as a learner).
	Bootstrap *pb.ConfState
	// Voters is the voter count autopilot keeps; zero means VotersFor the
	// live members: 1 for two, 3, 5 from 5 members, 3 from 13, 5 from 64.
	Voters int
	// ElectionTicks is the raft election timeout in ticks; zero means 10.
	// Timing derives it, and HeartbeatTicks, from the liveness: what a
	// node and the simulator run.
	ElectionTicks int
	// HeartbeatTicks is how many ticks between the leader's heartbeats;
	// zero means 1.
	HeartbeatTicks int
	// SnapshotEvery is how many applied entries between snapshots; zero
	// means 64.
	SnapshotEvery uint64
	// NoQuiet keeps raft's heartbeats among three voters without
	// learners, where quiet sessions (quiet.go) would replace them: for
	// comparisons.
	NoQuiet bool
	// Disk keeps the log in a data directory (OpenDisk); nil keeps it in
	// memory. A member whose Disk holds a log resumes it, as the same
	// raft member (RaftID must be the one it had) under an ownership ID
	// the log does not know yet, and ignores Bootstrap.
	Disk *Disk
}

// Peer is one raft member as gossip describes it, for autopilot.
type Peer struct {
	RaftID  uint64
	Member  string // ownership ID of the incarnation
	Gone    bool   // crashed for good, replaced by a later incarnation, or left
	Leaving bool
}

// Output is what one call asks the driver to do, in order.
type Output struct {
	// Messages are raft messages to send. A MsgSnap's delivery must be
	// reported to the sender with ReportSnapshot.
	Messages []*pb.Message
	// Actions are the machine's data actions (SendCopy, Reset); proposals
	// are already in the log.
	Actions []ownership.Action
	// Applied counts the commands applied.
	Applied int
	// Proposed counts the commands and configuration changes raft took
	// as proposals (a follower forwards them to the leader).
	Proposed, ConfChanges int
}

// Member is one member's log and machine.
type Member struct {
	cfg      Config
	rn       *raft.RawNode
	storage  *raft.MemoryStorage
	own      *ownership.Machine
	conf     *pb.ConfState
	applied  uint64
	snapAt   uint64
	snapNow  bool
	lastConf int64
	roster   []Peer
	out      Output
	lead     uint64 // the leader last seen
	lastLead uint64 // the last leader known (kaLead)
	// heard is when (the now of Step) this member last had a message
	// from each raft member; tick and lastTick measure the tick, so that
	// autopilot can tell a voter that answers from one that is down
	// without raft's RecentActive, which stays set for up to an election
	// timeout after a crash and is set for every follower of a new leader.
	heard          map[uint64]int64
	tick, lastTick int64
	// held is the entries other members proposed to this leader since its
	// last tick, appended together at the next (heldProps).
	held []*pb.Entry
	// boot is the snapshot a restarted member found on disk, whose table
	// the machine is given at the first Ready (restoreTable).
	boot *pb.Snapshot
	// poke is set when the table, the raft configuration, the leader or
	// the gossip view changed since the machine's last periodic step: the runner
	// runs one early (Poke) once no event waits, so that what the change
	// makes possible (a grant after a join, a handoff after a copy) is
	// proposed at once instead of at the next tick.
	poke bool
	// ka is the leader's keep-alive state (session.go), q the quiet
	// sessions' (quiet.go).
	ka sessions
	q  quietState
	// now is the now of the latest call (Tick, Poke, Step, ready): when
	// the machine's keep-alives are sent.
	now int64
	// ledTerm is the raft term in which this member was last observed
	// leading (observeLeader), and ledAt since when (the now of the call
	// that first observed it lead in that term).
	ledTerm uint64
	ledAt   int64
	// beat is when the leader last sent each learner a heartbeat;
	// learners caches the learners of learnersOf (thin).
	beat       map[uint64]int64
	readBeat   map[uint64]int64 // when a read's heartbeat last went to each voter (thin)
	learners   map[uint64]bool
	learnersOf *pb.ConfState
	// owed are the learners owed a heartbeat (noteRefused).
	owed map[uint64]bool
	// contact is when this member last heard from a leader (an append,
	// a heartbeat, a snapshot) or led, or started (contactSet: since its
	// first call): every acknowledgement it gave a leader was sent
	// before (votes.go).
	contact    int64
	contactSet bool
	// votes are the votes granted to this member in votes.term: the
	// latest contact any of them reported (votes.go).
	votes votes
	// electedTerm is the term in which this member was last elected,
	// and electedFrom the latest contact among it and its voters then:
	// any keep-alive an earlier leader granted was sent before.
	electedTerm uint64
	electedFrom int64
}

// stallTicks is how many ticks' worth of silence in a leader's own
// ticking count as a stall (Machine.Stalled): a quarter second at 50 ms.
const stallTicks = 5

// heldMax bounds the entries a leader holds for its next tick.
const heldMax = 256

// ErrConfig is returned by New for an unusable configuration.
var ErrConfig = errors.New("ownlog: bad config")

// New returns a member. Its machine starts with an empty table.
func New(cfg Config) (*Member, error) {
	if cfg.RaftID == 0 || cfg.Ownership.ID == "" || cfg.Partitions <= 0 {
		return nil, fmt.Errorf("%w: raft ID %d, member %q, %d partitions", ErrConfig, cfg.RaftID, cfg.Ownership.ID, cfg.Partitions)
	}
	if cfg.ElectionTicks == 0 {
		cfg.ElectionTicks = 10
	}
	if cfg.HeartbeatTicks == 0 {
		cfg.HeartbeatTicks = 1
	}
	if cfg.SnapshotEvery == 0 {
		cfg.SnapshotEvery = 64
	}
	m := &Member{cfg: cfg, storage: raft.NewMemoryStorage(), conf: cfg.Bootstrap, heard: map[uint64]int64{}, beat: map[uint64]int64{}, readBeat: map[uint64]int64{}, learners: map[uint64]bool{}}
	resumed, err := m.loadDisk()
	if err != nil {
		return nil, err
	}
	if cs := cfg.Bootstrap; cs != nil && !resumed {
		snap := &pb.Snapshot{Metadata: &pb.SnapshotMetadata{Index: proto.Uint64(1), Term: proto.Uint64(1), ConfState: cs}}
		if err := m.storage.ApplySnapshot(snap); err != nil {
			return nil, fmt.Errorf("ownlog: bootstrap: %w", err)
		}
		if err := m.saveBootstrap(snap); err != nil {
			return nil, err
		}
	}
	// StepDownOnRemoval: a leader that applies a configuration without
	// itself (a removal an earlier leader proposed, committed with this
	// one's first entry) steps down. raft drops every proposal of a
	// leader outside the configuration, while its heartbeats keep its
	// followers from electing another: no End, move or extension would
	// commit again (TestRemovedLeaderStepsDown).
	rn, err := raft.NewRawNode(&raft.Config{ID: cfg.RaftID, ElectionTick: cfg.ElectionTicks, HeartbeatTick: cfg.HeartbeatTicks, Storage: m.storage,
		MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 256, CheckQuorum: true, PreVote: true, StepDownOnRemoval: cfg.Ownership.Mutation != ownership.MutRemovedLeaderLeads, Logger: quiet{}})
	if err != nil {
		return nil, fmt.Errorf("ownlog: %w", err)
	}
	m.rn = rn
	m.own = ownership.New(cfg.Ownership, cfg.Partitions)
	if cs := cfg.Bootstrap; cs != nil && !resumed && len(cs.GetVoters()) == 1 && cs.GetVoters()[0] == cfg.RaftID {
		// The founder alone: lead at once rather than after an election
		// timeout with nobody to vote against.
		if err := rn.Campaign(); err != nil {
			return nil, fmt.Errorf("ownlog: campaign: %w", err)
		}
	}
	return m, nil
}

// Own returns the member's machine, for the decision path's questions.
func (m *Member) Own() *ownership.Machine { return m.own }

// Voter reports whether the member's applied configuration lists it as a
// voter.
func (m *Member) Voter() bool { return slices.Contains(m.conf.GetVoters(), m.cfg.RaftID) }

// Voters returns how many voters the member's applied configuration has,
// and how many voters autopilot wants for members live members.
func (m *Member) Voters(members int) (have, want int) {
	if m.conf != nil {
		have = len(m.conf.GetVoters())
	}
	return have, min(m.voters(members), members)
}

// ReachesMajority reports whether the voters of the applied
// configuration this member had a raft message from (of any kind: a vote
// request counts as much as a heartbeat) at or after since, itself
// included when it is a voter, make a majority of them (of both halves of
// a joint configuration). Voters that reach each other elect a leader in
// the end, however many election timeouts a starved machine makes that
// take; a member that reaches no majority may wait for one for good.
// Without an applied configuration it reports false.
func (m *Member) ReachesMajority(since int64) bool {
	if len(m.conf.GetVoters()) == 0 {
		return false
	}
	majority := func(ids []uint64) bool {
		n := 0
		for _, id := range ids {
			if at, ok := m.heard[id]; id == m.cfg.RaftID || ok && at >= since {
				n++
			}
		}
		return n > len(ids)/2
	}
	out := m.conf.GetVotersOutgoing()
	return majority(m.conf.GetVoters()) && (len(out) == 0 || majority(out))
}

// Describe summarises the member's raft state (term, leader, voters,
// learners, commit), for status pages and test failures.
func (m *Member) Describe() string {
	st := m.rn.Status()
	return fmt.Sprintf("raft %016x: %v term %d leader %016x commit %d applied %d voters %016x learners %016x",
		m.cfg.RaftID, st.RaftState, st.HardState.GetTerm(), st.Lead, st.HardState.GetCommit(), m.applied, sorted(st.Config.Voters.IDs()), sorted(st.Config.Learners))
}

// TransferLeadership hands the log's leadership to another voter that
// has caught up, when this member leads it: a member about to leave does
// so before it goes, so the log has a leader again in one round trip
// rather than an election timeout. It reports whether a transfer began.
func (m *Member) TransferLeadership() bool {
	if !m.Leader() {
		return false
	}
	st := m.rn.Status()
	for _, id := range sorted(st.Config.Voters.IDs()) {
		// One that answers: a transfer to a voter that is down stalls
		// proposals for an election timeout before raft gives it up.
		at, heard := m.heard[id]
		if id != m.cfg.RaftID && heard && (m.tick == 0 || m.lastTick-at <= m.answersWithin()) && st.Progress[id].Match+m.cfg.SnapshotEvery >= st.HardState.GetCommit() {
			m.rn.TransferLeader(id)
			return true
		}
	}
	return false
}

// Lead returns the raft ID of the leader this member knows of, 0 for none.
func (m *Member) Lead() uint64 { return m.rn.BasicStatus().Lead }

// Leader reports whether this member leads the log.
func (m *Member) Leader() bool { return m.rn.BasicStatus().RaftState == raft.StateLeader }

// Term returns the raft term this member is in.
func (m *Member) Term() uint64 { return m.rn.BasicStatus().GetTerm() }

// SetView passes the gossip view on to the machine, and the raft members
// gossip knows of to autopilot.
func (m *Member) SetView(v ownership.View, roster []Peer) {
	m.own.SetView(v)
	m.roster = roster
	m.poke = true
}

// Tick advances raft by one tick and runs the machine's periodic steps.
func (m *Member) Tick(now int64) Output {
	if m.lastTick != 0 && m.tick > 0 && now-m.lastTick > stallTicks*m.tick && m.Leader() {
		// Ticks were missed: the member was starved or paused, and
		// keep-alives may be waiting unread. Nobody is ended for a
		// lapse before they are read (Machine.Stalled): a few ticks'
		// grace, not a whole Liveness, which under a loaded test run's
		// frequent stalls postponed every End.
		m.own.Stalled(now, stallTicks*m.tick)
	}
	if m.lastTick != 0 && now > m.lastTick {
		m.tick = now - m.lastTick
	}
	m.lastTick = now
	m.now = max(m.now, now)
	m.proposeHeld()
	m.poke = false
	m.raftTick()
	m.observeLeader(now)
	m.slotQuiet(now)
	m.do(m.own.Tick(now))
	m.tickQuiet(now)
	m.readKeepAlives(now)
	m.forwardRelayed(now)
	m.sendBack(now)
	if m.Leader() {
		m.autopilot(now)
	}
	return m.ready(now)
}

// observeLeader tells the machine whether this member leads, as raft
// has it now.
func (m *Member) observeLeader(now int64) {
	st := m.rn.BasicStatus()
	leader := st.RaftState == raft.StateLeader
	if leader && st.GetTerm() != m.ledTerm {
		// Leading in another term than when last observed: it lost the
		// leadership and won it back in between, and another leader may
		// have granted keep-alives meanwhile. Lead anew (SetLeaderFrom
		// waits a whole Liveness from its voters' contact: votes.go).
		m.own.SetLeader(false, now)
	}
	if leader {
		if st.GetTerm() != m.ledTerm {
			// Leading anew: its latest snapshot may predate a member
			// added since, which would refuse it.
			m.snapNow = true
			m.ledAt = now
		}
		m.ledTerm = st.GetTerm()
	}
	from := now
	if leader && st.GetTerm() == m.electedTerm {
		from = min(m.electedFrom, now)
	}
	m.own.SetLeaderFrom(leader, now, from)
	if l := m.Lead(); l != m.lead {
		m.lead = l
		if l != 0 {
			// A leader known anew: no keep-alive waits for it yet
			// (quiet.go).
			m.q.waiting, m.q.campaigned, m.q.asked, m.q.ranOut = false, false, false, false
			m.lastLead = l
			// A new leader: extensions proposed during the election were
			// dropped, so extend now rather than at the next interval.
			m.own.ExtendSoon()
		}
	}
}

// Poked reports whether the table, the configuration, the leader or the
// view changed since the machine's last periodic step (Tick or Poke).
func (m *Member) Poked() bool { return m.poke }

// Poke runs the machine's periodic steps, and on the leader autopilot,
// early: when Poked, else it does nothing. Raft's clock does not move
// (only Tick moves it) and proposals held for the tick stay held. Every
// step of the machine reads now and is safe at any time; a poke only
// makes one come sooner.
func (m *Member) Poke(now int64) Output {
	m.now = max(m.now, now)
	if m.poke {
		m.poke = false
		m.observeLeader(now)
		m.do(m.own.Tick(now))
		if m.Leader() {
			m.autopilot(now)
		}
	}
	return m.ready(now)
}

// Step delivers one raft message.
func (m *Member) Step(msg *pb.Message, now int64) Output {
	if msg.GetTo() != m.cfg.RaftID {
		// Addressed to another incarnation: one that listened on this
		// address before. Its progress is not this member's (a heartbeat
		// committing past this log's end makes raft panic).
		return m.ready(now)
	}
	m.heard[msg.GetFrom()] = now
	m.now = max(m.now, now)
	m.touch(now)
	switch msg.GetType() {
	case pb.MsgApp, pb.MsgHeartbeat, pb.MsgSnap, pb.MsgTimeoutNow, pb.MsgReadIndexResp:
		m.contact = now // from a leader (or answers it sent)
	case pb.MsgVoteResp:
		msg = m.noteVote(msg, now)
	case pb.MsgPreVote:
		m.probeQuiet(msg, now)
	}
	if IsKeepAlive(msg) {
		m.stepKeepAlive(msg, now)
		return m.ready(now)
	}
	m.noteRefused(msg)
	if msg.GetType() == pb.MsgHeartbeatResp {
		for _, magic := range carriers {
			if bytes.HasPrefix(msg.GetContext(), magic) {
				var ok bool
				if msg, ok = m.uncarry(msg, magic, now); !ok {
					return m.ready(now)
				}
				break
			}
		}
	}
	if msg.GetType() == pb.MsgHeartbeatResp && bytes.HasPrefix(msg.GetContext(), kzMagic) {
		var ok bool
		if msg, ok = m.stepQuiet(msg, now); !ok {
			return m.ready(now)
		}
	}
	if msg.GetType() == pb.MsgHeartbeat && !bytes.HasPrefix(msg.GetContext(), kyMagic) {
		m.noteLoud(msg, now)
	}
	if msg.GetType() == pb.MsgHeartbeat && bytes.HasPrefix(msg.GetContext(), kqMagic) {
		var ok bool
		if msg, ok = m.uncarryBack(msg, now); !ok {
			return m.ready(now)
		}
	}
	if msg.GetType() == pb.MsgHeartbeat && bytes.HasPrefix(msg.GetContext(), kyMagic) {
		var ok bool
		if msg, ok = m.unquietAnswer(msg, now); !ok {
			return m.ready(now)
		}
		defer func() { m.q.drop = false }()
	}
	if msg.GetType() == pb.MsgProp && msg.GetFrom() != m.cfg.RaftID && m.Leader() && len(m.held) < heldMax {
		// Held for the tick: raft sends every follower an append, and
		// then its commit, for each proposal it is given, so N members
		// extending their liveness cost 4(N-1) messages for each of N
		// extensions; appended together they cost 4(N-1) a tick.
		m.held = append(m.held, msg.GetEntries()...)
		return m.ready(now)
	}
	_ = m.rn.Step(msg) // a message from a removed or unknown member is dropped by raft
	return m.ready(now)
}

// proposeHeld appends, as one proposal, the entries held since the last
// tick. A member that no longer leads hands them to raft all the same,
// which forwards them to the leader or drops them (their proposers
// propose again when it still matters).
func (m *Member) proposeHeld() {
	if len(m.held) == 0 {
		return
	}
	_ = m.rn.Step(&pb.Message{Type: pb.MsgProp.Enum(), From: proto.Uint64(m.cfg.RaftID), Entries: m.held})
	m.held = nil
}

// CopyAcked tells the machine a copy was installed by its receiver.
func (m *Member) CopyAcked(p int, to string, epoch, seq uint64, now int64) Output {
	m.do(m.own.CopyAcked(p, to, epoch, seq, now))
	return m.ready(now)
}

// CopyFailed tells the machine a copy was refused or failed.
func (m *Member) CopyFailed(p int, to string, epoch, seq uint64, now int64) Output {
	m.do(m.own.CopyFailed(p, to, epoch, seq, now))
	return m.ready(now)
}

// SetEmptyAfter changes how long a vacancy waits for its last holder
// (ownership.Machine.SetEmptyAfter).
func (m *Member) SetEmptyAfter(d time.Duration) { m.own.SetEmptyAfter(d) }

// Raise tells the machine a policy's replication became stronger.
func (m *Member) Raise(now int64) Output {
	m.own.Raise()
	return m.ready(now)
}

// Recopy tells the machine that an admission of partition p replicated
// without waiting at epoch did not reach the backup
// (ownership.Machine.Recopy).
func (m *Member) Recopy(p int, epoch uint64, now int64) Output {
	m.own.Recopy(p, epoch)
	return m.ready(now)
}

// Leave proposes the end, for good, of this member's liveness
// (ownership.Machine.Leave), for a member leaving gracefully once nothing
// depends on it.
func (m *Member) Leave(now int64) Output {
	if c, ok := m.own.Leave(); ok {
		m.do([]ownership.Action{{Kind: ownership.Propose, Cmd: c}})
	}
	return m.ready(now)
}

// ReportSnapshot tells raft whether a MsgSnap reached its receiver.
func (m *Member) ReportSnapshot(to uint64, ok bool, now int64) Output {
	st := raft.SnapshotFinish
	if !ok {
		st = raft.SnapshotFailure
	}
	m.rn.ReportSnapshot(to, st)
	return m.ready(now)
}

func (m *Member) do(acts []ownership.Action) {
	for _, a := range acts {
		if a.Kind == ownership.KeepAlive {
			m.sendKeepAlive(a.KeepAlive)
			continue
		}
		if a.Kind == ownership.Propose {
			// A proposal without a known leader is dropped; the machine
			// proposes again when it still matters.
			if m.rn.Propose(a.Cmd.Encode(nil)) == nil {
				m.out.Proposed++
			}
			continue
		}
		m.out.Actions = append(m.out.Actions, a)
	}
}

func (m *Member) ready(now int64) Output {
	if m.diskStopped(now) {
		return Output{}
	}
	m.now = max(m.now, now)
	m.touch(now)
	for m.rn.HasReady() {
		rd := m.rn.Ready()
		if m.cfg.Disk != nil && m.cfg.Disk.save(rd) != nil {
			// Nothing that is not on disk may be acknowledged: no
			// message goes out, and the member stops (Disk.Err).
			m.out = Output{}
			return Output{}
		}
		if rd.SoftState != nil {
			m.poke = true // the leader or this member's role changed
		}
		if !raft.IsEmptySnap(rd.Snapshot) {
			m.restore(rd.Snapshot, now)
		}
		if !raft.IsEmptyHardState(rd.HardState) {
			_ = m.storage.SetHardState(rd.HardState)
		}
		_ = m.storage.Append(rd.Entries)
		m.out.Messages = m.thin(m.out.Messages, rd.Messages, now)
		m.tellAge(m.out.Messages, now)
		for _, e := range rd.CommittedEntries {
			m.apply(e, now)
		}
		if n := len(rd.CommittedEntries); n > 0 {
			m.applied = rd.CommittedEntries[n-1].GetIndex()
		}
		m.readState(rd.ReadStates)
		m.rn.Advance(rd)
		m.snapshot()
		m.answerKeepAlives(now)
	}
	out := m.out
	m.out = Output{}
	return out
}

func (m *Member) restore(s *pb.Snapshot, now int64) {
	if err := m.storage.ApplySnapshot(s); err != nil {
		return // an older snapshot than we have: raft ignores it too
	}
	t := ownership.NewTable(m.cfg.Partitions)
	if d := s.GetData(); len(d) > 0 {
		if err := json.Unmarshal(d, t); err != nil || len(t.Parts) != m.cfg.Partitions {
			// A snapshot from a member with another partition count: a
			// different cluster. Keep the empty table; nothing decides.
			t = ownership.NewTable(m.cfg.Partitions)
		}
	}
	m.conf = s.GetMetadata().GetConfState()
	m.applied = max(m.applied, s.GetMetadata().GetIndex())
	m.poke = true
	m.do(m.own.Restored(t, now))
}

func (m *Member) apply(e *pb.Entry, now int64) {
	switch e.GetType() {
	case pb.EntryNormal:
		if len(e.GetData()) == 0 {
			return // a new leader's empty entry
		}
		c, err := ownership.Decode(e.GetData())
		if err != nil {
			return // refused alike by every member: it changes nothing
		}
		m.out.Applied++
		m.poke = true
		m.do(m.own.Apply(c, now))
	case pb.EntryConfChange, pb.EntryConfChangeV2:
		// V2: a batch of learner changes (learnerChange), and leaving a
		// joint configuration (that, or a founding one: Config.
		// Bootstrap), which raft proposes itself.
		var cc pb.ConfChangeI
		if e.GetType() == pb.EntryConfChange {
			v1 := &pb.ConfChange{}
			if err := proto.Unmarshal(e.GetData(), v1); err != nil {
				return
			}
			cc = v1
		} else {
			v2 := &pb.ConfChangeV2{}
			if err := proto.Unmarshal(e.GetData(), v2); err != nil {
				return
			}
			cc = v2
		}
		m.tellRemoved(cc, e.GetIndex())
		m.conf = m.rn.ApplyConfChange(cc)
		m.poke = true
		// A member just added catches up from a snapshot, which raft
		// refuses unless its configuration names the member: the leader,
		// which sends it, takes one now rather than resend a stale one
		// until the next (a member that becomes leader takes one too:
		// observeLeader). Only the leader: every member marshalling the
		// whole table at every change was most of a fleet deploy's work
		// (a change per joiner and per leaver, members² snapshots).
		m.snapNow = m.snapNow || m.Leader() && !leavesJoint(cc)
	}
}

// snapshot takes a snapshot of the table every snapshotEvery applied
// entries and compacts the log behind it, so that a joining member
// catches up from a snapshot whose configuration names it.
func (m *Member) snapshot() {
	if !m.snapNow && m.applied < m.snapAt+m.snapshotEvery() || m.conf == nil || m.applied <= m.snapAt {
		return
	}
	m.snapNow = false
	data, err := json.Marshal(m.own.Table())
	if err != nil {
		return
	}
	snap, err := m.storage.CreateSnapshot(m.applied, m.conf, data)
	if err != nil {
		return
	}
	if d := m.cfg.Disk; d != nil {
		if err := d.saveSnapshot(snap, m.storage); err != nil {
			d.fail(err)
			return
		}
	}
	m.snapAt = m.applied
	if to := m.compactTo(); to > 0 {
		_ = m.storage.Compact(to)
	}
}

// voters is how many voters autopilot keeps for n members (VotersFor:
// 3, 5 from 5 members, 3 from 13, 5 from 64), and 1 for two. A log of two voters stops when either member
// does (a majority of two is both); of one voter and a learner it keeps
// going when the learner does.
func (m *Member) voters(n int) int {
	if m.cfg.Voters > 0 {
		return m.cfg.Voters
	}
	return VotersFor(n)
}

// VotersFor is how many voters autopilot keeps for n live members
// without Config.Voters: 5 survive two voters' failure where 3 survive
// one, but only among at most three are the leader and a voter a
// quorum, so that a voter's message confirms the keep-alives it carries
// (session.go) and the voters' keep-alives are the log's heartbeats
// (quiet.go): at rest the leader of 3 or 4 members, or of 13 to 63,
// exchanges 6 messages a second with its voters, where of 5 voters raft's
// heartbeats and their answers are 43 to 50 at 5 to 12 members, over
// issue 54's 2 a member. A small cluster keeps 5 voters from 5 members
// all the same, and survives two of them failing at once: from 13 members
// to 63, 3; from 64 on, where 5 voters' heartbeats are a small share, 5.
func VotersFor(n int) int {
	switch {
	case n >= 64:
		return 5
	case n >= 13:
		return 3
	case n >= 5:
		return 5
	case n <= 2:
		return 1
	}
	return 3
}

func sorted(set map[uint64]struct{}) []uint64 {
	ids := make([]uint64, 0, len(set))
	for id := range set {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

type quiet struct{}

func (quiet) Debug(...any)              {}
func (quiet) Debugf(string, ...any)     {}
func (quiet) Error(...any)              {}
func (quiet) Errorf(string, ...any)     {}
func (quiet) Info(...any)               {}
func (quiet) Infof(string, ...any)      {}
func (quiet) Warning(...any)            {}
func (quiet) Warningf(string, ...any)   {}
func (quiet) Fatal(v ...any)            { panic(fmt.Sprint(v...)) }
func (quiet) Fatalf(f string, v ...any) { panic(fmt.Sprintf(f, v...)) }
func (quiet) Panic(v ...any)            { panic(fmt.Sprint(v...)) }
func (quiet) Panicf(f string, v ...any) { panic(fmt.Sprintf(f, v...)) }
