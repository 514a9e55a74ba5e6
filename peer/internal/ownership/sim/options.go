package sim

// The run's shape: its fault, the keys' replication, the deliberate
// breaks (Mutation) and the Options that gather them.

import (
	"time"

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
	// FaultLongSplit is FaultSplit outlasting FailedAfter, gossip's
	// FailedMemberTimeout: the big side gives the small side's members
	// up (Failed, not gone for good) while they hold the state of the
	// partitions that wait for them.
	FaultLongSplit
	// FaultReadd removes the first key's policy from every member's
	// table, lets a member join meanwhile, adds the policy back with sync
	// replication, then crashes the key's holder.
	FaultReadd
	// FaultBlip drops the replication from the first key's holder to its
	// backup for 100-600 ms (the pipe breaks and is dialled again), then
	// crashes the holder 1-5 s later: the blip must have been repaired
	// (for async keys, by a copy) before the crash.
	FaultBlip
	// FaultLate holds back the Move and SetBackup proposals every member
	// but the leader sends, for 1.2-3 s each (past Retry), and slows what every member
	// hears by up to 600 ms, for 10 s while a member joins; then the
	// first key's holder crashes. Moves and SetBackups commit after the
	// Keeps their holders proposed once they seemed lost; whatever that
	// left behind must not show when the holder's backup takes over.
	FaultLate
	// FaultSlowCut slows everything a member hears by 0.3-1.5 s for 2-5 s,
	// then cuts it off both ways for 3-10 s (a link that degrades before
	// it fails): it applies its own commands late, then not at all.
	FaultSlowCut
	// FaultStall holds everything a member (not the leader) sends for
	// 1.7-2.7 s, about one Liveness, then lets it arrive at once, while
	// what it hears is up to 600 ms late: its extensions reach the
	// leader about when the leader sees its record expire.
	FaultStall
	// FaultLeaderSplit cuts the log's leader and a holder (not the
	// leader) off from everyone else, both ways, for 3-15 s: the leader
	// still believes it leads for up to two election timeouts and the
	// holder still reaches it with keep-alives, which it must not grant
	// (it cannot confirm a read), while the other side elects a leader
	// that ends the holder.
	FaultLeaderSplit
	// FaultLeaderChange crashes a holder, then the log's leader 0.2-2 s
	// later, while its End may be on the way: the next leader must wait
	// out the keep-alives the crashed one granted before it ends anyone.
	FaultLeaderChange
	// FaultLateAnswer delays the keep-alive answers to a holder (in
	// messages of their own, or in the leader's heartbeats that carry
	// them back to a voter) by 1-2
	// Livenesses for 3 s, then cuts what it sends for 3-8 s: answers
	// arrive long after the requests they grant, while the leader no
	// longer hears from it.
	FaultLateAnswer
	// FaultLateCopy holds back every copy 1.2-3 s (past the copy's wait,
	// which then grows) for 10 s while a member joins, then crashes the
	// first key's holder: copies arrive after newer ones, and after the
	// partition's epoch moved on.
	FaultLateCopy
	// FaultLeaderPause pauses the log's leader for 0.5-3 Livenesses
	// while keep-alives wait for its read: it wakes believing it leads,
	// with requests it took before the pause.
	FaultLeaderPause
	numFaults

	// FaultDouble crashes a holder and its backup at once: two faults,
	// outside the promise. Their partitions' state is lost, which must be
	// counted (Result.Lost), never silent.
	FaultDouble = numFaults
	// FaultLeavePause is a graceful leave of a holder while its backup
	// pauses for up to 40 s: two faults at once. Nothing may be admitted
	// over the limit (the paused backup's copy is current when it wakes,
	// and the leaver stops deciding at its close deadline); what it
	// costs is availability, which Result.Unavailable reports.
	FaultLeavePause = numFaults + 1
	// FaultLeaverPause is a graceful leave of a voter (not the leader)
	// that holds partitions and pauses for 1-3 s while it drains (a loaded machine, a stop-the-world pause):
	// one fault. Its close deadline waits out the pause, and its leave
	// must still finish: a leaver the log stopped sending to would see
	// no move commit, and stop at its deadline holding partitions
	// (Result.Stalled).
	FaultLeaverPause = numFaults + 2
	// FaultBackupLeave is a graceful leave of the first key's backup at
	// the instant its holder crashes and restarts as a new incarnation
	// (the old one gone for good at once), while the leaver's gossip
	// hears nobody for 1-6 s (its log still works): one fault. The
	// leaver keeps the only copy of the holder's state; it may end its
	// liveness only once the log handed it the partition and it moved
	// it on, whatever its gossip view says.
	FaultBackupLeave = numFaults + 3
	// FaultSplitRestart is a 2 | 3 split with a holder and its backup on
	// the small side, during which the holder crashes and restarts as a
	// new incarnation (its old one gone for good): a cut and a crash,
	// two faults. The backup cut off with it has the state, but a
	// vacancy remembers one member (Last), and when the log ended the
	// backup first, that member is the restarted holder: the partition
	// restarts empty, counted (Result.Lost), never silent.
	FaultSplitRestart = numFaults + 4
	// FaultWholeRestart crashes every member at once and starts each
	// again from its data directory (simdisk.go): the same raft member
	// under a new incarnation, the heir of its old one, restoring on
	// Reset the partition state its old one had; a member new to the
	// cluster starts with them.
	FaultWholeRestart = numFaults + 5
	// FaultRestoredBackup takes a backup of the first key's holder's
	// data directory, crashes it 2-6 s later, and starts it again from
	// that backup (simdisk.go): its partition state as it was then, its
	// raft files removed as a restore must (a raft log must never go
	// back), so it joins the log as a new raft member.
	FaultRestoredBackup = numFaults + 6
	// FaultBehindBackup makes the log fall silent to the first key's
	// holder's backup (no raft message reaches it; its keep-alives and
	// the data plane still work), makes the holder copy its partitions
	// to their backups again (a raise), and crashes it the instant the
	// backup installs such a copy, before the SetBackup is proposed:
	// one fault, a holder's crash. The log ends the holder and hands
	// the partition to the backup, which learns that from a snapshot
	// (snapshots every 4 entries) once the log reaches it again: it must
	// take over with the copy it installed (a member caught up by
	// snapshot across a takeover once held the partition for good
	// without its state, never deciding).
	FaultBehindBackup = numFaults + 7
	// FaultLeaderCrash crashes the log's leader for good: its own
	// holdings wait for an election, then for the new leader to wait out
	// the keep-alives the crashed one may have granted (a whole Liveness
	// from when its voters last heard the crashed one) before it ends it.
	// TestFailoverTimes measures
	// how long its keys are unavailable.
	FaultLeaderCrash = numFaults + 8
	// FaultVoterCutCrash cuts a voter (not the leader, nor the first
	// key's holder) off from the log's leader, both ways, for 0.6-1.2 s,
	// then crashes the leader and cuts the holder off from everyone for
	// 5 s: the cut voter may be elected next, with the vote of the other,
	// which heard the crashed leader to the end (and confirmed its last
	// grants), and must wait them out all the same.
	FaultVoterCutCrash = numFaults + 9
	// FaultSelfRemoval makes a leader apply its own removal, then
	// crashes a holder (selfremoval.go): a voter's messages to the
	// leader are lost (a link failing one way), so autopilot replaces it
	// and proposes its removal; the leader pauses the instant that
	// append has gone out to the removed voter alone, which is then
	// elected (its log is the longest) and commits its own removal with
	// its first entry. It must step down: a leader outside its
	// configuration has every proposal dropped while its heartbeats keep
	// the others from electing, and the crashed holder is never ended.
	FaultSelfRemoval = numFaults + 10
	// FaultKeepAliveCut is FaultLeaderSplit timed by the holder's
	// keep-alives (one that does not vote, of three voters; of five, a
	// voter, and the leader's CheckQuorum), so that one reaches the
	// cut-off leader late into the cut (aimkeepalive.go).
	FaultKeepAliveCut = numFaults + 11
	// FaultEndingRace cuts what a voter that holds a partition sends the
	// leader, its keep-alives waiting, until the leader's append of its
	// End goes out: then they arrive, a round trip before the End
	// commits, and the leader's appends to it stall for 0.25-0.5
	// Liveness (aimending.go). No keep-alive may be granted meanwhile.
	FaultEndingRace = numFaults + 13
	// FaultLateSetBackup holds back one SetBackup that replaces a
	// working backup until its holder has applied the Keep that lifted
	// its fence, a client asking the holder at that instant; the
	// holder's next copies are lost, then it crashes (aimepoch.go).
	FaultLateSetBackup = numFaults + 15
)

