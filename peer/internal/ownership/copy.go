package ownership

// Copies: a holder copies a partition to its ring target (a move) or to a
// backup before the command that makes either so (rule 4 and 5 of the
// package doc); these are the machine's events and choices for them.

import "slices"

// CopyAcked tells the machine that to installed its copy of p tagged
// (epoch, seq). It proposes the Move or SetBackup the copy was for.
func (m *Machine) CopyAcked(p int, to string, epoch, seq uint64, now int64) []Action {
	m.gen++
	l := &m.parts[p]
	if l.fence != fenceCopy || l.to != to || l.epoch != epoch || l.seq != seq || !m.table.Holds(m.cfg.ID, p) {
		return nil
	}
	took := now - l.since
	if target := max(int64(m.cfg.Retry), 2*took); target < m.copyWait {
		m.copyWait -= (m.copyWait - target) / 4
	} else {
		m.copyWait = min(target, int64(m.cfg.MaxCopyWait))
	}
	l.fence, l.since = fenceProposed, now
	c := Command{Kind: SetBackup, Member: m.cfg.ID, P: p, Epoch: epoch, To: to}
	if l.move {
		e, ok := m.table.Live(to)
		if !ok {
			l.fence = fenceNone
			return nil
		}
		c = Command{Kind: Move, Member: m.cfg.ID, P: p, Epoch: epoch, To: to, ToEpoch: e, Seq: seq}
	}
	c.Seq = seq
	return []Action{{Kind: Propose, Cmd: c}}
}

// CopyFailed tells the machine that to did not install its copy of p
// tagged (epoch, seq): it refused (it is leaving, say, and gossip has not
// said so yet), or the connection failed. Nothing was proposed, so the
// fence is lifted at once, as a timeout would lift it, without lengthening
// the wait for later copies; the partition begins no new copy for Retry/4,
// so a receiver that refuses is not asked again at every tick. As after a
// timeout, a copy to the current backup may have been installed: the
// backup is copied again before the partition decides.
func (m *Machine) CopyFailed(p int, to string, epoch, seq uint64, now int64) []Action {
	m.gen++
	l := &m.parts[p]
	if l.fence != fenceCopy || l.to != to || l.epoch != epoch || l.seq != seq {
		return nil
	}
	l.fence, l.retryAt = fenceNone, now+int64(m.cfg.Retry)/4
	if l.to == m.table.Parts[p].Backup {
		l.recopy, l.recopyAfter = true, l.seq
	}
	return nil
}

// pickBackup is the gossip view's second choice for p if it is fresh and
// listed, else the first fresh listed member in ID order other than this
// one. A member gossip no longer lists is leaving: a backup there would
// be handed the partition if this holder failed before it left.
func (m *Machine) pickBackup(p int, now int64) string {
	self := m.cfg.ID
	if p < len(m.view.Second) {
		if b := m.view.Second[p]; b != "" && b != self && m.fresh(b, now) && m.listed(b) {
			return b
		}
	}
	ids := make([]string, 0, len(m.table.Members))
	for id := range m.table.Members {
		if id != self && m.fresh(id, now) && m.listed(id) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return ""
	}
	slices.Sort(ids)
	return ids[p%len(ids)]
}

func (m *Machine) startCopy(p int, to string, move bool, now int64, acts []Action) []Action {
	l := &m.parts[p]
	m.seq++
	l.fence, l.epoch, l.to, l.move, l.seq, l.since, l.wait = fenceCopy, m.table.Parts[p].Epoch, to, move, m.seq, now, m.copyWait
	return append(acts, Action{Kind: SendCopy, P: p, To: to, Epoch: l.epoch, Seq: l.seq})
}

// Raise tells the machine that replication became stronger for some
// policy (a policy table change took a policy from off to async or sync,
// or from async to sync, or added one with async or sync replication:
// an absent policy counts as off). Every partition this member holds is
// copied to its backup again
// before it decides again, so that no decision is reported as
// synchronously replicated while the backup's copy lacks admissions made
// unreplicated before the change. The partitions are unavailable for that
// copy and one commit.
func (m *Machine) Raise() {
	m.gen++
	for p := range m.parts {
		m.parts[p].recopy, m.parts[p].recopyAfter = true, m.seq
	}
}

// Recopy tells the machine that some admission of partition p, replicated
// to its backup at partition epoch epoch without waiting (async), did not
// reach it: the batch failed, timed out or was refused. If this member
// still holds p at that epoch, p is copied to its backup again before it
// decides again, exactly as after Raise, so that the backup's state lacks
// only what is still in flight rather than, until the window passes,
// every admission of a batch that failed once. A replica tagged with an
// older epoch needs nothing: the copy that made the current backup was
// taken from this member's state, failed admissions included. It reports
// whether a re-copy is now owed.
func (m *Machine) Recopy(p int, epoch uint64) bool {
	if p < 0 || p >= len(m.parts) || !m.table.Holds(m.cfg.ID, p) || m.table.Parts[p].Epoch != epoch {
		return false
	}
	l := &m.parts[p]
	if !l.recopy {
		m.gen++
		l.recopy, l.recopyAfter = true, m.seq
	}
	return true
}

// AcceptReplica reports whether an admission of p replicated by from at
// epoch may be applied to this member's copy: only while the table names
// this member p's backup and from its holder, at exactly that epoch. A
// replica of an older holding is refused (its holder was ended or moved
// on), and so is one from a newer epoch this member has not applied yet:
// the holder then answers unavailable rather than report it replicated.
func (m *Machine) AcceptReplica(p int, from string, epoch uint64) bool {
	pt := m.table.Parts[p]
	return pt.Backup == m.cfg.ID && pt.Holder == from && (pt.Epoch == epoch || m.cfg.Mutation == MutReplicaAnyEpoch) && m.parts[p].have
}

// OfferCopy reports whether a complete copy of p from a holder, tagged
// (epoch, seq), may replace this member's state of p. A member never
// replaces the state of a partition it holds, nor a newer copy with an
// older one (copies may be delayed, duplicated and reordered). On true
// the driver installs the copy and acknowledges it.
func (m *Machine) OfferCopy(p int, from string, epoch, seq uint64) bool {
	m.gen++
	l := &m.parts[p]
	if m.table.Parts[p].Holder == m.cfg.ID {
		return false
	}
	if m.cfg.Mutation != MutCopyAnyEpoch {
		// A copy older than the partition's epoch is refused first: a
		// duplicate of the copy a SetBackup named, delivered after it,
		// would otherwise be installed again over the admissions
		// replicated since. (No simulated schedule delivers a
		// duplicate that late: this order is reasoned, not yet shown.)
		if epoch < m.table.Parts[p].Epoch {
			return false
		}
		if l.copyFrom == from && (epoch < l.copyEpoch || epoch == l.copyEpoch && seq <= l.copySeq) {
			return epoch == l.copyEpoch && seq == l.copySeq // a duplicate: acknowledge again
		}
	}
	l.copyFrom, l.copyEpoch, l.copySeq = from, epoch, seq
	// A copy replaces whatever this member kept: it backs nothing until a
	// command names it, with this copy.
	l.have = false
	return true
}
