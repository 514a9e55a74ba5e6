package sim

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"testing/cryptotest"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/ownership"
)

// run runs one schedule replayably: etcd raft draws its election timeouts
// from crypto/rand, which SetGlobalRandom seeds for the test.
func run(t *testing.T, o Options) Result {
	t.Helper()
	cryptotest.SetGlobalRandom(t, o.Seed)
	return Run(o)
}

// seeds is how many schedules TestSchedules runs: RINGLIMIT_SIM_SEEDS, or
// a fixed set sized to stay within about a minute of CI (fewer under the
// race detector, which slows the simulator about tenfold).
func seeds(t *testing.T) int {
	if v := os.Getenv("RINGLIMIT_SIM_SEEDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("RINGLIMIT_SIM_SEEDS=%q: want a positive count", v)
		}
		return n
	}
	if raceOn {
		return 26
	}
	return 260
}

// firstSeed is TestSchedules' first seed: RINGLIMIT_SIM_FIRST, or 1. A
// long run is split over processes with it (seeds 1-5000 in one,
// RINGLIMIT_SIM_FIRST=5001 in another).
func firstSeed(t *testing.T) uint64 {
	v := os.Getenv("RINGLIMIT_SIM_FIRST")
	if v == "" {
		return 1
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n < 1 {
		t.Fatalf("RINGLIMIT_SIM_FIRST=%q: want a positive seed", v)
	}
	return n
}

// options draws a run's shape from its seed: the fault cycles through
// every kind, and one run in two has a window longer than the liveness
// period, so that a takeover from an incomplete copy (or a restart from
// empty) would show as a window over the limit.
func options(seed uint64) Options {
	o := Options{Seed: seed, Fault: Fault(seed % uint64(numFaults)), NoFault: seed%uint64(numFaults) == 0}
	// Every key's policy replicates as one of sync, async and off, in
	// turns that move with the seed, so the first key (the one faults
	// aim at) runs each in turn.
	all := []Mode{ModeSync, ModeAsync, ModeOff}
	r := int(seed/uint64(numFaults)) % 3
	o.Modes = append(all[r:], all[:r]...)
	if seed%2 == 1 {
		o.Window = 5 * time.Second
		o.Limit = 8
	}
	// One run in three has every clock at the edge of what the holder's
	// share allows (rates differing by just under 10 %: 1 ± 4.7 %), fast
	// or slow: a slow holder beside a fast leader then has about 20 ms of
	// margin, and any smaller share shows.
	if seed%3 == 2 {
		o.RatesAtBound, o.RateBound = true, 0.047
	}
	return o
}

// TestSchedules runs seeded single-fault schedules and checks every
// history: no window over the limit (the direct rule and porcupine
// against the sliding-log model), no holding handed without its state,
// and no partition restarted empty (a single fault never loses state).
func TestSchedules(t *testing.T) {
	schedules(t, seeds(t), 0)
}

// schedules runs n seeded single-fault schedules from firstSeed, with
// members members (0: Options' default).
func schedules(t *testing.T, n, members int) {
	first := firstSeed(t)
	start := time.Now()
	var ops, faults, lost, failed, skipped int
	var events int
	worst := map[Fault]time.Duration{}
	for seed := first; seed < first+uint64(n); seed++ {
		o := options(seed)
		if members > 0 && members < 5 && o.Fault == FaultLeaderChange {
			// Two crashes: of three members, one is left, no majority.
			skipped++
			continue
		}
		o.Members = members
		if os.Getenv("RINGLIMIT_SIM_NOQUIET") != "" {
			o.NoQuiet = true
		}
		r := run(t, o)
		ops += len(r.Ops)
		events += r.Events
		worst[r.Fault] = max(worst[r.Fault], r.Unavailable)
		if r.Fault != FaultNone {
			faults++
		}
		if r.Lost > 0 {
			lost++
			t.Errorf("a single fault lost state:\n%s", r)
		}
		if r.Failed() {
			failed++
			t.Errorf("promise broken (replay: Run(options(%d)), %d members):\n%s", seed, members, r)
		}
		if r.Fault == FaultLeave && r.Stalled > 0 {
			t.Errorf("a graceful leave stopped at its close deadline still holding partitions:\n%s", r)
		}
		if r.Pokes == 0 {
			t.Errorf("seed %d: no member stepped between ticks (Member.Poke): the simulator must drive what a node's runner does", seed)
		}
		if len(r.Report.TimedOut) > 0 {
			t.Logf("seed %d: the linearizability check timed out on %v (the direct rule still ran)", seed, r.Report.TimedOut)
		}
		if done := seed - first + 1; n > 1000 && done%500 == 0 {
			// A long run tells how far it got (go test -v streams it).
			t.Logf("%d schedules run (seeds %d-%d) in %v, %d failed", done, first, seed, time.Since(start).Round(time.Second), failed)
		}
	}
	took := time.Since(start)
	t.Logf("%d schedules (%d with a fault; %d seeds skipped), %d operations, %d events in %v: %.1f schedules/s", n-skipped, faults, skipped, ops, events, took.Round(time.Millisecond), float64(n-skipped)/took.Seconds())
	for _, f := range Faults() {
		t.Logf("  %-9s longest unavailable stretch of one key %v", f, worst[f].Round(time.Millisecond))
	}
}

// spreadOptions is options with the first key spread and a lease drawn
// from the seed, from a fifth of the window to three windows.
func spreadOptions(seed uint64) Options {
	o := options(seed)
	o.Spread = true
	w := o.Window
	if w == 0 {
		w = time.Second
	}
	o.Lease = w/5 + time.Duration(seed*7919%15)*w/5
	return o
}

// TestSpreadSchedules runs seeded single-fault schedules with the first
// key (the one each fault aims at) spread over the members as rights, and
// checks every history as TestSchedules does: the grantees' local
// admissions are in it, so a grant charged too briefly, lost in a
// takeover or used outside its lease shows as a window over the limit.
func TestSpreadSchedules(t *testing.T) {
	n := max(seeds(t)/2, 14)
	start := time.Now()
	var granted, used, spreadOps int64
	for seed := uint64(1); seed <= uint64(n); seed++ {
		o := spreadOptions(seed)
		r := run(t, o)
		granted += r.Granted
		used += r.Used
		for _, op := range r.Ops {
			if op.Key == "k0" {
				spreadOps++
			}
		}
		if r.Lost > 0 {
			t.Errorf("a single fault lost state:\n%s", r)
		}
		if r.Failed() {
			t.Errorf("promise broken (replay: Run(spreadOptions(%d))), %d rights granted, %d used:\n%s", seed, r.Granted, r.Used, r)
		}
	}
	t.Logf("%d spread schedules in %v: %d operations on the spread key, %d rights granted, %d admitted from them (%.0f %%)",
		n, time.Since(start).Round(time.Millisecond), spreadOps, granted, used, 100*float64(used)/float64(max(granted, 1)))
	if used == 0 {
		t.Errorf("no admission was decided from rights: the schedules did not spread the key")
	}
}

// TestReplay: one seed gives the same run, event for event.
func TestReplay(t *testing.T) {
	for _, seed := range []uint64{3, 5, 17} {
		a := run(t, options(seed))
		b := run(t, options(seed))
		if a.Events != b.Events || a.Messages != b.Messages || len(a.Ops) != len(b.Ops) || a.String() != b.String() {
			t.Errorf("seed %d ran differently twice:\n%s\n%s", seed, a, b)
		}
	}
}

// mutant is one entry of the mutation catalogue: a rule broken on
// purpose (of the machine, Rule, or of the data plane and a driver's use
// of the machine, Mut) and the faults it is there for.
type mutant struct {
	name   string
	rule   ownership.Mutation
	mut    Mutation
	faults []Fault
	spread bool
	tweak  func(*Options)
	// budget, when set, is how many schedules this one may take, over
	// the default (mutationBudget).
	budget int
	// beyond, when set, says why no schedule reaches the rule and which
	// unit test of package ownership pins it instead (it fails with the
	// rule broken: TestGuards... in guard_test.go).
	beyond string
}

// catalogue is every deliberate break of the protocol's rules the
// simulator must catch: every mutation of ownership.Mutations() and of
// the data plane's Mutation. TestCatalogueIsComplete pins that.
func catalogue() []mutant {
	cut := []Fault{FaultIsolate, FaultPause, FaultSplit, FaultMute, FaultDeaf}
	return []mutant{
		{name: "lease ignored", rule: ownership.MutLeaseIgnored, faults: cut},
		{name: "holder counts the whole liveness", rule: ownership.MutHolderShareWhole, faults: []Fault{FaultIsolate, FaultDeaf}, tweak: func(o *Options) { atBound(o); oftener(o) }},
		{name: "holder counts three livenesses", rule: ownership.MutHolderLeaseTriple, faults: cut},
		{name: "lease counted from apply", rule: ownership.MutLeaseFromApply, faults: []Fault{FaultLateAnswer, FaultSlowCut, FaultDelay}},
		{name: "leader ends early", rule: ownership.MutLeaderEndsEarly, faults: cut},
		{name: "leader counts from an earlier keep-alive", rule: ownership.MutLeaderFromEarlier, faults: cut},
		{name: "alone leaver counts only holders", rule: ownership.MutAloneLeaverCountsHolders,
			beyond: "the leaver must be alone in gossip while the log's leader ends every other member's lapsed session (a starved machine: raft still commits, keep-alives do not arrive), so that it holds every partition and the others, active again, hold nothing: no single fault of the simulator starves keep-alives alone; TestMayLeaveAloneWhileOthersActive, TestMayLeaveAloneBrokenRuleCaught"},
		{name: "restored table counts nothing", rule: ownership.MutRestoredNoWait,
			beyond: "a member restored from a snapshot must then be elected: two faults; TestRestoredCountsAWholeLiveness"},
		{name: "end ignores the version", rule: ownership.MutEndIgnoresVersion,
			beyond: "an extension must be appended in the leader's tick that proposes the End (about 100 ms in a Liveness), and its member apply the End later than its backup; FaultStall aims at it, 0 of 300 schedules hit it; FaultEndingRace times a keep-alive into that round trip in 40 of 40 and catches it in 0 of 40: only an Extend command moves the version, proposed only by a member activating at an epoch, and the leader ends an inactive member only once gossip says it is gone; TestEndNamesTheVersionSeen"},
		{name: "end keeps the epoch", rule: ownership.MutEndKeepsEpoch, faults: cut},
		// Caught at seed 69 of late proposals (then crash) once autopilot
		// batched learner changes and told removed voters (a fleet's
		// deploy), where 60 schedules had been enough.
		{name: "move ignores the epoch", rule: ownership.MutMoveIgnoresEpoch, faults: []Fault{FaultLate, FaultDelay, FaultJoin}, budget: 150},
		// FaultLateSetBackup aims at it (aimepoch.go): FaultLate, unaimed,
		// reached it in 0 of 200 schedules.
		{name: "set-backup ignores the epoch", rule: ownership.MutSetBackupIgnoresEpoch, faults: []Fault{FaultLateSetBackup}, tweak: lateSetBackupWindow, budget: 20},
		{name: "grant ignores last", rule: ownership.MutGrantIgnoresLast,
			beyond: "a second guard: the leader proposes a plain grant only when Last is not live, and Last never becomes live again; TestGrantWaitsForLast"},
		{name: "replica of any epoch", rule: ownership.MutReplicaAnyEpoch,
			beyond: "the simulator's replicas only add entries, by id, so a stale one is a duplicate; peer's refunds and resets, which a stale replica could undo, are not simulated; TestReplicaOfItsEpoch"},
		// 38 schedules before sessions' cadence of Liveness/2, 78 since
		// (with keep-alives every third of a Liveness; more without).
		// Since the heartbeat came from the lease (200 ms, an election
		// after 0.5-1 s) few schedules reach it: of the first 120 of
		// each, 1 of late copies (with oftener or without), 1 of late
		// proposals (without oftener only), none of delay, duplicate,
		// loss, join, leave or restart; the gate runs late copies alone.
		// Since keep-alive answers ride the leader's heartbeats among
		// three voters, 5 members' late copies caught it in 0 of the
		// first 150 schedules with oftener (3 without), 6 members' in 11
		// (the first at seed 14), 7 members' in 2.
		{name: "copy of any epoch", rule: ownership.MutCopyAnyEpoch, faults: []Fault{FaultLateCopy}, tweak: func(o *Options) { oftener(o); o.Members = 6 }, budget: 100},
		{name: "fence ignored", rule: ownership.MutFenceIgnored, faults: []Fault{FaultJoin, FaultLeave, FaultRaise, FaultBlip}},
		{name: "aged grant early", rule: ownership.MutAgedGrantEarly, faults: []Fault{FaultSplit, FaultLongSplit}},
		{name: "new leader counts nothing", rule: ownership.MutLeaderNoWait, faults: []Fault{FaultLeaderChange, FaultLeaderSplit, FaultLeaderPause}},
		{name: "new leader counts from its own contact", rule: ownership.MutLeaderOwnContact, faults: []Fault{FaultVoterCutCrash}, tweak: oftener, budget: 200},
		// FaultKeepAliveCut aims at it: the holder's keep-alives reach the
		// cut-off leader well into the cut (aimkeepalive.go).
		{name: "keep-alive unconfirmed", rule: ownership.MutKeepAliveUnconfirmed, faults: []Fault{FaultKeepAliveCut}, budget: 20},
		// FaultKeepAliveCut with five voters aims at it: a voter that
		// holds is cut off with the leader, its keep-alive riding a
		// heartbeat answer well into the cut (aimkeepalive.go).
		{name: "a carrier counts as a quorum", rule: ownership.MutCarrierIsQuorum, faults: []Fault{FaultKeepAliveCut},
			tweak: func(o *Options) { o.Voters, o.Members = 5, 6 }, budget: 20},
		// Three members, whose voters' keep-alives are the log's
		// heartbeats (ownlog's quiet.go): a muted leader hears the
		// voters' keep-alives while they no longer hear it, and counts
		// its own lease on from them; its successor ends it from the
		// voters' last hearing, a keep-alive interval earlier.
		{name: "quiet leader counts from a keep-alive", rule: ownership.MutQuietOwnFromKeepAlive,
			faults: []Fault{FaultMute, FaultLeaderSplit, FaultIsolate}, tweak: func(o *Options) { o.Members = 3 }, budget: 60},
		// FaultSelfRemoval aims at it: a leader elected with its own
		// removal in its log; with the rule broken it leads on, and the
		// holder crashed next is never ended (checkEnded).
		{name: "removed leader keeps leading", rule: ownership.MutRemovedLeaderLeads, faults: []Fault{FaultSelfRemoval}, budget: 10},
		// FaultEndingRace aims at it: a holder's keep-alive taken the
		// round trip its End is pending, and the End late to the holder;
		// caught at the first schedule, 35 of the first 40 do.
		{name: "keep-alive while ending", rule: ownership.MutKeepAliveWhileEnding, faults: []Fault{FaultEndingRace}, budget: 10},
		{name: "lease counted from the latest keep-alive", rule: ownership.MutLeaseFromLatestSend, faults: []Fault{FaultSlowCut}},
		// A liveness break, not a safety one: the member left without the
		// state counts a missing copy, which fails a schedule.
		{name: "restored forgets the takeover", rule: ownership.MutRestoredForgetsTakeover, faults: []Fault{FaultBehindBackup}},
		{name: "aged grant ignores the version", rule: ownership.MutAgedGrantIgnoresVersion,
			beyond: "a split must heal within the commit of an aged grant, EmptyAfter after it began, and even then no checker of the promise can see it: EmptyAfter outlasts every window Last's state counts in, so the state the grant drops no longer counts (split and long split with the rule broken, not aimed at the heal: aged grants in 54 of 60 schedules, 0 caught); the version is a second guard; TestAgedGrant"},
		{name: "a backup takes over on its gossip view", mut: MutGossipTakeover, faults: cut},
		{name: "a takeover starts empty", mut: MutTakeoverEmpty, faults: []Fault{FaultCrash, FaultRestart}},
		{name: "raised replication is not re-copied", mut: MutNoRecopy, faults: []Fault{FaultRaise}},
		// Caught after 5 schedules at a 100 ms heartbeat, 76 since the
		// heartbeat came from the lease (200 ms, an election after
		// 0.5-1 s): the loss that shows it lands less often on a grant.
		{name: "a grant is charged only during its lease", mut: MutGrantLeaseOnly, faults: []Fault{FaultLoss, FaultDelay}, spread: true, budget: 100,
			// Short leases: a use outlives its lease by most of a
			// window, which the broken rule stops charging.
			tweak: func(o *Options) { o.Lease = 300 * time.Millisecond }},
		// Leases as long as the window and a limit of 20: rights are
		// still in use (and many) when the crashed holder's successor
		// takes over.
		{name: "grants are not replicated", mut: MutGrantsNotReplicated, faults: []Fault{FaultCrash, FaultRestart}, spread: true,
			tweak: func(o *Options) { o.Lease, o.Limit = 5*time.Second, 20 }},
		{name: "a leaver goes on its gossip view", mut: MutLeaveOnGossip, faults: []Fault{FaultBackupLeave}},
		{name: "a failed async replica is forgotten", mut: MutAsyncForget, faults: []Fault{FaultBlip, FaultCrash, FaultLoss}},
		// A window long enough that the admissions made before the
		// policy was removed still count when the holder crashes.
		{name: "a policy added back is not a raise", mut: MutReaddNoRaise, faults: []Fault{FaultReadd},
			tweak: func(o *Options) { o.Window, o.Limit = 20*time.Second, 20 }},
		{name: "a member gossip gave up on is gone for good", mut: MutFailedIsGone, faults: []Fault{FaultLongSplit}},
		// A window longer than the restart takes, as
		// TestWholeRestartFromDisk: what the old incarnations admitted
		// still counts when the partitions decide again.
		{name: "heir ignored", rule: ownership.MutHeirIgnored, faults: []Fault{FaultWholeRestart},
			tweak: func(o *Options) { o.Window, o.Limit = 30*time.Second, 20 }},
	}
}

// oftener has members send a keep-alive every third of a Liveness, as
// before the cadence became Liveness/2: the rule's break shows only when
// the lease is renewed close to where it fails (the margin lost is a
// tenth of a Liveness), and 60 schedules no longer reached it at half.
func oftener(o *Options) { o.ExtendEvery = 2 * time.Second / 3 }

// atBound puts every clock at the stated rate bound (±4 %), fast or
// slow: a margin that is not there shows when a slow holder is cut off
// from a fast leader.
func atBound(o *Options) { o.RatesAtBound = true }

// TestCatalogueIsComplete: every mutation the machine and the data plane
// define is in the catalogue, once.
func TestCatalogueIsComplete(t *testing.T) {
	rules := map[ownership.Mutation]int{}
	muts := map[Mutation]int{}
	for _, c := range catalogue() {
		if (c.rule == ownership.MutNone) == (c.mut == MutNone) {
			t.Errorf("%s: breaks %v and %v: want exactly one", c.name, c.rule, c.mut)
		}
		if (c.beyond == "") == (len(c.faults) == 0) {
			t.Errorf("%s: want either faults to run or a reason it is beyond the simulator", c.name)
		}
		rules[c.rule]++
		muts[c.mut]++
	}
	for _, r := range ownership.Mutations() {
		if rules[r] != 1 {
			t.Errorf("machine mutation %q is in the catalogue %d times, want once", r, rules[r])
		}
	}
	for m := MutNone + 1; m < numMutations; m++ {
		if muts[m] != 1 {
			t.Errorf("data plane mutation %d is in the catalogue %d times, want once", m, muts[m])
		}
	}
}

// mutationBudget is how many schedules each mutation may take to be
// caught: RINGLIMIT_SIM_MUTATION_SEEDS, or 60.
func mutationBudget(t *testing.T) int {
	if v := os.Getenv("RINGLIMIT_SIM_MUTATION_SEEDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("RINGLIMIT_SIM_MUTATION_SEEDS=%q: want a positive count", v)
		}
		return n
	}
	return 60
}

