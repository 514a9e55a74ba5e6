package ownership

import (
	"slices"
	"time"
)

// Drain is what a member leaving gracefully knows besides the table: when
// its drain began and how many members its gossip view lists.
type Drain struct {
	// Since is when the drain began, on this member's monotonic clock.
	Since int64
	// Alive counts the members gossip lists as alive, this one included
	// (draining ones too).
	Alive int
	// BackupWait is how long a member that holds nothing waits for the
	// holders it backs to pick other backups before it leaves anyway.
	BackupWait time.Duration
}

// LeaveVerdict is what a leaving member does next.
type LeaveVerdict uint8

const (
	// Stay: some partition's state would be on no live member if this
	// one ended its liveness now. Keep draining.
	Stay LeaveVerdict = iota + 1
	// Go: nothing depends on this member (or no other member is left to
	// depend on): end its liveness for good.
	Go
	// GoBacking: this member still backs partitions, but every one's
	// holder has shown it is alive since the drain began, and they had
	// BackupWait to pick other backups (or there is nobody else to pick):
	// end its liveness for good. Those holders decide without a replica
	// until a new backup has a copy; the driver warns.
	GoBacking
)

func (v LeaveVerdict) String() string {
	switch v {
	case Stay:
		return "stay"
	case Go:
		return "go"
	case GoBacking:
		return "go, still backing"
	}
	return "?"
}

// MayLeave tells a member leaving gracefully, at now, whether it may end
// its liveness for good (Leave), and how many partitions it still holds
// and backs (Depends). The rule, whatever gossip says:
//
//   - Nothing depends on it: go.
//   - Gossip lists no other member, and no other member the table keeps
//     live (not ended, not gone for good in the view) holds or backs a
//     partition, is active, or was ended (not for good) within two
//     Liveness: go. The others left or failed and the log ended them;
//     there is nobody to hand anything to.
//   - It holds a partition, or a vacancy waits for its state: stay. Ending
//     it would end the holding, and the state with it when no live
//     backup has it.
//   - It backs a partition whose holder has not extended its liveness
//     since the drain began (nor within the last half Liveness): stay. That
//     holder may have failed; the log ends it and hands the partition
//     here, with the only copy, which this member then moves on.
//   - Otherwise it backs only live holders: go once they had BackupWait to
//     copy elsewhere, or at once when gossip lists one other member only.
//
// Gossip alone is never a reason to go: a member whose gossip is cut off,
// or whose view lost everyone while its log answered late, may be the
// only member with some partition's state.
func (m *Machine) MayLeave(d Drain, now int64) (v LeaveVerdict, held, backed int) {
	m.draining = true
	held, backed = m.Depends()
	switch {
	case held == 0 && backed == 0:
		return Go, held, backed
	case d.Alive <= 1 && !m.othersLive(now):
		return Go, held, backed
	case held > 0:
		return Stay, held, backed
	}
	since := max(d.Since, now-int64(m.cfg.Liveness)/2)
	for p := range m.parts {
		if _, b := m.DependsOn(p); b && !m.extendedSince(m.table.Parts[p].Holder, since) {
			return Stay, held, backed
		}
	}
	if d.Alive == 2 || now-d.Since >= int64(d.BackupWait) {
		return GoBacking, held, backed
	}
	return Stay, held, backed
}

// othersLive reports whether a member besides this one, not gone for
// good in the view, holds or backs a partition at a liveness the table
// has not ended, or is active (it extended at its current epoch and its
// session has not lapsed), or had its liveness ended (not for good: a
// record ended for good is skipped) less than two Liveness ago: a member
// a cut-off leaver may yet reach again, and hand what it holds. A loaded
// log lets sessions lapse; the leader's ends then hand every partition to
// this member, while the others hold nothing and extend again at their
// next epoch a moment later. Counting only holders and backups, a leaver
// alone in gossip went with the only copy and the log restarted its
// partitions empty.
func (m *Machine) othersLive(now int64) bool {
	for id, l := range m.table.Members {
		if m.cfg.Mutation == MutAloneLeaverCountsHolders {
			break
		}
		if id == m.cfg.ID || l.Ended || slices.Contains(m.view.Gone, id) {
			continue
		}
		if l.Active {
			return true
		}
		if s := m.seen[id]; s != nil && s.ended > 0 && now-s.ended < 2*int64(m.cfg.Liveness) {
			return true
		}
	}
	for _, pt := range m.table.Parts {
		for _, id := range [2]string{pt.Holder, pt.Backup} {
			if id == "" || id == m.cfg.ID || slices.Contains(m.view.Gone, id) {
				continue
			}
			if e, ok := m.table.Live(id); ok && (id == pt.Backup || e == pt.HolderEpoch) {
				return true
			}
		}
	}
	return false
}

// extendedSince reports whether id is live in the table and this member
// applied an extension of its record (or its Join) after since. A table
// restored from a snapshot proves nobody alive until the next extension.
func (m *Machine) extendedSince(id string, since int64) bool {
	if _, ok := m.table.Live(id); !ok {
		return false
	}
	s := m.seen[id]
	return s != nil && s.extended > since
}
