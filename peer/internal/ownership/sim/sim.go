// Package sim is a seeded, single-threaded simulator of a ringlimit
// cluster's ownership: members that each run the ownership Machine beside
// an etcd raft node (go.etcd.io/raft/v3, itself a pure state machine),
// partitions of sliding logs, replication to backups, a spread key's
// rights (grants made by its holder, used by other members with no
// message, returned with their uses; grants.go), and clients whose every
// decision, a grantee's local ones too, is recorded for the history
// checker.
//
// Everything runs in virtual time on one goroutine: the network delays,
// drops, duplicates and reorders messages and can be cut in one direction;
// members crash, restart as new incarnations, pause (their monotonic clock
// runs on while they do nothing), join and leave; each member's clock runs
// at its own rate within the stated bound. The same Options give the same
// run, event for event, so a failing seed prints its schedule and replays
// exactly.
//
// What runs as nodes run it, and what is modelled: the ownership rules
// are peer's own code (ownership.Machine inside ownlog.Member, raft
// included), and so is the grantee's side of a spread key
// (internal/grantee). The data plane is modelled on peer's (data.go):
// each key's policy replicates sync, async or off, mixed in one schedule
// (Options.Modes); a replica batch fails at once 1 % of the time (a
// broken pipe), is refused by a backup at another epoch, or vanishes
// (FaultBlip) and times out; an async replica that fails makes its holder
// re-copy the partition (Machine.Recopy, as peer's replication does); a
// policy is removed and added back (FaultReadd) and raised (FaultRaise),
// a raise re-copying every held partition (one difference, stated: the
// simulator's copies carry every key, while peer's leave out the keys of
// a policy its table lacks, so there a partition that moves, or is taken
// over, while a policy is removed loses that policy's keys; that is
// open); gossip gives a member up
// after FailedAfter (View.Failed) and knows one gone for good only once
// it left or a later incarnation runs.
//
// What is checked (oracle.go), besides the windows (the direct rule and
// porcupine against the sliding-log model, a key allowed over its limit
// by exactly the admissions its policy may lose, each checked):
//   - every 5 ms of true time, no two members may decide for one
//     partition (MayDecide, as the decision path asks it);
//   - every 50 ms, a working backup has every admission its holder
//     acknowledged under sync and every async one no longer in flight;
//   - when a member first decides for a partition, the admissions its
//     state lacks: none acknowledged under sync, async ones only if made
//     within ReplicaTimeout before their holder stopped, none at a move,
//     none after an aged grant while they could count;
//   - no holding handed without its state, no single fault restarting a
//     partition empty;
//   - a crashed member's liveness ended within a bound (DESIGN's price:
//     its keys unavailable for the liveness to expire and a commit).
//
// The simulator is itself tested: sim_test.go's catalogue breaks every
// rule of ownership.Mutation and of this package's Mutation, one at a
// time, and fails unless a schedule catches each.
//
// Every message is counted by category, the ownership log's apart from
// the data plane's (traffic.go), and RunFleet (fleet.go) takes hundreds
// to thousands of members through a churn and a rolling deploy, timing
// how long each takes to settle; README.md has the commands and figures.
package sim

