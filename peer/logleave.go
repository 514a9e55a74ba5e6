package peer

// Leaving the ownership log: a member closing gracefully drains (its
// holdings and backups move off it), then hands on its vote and ends its
// liveness for good, so that the log keeps a majority without it.

import (
	"context"
	"errors"
	"fmt"
	"github.com/ringlimit/ringlimit/peer/internal/ownlog"
	"log/slog"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/ownership"
	"github.com/ringlimit/ringlimit/peer/internal/partition"
)

// drain lets the machine move every partition this node holds: the node
// is already out of its own ring, so every target is another member. It
// waits until the machine says the member may end its liveness
// (ownership.Machine.MayLeave: nothing depends on it, or only backups of
// holders that showed they are alive), the whole cluster is stopping, or
// ctx ends.
func (lo *logOwner) drain(ctx context.Context) error {
	e := lo.env
	e.leaveRing(ctx)
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	// How long, once it holds nothing, the member waits for its holders
	// to move their backups off it before it leaves anyway.
	d := ownership.Drain{Since: e.mono(), BackupWait: max(10*e.lease, 5*time.Second)}
	// The wait for holders to move their backups off ends a reserve
	// before ctx's deadline, so that the leave itself (vote, liveness)
	// has time of its own: when it ended with ctx, the member went a
	// voter with its liveness running, and the log counted a vote that
	// was gone until autopilot found it silent. The reserve is half of
	// what is left, at most the four leases a leave may take (a third, at
	// most two, was too little for a loaded log to hand on leadership and
	// apply the End). A partition still held then keeps the drain waiting
	// until ctx ends, as before.
	var backupsDone <-chan struct{} // nil (never) without a deadline
	if dl, ok := ctx.Deadline(); ok {
		reserve := min(time.Until(dl)/2, 4*e.lease)
		bctx, bcancel := context.WithDeadline(ctx, dl.Add(-reserve))
		defer bcancel()
		backupsDone = bctx.Done()
	}
	aloneSaid := false
	for {
		v := e.view.Load()
		d.Alive = len(v.alive)
		if v.stopping && d.Alive > 1 {
			// Every other member gossip lists is leaving too: the whole
			// cluster is stopping.
			return nil
		}
		// What depends on this member is the machine's rule: a vacancy
		// kept for its state counts as held (the log grants it back,
		// then it moves on), and a copy a holder may yet commit it
		// backup with counts as backed. Gossip alone (a cut, or a view
		// that lost every member while the log answered late) is no
		// reason to leave: this member may have the only copy.
		actx, acancel := context.WithTimeout(ctx, time.Second)
		verdict, parts, backs, ok := lo.run.MayLeave(actx, d)
		acancel()
		if ok && verdict != ownership.Stay {
			if d.Alive <= 1 {
				// Alone as gossip sees it. A voter still hands on its
				// vote while the log has a leader: a voter that left
				// without a word while another voter is dead leaves the
				// log without a majority. The log may be electing one
				// (its leader has just crashed, say): wait for one,
				// within two leases.
				voter := lo.run.Voter() && lo.run.Voters() > 1
				e.log.Info("leaving while gossip reaches no other member", "voter", voter, "voters", lo.run.Voters(), "leader", lo.run.Lead() != 0)
				if voter && !lo.awaitLeader(ctx, 2*e.lease) {
					return nil
				}
			}
			if verdict == ownership.GoBacking {
				// Holders that cannot copy elsewhere (their copies fail)
				// would keep a Close without a deadline waiting for good.
				// Ending this member's liveness makes them pick another
				// backup; until one has a copy their synchronous policies
				// are unavailable.
				e.log.Warn("left while still the backup of partitions: their holders copy them elsewhere now that this member's liveness ends", "partitions", backs, "waited", time.Duration(e.mono()-d.Since).Round(time.Millisecond))
			}
			// Leadership goes first (the log then has a leader again in
			// a round trip, not an election timeout), then its liveness,
			// for good, so that nobody waits for it to expire.
			return lo.leaveLog(ctx)
		}
		if since := lo.run.Leaderless(); since != 0 && e.mono()-since > int64(noLeaderGiveUp(e.lease)) && !lo.electing(ctx) {
			// Nothing moves without a leader: no copy commits, no
			// liveness ends. Waiting out the close deadline only made
			// Close slow (11 s) and its error long (issue 53 item 14).
			// But only a log that reaches no majority of its voters
			// never elects one: see electing.
			parts, _ = lo.depends()
			_, keys := heldPartitions(e.parts)
			return fmt.Errorf("%w: the ownership log has no leader (%v); %d partitions (%d keys) move once this member's liveness lapses",
				errNoLeader, time.Duration(e.mono()-since).Round(100*time.Millisecond), parts, keys)
		}
		if d.Alive <= 1 && !aloneSaid && ok {
			aloneSaid = true
			e.log.Warn("leaving while gossip reaches no other member, with partitions that depend on this member: waiting for gossip or the close deadline",
				"held", parts, "backed", backs)
		}
		select {
		case <-t.C:
		case <-backupsDone:
			backupsDone = nil
			if held, backs := lo.depends(); held == 0 && ctx.Err() == nil {
				e.log.Warn("left while still the backup of partitions, at the close deadline's reserve: their holders copy them elsewhere now that this member's liveness ends", "partitions", backs)
				return lo.leaveLog(ctx)
			}
		case <-ctx.Done():
			// The counts from the published states: the machine's answer
			// may not have come (ctx ended while it was asked).
			parts, backs = lo.depends()
			_, keys := heldPartitions(e.parts)
			if parts == 0 {
				e.log.Warn("left while still the backup of partitions: their holders copy them elsewhere once this member's liveness ends", "partitions", backs)
				return nil
			}
			return fmt.Errorf("peer: %d partitions (%d keys) still held at the close deadline (%s): %w", parts, keys, lo.explainHeld(3), ctx.Err())
		}
	}
}

