package peer

import (
	"maps"
	"slices"
	"sync"
	"time"
)

// quorumWatch remembers what the node last said about its majority, so
// that it warns once when it loses it (and says so again when it is back),
// and once when the cluster grew to two members and stayed two.
type quorumWatch struct {
	mu    sync.Mutex
	known bool // a first value was stored
	had   bool // the majority, as last stored
	size  int  // live plus recently failed members, as last stored
	// twoSince is when the cluster grew to two members (zero when it is
	// not two, or became two by shrinking); twoWarned that it was said.
	twoSince  time.Time
	twoWarned bool
}

// twoMemberGrace is how long a cluster that grew to two members stays two
// before the node warns: a three-member cluster starting up is two for a
// moment (its third member joining) and is not warned about.
func (n *Node) twoMemberGrace() time.Duration { return 10 * n.cfg.LeaseDuration }

// storeQuorum refreshes the decision path's copy of quorum() and logs the
// changes: a Warn when the node loses its majority (its partitions without
// a live backup stop deciding: how many, and until when at the latest), an
// Info when it has it again, and a Warn when the cluster grew to two
// members and is still two twoMemberGrace later (one of them is the
// other's majority; neither a three-member cluster starting up nor one
// that a member leaves for a restart is warned about). Called by the
// rebuild goroutine and the ownership loop (every LeaseDuration/4, which
// is what notices the grace passing).
func (n *Node) storeQuorum() {
	if n.lo != nil {
		// The log's majority decides; a node's view of one does not.
		n.hasQuorum.Store(true)
		return
	}
	q := &n.quorumWatch
	q.mu.Lock()
	defer q.mu.Unlock()
	ok := n.quorum()
	n.hasQuorum.Store(ok)
	v := n.view.Load()
	if v == nil {
		return
	}
	failed, until := n.failedMembers()
	size := len(v.alive) + len(failed)
	wasKnown, had, oldSize := q.known, q.had, q.size
	q.known, q.had, q.size = true, ok, size
	switch now := time.Now(); {
	case size != 2 || len(v.alive) != 2:
		q.twoSince, q.twoWarned = time.Time{}, false
	case oldSize < 2:
		q.twoSince, q.twoWarned = now, false
	case !q.twoSince.IsZero() && !q.twoWarned && now.Sub(q.twoSince) >= n.twoMemberGrace():
		q.twoWarned = true
		// Of two, the lower-named member is the majority's tie-break
		// (quorum): without it the other has none.
		lower := slices.Min(slices.Collect(maps.Keys(v.alive)))
		n.log.Warn("cluster of two members: losing the lower-named one stops every decision (no majority without it); run three or more",
			"members", size, "stops_if_lost", lower, "two_since", q.twoSince.UTC().Format(time.RFC3339))
	}
	switch {
	case !ok && (had || !wasKnown && size > 1):
		n.log.Warn("no majority of members: partitions without a live backup stop deciding until failed members return or age out",
			"members_alive", len(v.alive), "members_failed", len(failed), "failed", failed,
			"partitions", n.partitionsWithoutLiveBackup(v), "until", until.UTC().Format(time.RFC3339))
	case ok && wasKnown && !had:
		n.log.Info("majority of members regained: decisions resume", "members_alive", len(v.alive), "members_failed", len(failed))
	}
}

// failedMembers returns the members that failed recently enough to count
// against the majority, sorted, and when the last of them ages out
// (FailedMemberTimeout after its failure): the node has a majority again
// by then at the latest, or sooner if they come back.
func (n *Node) failedMembers() (names []string, until time.Time) {
	n.own.mu.Lock()
	defer n.own.mu.Unlock()
	for m, at := range n.own.failed {
		if time.Since(at) > n.cfg.FailedMemberTimeout {
			continue
		}
		names = append(names, m)
		if end := at.Add(n.cfg.FailedMemberTimeout); end.After(until) {
			until = end
		}
	}
	slices.Sort(names)
	return names, until
}

// partitionsWithoutLiveBackup counts the partitions this node holds whose
// backup is none or not alive in view v: without a majority they cannot
// get a new backup, and stop deciding once their lease ends.
func (n *Node) partitionsWithoutLiveBackup(v *view) int {
	count := 0
	for i := range n.pt.parts {
		pt := &n.pt.parts[i]
		pt.mu.RLock()
		if pt.role == roleHolder || pt.role == roleFenced {
			if _, ok := v.alive[pt.backup]; pt.backup == "" || !ok {
				count++
			}
		}
		pt.mu.RUnlock()
	}
	return count
}
