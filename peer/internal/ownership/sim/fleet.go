package sim

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/history"
	"github.com/ringlimit/ringlimit/peer/internal/ownership"
	"github.com/ringlimit/ringlimit/peer/internal/ownlog"
)

// This file is the fleet run: hundreds to thousands of members, no fault
// drawn, but the events a fleet lives through, one phase after another,
// each measured (traffic.go) and timed until the cluster settles:
//
//   - founding: the members start and the log grants every partition;
//   - at rest: nothing happens for FleetOptions.Rest;
//   - churn: a share of the members (FleetOptions.Churn) crash at once and
//     each starts again as a new incarnation 1-3 s later;
//   - rolling deploy: every member, in waves of FleetOptions.Wave of them,
//     leaves gracefully (the machine's drain: its partitions move, then it
//     ends its liveness and stops) and starts again 1 s later as a new
//     incarnation; a wave begins once the previous one settled, as a
//     deploy that waits for readiness does.
//
// Settled means: the log has a leader and the voters autopilot wants,
// all of them running; every running member has joined it and none is
// leaving; and every partition has exactly one member that may decide
// for it, the one gossip's placement targets, with a backup that has its
// state. A wave waits for it, as a deploy that gates on the cluster's
// health would: one that began while the log still counted stopped
// voters (autopilot replaces them one configuration change at a time,
// after adding every joiner as a learner) could stop a majority of them. Clients run throughout, and the whole history is checked as
// Run's is (windows, oracles, holdings handed without their state).

// FleetOptions configure a fleet run. Zero fields take the defaults in
// brackets.
type FleetOptions struct {
	Seed       uint64
	Members    int           // [256]
	Partitions int           // [max(8, Members)]
	Rest       time.Duration // [10 s] the at-rest phase
	Churn      float64       // [0.10] share of members crashed and restarted
	Wave       float64       // [0.25] share of members per rolling-deploy wave
	// Settle bounds each phase's wait for the cluster to settle [60 s];
	// a phase that does not settle in it is reported unsettled and the
	// run goes on.
	Settle  time.Duration
	Keys    int // [32]
	Clients int // [16]
	// CheckEvery spaces each member's checks of its machine's own
	// consistency (Result.Misstood): after every output up to 64
	// members, at most every 100 ms of virtual time beyond, where
	// checking every output costs members × partitions per message.
	CheckEvery time.Duration
	// Liveness is the machine's liveness period [2 s].
	Liveness time.Duration
	// Voters is the log's voter count [ownlog.VotersFor(Members): 5].
	Voters int
	// Heartbeat and Election replace raft's timing (Options.Heartbeat).
	Heartbeat, Election time.Duration
	// NoQuiet keeps raft's heartbeats among three voters (Options.NoQuiet).
	NoQuiet bool
	// RestOnly ends the run after the at-rest phase.
	RestOnly bool
	// Progress, when set, is told each phase's end as it comes (a run
	// of 1 024 members takes many minutes).
	Progress func(phase string, virtual, wall time.Duration)
}

func (f *FleetOptions) defaults() {
	if f.Members == 0 {
		f.Members = 256
	}
	if f.Partitions == 0 {
		f.Partitions = max(8, f.Members)
	}
	if f.Rest == 0 {
		f.Rest = 10 * time.Second
	}
	if f.Churn == 0 {
		f.Churn = 0.10
	}
	if f.Wave == 0 {
		f.Wave = 0.25
	}
	if f.Settle == 0 {
		f.Settle = 60 * time.Second
	}
	if f.Keys == 0 {
		f.Keys = 32
	}
	if f.Clients == 0 {
		f.Clients = 16
	}
	if f.Voters == 0 {
		f.Voters = ownlog.VotersFor(f.Members)
	}
	if f.Liveness == 0 {
		f.Liveness = 2 * time.Second
	}
	if f.CheckEvery == 0 && f.Members > 64 {
		f.CheckEvery = 100 * time.Millisecond
	}
}