import (
	"container/heap"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/peer/internal/grantee"
	"github.com/ringlimit/ringlimit/peer/internal/history"
	"github.com/ringlimit/ringlimit/peer/internal/ownership"
	"github.com/ringlimit/ringlimit/peer/internal/ownlog"
)

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
	// Rights granted to spread the first key, and those admitted from.
	Granted, Used int64
	// Misstood counts partitions whose Machine.Standings (what the
	// runner publishes) differed from the machine's own answers, or
	// changed while Machine.Gen (when the runner rebuilds them) did not.
	Misstood int
	// Pokes counts the early periodic steps members ran between ticks
	// (Member.Poke), as a node's runner runs them.
	Pokes int
	// Stalled counts graceful leaves that reached their close deadline
	// still holding partitions.
	Stalled int
	// Aged counts partitions restarted empty by an aged grant (their
	// Last out of reach for longer than EmptyAfter): nothing lost.
	Aged int
	// Oracle lists what the oracles beside the windows found: two
	// members deciding for one partition at overlapping instants of true
	// time, an acknowledged sync admission lost, an async admission lost
	// beyond what was in flight, a move that lost admissions.
	Oracle []string
	// Decisions counts the holders' decisions the overlap oracle saw.
	Decisions int
	// LostAsync and LostOff count admissions of async and off keys a
	// takeover lost, within their bounds (the windows allow them).
	LostAsync, LostOff int
	// Traffic is the whole run's messages by category (traffic.go).
	Traffic Traffic
	// LeaderCrash is, under FaultLeaderCrash, how long keys stayed
	// unavailable after the leader crashed: those it held and the others.
	LeaderCrash CrashGaps
	// Unended lists the crashed incarnations every running member's
	// table still listed active endedWithin after the crash (oracle.go):
	// whatever they held stayed unavailable.
	Unended []string
	// SelfRemoved is, under FaultSelfRemoval, whether a leader applied
	// its own removal in the term it led (selfremoval.go).
	SelfRemoved bool
	// EndingRace is, under FaultEndingRace, whether the leader took and
	// answered a holder's keep-alive while its End was pending, and the
	// holder applied the End after the answer and its backup
	// (aimending.go).
	EndingRace bool
	// KeptAliveCut is, under FaultKeepAliveCut, whether the holder sent
	// the cut-off leader, still leading, a keep-alive a fifth of a
	// Liveness or more into the cut (aimkeepalive.go).
	KeptAliveCut bool
	// LateSetBackup is what FaultLateSetBackup brought about (aimepoch.go).
	LateSetBackup LateSetBackup
}

// CrashGaps is the longest stretch of one key's consecutive unavailable
// or unknown answers that began after the log's leader crashed, among the
// keys of the partitions it held (Own, OwnKeys of them) and among the
// others (Others); Measured is false when no leader was crashed. A
// stretch counts from the first call after the crash.
type CrashGaps struct {
	Own, Others time.Duration
	OwnKeys     int
	Measured    bool
}

// Failed reports whether the run broke the promise or an invariant.
func (r Result) Failed() bool {
	return len(r.Report.Violations) > 0 || r.Counters.MissingCopy > 0 || r.Misstood > 0 || len(r.Oracle) > 0 || len(r.Unended) > 0
}

// Caught reports whether a checker of the promise (a window, the
// overlap and loss oracles, a holding handed without its state, a single
// fault's restart from empty, a crashed member never ended) failed the
// run: what a mutation test requires, beside the machine's own
// consistency check (Misstood).
func (r Result) Caught() bool {
	return len(r.Report.Violations) > 0 || r.Counters.MissingCopy > 0 || len(r.Oracle) > 0 || len(r.Unended) > 0 || r.Lost > 0 && r.Fault < numFaults
}

// String tells the run in a few lines, with its schedule.
func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d fault %s: %d ops (%d admitted, %d unknown), %d decisions, %d events, %d messages, %d commands, lost %d, aged %d, lost async %d, lost off %d, missing copies %d, misstood %d, stalled leaves %d, longest unavailable %v\n",
		r.Seed, r.Fault, r.Report.Ops, r.Report.Admitted, r.Report.Unknown, r.Decisions, r.Events, r.Messages, r.Commands, r.Lost, r.Aged, r.LostAsync, r.LostOff, r.Counters.MissingCopy, r.Misstood, r.Stalled, r.Unavailable)
	for _, s := range r.Schedule {
		fmt.Fprintf(&b, "  %s\n", s)
	}
	for _, v := range r.Report.Violations {
		fmt.Fprintf(&b, "  VIOLATION %s\n", v)
	}
	for _, v := range r.Oracle {
		fmt.Fprintf(&b, "  ORACLE %s\n", v)
	}
	for _, v := range r.Unended {
		fmt.Fprintf(&b, "  UNENDED %s\n", v)
	}
	return b.String()
}

// Run runs one schedule and checks its history.
func Run(o Options) Result {
	o.defaults()
	s := newSim(o)
	defer s.removeDisks()
	s.run()
	return s.result()
}