// TestMutationsAreCaught is the simulator's own test (mutation testing):
// it breaks one rule at a time, every rule of the catalogue, and fails
// unless a checker of the promise (the windows, the overlap and loss
// oracles, a holding handed without its state) fails some schedule of
// the faults the rule is there for within the budget. A simulator that
// cannot see a broken rule proves nothing; the score (caught / tried)
// is logged. The race detector makes it take minutes and finds nothing
// here the plain run does not, so under -race it is skipped (as the
// allocation checks are) and .ci/run runs it whole without -race.
func TestMutationsAreCaught(t *testing.T) {
	if raceOn && os.Getenv("RINGLIMIT_SIM_MUTATION_SEEDS") == "" {
		t.Skip("the race detector slows the simulator tenfold: .ci/run runs this without -race")
	}
	budget := mutationBudget(t)
	cat := catalogue()
	caught, reach, schedules := 0, 0, 0
	for _, c := range cat {
		if c.beyond != "" {
			t.Logf("%s: beyond the simulator: %s", c.name, c.beyond)
			continue
		}
		reach++
		t.Run(c.name, func(t *testing.T) {
			tried, found := 0, false
			budget := budget
			if c.budget > budget && os.Getenv("RINGLIMIT_SIM_MUTATION_SEEDS") == "" {
				budget = c.budget
			}
			for seed := uint64(1); tried < budget && !found; seed++ {
				f := c.faults[int(seed)%len(c.faults)]
				o := options(seed)
				if c.spread {
					o = spreadOptions(seed)
				}
				o.Fault, o.NoFault, o.Rule, o.Mutation = f, false, c.rule, c.mut
				o.Window, o.Limit = 5*time.Second, 8
				if c.tweak != nil {
					c.tweak(&o)
				}
				r := run(t, o)
				tried++
				if r.Caught() {
					caught++
					why := ""
					switch {
					case len(r.Oracle) > 0:
						why = r.Oracle[0]
					case len(r.Report.Violations) > 0:
						why = r.Report.Violations[0].String()
					case len(r.Unended) > 0:
						why = "never ended: " + r.Unended[0]
					default:
						why = fmt.Sprintf("%d holdings handed without their state", r.Counters.MissingCopy)
					}
					t.Logf("caught after %d schedules (seed %d, %s): %s", tried, seed, f, why)
					found = true
				}
			}
			schedules += tried
			if !found {
				t.Errorf("no schedule of %v caught the broken rule (%d tried)", c.faults, tried)
			}
		})
	}
	t.Logf("mutation score: %d caught of %d in the simulator's reach (%d in the catalogue), in %d schedules", caught, reach, len(cat), schedules)
}