// noLeaderGiveUp is how long a drain waits for the ownership log to have
// a leader before it gives up, unless the log is electing one (electing):
// three election timeouts (ownlog.Timing: at a 2 s lease an election
// after 0.5 to 1 s without a leader, so 1.5 s), so a log whose leader
// crashed elects another first on an idle machine, while one without a
// majority of voters never does. It is also how recently the voters must
// have been heard from to count as electing.
func noLeaderGiveUp(lease time.Duration) time.Duration {
	_, election := ownlog.Timing(lease, logTick)
	return 3 * time.Duration(election) * logTick
}

// electing reports whether the ownership log, leaderless, may still elect
// a leader: within the last noLeaderGiveUp this member heard from a
// majority of its voters (itself among them when it is one), or its
// runner did not answer within a second (a starved runner proves nothing
// about the voters). Such a log is electing, however long a loaded
// machine makes that take: votes split, candidates time out again. A
// drain that gave up on it after three election timeouts went with the
// partitions it held, the only copy of one among them, and, a voter,
// with its vote: with another of three voters crashed, the log never had
// a leader again (TestAloneLeaverKeepsTheOnlyCopy at a load of 7 to 13 on
// two cores, its election over 3 s; TestLeaverWaitsForElection).
func (lo *logOwner) electing(ctx context.Context) bool {
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	reach, ok := lo.run.ReachesMajority(rctx, noLeaderGiveUp(lo.env.lease))
	return reach || !ok
}

// errNoLeader ends a drain whose log has no leader.
var errNoLeader = errors.New("peer: left without a graceful drain")

// depends counts the partitions that depend on this member, held and
// backed (Machine.DependsOn), as the runner last published them:
// lock-free, whether or not the runner answers now.
func (lo *logOwner) depends() (held, backed int) {
	for p := range lo.env.parts {
		st := lo.run.Part(p)
		if st.Held {
			held++
		}
		if st.Backed {
			backed++
		}
	}
	return held, backed
}

// leaveLog hands on leadership, ends this member's liveness for good
// and waits, within four leases, until the log no longer counts its vote
// (when another voter is down, autopilot removes that one first: a few
// configuration changes, each a commit).
//
// The end of its liveness must be applied before the member goes. When
// this step had one second in all, a loaded log could let it go with its
// leave unapplied: still live in the table, the last voter of a two-member
// log granted itself the partitions of the other, whose liveness had
// lapsed for a moment, and went with them and the log's only vote. Close
// then says so instead of returning nil.
func (lo *logOwner) leaveLog(ctx context.Context) error {
	return leaveLog(ctx, lo.run, lo.env.lease, lo.env.log)
}

