package sim

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/ownlog"
)

// simDisk is FaultWholeRestart's data directories: each member name's
// raft log on disk (ownlog.Disk, real files in a temporary directory,
// removed when the run ends), and what each incarnation's partition
// state on disk held when it crashed, as a node's data directory keeps
// it under `disk` durability (every admission on disk before it is
// answered).
type simDisk struct {
	root  string
	open  map[string]*ownlog.Disk // member name → its open log
	heirs map[string]string       // new incarnation → the one whose directory it has
	// kept is each heir's restorable state: partition → key → entries,
	// times on the old incarnation's clock, with that clock's reading
	// at the crash.
	kept    map[string]map[int]map[string][]entry
	crashAt map[string]int64
}

// diskFor opens the data directory of member name, for runs whose fault
// restarts every member from disk; nil (memory) otherwise.
func (s *sim) diskFor(name string) *ownlog.Disk {
	if s.fault != FaultWholeRestart && s.fault != FaultRestoredBackup {
		return nil
	}
	if s.disk == nil {
		// Memory-backed when the host has it: the simulator's own files
		// need no durability, and an fsync per Ready on a real disk
		// costs a run seconds.
		base := ""
		if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
			base = "/dev/shm"
		}
		root, err := os.MkdirTemp(base, "ringlimit-sim-")
		if err != nil {
			panic(err)
		}
		s.disk = &simDisk{root: root, open: map[string]*ownlog.Disk{}, heirs: map[string]string{},
			kept: map[string]map[int]map[string][]entry{}, crashAt: map[string]int64{}}
	}
	dir := filepath.Join(s.disk.root, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		panic(err)
	}
	d, err := ownlog.OpenDisk(dir, "sim")
	if err != nil {
		panic(err) // a directory this run wrote: a bug, not an input
	}
	s.disk.open[name] = d
	return d
}

// removeDisks closes the run's logs and removes its directories.
func (s *sim) removeDisks() {
	if s.disk == nil {
		return
	}
	for _, d := range s.disk.open {
		d.Close()
	}
	os.RemoveAll(s.disk.root)
}

// heirs is the view's Heirs: which incarnation restarted with whose
// directory.
func (s *sim) heirs() map[string]string {
	if s.disk == nil {
		return nil
	}
	return s.disk.heirs
}

// wholeRestart crashes every running member at the same instant, as a
// power cut does: nothing is flushed, nothing is told. After 0.5-4 s each
// starts again from its data directory: the same raft member (its log,
// term and vote on disk) as a new incarnation, heir of its old one, with
// the partition state its old one had (for the partitions whose state it
// had: Machine.Has). A member new to the cluster starts with them.
func (s *sim) wholeRestart(span func(lo, hi time.Duration) int64) {
	type was struct {
		name   string
		inc    int
		raftID uint64
		id     string
	}
	var down []was
	s.note("every member crashes at once")
	for _, id := range s.sortedIDs() {
		m := s.members[id]
		s.keep(m)
		// Abandoned as kill -9 leaves it: the log wrote and fsynced each
		// Ready before its messages went out; Close flushes nothing more.
		s.disk.open[m.name].Close()
		delete(s.disk.open, m.name)
		down = append(down, was{m.name, m.inc, m.raftID, m.id})
		s.crash(m, false)
	}
	s.extendEnd(int64(10 * time.Second))
	// Each starts again after 0.5-4 s, on its own: the first to return
	// find the vacancies of those still down, and a member new to the
	// cluster starts with the first, so that ring targets move to it and
	// a vacancy's target is not always its Last's heir (the heir rule,
	// not the ring, must bring each state back).
	first := true
	for _, w := range down {
		s.at(span(500*time.Millisecond, 4*time.Second), func() {
			m := s.start(w.name, w.inc+1, w.raftID, nil)
			s.gone = append(s.gone, w.id) // a later incarnation runs
			s.disk.heirs[m.id] = w.id
			s.note("restart %s from its data directory as %s", w.id, m.id)
			if first {
				first = false
				nm := s.start(fmt.Sprintf("n%d", s.o.Members), 1, s.newRaftID(), nil)
				s.note("start %s, new to the cluster", nm.id)
			}
		})
	}
}

// restoreFromDisk gives partition p, just granted to m empty, the state
// m's data directory has for it (its old incarnation's), if any: each
// entry as old as it was at the crash, on m's clock (the time it was down
// is not counted: entries expire later, never earlier).
func (s *sim) restoreFromDisk(m *member, p int) {
	if s.disk == nil {
		return
	}
	old, ok := s.disk.heirs[m.id]
	if !ok {
		return
	}
	st := s.disk.kept[old][p]
	if st == nil {
		s.note("%s granted p%d empty: nothing for it in its data directory", m.id, p)
		return
	}
	delete(s.disk.kept[old], p)
	shift := m.mono() - s.disk.crashAt[old]
	n := 0
	for k, log := range st {
		out := make([]entry, len(log))
		for i, e := range log {
			e.ts += shift
			out[i] = e
			n++
		}
		m.stores[p][k] = out
	}
	s.note("%s restores p%d from %s's data directory (%d entries)", m.id, p, old, n)
}

// keep records what m's data directory holds of its partition state now:
// the partitions whose state it has (Machine.Has), under `disk`
// durability every admission it made.
func (s *sim) keep(m *member) {
	kept := map[int]map[string][]entry{}
	for p := range m.stores {
		if !m.own.Has(p) {
			continue
		}
		st := map[string][]entry{}
		for k, log := range m.stores[p] {
			st[k] = slices.Clone(log)
		}
		kept[p] = st
	}
	s.disk.kept[m.id], s.disk.crashAt[m.id] = kept, m.mono()
}

// restoredBackup backs up victim's data directory now, crashes it 2-6 s
// later and, 0.5-2 s after that, starts it again from the backup: the
// partition state as it was at the backup, the raft files removed (as a
// restore must: a raft member whose log or vote went back could vote
// twice in a term or forget an entry it acknowledged), so it joins the
// log as a new raft member, the heir of its old incarnation.
func (s *sim) restoredBackup(victim *member, span func(lo, hi time.Duration) int64) {
	s.keep(victim)
	s.note("back up %s's data directory", victim.id)
	s.extendEnd(int64(10 * time.Second))
	s.at(span(2*time.Second, 6*time.Second), func() {
		if victim.crashed {
			return
		}
		s.note("crash %s", victim.id)
		s.disk.open[victim.name].Close()
		delete(s.disk.open, victim.name)
		s.crash(victim, false)
		s.at(span(500*time.Millisecond, 2*time.Second), func() {
			if err := os.RemoveAll(filepath.Join(s.disk.root, victim.name)); err != nil {
				panic(err)
			}
			m := s.start(victim.name, victim.inc+1, s.newRaftID(), nil)
			s.gone = append(s.gone, victim.id) // a later incarnation runs
			s.disk.heirs[m.id] = victim.id
			s.note("restart %s from the backup of its data directory as %s (raft files removed)", victim.id, m.id)
		})
	})
}
