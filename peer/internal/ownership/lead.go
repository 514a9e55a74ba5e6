package ownership

// The leader's side (rule 7 of the package doc): when a member's liveness
// has expired in this member's view, which members are fit to be given a
// partition, and the reconciliation the leader proposes each tick: Ends,
// grants of vacant partitions (aged ones after EmptyAfter), and Joins.

import "slices"

// expired reports whether id's liveness has expired in this member's
// view: a whole Liveness since it applied the record's latest change.
func (m *Machine) expired(id string, now int64) bool {
	s := m.seen[id]
	return s != nil && now-s.at >= int64(m.cfg.Liveness)
}

// endable reports whether the leader may end id's liveness: expired, as
// every member counts it (MutLeaderEndsEarly counts 0.8 of it), and no
// keep-alive of it heard within the last Liveness waits for its read.
func (m *Machine) endable(id string, now int64) bool {
	if m.cfg.Mutation == MutLeaderEndsEarly {
		s := m.seen[id]
		return s != nil && now-s.at >= int64(m.cfg.Liveness)*4/5
	}
	if s := m.seen[id]; s != nil && s.heard > s.at && now-s.heard < int64(m.cfg.Liveness) {
		// Its keep-alive waits here for the read that confirms it
		// (Heard): alive, however long the read takes.
		return false
	}
	return m.expired(id, now)
}

// Fresh reports whether member id is live in the table and extended
// within the last Liveness in this member's view (as fresh, for drivers:
// a member gossip gave up on that still extends through the log).
func (m *Machine) Fresh(id string, now int64) bool { return m.fresh(id, now) }

// fresh reports whether id is live in the table and extended within the
// last Liveness in this member's view: fit to be given a partition.
func (m *Machine) fresh(id string, now int64) bool {
	_, ok := m.table.Live(id)
	// A member not active at its epoch has not extended through the log
	// since it joined or was ended: it could not keep a holding. Only the
	// leader hears keep-alives; every other member trusts the table,
	// which the leader keeps (it ends an active member whose session
	// lapsed), while its own keep-alives are granted: a member cut off
	// from the leader no longer learns of those Ends, so to it nobody is
	// fresh, as nobody's extensions arrived when they went through the
	// log.
	if !ok || !m.table.Members[id].Active || m.seen[id] == nil {
		return false
	}
	if m.leader {
		return !m.expired(id, now)
	}
	return now < m.liveUntil
}

// lead is the leader's reconciliation: it ends liveness that expired in
// its view, grants vacant partitions to their targets, and proposes a Join
// for each member gossip lists that the table does not.
func (m *Machine) lead(now int64, acts []Action) []Action {
	ids := make([]string, 0, len(m.table.Members))
	for id := range m.table.Members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		rec := m.table.Members[id]
		s := m.seen[id]
		if rec.Ended || s == nil || !m.endable(id, now) {
			continue
		}
		gone := slices.Contains(m.view.Gone, id)
		if id == m.cfg.ID && !gone {
			// Its own session lapsed only while this member was paused or
			// could not confirm it leads (then it cannot commit an End
			// either): its lease ended with it, and a later leader ends it.
			continue
		}
		if rec.Active && !gone {
			// Every active member whose session lapsed, whether or not it
			// holds anything: the table is how the others know who is
			// alive (they hear no keep-alives).
			m.ending[id] = [2]uint64{rec.Epoch, rec.Version}
			acts = m.propose(acts, Command{Kind: End, Member: id, Epoch: rec.Epoch, Version: rec.Version}, now)
			continue
		}
		// Gone for good: it left, or a later incarnation runs. One that
		// gossip has only given up on (Failed) may come back, with the
		// state of partitions that wait for it, or to hold again: it is
		// ended, never for good (an incarnation ended for good can never
		// extend again, and one cut off by a long split came back to a
		// log that would not take it).
		if !gone && !m.mattersEnded(id) {
			continue
		}
		m.ending[id] = [2]uint64{rec.Epoch, rec.Version}
		acts = m.propose(acts, Command{Kind: End, Member: id, Epoch: rec.Epoch, Version: rec.Version, Ended: gone}, now)
	}
	for p, pt := range m.table.Parts {
		if pt.Holder != "" {
			continue
		}
		to := ""
		aged := false
		if pt.Last != "" {
			if _, live := m.table.Live(pt.Last); live {
				if m.fresh(pt.Last, now) {
					e, _ := m.table.Live(pt.Last)
					acts = m.propose(acts, Command{Kind: Grant, Member: pt.Last, P: p, Epoch: pt.Epoch, To: pt.Last, ToEpoch: e}, now)
					continue
				}
				// Out of reach: wait for it, unless the vacancy has
				// outlasted every window its state could count in.
				waited := m.emptyAfter > 0 && now-m.vacantAt[p] >= m.emptyAfter
				if m.cfg.Mutation == MutAgedGrantEarly {
					waited = m.expired(pt.Last, now)
				}
				if !waited {
					continue
				}
				aged = true
			}
		}
		if h, wait := m.heir(p, pt, now); wait {
			continue // its heir is coming (inherit.go)
		} else if h != "" {
			to = h
		} else if p < len(m.view.Target) && m.fresh(m.view.Target[p], now) {
			to = m.view.Target[p]
		} else {
			// Any fresh member gossip lists (not one that is leaving:
			// it would end its liveness with the partition), else any
			// fresh one.
			for _, id := range ids {
				if m.fresh(id, now) && (to == "" || m.listed(id) && !m.listed(to)) {
					to = id
				}
			}
		}
		if to == "" {
			continue
		}
		e, _ := m.table.Live(to)
		c := Command{Kind: Grant, P: p, Epoch: pt.Epoch, To: to, ToEpoch: e}
		if aged {
			c.Ended, c.Version = true, m.table.Members[pt.Last].Version
		}
		acts = m.propose(acts, c, now)
	}
	for _, id := range m.view.Members {
		if m.table.Members[id] == nil && !slices.Contains(m.view.Gone, id) {
			acts = m.propose(acts, Command{Kind: Join, Member: id}, now)
		}
	}
	return acts
}

// mattersEnded reports whether ending id changes anything: it holds or
// backs a partition.
func (m *Machine) mattersEnded(id string) bool {
	for _, pt := range m.table.Parts {
		if pt.Holder == id || pt.Backup == id {
			return true
		}
	}
	return false
}