// Phase is one phase of a fleet run.
type Phase struct {
	Name string
	// Traffic is the network's use over the phase: from its start until
	// it settled (at rest: over Rest).
	Traffic Traffic
	// Settle is how long the cluster took to settle from the phase's
	// start (the founding: from the start; a rolling deploy: the whole
	// deploy's, each wave's in Waves); negative when it (or a wave) did
	// not within FleetOptions.Settle.
	Settle time.Duration
	Waves  []time.Duration
	// Unavailable is the longest stretch of one key's consecutive
	// unavailable or unknown answers, among calls made in the phase.
	Unavailable time.Duration
}

// FleetResult is a fleet run's phases and the whole run's check.
type FleetResult struct {
	Options FleetOptions
	Phases  []Phase
	Result  Result
	// Wall is how long the run took on the machine that ran it.
	Wall time.Duration
}

// Failed reports whether the run broke the promise or an invariant, lost
// state, left a phase unsettled, or left a key unavailable for longer
// than the bound at a time (Unavailable beyond 2 × Liveness: a
// crashed holder's keys come back within a Liveness and a commit).
func (r FleetResult) Failed() bool {
	if r.Result.Failed() || r.Result.Lost > 0 || r.Result.Stalled > 0 {
		return true
	}
	for _, p := range r.Phases {
		if p.Settle < 0 || p.Unavailable > 2*r.Options.Liveness {
			return true
		}
	}
	return false
}

// String tells the run: a line per phase, then the check.
func (r FleetResult) String() string {
	var b strings.Builder
	o := r.Options
	fmt.Fprintf(&b, "fleet of %d members, %d partitions, seed %d (%v of wall time):\n", o.Members, o.Partitions, o.Seed, r.Wall.Round(time.Millisecond))
	for _, p := range r.Phases {
		fmt.Fprintf(&b, "  %-14s %5.1fs, settled in %v", p.Name, p.Traffic.Seconds, settle(p.Settle))
		if len(p.Waves) > 0 {
			ws := make([]string, len(p.Waves))
			for i, w := range p.Waves {
				ws[i] = settle(w)
			}
			fmt.Fprintf(&b, " (waves %s)", strings.Join(ws, ", "))
		}
		over := ""
		if p.Unavailable > 2*o.Liveness {
			over = fmt.Sprintf(" (OVER the bound of 2 × Liveness, %v)", 2*o.Liveness)
		}
		fmt.Fprintf(&b, ", longest unavailable %v%s\n    %s\n    raft: %s\n", p.Unavailable.Round(time.Millisecond), over, p.Traffic.Rates(), p.Traffic.RaftMix())
	}
	res := r.Result
	fmt.Fprintf(&b, "  %d ops (%d admitted), %d windows over the limit, %d holdings without their state, %d oracle findings, lost %d, misstood %d, stalled leaves %d\n",
		res.Report.Ops, res.Report.Admitted, len(res.Report.Violations), res.Counters.MissingCopy, len(res.Oracle), res.Lost, res.Misstood, res.Stalled)
	for _, v := range res.Report.Violations {
		fmt.Fprintf(&b, "  VIOLATION %s\n", v)
	}
	for _, v := range res.Oracle {
		fmt.Fprintf(&b, "  ORACLE %s\n", v)
	}
	return b.String()
}

func settle(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.Round(time.Millisecond).String()
}

// RunFleet runs a fleet's phases and checks its history.
func RunFleet(f FleetOptions) FleetResult {
	start := time.Now()
	f.defaults()
	o := Options{Seed: f.Seed, NoFault: true, Members: f.Members, Partitions: f.Partitions, Keys: f.Keys, Clients: f.Clients, Liveness: f.Liveness, Voters: f.Voters, Heartbeat: f.Heartbeat, Election: f.Election, NoQuiet: f.NoQuiet,
		Duration: time.Hour} // the phases set the end
	o.defaults()
	s := newSim(o)
	s.checkEvery = int64(f.CheckEvery)
	s.fleet = &fleet{s: s, o: f, start: start}
	s.run()
	r := FleetResult{Options: f, Phases: s.fleet.phases}
	r.Result = s.result()
	for i := range r.Phases {
		p := &r.Phases[i]
		p.Unavailable = s.gapIn(s.fleet.spans[i][0], s.fleet.spans[i][1])
	}
	r.Wall = time.Since(start)
	return r
}

