// Package sim is a seeded, single-threaded simulator of a ringlimit
// cluster's ownership: members that each run the ownership Machine beside
// an etcd raft node (go.etcd.io/raft/v3, itself a pure state machine),
// partitions of sliding logs, replication to backups, and clients whose
// every decision is recorded for the history checker.
//
// Everything runs in virtual time on one goroutine: the network delays,
// drops, duplicates and reorders messages and can be cut in one direction;
// members crash, restart as new incarnations, pause (their monotonic clock
// runs on while they do nothing), join and leave; each member's clock runs
// at its own rate within the stated bound. The same Options give the same
// run, event for event, so a failing seed prints its schedule and replays
// exactly.
package sim

import (
	"container/heap"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/peer/internal/history"
	"github.com/ringlimit/ringlimit/peer/internal/ownership"
)

// Fault is the one fault a schedule injects.
type Fault uint8

const (
	FaultNone      Fault = iota // clock rates and normal message delays only
	FaultCrash                  // a member crashes for good
	FaultRestart                // a member crashes and starts again as a new incarnation
	FaultPause                  // a member stops for a while; its clock runs on
	FaultIsolate                // a member is cut off from all others, both ways
	FaultSplit                  // 2 | 3: a holder and its backup on the small side
	FaultDeaf                   // a member hears nobody but is heard (asymmetric cut)
	FaultMute                   // a member is heard by nobody but hears all (asymmetric cut)
	FaultLoss                   // 30 % of messages lost for a while
	FaultDelay                  // messages delayed up to 1.5 s for a while
	FaultDuplicate              // 30 % of messages duplicated, all run long
	FaultJoin                   // a new member joins under load
	FaultLeave                  // a member leaves gracefully
	FaultRaise                  // replication raised from off to sync, then the holder crashes
	numFaults

	// FaultDouble crashes a holder and its backup at once: two faults,
	// outside the promise. Their partitions' state is lost, which must be
	// counted (Result.Lost), never silent.
	FaultDouble = numFaults
)

var faultNames = [...]string{"none", "crash", "restart", "pause", "isolate", "split", "deaf", "mute", "loss", "delay", "duplicate", "join", "leave", "raise then crash", "double crash"}

func (f Fault) String() string { return faultNames[f] }

// Faults lists every fault kind.
func Faults() []Fault {
	fs := make([]Fault, numFaults)
	for i := range fs {
		fs[i] = Fault(i)
	}
	return fs
}

// Mutation deliberately breaks one rule of the protocol, so tests can show
// that the simulator and the checker find what a broken rule admits.
type Mutation uint8

const (
	MutNone Mutation = iota
	// MutNoLease: a holder decides while the table names it, whether or
	// not its liveness lease has run out.
	MutNoLease
	// MutNoCAS: an End does not check the record's version (a late
	// extension no longer saves the holder from being ended while it
	// still decides).
	MutEndIgnoresVersion
	// MutGossipTakeover: the rule the log replaced: a backup decides from
	// its copy as soon as its gossip view has lost the holder. (Synchronous
	// replication alone defeats it in this simulator: the holder's
	// admissions fail once its backup stops hearing it.)
	MutGossipTakeover
	// MutTakeoverEmpty: a backup that takes a partition over starts from
	// an empty state instead of its replica.
	MutTakeoverEmpty
	// MutNoRecopy: raising a policy's replication does not re-copy the
	// partitions (the hole SetPolicies had: the backup's copy lacked every
	// admission made while the policy was off).
	MutNoRecopy
)

// Options configure one run. Zero fields take the defaults in brackets.
type Options struct {
	Seed       uint64
	Fault      Fault         // [drawn from the seed]
	Members    int           // [5]
	Voters     int           // [3]
	Partitions int           // [8]
	Keys       int           // [6]
	Clients    int           // [6]
	Limit      int64         // [5]
	Window     time.Duration // [1 s]
	Duration   time.Duration // [20 s] of virtual time under load
	Liveness   time.Duration // [2 s]
	RateBound  float64       // [0.04]: clock rates within 1 ± RateBound
	Mutation   Mutation
	// NoFault leaves Fault at FaultNone instead of drawing one.
	NoFault bool
}