// result is what the run did and what the checker found.
func (s *sim) result() Result {
	o := s.o
	res := Result{Seed: o.Seed, Fault: s.fault, Schedule: s.schedule, Ops: s.ops, Events: s.events, Messages: s.messages, Commands: s.commands, RaftBytes: s.raftBytes}
	for _, m := range s.all {
		c := m.own.Counters()
		res.Counters.MissingCopy += c.MissingCopy
		res.Counters.Moves += c.Moves
		res.Counters.Takeovers += c.Takeovers
		res.Counters.Restarts += c.Restarts
		res.Counters.Aged += c.Aged
	}
	res.Lost = uint64(res.Counters.Restarts)
	res.Aged = res.Counters.Aged
	res.Oracle, res.Decisions = s.checkOracles()
	res.LostAsync, res.LostOff = s.lostAsync, s.lostOff
	// The promise is checked on the real (virtual) clock: an owner whose
	// clock runs fast by the rate bound ends a window early by as much.
	// A key may go over its limit by the admissions a takeover lost
	// within their policy's bound (async, off) or with a counted restart,
	// and by no more.
	w := time.Duration(float64(o.Window) / (1 + o.RateBound))
	res.Report = history.Check(s.ops, func(k string) history.Limits { return history.Limits{Limit: o.Limit + s.slack[k], Window: w} }, 3*time.Second)
	res.Unavailable = s.longestGap()
	res.LeaderCrash = s.crashGaps()
	res.Granted, res.Used = s.granted, s.used
	res.Misstood = s.misstood
	res.Pokes = s.pokes
	res.Stalled = s.stalled
	res.Unended = s.unended
	res.SelfRemoved = s.sr != nil && s.sr.reached
	res.EndingRace = s.er.reached()
	res.KeptAliveCut = s.kc != nil && s.kc.reached
	if s.lsb != nil {
		res.LateSetBackup = s.lsb.res
	}
	res.Traffic = s.since(snapshot{})
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
	deaf      map[string]bool    // member names whose gossip hears nobody (the log still works)
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

	granted, used int64 // rights of the spread key

	// misstood counts partitions whose Machine.Standings differed from
	// Has, MayDecide and DependsOn asked one by one, or changed while the
	// machine's Gen did not (checked after every output a member
	// carries).
	misstood int
	pokes    int // Member.Poke calls (Result.Pokes)
	stalled  int // leaves stopped at their close deadline (Result.Stalled)

	// The oracles' records (oracle.go).
	spans     map[spanKey]*span     // each (partition, member, epoch)'s decisions
	adms      map[uint64]*admission // every admission decided by a holder, by id
	losses    []loss                // admissions a new decider's state lacked
	lostSeen  map[uint64]bool       // admissions counted lost once
	restarts  map[int]uint64        // each partition's Restarts when last looked at
	aged      map[int]uint64        // and its Aged
	slack     map[string]int64      // per key: admissions lost within their bound
	lostAsync int                   // Result.LostAsync
	lostOff   int                   // Result.LostOff
	blip      map[[2]string]bool    // replicas between these (from, to) names vanish
	late      bool                  // Move and SetBackup proposals are held back (FaultLate)
	slowIn    map[string]int64      // member names → the most a message to them is slowed
	stallTo   map[string]int64      // member names → until when what they send is held
	// lateAnswer: member names → how late keep-alive answers to them
	// arrive (FaultLateAnswer).
	lateAnswer map[string]int64
	lateCopy   bool     // copies are held back 1.2-3 s (FaultLateCopy)
	disk       *simDisk // data directories of FaultWholeRestart and FaultRestoredBackup (simdisk.go)
	// leaderHeld is, under FaultLeaderCrash, the partitions the crashed
	// leader held, and leaderAt when it crashed (Result.LeaderCrash).
	leaderHeld map[int]bool
	leaderAt   int64
	overlaps   int      // probes that found two members that may decide
	overlapAt  []string // the first few
	probes     int
	stale      int      // admissions a working backup lacked (checkBackups)
	staleAt    []string // the first few

	// behind is the member the log falls silent to (FaultBehindBackup):
	// no raft message reaches it, keep-alives and the data plane do;
	// behindFrom is the holder crashed the instant behind installs a
	// copy from it; behindWas is behind, kept once the log reaches it
	// again, to note the snapshot that catches it up.
	behind, behindFrom, behindWas *member

	// Fleet-size runs and what they measure (placement.go, traffic.go,
	// fleet.go).
	pl    *placement // gossip's targets for a view
	ids   []string   // sortedIDs, until a member starts or stops
	tr    traffic    // messages and bytes by category and member
	fleet *fleet     // the fleet run's phases (nil: planFault's one fault)
	// who and touched are the probe's scratch: per partition, the
	// members that may decide for it; the partitions with any.
	who      [][]string
	touched  []int
	allParts []int // every partition (candidates under MutGossipTakeover)
	// checkEvery spaces each member's consistency checks (checkDue; 0:
	// after every output).
	checkEvery int64
	unended    []string       // Result.Unended
	sr         *selfRemoval   // FaultSelfRemoval's aim (selfremoval.go)
	er         *endingRace    // FaultEndingRace's aim (aimending.go)
	kc         *keepAliveCut  // FaultKeepAliveCut's aim (aimkeepalive.go)
	lsb        *lateSetBackup // FaultLateSetBackup's aim (aimepoch.go)
}