// TestRaftTraffic reports the ownership log's traffic at rest (no fault,
// every member keeping its liveness through keep-alives, which are raft
// messages but no commands) and through churn
// (a holder restarted as a new incarnation: an End, takeovers, a new raft
// member caught up from a snapshot, moves back) for 3, 16 and 64 members,
// per second of virtual time.
func TestRaftTraffic(t *testing.T) {
	sizes := []int{3, 16, 64}
	if raceOn && os.Getenv("RINGLIMIT_SIM_SEEDS") == "" {
		sizes = sizes[:1] // the race detector makes 64 members take minutes
	}
	for _, n := range sizes {
		for _, f := range []Fault{FaultNone, FaultRestart} {
			o := Options{Seed: 1, NoFault: f == FaultNone, Fault: f, Members: n, Partitions: max(8, n), Duration: 10 * time.Second}
			r := run(t, o)
			secs := (o.Duration + 7*time.Second).Seconds() // warm-up and drain included
			what := "at rest"
			if f != FaultNone {
				what = "with a holder restarted"
			}
			t.Logf("members=%d %s: %.1f commands/s, %.0f raft bytes/s (%d ops checked)", n, what, float64(r.Commands)/secs, float64(r.RaftBytes)/secs, len(r.Ops))
			if r.Failed() {
				t.Errorf("members=%d: %s", n, r)
			}
			// The founding's joins, activations, grants and moves only:
			// about 5 commands a member over the run, none at rest.
			if perMember := float64(r.Commands) / secs / float64(n); f == FaultNone && perMember > 0.6 {
				t.Errorf("members=%d: %.2f commands/s per member over the run, want under 0.6 (no command at rest)", n, perMember)
			}
		}
	}
}