func (o *Options) defaults() {
	if o.Members == 0 {
		o.Members = 5
	}
	if o.Voters == 0 {
		o.Voters = 3
	}
	if o.Partitions == 0 {
		o.Partitions = 8
	}
	if o.Keys == 0 {
		o.Keys = 6
	}
	if o.Clients == 0 {
		o.Clients = 6
	}
	if o.Limit == 0 {
		o.Limit = 5
	}
	if o.Window == 0 {
		o.Window = time.Second
	}
	if o.Duration == 0 {
		o.Duration = 20 * time.Second
	}
	if o.Liveness == 0 {
		o.Liveness = 2 * time.Second
	}
	if o.RateBound == 0 {
		o.RateBound = 0.04
	}
}

// Result is what one run did and what the checker found.
type Result struct {
	Seed     uint64
	Fault    Fault
	Schedule []string // faults and notable steps, with virtual times
	Ops      []history.Op
	Report   history.Report
	// Counters summed over every incarnation.
	Counters ownership.Counters
	// Lost counts partitions restarted empty after the founding: a double
	// fault, never silent.
	Lost     uint64
	Events   int
	Messages int
	Commands int
	// RaftBytes is the size of every raft message sent (snapshots too).
	RaftBytes int
	// Unavailable is the longest stretch of a key's consecutive
	// unavailable or unknown answers (virtual time).
	Unavailable time.Duration
}

// Failed reports whether the run broke the promise or an invariant.
func (r Result) Failed() bool {
	return len(r.Report.Violations) > 0 || r.Counters.MissingCopy > 0
}

// String tells the run in a few lines, with its schedule.
func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d fault %s: %d ops (%d admitted, %d unknown), %d events, %d messages, %d commands, lost %d, missing copies %d, longest unavailable %v\n",
		r.Seed, r.Fault, r.Report.Ops, r.Report.Admitted, r.Report.Unknown, r.Events, r.Messages, r.Commands, r.Lost, r.Counters.MissingCopy, r.Unavailable)
	for _, s := range r.Schedule {
		fmt.Fprintf(&b, "  %s\n", s)
	}
	for _, v := range r.Report.Violations {
		fmt.Fprintf(&b, "  VIOLATION %s\n", v)
	}
	return b.String()
}

// Run runs one schedule and checks its history.
func Run(o Options) Result {
	o.defaults()
	s := newSim(o)
	s.run()
	res := Result{Seed: o.Seed, Fault: s.fault, Schedule: s.schedule, Ops: s.ops, Events: s.events, Messages: s.messages, Commands: s.commands, RaftBytes: s.raftBytes}
	for _, m := range s.all {
		c := m.own.Counters()
		res.Counters.MissingCopy += c.MissingCopy
		res.Counters.Moves += c.Moves
		res.Counters.Takeovers += c.Takeovers
		res.Counters.Restarts += c.Restarts
	}
	res.Lost = uint64(res.Counters.Restarts)
	// The promise is checked on the real (virtual) clock: an owner whose
	// clock runs fast by the rate bound ends a window early by as much.
	w := time.Duration(float64(o.Window) / (1 + o.RateBound))
	res.Report = history.Check(s.ops, func(string) history.Limits { return history.Limits{Limit: o.Limit, Window: w} }, 3*time.Second)
	res.Unavailable = s.longestGap()
	return res
}

// event is one scheduled step.
type event struct {
	at  int64
	seq uint64
	fn  func()
}

type queue []*event

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(*event)) }
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type sim struct {
	o     Options
	rng   *rand.Rand
	now   int64
	seq   uint64
	q     queue
	fault Fault

	members  map[string]*member // running or paused incarnations, by ID
	all      []*member          // every incarnation ever
	byRaft   map[uint64]*member
	gone     []string
	nextRaft uint64

	// network conditions
	cut       map[[2]string]bool // (from name, to name) → dropped
	loss, dup float64
	maxDelay  int64

	schedule  []string
	ops       []history.Op
	events    int
	messages  int
	commands  int
	raftBytes int
	keys      []string
	end       int64
}

const (
	tick       = 100 * time.Millisecond
	gossipTick = 200 * time.Millisecond
	clientWait = time.Second
)

func newSim(o Options) *sim {
	s := &sim{o: o, rng: rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15)), members: map[string]*member{}, byRaft: map[uint64]*member{}, cut: map[[2]string]bool{}, maxDelay: int64(2 * time.Millisecond)}
	s.fault = FaultNone
	if !o.NoFault {
		s.fault = o.Fault
		if s.fault == FaultNone {
			s.fault = Fault(s.rng.IntN(int(numFaults)))
		}
	}
	for i := range o.Keys {
		s.keys = append(s.keys, fmt.Sprintf("k%d", i))
	}
	return s
}

