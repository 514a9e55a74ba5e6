package ownership

import "testing"

// restoredScene is a member b that applies a log's first commands and
// installs copies as they arrive, then learns the rest of the log from a
// snapshot (Restored) instead of applying it, as a learner the leader
// catches up by snapshot does. Beside it, a member that applied every
// command: both must come to the same Has for every partition the table
// names b holder of.
type restoredScene struct {
	t       *testing.T
	applied *Machine // applies every command
	caught  *Machine // applies up to the snapshot, then Restored
	log     *Table   // the log's table, every command applied
	cut     bool     // the snapshot point passed: caught applies no more
}

func newRestoredScene(t *testing.T) *restoredScene {
	s := &restoredScene{t: t, applied: New(Config{ID: "b"}, 1), caught: New(Config{ID: "b"}, 1), log: NewTable(1)}
	for _, id := range []string{"a", "b", "c"} {
		s.cmd(Command{Kind: Join, Member: id})
		s.cmd(Command{Kind: Extend, Member: id, Epoch: 1, Seq: 1})
	}
	return s
}

func (s *restoredScene) cmd(c Command) {
	s.t.Helper()
	if err := s.log.Apply(c); err != nil {
		s.t.Fatalf("%v: %v", c, err)
	}
	s.applied.Apply(c, 1)
	if !s.cut {
		s.caught.Apply(c, 1)
	}
}

// copyTo delivers holder's copy of p, tagged at the partition's current
// epoch with seq, to b (both members), and reports whether b took it.
func (s *restoredScene) copyTo(from string, seq uint64) {
	s.t.Helper()
	e := s.log.Parts[0].Epoch
	a, c := s.applied.OfferCopy(0, from, e, seq), s.caught.OfferCopy(0, from, e, seq)
	if !a || !c {
		s.t.Fatalf("copy %s@%d #%d refused: applier %v, caught up %v", from, e, seq, a, c)
	}
}

func (s *restoredScene) end(id string) {
	r := s.log.Members[id]
	s.cmd(Command{Kind: End, Member: id, Epoch: r.Epoch, Version: r.Version})
}

// check restores the caught-up member from the log's table and compares.
func (s *restoredScene) check() {
	s.t.Helper()
	s.caught.Restored(s.log, 2)
	if pt := s.log.Parts[0]; pt.Holder == "" && pt.Last == "b" {
		// Vacant, kept for b's state: grant it back.
		s.cut = false
		s.cmd(Command{Kind: Grant, Member: "b", P: 0, Epoch: pt.Epoch, To: "b", ToEpoch: s.log.Members["b"].Epoch})
	}
	if !s.log.Holds("b", 0) {
		s.t.Fatalf("the scene does not make b the holder: %+v", s.log.Parts[0])
	}
	if !s.applied.Has(0) {
		s.t.Fatalf("b that applied every command has no state for p0: %+v", s.log.Parts[0])
	}
	if !s.caught.Has(0) || s.caught.Counters().MissingCopy != 0 {
		s.t.Fatalf("b caught up by a snapshot holds p0 without its state (never decides, never moves): %+v, %+v", s.log.Parts[0], s.caught.Counters())
	}
}

// TestRestoredTakeoverAfterAMoveCopy: a holds p0 with backup b and copies
// it to b again, for a move to b (b became its ring target) or a re-copy;
// before the Move commits, a lapses and its End hands p0 to b. A b that
// applied the End takes over with that copy (it is a's state, taken
// while a was fenced); a b that learned the End from a snapshot compared
// its copy only with the one the SetBackup named, kept no state, and held
// p0 for ever without deciding or moving it (the 32-process fleet's start:
// `holder "fleet-13@…"@2 backup "" …; have false`).
func TestRestoredTakeoverAfterAMoveCopy(t *testing.T) {
	for _, c := range []struct{ late, ended bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		s := newRestoredScene(t)
		late := c.late
		s.cmd(Command{Kind: Grant, P: 0, Epoch: 0, To: "a", ToEpoch: 1})
		s.copyTo("a", 1)
		if late {
			s.cut = true // even the SetBackup comes in the snapshot
		}
		s.cmd(Command{Kind: SetBackup, Member: "a", P: 0, Epoch: 1, To: "b", Seq: 1})
		s.copyTo("a", 2) // the move's copy (or a re-copy), never committed
		s.cut = true
		s.end("a")
		if c.ended {
			// b lapses too (the log's silence lost its keep-alive
			// answers, say): p0 is vacant, kept for b's state, and
			// granted back to it once it extends.
			s.end("b")
			s.cmd(Command{Kind: Extend, Member: "b", Epoch: 2, Seq: 2})
		}
		s.check()
	}
}

// TestRestoredEmptyGrantOverAnOldCopy: b once installed a copy of p0 (a
// move from a that never committed); a ended for good and the leader
// granted p0 empty to b. A b that learned the grant from a snapshot kept
// no state while it had any copy at all, though one older than the grant
// is no state of the new holding: the holding began empty.
func TestRestoredEmptyGrantOverAnOldCopy(t *testing.T) {
	s := newRestoredScene(t)
	s.cmd(Command{Kind: Grant, P: 0, Epoch: 0, To: "a", ToEpoch: 1})
	s.copyTo("a", 1)
	s.cut = true
	r := s.log.Members["a"]
	s.cmd(Command{Kind: End, Member: "a", Epoch: r.Epoch, Version: r.Version, Ended: true})
	s.cmd(Command{Kind: Grant, P: 0, Epoch: s.log.Parts[0].Epoch, To: "b", ToEpoch: 1})
	s.check()
}