// TestDoubleFaults crashes a holder and its backup together, outside the
// promise: the partitions they held wait for their last holder, which
// never comes back, and are restarted empty once they have waited
// EmptyAfter (an aged grant: nothing they admitted still counts). The
// simulator must count every restart, and a window over the limit may
// only ever follow a counted loss.
func TestDoubleFaults(t *testing.T) {
	n, lost, over, _ := runDoubleFault(t, FaultDouble)
	t.Logf("%d double crashes: %d restarted a partition (aged or lost, counted), %d of them then admitted more than the limit in a window", n, lost, over)
	if lost == 0 {
		t.Errorf("no double crash restarted a partition: the fault did not hit a holder and its backup")
	}
}

// TestSplitRestart cuts a holder and its backup off in a 2 | 3 split and
// restarts the holder as a new incarnation inside it: two faults. A
// partition whose vacancy remembers the restarted holder loses its state
// (the backup's copy is not remembered); every such loss must be counted.
func TestSplitRestart(t *testing.T) {
	n, lost, over, _ := runDoubleFault(t, FaultSplitRestart)
	t.Logf("%d splits with the holder restarted inside: %d restarted a partition (counted), %d of them then admitted more than the limit in a window", n, lost, over)
}

// TestLeaveWhileBackupPauses leaves a holder gracefully while its backup
// pauses (up to 40 s): two faults at once, outside the promise. The
// leaver's drain cannot copy to a paused member, so it may stop at its
// close deadline still holding; when the pause outlasts the backup's
// liveness, the log ends the backup too and the partition restarts
// empty. Every such loss must be counted, as for TestDoubleFaults.
func TestLeaveWhileBackupPauses(t *testing.T) {
	n, lost, over, worst := runDoubleFault(t, FaultLeavePause)
	t.Logf("%d leaves while the backup paused: %d lost a partition's state (counted, restarted empty), %d of them then admitted more than the limit in a window; longest unavailability %v", n, lost, over, worst)
}