// logLeaver is what leaving asks of this member's side of the ownership
// log (*ownlog.Runner).
type logLeaver interface {
	TransferLeadership(ctx context.Context)
	Leave(ctx context.Context) bool
	Voter() bool
	Voters() int
	OthersFresh(ctx context.Context) bool
	Describe(ctx context.Context) string
}

// leaveLog is logOwner.leaveLog over r, with lease the liveness lease.
func leaveLog(ctx context.Context, r logLeaver, lease time.Duration, log *slog.Logger) error {
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	r.TransferLeadership(tctx)
	cancel()
	wait := 4 * lease
	lctx, lcancel := context.WithTimeout(ctx, wait)
	left := r.Leave(lctx)
	lcancel()
	if !left {
		return fmt.Errorf("peer: the ownership log did not apply this member's leave within %v (no majority, or the close deadline): its partitions move once its liveness expires", wait)
	}
	if !awaitRemoved(ctx, r, wait) {
		dctx, dcancel := context.WithTimeout(context.Background(), time.Second)
		defer dcancel()
		log.Warn("left while still a voter of the ownership log: if another voter is down too, the log has no majority until it is back",
			"voters", r.Voters(), "log", r.Describe(dctx))
	}
	return nil
}

// awaitRemoved waits, within ctx and at most d, until the log no longer
// lists this member as a voter: autopilot promotes a learner in its place
// first, then removes it. A voter that left before that, while another
// voter is down but not yet removed (a crash gossip has not confirmed),
// would leave the log without a majority: every holder would stop. The
// last voter waits too while another member is live in the table, until
// that one has its vote (a learner not yet promoted would otherwise be
// left with a log nobody can commit to); with nobody else live it does
// not wait. It reports whether the member no longer counts as a voter.
func awaitRemoved(ctx context.Context, r logLeaver, d time.Duration) bool {
	return pollUntil(ctx, d, func() bool {
		if !r.Voter() {
			return true
		}
		if r.Voters() > 1 {
			return false
		}
		fctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		return !r.OthersFresh(fctx)
	})
}

// awaitLeader waits, within ctx and at most d, until the log has a
// leader this member knows of, and reports whether it has.
func (lo *logOwner) awaitLeader(ctx context.Context, d time.Duration) bool {
	return pollUntil(ctx, d, func() bool { return lo.run.Lead() != 0 })
}

// pollUntil checks cond every 20 ms until it holds (true), d has passed
// or ctx ended (false).
func pollUntil(ctx context.Context, d time.Duration, cond func() bool) bool {
	limit := time.NewTimer(d)
	defer limit.Stop()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-t.C:
		case <-limit.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// explainHeld describes up to limit of the partitions that still depend on
// this member as their holder, as its machine sees them, for the error of
// a drain its deadline cut short: an operator reads from it what each
// waits for (a target not yet live, a copy under way, a proposal not yet
// committed), then the log's state (term, leader, commit). It asks the
// runner within a second of its own.
func (lo *logOwner) explainHeld(limit int) string {
	var pids []int
	for p := range lo.env.parts {
		if lo.run.Part(p).Held && len(pids) < limit {
			pids = append(pids, p)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ex := lo.run.Explain(ctx, pids)
	if ex == nil {
		return "the ownership log did not answer"
	}
	// The log's state says whether commits still reach this member: a
	// proposal that never commits, a target never fresh, is one without
	// a leader or cut off from it.
	return strings.Join(append(ex, lo.run.Describe(ctx)), "; ")
}

// heldPartitions counts the partitions of parts this node holds or is
// moving, and their keys.
func heldPartitions(parts []part) (held, keys int) {
	for i := range parts {
		pt := &parts[i]
		pt.Mu.RLock()
		if pt.Role == partition.RoleHolder || pt.Role == partition.RoleFenced {
			held++
			if pt.Store != nil {
				keys += pt.Store.Len()
			}
		}
		pt.Mu.RUnlock()
	}
	return held, keys
}