// fleet is a fleet run's plan and what it measured.
type fleet struct {
	s      *sim
	o      FleetOptions
	start  time.Time // wall time at the run's start
	phases []Phase
	spans  [][2]int64 // each phase's start and end (virtual ns)
}

// settleEvery is how often a phase that waits to settle looks.
const settleEvery = 100 * time.Millisecond

// plan runs the phases one after the other; the founding is timed from
// the start, and the rest begins once the warm-up is over (the clients
// run).
func (f *fleet) plan(warm int64) {
	s := f.s
	f.waitSettled(0, func(d int64) {
		f.done("founding", snapshot{}, d)
		s.at(max(0, warm-s.now), f.rest)
	})
}

// rest measures Rest of nothing happening, then churns.
func (f *fleet) rest() {
	s := f.s
	a := s.snap()
	s.at(int64(f.o.Rest), func() {
		f.done("at rest", a, 0)
		if f.o.RestOnly {
			f.finish()
			return
		}
		f.churn()
	})
}

// churn crashes a share of the members at once; each starts again as a
// new incarnation 1-3 s later. The crashed are drawn at random but so
// that each is a single fault the promise covers: no partition loses
// both its holder and its backup (two faults, TestDoubleFaults'
// business), and the log keeps a majority of its voters.
func (f *fleet) churn() {
	s := f.s
	a := s.snap()
	ids := s.sortedIDs()
	n := int(math.Ceil(f.o.Churn * float64(len(ids))))
	var t *ownership.Table
	for _, id := range ids {
		if m := s.members[id]; m.log.Leader() {
			t = m.own.Table()
		}
	}
	if t == nil {
		t = s.members[ids[0]].own.Table()
	}
	hit := map[string]bool{}
	voters, maxVoters := 0, (f.o.Voters-1)/2
	var victims []*member
	for _, i := range s.rng.Perm(len(ids)) {
		if len(victims) == n {
			break
		}
		m := s.members[ids[i]]
		if m.log.Voter() && voters == maxVoters {
			continue
		}
		double := false
		for _, pt := range t.Parts {
			if pt.Holder == m.id && hit[pt.Backup] || pt.Backup == m.id && hit[pt.Holder] {
				double = true
				break
			}
		}
		if double {
			continue
		}
		if m.log.Voter() {
			voters++
		}
		hit[m.id] = true
		victims = append(victims, m)
	}
	s.note("churn: crash %d members (%d voters), each restarting 1-3s later", len(victims), voters)
	left := len(victims)
	settled := func() {
		f.waitSettled(a.at, func(d int64) {
			f.done(fmt.Sprintf("churn %.0f %%", 100*f.o.Churn), a, d)
			f.deploy()
		})
	}
	if left == 0 {
		settled()
		return
	}
	for _, v := range victims {
		s.crash(v, false)
		s.at(int64(time.Second)+s.rng.Int64N(int64(2*time.Second)), func() {
			s.start(v.name, v.inc+1, s.newRaftID(), nil)
			s.gone = append(s.gone, v.id) // a later incarnation runs
			if left--; left == 0 {
				settled()
			}
		})
	}
}

// deploy restarts every member gracefully, a wave at a time.
func (f *fleet) deploy() {
	s := f.s
	a := s.snap()
	ids := s.sortedIDs()
	var names []string
	for _, i := range s.rng.Perm(len(ids)) {
		names = append(names, s.members[ids[i]].name)
	}
	per := max(1, int(math.Ceil(f.o.Wave*float64(len(names)))))
	var waves []time.Duration
	var wave func(from int)
	wave = func(from int) {
		if from >= len(names) {
			took := s.now - a.at
			if slices.Contains(waves, -1) {
				took = -1
			}
			f.done("rolling deploy", a, took)
			f.phases[len(f.phases)-1].Waves = waves
			f.finish()
			return
		}
		w := names[from:min(from+per, len(names))]
		s.note("deploy wave: %d members leave gracefully and restart; voters %v", len(w), s.voters())
		start := s.now
		left := len(w)
		for _, name := range w {
			m := s.running(name)
			if m == nil {
				left--
				continue
			}
			m.leaving = true
			m.leaveLog = func() { f.leaveLog(m) }
			s.drain(m, s.now)
			f.whenStopped(m, func() {
				s.at(int64(time.Second), func() {
					s.start(m.name, m.inc+1, s.newRaftID(), nil)
					if left--; left == 0 {
						f.waitSettled(start, func(d int64) {
							waves = append(waves, time.Duration(d))
							wave(from + len(w))
						})
					}
				})
			})
		}
		if left == 0 {
			wave(from + len(w))
		}
	}
	wave(0)
}