var faultNames = [...]string{"none", "crash", "restart", "pause", "isolate", "split", "deaf", "mute", "loss", "delay", "duplicate", "join", "leave", "raise then crash",
	"split past the failure timeout", "policy removed and added back, then crash", "replication blip, then crash", "late proposals, then crash", "slow then cut off", "stalled sends", "leader cut off with a holder", "holder then leader crash", "late keep-alive answers, then muted", "late copies, then crash", "leader pauses", "double crash", "leave while the backup pauses", "leave, pausing while it drains", "backup leaves as its holder restarts", "split, the holder restarting in it", "every member crashes at once and restarts from disk", "a member restarts from an old backup of its data directory", "the log falls silent to a backup, whose holder crashes as it re-copies", "the leader crashes", "a voter cut off from the leader, then the leader crashes", "a leader elected with its own removal, then a holder crashes", "leader cut off with a holder, timed by its keep-alives",
	FaultEndingRace: "a holder's keep-alive races its End", FaultLateSetBackup: "a SetBackup held back past its Keep, then its holder crashes"}

func (f Fault) String() string { return faultNames[f] }

// Faults lists every fault kind.
func Faults() []Fault {
	fs := make([]Fault, numFaults)
	for i := range fs {
		fs[i] = Fault(i)
	}
	return fs
}