const (
	tick       = 100 * time.Millisecond
	gossipTick = 200 * time.Millisecond
	clientWait = time.Second
)

func newSim(o Options) *sim {
	s := &sim{o: o, rng: rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15)), members: map[string]*member{}, byRaft: map[uint64]*member{}, cut: map[[2]string]bool{}, deaf: map[string]bool{}, maxDelay: int64(2 * time.Millisecond),
		pl:    newPlacement(o.Partitions),
		spans: map[spanKey]*span{}, adms: map[uint64]*admission{}, lostSeen: map[uint64]bool{}, restarts: map[int]uint64{}, aged: map[int]uint64{}, slack: map[string]int64{}, blip: map[[2]string]bool{}, slowIn: map[string]int64{}, stallTo: map[string]int64{}, lateAnswer: map[string]int64{}}
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

// jointFoundingFrom is the member count above which a fleet run founds
// its log with a joint configuration (run).
const jointFoundingFrom = 64

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
	if s.fleet != nil && s.o.Members > jointFoundingFrom {
		// A fleet's founding: the voters joint with themselves (the
		// same majorities), which the first leader leaves at once. etcd
		// raft restores a plain configuration one member at a time,
		// copying it at each (members² work a member: at 1 024 members
		// half a second, times 1 024 founders, BenchmarkConfRestore), and
		// a joint one with all its learners in one step.
		cs.VotersOutgoing, cs.AutoLeave = voters, proto.Bool(true)
	}
	for i := range s.o.Members {
		s.start(fmt.Sprintf("n%d", i), 1, uint64(i+1), cs)
	}
	for c := range s.o.Clients {
		s.at(warm+int64(s.rng.IntN(int(50*time.Millisecond))), func() { s.client(c) })
	}
	if s.fleet != nil {
		s.fleet.plan(warm)
	} else {
		s.planFault(warm)
	}
	s.at(int64(gossipTick), s.gossip)
	s.at(int64(probeEvery), s.probe)
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
	// policies are the keys' policies in this member's table: absent
	// (removed) or present with a replication; a change reaches members
	// at different times, as a policy file's reload does.
	policies map[string]policyState
	policyAt map[string]int64 // when each key's policy last changed here
	// asyncPending are the async replicas not confirmed yet, by
	// admission id.
	asyncPending map[uint64]asyncItem
	leaving      bool
	// alive counts the members the last gossip view listed, this one
	// included (ownership.Drain.Alive).
	alive int
	// closeIn is a leaver's close deadline, virtual ns from its drain's
	// start (0: 4 s).
	closeIn int64

	log *ownlog.Member
	own *ownership.Machine
	// held and wasBackup: what the table said after the last Output, for
	// MutTakeoverEmpty.
	held, wasBackup []bool
	stores          []map[string][]entry
	clamp           map[string]int64
	pending         map[uint64]*pendingSync
	admSeq          uint64
	ix              int     // index of this incarnation (placement's)
	heard           []int64 // by incarnation index: virtual ns + 1 last heard through gossip (0: never)
	detect          int64
	rights          map[string]*grantee.State // the spread key's rights, as a grantee
	poking          bool                      // an early periodic step (Member.Poke) is scheduled
	// stood is each partition as a node's runner last published it, at
	// the machine's Gen stoodGen (stoodAt: set once).
	stood    []stood
	stoodGen uint64
	stoodAt  bool
	// holding lists the partitions the table named this member holder
	// of after its last output (held's true ones): the only ones it may
	// decide for (the probes ask these). It rests on two facts: the
	// table changes only in calls whose output carry carries, and whom
	// it names holder moves only with the machine's Gen (heldGen).
	// checkAt is when its next consistency check is due (checkDue).
	holding []int
	heldGen uint64
	heldAt  bool
	checkAt int64
	// ledTicks counts, under FaultKeepAliveCut, the raft ticks since
	// the member last became leader, in term ledTerm: raft's CheckQuorum
	// keeps that count (aimkeepalive.go).
	ledTerm  uint64
	ledTicks int
	// leaveLog, when set, ends a drain that may go (faults.go's drain)
	// in place of its default: fleet.go's leaveLog.
	leaveLog func()
}