// leaveLog is peer's leave once its drain may go (logleave.go's
// leaveLog): it hands on the log's leadership, ends its liveness
// (proposing the End again every four ticks, as peer's Runner.Leave
// does) and waits within four Livenesses until its log applied that,
// then within four more until its log no longer lists it as a voter
// (peer's awaitRemoved), and stops. A voter that stopped at once took
// its vote with it: a wave that held every voter left the log without a
// majority for good.
func (f *fleet) leaveLog(m *member) {
	s := f.s
	if m.log.TransferLeadership() {
		s.note("%s hands on the log's leadership", m.id)
	}
	m.carry(m.log.Leave(m.mono()))
	limit := int64(4 * f.o.Liveness)
	start, proposed, endedAt := s.now, s.now, int64(-1)
	var wait func()
	wait = func() {
		if m.crashed {
			return
		}
		if rec := m.own.Table().Members[m.id]; endedAt < 0 && (rec == nil || rec.Ended) {
			endedAt = s.now
		}
		have, _ := m.log.Voters(0)
		switch {
		case endedAt < 0 && s.now-start < limit:
			if s.now-proposed >= int64(4*tick) {
				proposed = s.now
				m.carry(m.log.Leave(m.mono()))
			}
		case endedAt >= 0 && m.log.Voter() && have > 1 && s.now-endedAt < limit:
		default:
			switch {
			case endedAt < 0:
				s.note("%s stops, its End not applied", m.id)
			case m.log.Voter() && have > 1:
				s.note("%s stops, still a voter in its log", m.id)
			default:
				s.note("%s stops", m.id)
			}
			s.crash(m, true)
			return
		}
		s.at(int64(20*time.Millisecond), func() { s.deliver(m, wait) })
	}
	s.at(int64(20*time.Millisecond), func() { s.deliver(m, wait) })
}

// finish lets the run observe the last phase's aftermath, then ends it.
func (f *fleet) finish() {
	s := f.s
	s.end = s.now + int64(3*time.Second)
}

// whenStopped calls fn once m stopped (its drain crashed it).
func (f *fleet) whenStopped(m *member, fn func()) {
	s := f.s
	if m.crashed {
		fn()
		return
	}
	s.at(int64(50*time.Millisecond), func() { f.whenStopped(m, fn) })
}

// waitSettled calls fn with the time from since until the cluster
// settled, or -1 once Settle passed without it.
func (f *fleet) waitSettled(since int64, fn func(d int64)) {
	s := f.s
	why := s.unsettled()
	if why == "" {
		fn(s.now - since)
		return
	}
	if (s.now-since)%int64(time.Second) < int64(settleEvery) {
		s.note("not settled yet: %s", why)
	}
	if s.now-since > int64(f.o.Settle) {
		s.note("not settled after %v: %s", f.o.Settle, why)
		fn(-1)
		return
	}
	s.at(int64(settleEvery), func() { f.waitSettled(since, fn) })
}

// done records a phase from snapshot a to now.
func (f *fleet) done(name string, a snapshot, settle int64) {
	s := f.s
	s.note("%s done", name)
	f.phases = append(f.phases, Phase{Name: name, Traffic: s.since(a), Settle: time.Duration(settle)})
	f.spans = append(f.spans, [2]int64{a.at, s.now})
	if f.o.Progress != nil {
		f.o.Progress(name, time.Duration(s.now), time.Since(f.start))
	}
}

// voters lists the running members that vote in the log, the leader
// marked.
func (s *sim) voters() []string {
	var v []string
	for _, id := range s.sortedIDs() {
		m := s.members[id]
		switch {
		case m.log.Leader():
			v = append(v, id+"*")
		case m.log.Voter():
			v = append(v, id)
		}
	}
	return v
}