// Mode is a key's policy's replication, as peer's policies set it.
type Mode uint8

const (
	// ModeSync: an admission is answered once the backup has it.
	ModeSync Mode = iota
	// ModeAsync: an admission is answered at once and replicated after;
	// a replica that fails, times out or is refused makes the holder copy
	// the partition to its backup again before it decides again
	// (Machine.Recopy), as peer's replication does. A crash may lose
	// what was still in flight: admissions made within ReplicaTimeout
	// before the holder stopped deciding.
	ModeAsync
	// ModeOff: admissions are not replicated; copies (moves, new backups)
	// carry them, a takeover loses them.
	ModeOff
)

var modeNames = [...]string{"sync", "async", "off"}

func (m Mode) String() string { return modeNames[m] }

// ReplicaTimeout is how long a holder waits for its backup to confirm a
// replica: a sync admission is then answered unavailable, an async one
// makes the partition owe a re-copy.
const ReplicaTimeout = 500 * time.Millisecond

// Mutation deliberately breaks one rule of the data plane or of a
// driver's (peer's) use of the machine, so tests can show that the
// simulator and the checker find what a broken rule admits. The
// machine's own rules are broken through Options.Rule
// (ownership.Mutation).
type Mutation uint8

const (
	MutNone Mutation = iota
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
	// MutGrantLeaseOnly: a holder charges a grant's rights only while
	// its lease runs, not until the lease's end plus W (a right used just
	// before the lease ends still counts in the windows after it).
	MutGrantLeaseOnly
	// MutGrantsNotReplicated: grants live only at the holder that made
	// them: neither replicas nor copies carry them, so a takeover's new
	// holder does not charge the rights its grantees still use.
	MutGrantsNotReplicated
	// MutLeaveOnGossip: the leave rule the drain had before
	// Machine.MayLeave: a leaver alone in its gossip view ends its
	// liveness at once, and one that holds nothing ends it after its
	// backup wait whether or not the holders it backs are alive.
	MutLeaveOnGossip
	// MutAsyncForget: an async replica that failed is forgotten (peer's
	// replication before it called Recopy): the backup lacks it until
	// the window passes.
	MutAsyncForget
	// MutReaddNoRaise: a policy added back (absent from the previous
	// table) is not a raise, whatever its replication: the backup's copy
	// lacks what was admitted before unreplicated.
	MutReaddNoRaise
	// MutFailedIsGone: a member gossip gave up on (FailedMemberTimeout)
	// counts as gone for good, so the partitions that wait for it are
	// restarted empty at once (peer's view before View.Failed).
	MutFailedIsGone
	numMutations
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
	// ExtendEvery is the members' keep-alive cadence [the machine's:
	// Liveness/2]: some mutants show more often with keep-alives sent
	// more often (catalogue).
	ExtendEvery time.Duration
	RateBound   float64 // [0.04]: clock rates within 1 ± RateBound
	// RatesAtBound puts every member's clock rate at 1 − RateBound or
	// 1 + RateBound (a coin each) instead of anywhere between: a slow
	// holder beside a fast leader is where a lease's margin is thinnest.
	RatesAtBound bool
	Mutation     Mutation
	// Rule breaks one rule of the ownership machine itself, in every
	// member (the mutation catalogue).
	Rule ownership.Mutation
	// Modes are the keys' replication, by key index (cycled; [all sync]).
	// The first key (the one faults aim at) is sync in spread runs.
	Modes []Mode
	// FailedAfter is gossip's FailedMemberTimeout: a member not heard
	// from for this long is Failed in a member's view [10 s].
	FailedAfter time.Duration
	// ReplicaFail is the share of replicas whose batch fails at once (a
	// broken pipe), in every schedule [0.01].
	ReplicaFail float64
	// Spread makes the first key (the one faults aim at) a spread key:
	// members other than its holder ask the holder for rights and admit
	// from them with no message, as peer's spread keys do, and half of
	// the clients' requests go to it.
	Spread bool
	Lease  time.Duration // [1 s] a grant's lease
	// Heartbeat and Election, when Heartbeat is set, replace raft's
	// heartbeat interval and election timeout [ownlog.Timing's, as a node
	// derives them: 200 ms and 500 ms at a 2 s Liveness], rounded down to
	// the simulator's 100 ms tick: what a slower heartbeat would cost
	// (TestFailoverTimes, TestFleetSizes: RINGLIMIT_SIM_TIMING).
	Heartbeat, Election time.Duration
	// NoQuiet keeps raft's heartbeats among three voters without
	// learners (ownlog.Config.NoQuiet), for comparisons
	// (RINGLIMIT_SIM_NOQUIET=1 in TestFailoverTimes, TestFleetSizes).
	NoQuiet bool
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
	if o.Lease == 0 {
		o.Lease = time.Second
	}
	if o.FailedAfter == 0 {
		o.FailedAfter = 10 * time.Second
	}
	if o.ReplicaFail == 0 {
		o.ReplicaFail = 0.01
	}
}

// emptyAfter is the machine's EmptyAfter for these options: the window
// and a grant's lease with the clock-rate margin, and a Liveness more.
func (o *Options) emptyAfter() time.Duration {
	return time.Duration(float64(o.Window+o.Lease)*(1+4*o.RateBound)) + o.Liveness
}

// mode is key i's replication.
func (o *Options) mode(i int) Mode {
	if len(o.Modes) == 0 || i == 0 && o.Spread {
		return ModeSync
	}
	return o.Modes[i%len(o.Modes)]
}