func (s *sim) at(d int64, fn func()) {
	s.seq++
	heap.Push(&s.q, &event{at: s.now + d, seq: s.seq, fn: fn})
}

func (s *sim) note(format string, a ...any) {
	s.schedule = append(s.schedule, fmt.Sprintf("%8.3fs ", float64(s.now)/1e9)+fmt.Sprintf(format, a...))
}

func (s *sim) run() {
	warm := int64(4 * time.Second)
	s.end = warm + int64(s.o.Duration)
	var voters, learners []uint64
	for i := range s.o.Members {
		s.nextRaft++
		if i < s.o.Voters {
			voters = append(voters, s.nextRaft)
		} else {
			learners = append(learners, s.nextRaft)
		}
	}
	cs := &pb.ConfState{Voters: voters, Learners: learners}
	for i := range s.o.Members {
		s.start(fmt.Sprintf("n%d", i), 1, uint64(i+1), cs)
	}
	for c := range s.o.Clients {
		s.at(warm+int64(s.rng.IntN(int(50*time.Millisecond))), func() { s.client(c) })
	}
	s.planFault(warm)
	s.at(int64(gossipTick), s.gossip)
	for s.q.Len() > 0 {
		e := heap.Pop(&s.q).(*event)
		if e.at > s.end+int64(3*time.Second) {
			break
		}
		s.now = e.at
		s.events++
		e.fn()
	}
}

// member is one incarnation.
type member struct {
	s       *sim
	name    string
	inc     int
	id      string
	raftID  uint64
	rate    float64
	born    int64 // virtual ns
	crashed bool
	paused  int64 // virtual ns the pause ends (0: running)
	// unreplicated: the policy's replication is off here (FaultRaise,
	// until the change reaches this member).
	unreplicated bool
	leaving      bool

	rn       *raft.RawNode
	storage  *raft.MemoryStorage
	own      *ownership.Machine
	stores   []map[string][]entry
	clamp    map[string]int64
	pending  map[uint64]*pendingSync
	admSeq   uint64
	heard    map[string]int64 // member ID → virtual ns last heard through gossip
	detect   int64
	lastConf int64
	conf     *pb.ConfState
	applied  uint64
	snapAt   uint64
}

type entry struct {
	ts, hits int64
	id       uint64
}

type pendingSync struct {
	reply func(history.Outcome, uint64)
	epoch uint64
	done  bool
}

// mono is the member's monotonic clock: it starts at 0 with the process
// and runs at the member's rate, paused or not.
func (m *member) mono() int64 { return int64(float64(m.s.now-m.born) * m.rate) }

func (s *sim) start(name string, inc int, raftID uint64, cs *pb.ConfState) *member {
	m := &member{s: s, name: name, inc: inc, id: fmt.Sprintf("%s.%d", name, inc), raftID: raftID,
		rate: 1 + s.o.RateBound*(2*s.rng.Float64()-1), born: s.now,
		storage: raft.NewMemoryStorage(), clamp: map[string]int64{}, pending: map[uint64]*pendingSync{},
		heard: map[string]int64{}, detect: int64(300*time.Millisecond) + s.rng.Int64N(int64(4700*time.Millisecond))}
	m.conf = cs
	if cs != nil {
		snap := &pb.Snapshot{Metadata: &pb.SnapshotMetadata{Index: proto.Uint64(1), Term: proto.Uint64(1), ConfState: cs}}
		if err := m.storage.ApplySnapshot(snap); err != nil {
			panic(err)
		}
	}
	rn, err := raft.NewRawNode(&raft.Config{ID: raftID, ElectionTick: 10, HeartbeatTick: 1, Storage: m.storage,
		MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 256, CheckQuorum: true, PreVote: true, Logger: quietLogger{}})
	if err != nil {
		panic(err)
	}
	m.rn = rn
	m.own = ownership.New(ownership.Config{ID: m.id, Liveness: s.o.Liveness}, s.o.Partitions)
	m.stores = make([]map[string][]entry, s.o.Partitions)
	for p := range m.stores {
		m.stores[p] = map[string][]entry{}
	}
	m.unreplicated = s.fault == FaultRaise && s.now == 0
	s.members[m.id] = m
	s.all = append(s.all, m)
	s.byRaft[raftID] = m
	m.heard[m.id] = s.now
	s.schedTick(m)
	return m
}

func (s *sim) schedTick(m *member) {
	s.at(int64(float64(tick)/m.rate), func() {
		if m.crashed {
			return
		}
		if m.paused > s.now {
			s.at(m.paused-s.now, func() { s.schedTick(m) })
			return
		}
		m.tick()
		s.schedTick(m)
	})
}