// stood is what a node's runner publishes of one partition.
type stood struct {
	holder, backup string
	epoch          uint64
	st             ownership.Standing
}

// entry is one admission of hits at ts, or (grant) one grant of hits
// rights whose lease ends at ts, on the member's clock.
type entry struct {
	ts, hits int64
	id       uint64
	grant    bool
}

type pendingSync struct {
	reply func(history.Outcome, uint64)
	epoch uint64
	done  bool
}

// mono is the member's monotonic clock: it starts at 0 with the process
// and runs at the member's rate, paused or not.
func (m *member) mono() int64 { return m.monoAt(m.s.now) }

// monoAt is the member's monotonic clock at virtual time at.
func (m *member) monoAt(at int64) int64 { return int64(float64(at-m.born) * m.rate) }

func (s *sim) start(name string, inc int, raftID uint64, cs *pb.ConfState) *member {
	m := &member{s: s, name: name, inc: inc, id: fmt.Sprintf("%s.%d", name, inc), raftID: raftID,
		rate: s.rate(), born: s.now,
		clamp: map[string]int64{}, pending: map[uint64]*pendingSync{}, rights: map[string]*grantee.State{},
		detect: int64(300*time.Millisecond) + s.rng.Int64N(int64(4700*time.Millisecond))}
	beat, election := s.raftTicks()
	log, err := ownlog.New(ownlog.Config{RaftID: raftID, Ownership: ownership.Config{ID: m.id, Liveness: s.o.Liveness, ExtendEvery: s.o.ExtendEvery, EmptyAfter: s.o.emptyAfter(), Mutation: s.o.Rule},
		Partitions: s.o.Partitions, Bootstrap: cs, Voters: s.o.Voters, Disk: s.diskFor(name), SnapshotEvery: s.snapshotEvery(), HeartbeatTicks: beat, ElectionTicks: election, NoQuiet: s.o.NoQuiet})
	if err != nil {
		panic(err)
	}
	m.log, m.own = log, log.Own()
	m.held, m.wasBackup = make([]bool, s.o.Partitions), make([]bool, s.o.Partitions)
	m.stores = make([]map[string][]entry, s.o.Partitions)
	for p := range m.stores {
		m.stores[p] = map[string][]entry{}
	}
	m.policies, m.policyAt = map[string]policyState{}, map[string]int64{}
	m.asyncPending = map[uint64]asyncItem{}
	for i, k := range s.keys {
		st := policyState{present: true, mode: s.o.mode(i)}
		switch {
		case s.fault == FaultRaise && s.now == 0:
			st.mode = ModeOff // raised at the fault
		case s.fault == FaultReadd && i == 0:
			st.mode = ModeOff // removed, then added back as sync
		}
		if s.now > 0 {
			// A member started later reads the table the others run.
			for _, o := range s.all {
				if !o.crashed && o != m {
					st = o.policies[k]
					break
				}
			}
		}
		m.policies[k] = st
	}
	s.members[m.id] = m
	s.all = append(s.all, m)
	s.byRaft[raftID] = m
	s.ids = nil
	s.pl.add(m.id)
	m.ix = int(s.pl.ix[m.id])
	m.growHeard()
	m.heard[m.ix] = s.now + 1
	s.schedTick(m)
	return m
}

// raftTicks are the members' heartbeat interval and election timeout, in
// ticks: as a node derives them, or the options'.
func (s *sim) raftTicks() (beat, election int) {
	if s.o.Heartbeat > 0 {
		return max(int(s.o.Heartbeat/tick), 1), max(int(s.o.Election/tick), 2)
	}
	return ownlog.Timing(s.o.Liveness, tick)
}

