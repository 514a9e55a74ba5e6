package ownership

// A member caught up by a snapshot (Restored) learns of commands without
// applying them, and must still know what it has (rule 8 of the package
// doc).

// tookOver reports whether this member, which a restored table names
// holder of a partition (record pt) it has no state of, or Last of its
// vacancy, has the state anyway because it took the partition over as
// the backup (and, for Last, was ended since): a copy from
// the holder that made it the backup (pt.CopyFrom), newer than the one
// its SetBackup named. That is the copy Apply's End accepts from the
// ended holder (a move's to this member, or a re-copy, that never
// committed): the holder was fenced from that copy on, or owed a re-copy
// and decided nothing the backup applied until a SetBackup named a newer
// one. After a Move to this member no newer copy from the old holder can
// exist while the Move's holding lasts (the old holder holds no later
// epoch of it), so only a takeover passes. Before this, a member caught up
// by snapshot across such a takeover held the partition without its state
// for good: it never decides and never moves a partition it has no state
// of, and nothing ends a holder that keeps its liveness.
func (m *Machine) tookOver(pt Partition, l *local) bool {
	if pt.CopyFrom == "" || pt.CopyFrom == m.cfg.ID || l.copyFrom != pt.CopyFrom || l.copyEpoch >= pt.Epoch {
		return false // (a copy at the current epoch or later is from after the snapshot)
	}
	return l.copyEpoch > pt.CopyEpoch || l.copyEpoch == pt.CopyEpoch && l.copySeq > pt.CopySeq
}

// emptyFresh reports whether this member holds p, or is its Last, in a
// Fresh chain of holdings (table t) without ever having had its state:
// having none, and no copy installed since the chain began (a copy of
// an earlier holding is older than the partition's epoch; within the
// chain nobody else held it to copy from), it never decided for it
// (deciding needs the state), and nobody else did either, so the state
// is empty.
// This is how a member that learned of an empty grant from a snapshot, not
// by applying it, starts the partition.
func (m *Machine) emptyFresh(t *Table, p int) bool {
	pt, l := t.Parts[p], &m.parts[p]
	mine := t.Holds(m.cfg.ID, p) || pt.Holder == "" && pt.Last == m.cfg.ID
	return pt.Fresh && mine && !l.have && (l.copyFrom == "" || l.copyEpoch < pt.Epoch)
}