// deliver runs fn on m when it is running: now, or when its pause ends.
func (s *sim) deliver(m *member, fn func()) {
	if m.crashed {
		return
	}
	if m.paused > s.now {
		s.at(m.paused-s.now, func() { s.deliver(m, fn) })
		return
	}
	fn()
}

// send carries fn from one member to another through the network.
func (s *sim) send(from, to *member, fn func()) {
	s.messages++
	if s.cut[[2]string{from.name, to.name}] || s.rng.Float64() < s.loss {
		return
	}
	n := 1
	if s.rng.Float64() < s.dup {
		n = 2
	}
	for range n {
		d := int64(100*time.Microsecond) + s.rng.Int64N(s.maxDelay)
		s.at(d, func() { s.deliver(to, fn) })
	}
}

func (m *member) tick() {
	m.rn.Tick()
	m.own.SetLeader(m.rn.BasicStatus().RaftState == raft.StateLeader)
	m.do(m.own.Tick(m.mono()))
	if m.own.Table() != nil && m.rn.BasicStatus().RaftState == raft.StateLeader {
		m.autopilot()
	}
	m.ready()
}

func (m *member) do(acts []ownership.Action) {
	for _, a := range acts {
		switch a.Kind {
		case ownership.Propose:
			_ = m.rn.Propose(a.Cmd.Encode(nil))
		case ownership.SendCopy:
			m.sendCopy(a)
		case ownership.Reset:
			m.stores[a.P] = map[string][]entry{}
		}
	}
}

func (m *member) ready() {
	s := m.s
	for m.rn.HasReady() {
		rd := m.rn.Ready()
		if !raft.IsEmptySnap(rd.Snapshot) {
			if err := m.storage.ApplySnapshot(rd.Snapshot); err != nil {
				panic(err)
			}
			t := ownership.NewTable(s.o.Partitions)
			if d := rd.Snapshot.GetData(); len(d) > 0 {
				if err := json.Unmarshal(d, t); err != nil {
					panic(err)
				}
			}
			m.conf = rd.Snapshot.GetMetadata().GetConfState()
			m.own.Restored(t, m.mono())
		}
		if !raft.IsEmptyHardState(rd.HardState) {
			_ = m.storage.SetHardState(rd.HardState)
		}
		_ = m.storage.Append(rd.Entries)
		for _, msg := range rd.Messages {
			to := s.byRaft[msg.GetTo()]
			if to == nil {
				continue
			}
			wire, err := proto.Marshal(msg)
			if err != nil {
				panic(err)
			}
			s.raftBytes += len(wire)
			if msg.GetType() == pb.MsgSnap {
				// A transport sends a snapshot as one stream and tells
				// raft how that went.
				if s.cut[[2]string{m.name, to.name}] {
					m.rn.ReportSnapshot(msg.GetTo(), raft.SnapshotFailure)
					continue
				}
				s.at(int64(time.Millisecond), func() {
					s.deliver(to, func() {
						in := &pb.Message{}
						_ = proto.Unmarshal(wire, in)
						_ = to.rn.Step(in)
						to.ready()
					})
					if !m.crashed {
						m.rn.ReportSnapshot(msg.GetTo(), raft.SnapshotFinish)
						m.ready()
					}
				})
				continue
			}
			s.send(m, to, func() {
				in := &pb.Message{}
				if err := proto.Unmarshal(wire, in); err != nil {
					panic(err)
				}
				_ = to.rn.Step(in)
				to.ready()
			})
		}
		for _, e := range rd.CommittedEntries {
			switch e.GetType() {
			case pb.EntryNormal:
				if len(e.GetData()) == 0 {
					continue
				}
				c, err := ownership.Decode(e.GetData())
				if err != nil {
					panic(err)
				}
				if m == s.leaderOf() {
					s.commands++
				}
				c = m.mutate(c)
				var held []bool
				if s.o.Mutation == MutTakeoverEmpty && c.Kind == ownership.End {
					for p := range m.stores {
						held = append(held, m.own.Table().Holds(m.id, p))
					}
				}
				m.do(m.own.Apply(c, m.mono()))
				for p, h := range held {
					if !h && m.own.Table().Holds(m.id, p) {
						m.stores[p] = map[string][]entry{}
					}
				}
			case pb.EntryConfChange:
				cc := &pb.ConfChange{}
				if err := proto.Unmarshal(e.GetData(), cc); err != nil {
					panic(err)
				}
				m.conf = m.rn.ApplyConfChange(cc)
			}
		}
		if n := len(rd.CommittedEntries); n > 0 {
			m.applied = rd.CommittedEntries[n-1].GetIndex()
		}
		m.rn.Advance(rd)
		m.snapshot()
	}
}