// rate draws a member's clock rate within the bound (at it, with
// RatesAtBound).
func (s *sim) rate() float64 {
	if s.o.RatesAtBound {
		if s.rng.IntN(2) == 0 {
			return 1 - s.o.RateBound
		}
		return 1 + s.o.RateBound
	}
	return 1 + s.o.RateBound*(2*s.rng.Float64()-1)
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

// send carries fn, a message of category c and size bytes, from one
// member to another through the network.
func (s *sim) send(c Category, size int, from, to *member, fn func()) {
	s.messages++
	s.sent(c, from, size)
	if s.cut[[2]string{from.name, to.name}] || s.rng.Float64() < s.loss || c == Raft && to == s.behind {
		return
	}
	n := 1
	if s.rng.Float64() < s.dup {
		n = 2
	}
	for range n {
		d := int64(100*time.Microsecond) + s.rng.Int64N(s.maxDelay)
		if slow := s.slowIn[to.name]; slow > 0 {
			d += slow/5 + s.rng.Int64N(slow)
		}
		if until := s.stallTo[from.name]; until > s.now {
			d += until - s.now
		}
		s.at(d, func() { s.deliver(to, func() { s.received(c, to, size); fn() }) })
	}
}

func (m *member) tick() {
	if m.s.fault == FaultKeepAliveCut {
		m.s.keepAliveCutTick(m)
	}
	m.carry(m.log.Tick(m.mono()))
}

// schedPoke schedules the member's early periodic step (Member.Poke) when
// a change calls for one, as a node's runner runs it once no event waits:
// after a short random delay, so that other events may come first.
func (m *member) schedPoke() {
	if m.poking || !m.log.Poked() {
		return
	}
	m.poking = true
	s := m.s
	s.at(1+s.rng.Int64N(int64(time.Millisecond)), func() {
		s.deliver(m, func() {
			m.poking = false
			s.pokes++
			m.carry(m.log.Poke(m.mono()))
		})
	})
}

// carry carries out one Output of the member's log: raft messages onto
// the network, data actions here.
func (m *member) carry(out ownlog.Output) {
	s := m.s
	if m.log.Leader() {
		s.commands += out.Applied
	}
	t := m.own.Table()
	now := m.mono()
	// The machine's own consistency (Result.Misstood) is checked after
	// every output, or at most every checkEvery in a fleet run.
	check := m.checkDue()
	if check {
		m.own.Standings(now, func(p int, _ *ownership.Partition, st ownership.Standing) {
			held, backed := m.own.DependsOn(p)
			if st != (ownership.Standing{Have: m.own.Has(p), May: m.own.MayDecide(p, now), Held: held, Backed: backed}) {
				s.misstood++
			}
		})
	}
	// A node's runner rebuilds what it publishes only when the machine's
	// Gen moved, with the lease left out (readers check it): a partition
	// that changed while Gen stood still would be decided on stale.
	gen := m.own.Gen()
	if m.stood == nil {
		m.stood = make([]stood, len(m.stores))
	}
	if check {
		same := m.stoodAt && gen == m.stoodGen
		m.own.Standings(min(now, m.own.LiveUntil()-1), func(p int, pt *ownership.Partition, st ownership.Standing) {
			cur := stood{pt.Holder, pt.Backup, pt.Epoch, st}
			if same && cur != m.stood[p] {
				s.misstood++
			}
			m.stood[p] = cur
		})
		m.stoodGen, m.stoodAt = gen, true
	}
	if gen != m.heldGen || !m.heldAt {
		// Whom the table names moves only with Gen.
		m.heldGen, m.heldAt = gen, true
		m.holding = m.holding[:0]
		e, live := t.Live(m.id)
		for p := range m.stores {
			holds := live && t.Parts[p].Holder == m.id && t.Parts[p].HolderEpoch == e // t.Holds(m.id, p)
			if s.o.Mutation == MutTakeoverEmpty && !m.held[p] && holds && t.Parts[p].Backup == "" && m.wasBackup[p] {
				m.stores[p] = map[string][]entry{} // the broken rule: start empty
			}
			m.held[p], m.wasBackup[p] = holds, t.Parts[p].Backup == m.id
			if holds {
				m.holding = append(m.holding, p)
			}
		}
	}
	for _, a := range out.Actions {
		switch a.Kind {
		case ownership.SendCopy:
			m.sendCopy(a)
		case ownership.Reset:
			m.stores[a.P] = map[string][]entry{}
			s.restoreFromDisk(m, a.P)
		}
	}
	msgs := out.Messages
	if s.sr != nil {
		msgs = s.aimSelfRemoval(m, msgs)
	}
	if s.er != nil {
		msgs = s.aimEndingRace(m, msgs)
	}
	if s.kc != nil {
		s.aimKeepAliveCut(m, msgs)
	}
	if s.lsb != nil {
		msgs = s.aimLateSetBackup(m, msgs)
	}
	for _, msg := range msgs {
		to := s.byRaft[msg.GetTo()]
		if to == nil {
			continue
		}
		wire, err := proto.Marshal(msg)
		if err != nil {
			panic(err)
		}
		s.raftBytes += len(wire)
		s.tr.raftSent(msg.GetType(), len(wire))
		step := func() {
			in := &pb.Message{}
			if err := proto.Unmarshal(wire, in); err != nil {
				panic(err)
			}
			to.carry(to.log.Step(in, to.mono()))
		}
		if msg.GetType() == pb.MsgSnap {
			// A transport sends a snapshot as one stream and tells raft
			// how that went.
			id := msg.GetTo()
			s.sent(Raft, m, len(wire))
			if s.cut[[2]string{m.name, to.name}] || to == s.behind {
				m.carry(m.log.ReportSnapshot(id, false, m.mono()))
				continue
			}
			s.at(int64(time.Millisecond), func() {
				s.deliver(to, func() {
					if to == s.behindWas {
						s.note("%s is caught up by a snapshot", to.id)
					}
					s.received(Raft, to, len(wire))
					step()
				})
				if !m.crashed {
					m.carry(m.log.ReportSnapshot(id, true, m.mono()))
				}
			})
			continue
		}
		cat := Raft
		if ownlog.IsKeepAlive(msg) {
			cat = KeepAlive
		}
		if late := s.lateAnswer[to.name]; late > 0 && ownlog.CarriesAnswers(msg) {
			s.messages++
			s.sent(cat, m, len(wire))
			s.at(late+s.rng.Int64N(late), func() {
				s.deliver(to, func() { s.received(cat, to, len(wire)); step() })
			})
			continue
		}
		if msg.GetType() == pb.MsgProp && s.late && !slices.ContainsFunc(msg.Entries, onTime) {
			// Held back past Retry (FaultLate), each by its own delay.
			s.messages++
			s.sent(Raft, m, len(wire))
			s.at(int64(1200*time.Millisecond)+s.rng.Int64N(int64(1800*time.Millisecond)), func() {
				s.deliver(to, func() { s.received(Raft, to, len(wire)); step() })
			})
			continue
		}
		s.send(cat, len(wire), m, to, step)
	}
	m.schedPoke()
}

// onTime reports whether a proposed entry goes out on time under
// FaultLate: all but Moves and SetBackups.
func onTime(e *pb.Entry) bool {
	c, err := ownership.Decode(e.GetData())
	return err != nil || c.Kind != ownership.Move && c.Kind != ownership.SetBackup
}

// sortedIDs returns the running and paused incarnations' IDs in order
// (shared: read only).
func (s *sim) sortedIDs() []string {
	if s.ids != nil {
		return s.ids
	}
	ids := make([]string, 0, len(s.members))
	for id := range s.members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	s.ids = ids
	return ids
}

// byID returns the incarnation id, running or not (nil: none).
func (s *sim) byID(id string) *member {
	if ix, ok := s.pl.ix[id]; ok {
		return s.all[ix]
	}
	return nil
}

// roster is the raft members as gossip eventually tells them, for the
// leader's autopilot.
func (s *sim) roster() []ownlog.Peer {
	r := make([]ownlog.Peer, 0, len(s.all))
	for _, m := range s.all {
		r = append(r, ownlog.Peer{RaftID: m.raftID, Member: m.id, Gone: m.crashed, Leaving: m.leaving})
	}
	return r
}

func (s *sim) partition(key string) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(s.o.Partitions))
}
