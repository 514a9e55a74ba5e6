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