// snapshot takes a snapshot of the table every 64 applied entries and
// compacts the log behind it, so that a joining member catches up from a
// snapshot that names it.
func (m *member) snapshot() {
	if m.applied < m.snapAt+64 || m.conf == nil {
		return
	}
	data, err := json.Marshal(m.own.Table())
	if err != nil {
		panic(err)
	}
	if _, err := m.storage.CreateSnapshot(m.applied, m.conf, data); err != nil {
		return
	}
	m.snapAt = m.applied
	if m.applied > 32 {
		_ = m.storage.Compact(m.applied - 32)
	}
}

// leaderOf returns one running leader, for counting each command once.
func (s *sim) leaderOf() *member {
	for _, id := range s.sortedIDs() {
		m := s.members[id]
		if m.rn.BasicStatus().RaftState == raft.StateLeader {
			return m
		}
	}
	return nil
}

func (s *sim) sortedIDs() []string {
	ids := make([]string, 0, len(s.members))
	for id := range s.members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// autopilot keeps the voter set: a new incarnation joins as a learner;
// a voter whose incarnation is gone is replaced by a live learner. One
// change at a time (raft refuses a second pending one anyway).
func (m *member) autopilot() {
	s := m.s
	now := m.mono()
	if now-m.lastConf < int64(500*time.Millisecond) {
		return
	}
	st := m.rn.Status()
	cfg := st.Config
	in := func(id uint64) bool {
		_, v := cfg.Voters.IDs()[id]
		_, l := cfg.Learners[id]
		return v || l
	}
	propose := func(t pb.ConfChangeType, id uint64) {
		m.lastConf = now
		_ = m.rn.ProposeConfChange(&pb.ConfChange{Type: t.Enum(), NodeId: proto.Uint64(id)})
	}
	for _, id := range s.sortedIDs() {
		o := s.members[id]
		if !o.leaving && !in(o.raftID) && m.own.Table().Members[o.id] != nil {
			propose(pb.ConfChangeAddLearnerNode, o.raftID)
			return
		}
	}
	voters := cfg.Voters.IDs()
	for _, id := range sortedRaftIDs(voters) {
		o := s.byRaft[id]
		if o != nil && (o.crashed && slices.Contains(s.gone, o.id) || o.leaving) {
			propose(pb.ConfChangeRemoveNode, id)
			return
		}
	}
	if len(voters) < s.o.Voters {
		for _, id := range sortedRaftIDs(cfg.Learners) {
			o := s.byRaft[id]
			if o != nil && !o.crashed && !o.leaving && st.Progress[id].Match+10 >= st.HardState.GetCommit() {
				propose(pb.ConfChangeAddNode, id)
				return
			}
		}
	}
}

func sortedRaftIDs(set map[uint64]struct{}) []uint64 {
	ids := make([]uint64, 0, len(set))
	for id := range set {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (m *member) mutate(c ownership.Command) ownership.Command {
	if m.s.o.Mutation == MutEndIgnoresVersion && c.Kind == ownership.End {
		if l := m.own.Table().Members[c.Member]; l != nil {
			c.Version = l.Version
		}
	}
	return c
}

type quietLogger struct{}

func (quietLogger) Debug(...any)            {}
func (quietLogger) Debugf(string, ...any)   {}
func (quietLogger) Error(...any)            {}
func (quietLogger) Errorf(string, ...any)   {}
func (quietLogger) Info(...any)             {}
func (quietLogger) Infof(string, ...any)    {}
func (quietLogger) Warning(...any)          {}
func (quietLogger) Warningf(string, ...any) {}
func (quietLogger) Fatal(v ...any)          { panic(fmt.Sprint(v...)) }
func (quietLogger) Fatalf(f string, v ...any) {
	panic(fmt.Sprintf(f, v...))
}
func (quietLogger) Panic(v ...any)            { panic(fmt.Sprint(v...)) }
func (quietLogger) Panicf(f string, v ...any) { panic(fmt.Sprintf(f, v...)) }

func hash(p int, id string) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%s", p, id)
	return h.Sum64()
}

func (s *sim) partition(key string) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(s.o.Partitions))
}