// running returns the running incarnation of name (nil: none).
func (s *sim) running(name string) *member {
	for _, id := range s.sortedIDs() {
		if m := s.members[id]; m.name == name && !m.crashed {
			return m
		}
	}
	return nil
}

// unsettled says why the cluster has not settled ("": it has): the log
// has a leader and the voters autopilot wants, every running member has
// joined it and none is leaving, and every
// partition has exactly one member that may decide for it, at gossip's
// target, with a backup that has its state.
func (s *sim) unsettled() string {
	var lead *member
	var view []string
	for _, id := range s.sortedIDs() {
		m := s.members[id]
		if m.leaving || m.paused > s.now {
			return id + " is leaving or paused"
		}
		if m.log.Leader() {
			lead = m
		}
		view = append(view, id)
	}
	if lead == nil {
		return "no member leads the log"
	}
	// Voters as the leader's configuration counts them (a stopped one
	// too, until autopilot removes it) and as the running members do.
	voting := 0
	for _, id := range view {
		if s.members[id].log.Voter() {
			voting++
		}
	}
	if have, want := lead.log.Voters(len(view)); have != want || voting != want {
		return fmt.Sprintf("the log has %d voters, %d of them running; autopilot wants %d", have, voting, want)
	}
	t := lead.own.Table()
	for _, id := range view {
		if _, ok := t.Live(id); !ok {
			return id + " has no live record in the leader's table"
		}
	}
	holder := make([]*member, s.o.Partitions)
	for _, id := range view {
		m := s.members[id]
		for _, p := range m.candidates() {
			if m.mayDecide(p) {
				if holder[p] != nil {
					return fmt.Sprintf("p%d: %s and %s may both decide", p, holder[p].id, id)
				}
				holder[p] = m
			}
		}
	}
	target, _ := s.pl.place(view)
	for p, h := range holder {
		pt := t.Parts[p]
		switch {
		case h == nil:
			return fmt.Sprintf("p%d: no member may decide (the leader's table: holder %q, backup %q, last %q)", p, pt.Holder, pt.Backup, pt.Last)
		case h.id != target[p]:
			return fmt.Sprintf("p%d: %s decides, gossip targets %s", p, h.id, target[p])
		}
		b := s.members[h.own.Table().Parts[p].Backup]
		if b == nil || !b.own.Has(p) {
			return fmt.Sprintf("p%d: backup %q lacks the state", p, h.own.Table().Parts[p].Backup)
		}
	}
	return ""
}

// candidates are the partitions m may decide for: those its table named
// it holder of after its last output, or every one under
// MutGossipTakeover (a backup decides too).
func (m *member) candidates() []int {
	if m.s.o.Mutation == MutGossipTakeover {
		if len(m.s.allParts) != m.s.o.Partitions {
			m.s.allParts = make([]int, m.s.o.Partitions)
			for p := range m.s.allParts {
				m.s.allParts[p] = p
			}
		}
		return m.s.allParts
	}
	return m.holding
}

// checkDue reports whether m's machine's consistency is to be checked
// after this output (sim.checkEvery).
func (m *member) checkDue() bool {
	s := m.s
	if s.checkEvery == 0 {
		return true
	}
	if s.now < m.checkAt {
		return false
	}
	m.checkAt = s.now + s.checkEvery
	return true
}

// gapIn is longestGap over the operations called in [from, to].
func (s *sim) gapIn(from, to int64) time.Duration {
	var worst int64
	since := map[string]int64{}
	for _, o := range s.ops {
		if o.Call < from || o.Call > to {
			continue
		}
		switch o.Outcome {
		case history.Unavailable, history.Unknown:
			if _, ok := since[o.Key]; !ok {
				since[o.Key] = o.Call
			}
		default:
			if t, ok := since[o.Key]; ok {
				worst = max(worst, o.Call-t)
				delete(since, o.Key)
			}
		}
	}
	for _, t := range since {
		worst = max(worst, to-t)
	}
	return time.Duration(worst)
}