// TestLeaverPausesWhileDraining leaves a holder gracefully and pauses it
// for 1-3 s while it drains: one fault, inside the promise. Its leave
// must finish once it runs again (its close deadline waits out the
// pause): a leaver the log removed as a silent voter and never sent to
// again sees none of its moves commit, and stops at its deadline still
// holding partitions.
func TestLeaverPausesWhileDraining(t *testing.T) {
	runLeave(t, FaultLeaverPause, 0, 0)
}

// runLeave runs a tenth of the seeds (at least 6) with the leave fault f
// (window and limit set when not zero) and fails t for a broken promise,
// lost state or a leave stopped at its deadline still holding partitions.
func runLeave(t *testing.T, f Fault, window time.Duration, limit int64) {
	t.Helper()
	n := max(seeds(t)/10, 6)
	for seed := uint64(1); seed <= uint64(n); seed++ {
		o := options(seed)
		o.Fault, o.NoFault = f, false
		if window > 0 {
			o.Window, o.Limit = window, limit
		}
		r := run(t, o)
		if testing.Verbose() {
			t.Log(r)
		}
		if r.Failed() || r.Lost > 0 {
			t.Errorf("promise broken or state lost:\n%s", r)
		}
		if r.Stalled > 0 {
			t.Errorf("the leave stopped at its close deadline still holding partitions:\n%s", r)
		}
	}
}

// runDoubleFault runs a tenth of the seeds (at least 6) with the double
// fault f and counts the runs that lost a partition's state and those
// that went over the limit in a window, failing t for a window over the
// limit without a counted loss and for a holding handed without its
// state. worst is the longest unavailability.
func runDoubleFault(t *testing.T, f Fault) (n, lost, over int, worst time.Duration) {
	t.Helper()
	n = max(seeds(t)/10, 6)
	for seed := uint64(1); seed <= uint64(n); seed++ {
		o := options(seed)
		o.Fault, o.NoFault = f, false
		o.Window, o.Limit = 5*time.Second, 8
		r := run(t, o)
		if r.Lost > 0 || r.Aged > 0 {
			lost++
		}
		if len(r.Report.Violations) > 0 {
			over++
			if r.Lost == 0 {
				t.Errorf("a window over the limit without a counted loss:\n%s", r)
			}
		}
		if len(r.Oracle) > 0 {
			t.Errorf("an oracle failed the run:\n%s", r)
		}
		if r.Counters.MissingCopy > 0 {
			t.Errorf("a holding handed without its state:\n%s", r)
		}
		if r.Misstood > 0 {
			t.Errorf("Machine.Standings disagreed with the machine's own answers:\n%s", r)
		}
		worst = max(worst, r.Unavailable)
	}
	return n, lost, over, worst
}

// TestBackupLeavesAsHolderRestarts: the first key's backup leaves
// gracefully at the instant its holder crashes and restarts as a new
// incarnation, and the leaver's gossip hears nobody for 2-8 s (its log
// still works). The leaver has the only copy of the holder's state: it
// must keep it until the log hands it the partition and it has moved it
// on, whatever its view says. Nothing may be lost, nor any window go
// over the limit, nor the leave stall at its deadline.
func TestBackupLeavesAsHolderRestarts(t *testing.T) {
	runLeave(t, FaultBackupLeave, 5*time.Second, 8)
}

// TestQuietSchedules is TestSchedules at three members, whose voters'
// keep-alives are the log's heartbeats (ownlog's quiet.go): every fault
// kind against the quiet sessions' rules, but FaultLeaderChange (a
// holder's crash, then the leader's: of three, one is left). RINGLIMIT_SIM_QUIET_SEEDS
// sets how many (a fifth of TestSchedules' unless set).
func TestQuietSchedules(t *testing.T) {
	n := max(seeds(t)/5, 1)
	if v := os.Getenv("RINGLIMIT_SIM_QUIET_SEEDS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("RINGLIMIT_SIM_QUIET_SEEDS=%q: want a positive count", v)
		}
	}
	schedules(t, n, 3)
}
