package ownership

// A member restarted with its data directory runs as a new incarnation
// (its old one is gone for good: a later one runs), and the driver keeps
// the old one's partition state from disk. The heir rule gives it back
// what the log kept for its old self:
//
//   - A partition vacant for an incarnation (its Last) that has ended
//     goes to the member that restarted with that incarnation's data
//     directory (View.Heirs), once the heir is live and extending, as a
//     grant; while gossip lists the heir but it is not yet fresh, the
//     vacancy waits for it (until EmptyAfter, as it waits for Last).
//   - The grant is an empty grant to the machine (Reset, counted in
//     Restarts: the log cannot know what a disk holds); the driver
//     restores, on Reset, the state its data directory has for the
//     partition.
//
// Why it is safe: the grant is the one any empty grant is (one holder,
// checked against the table); and restoring state that a member of the
// partition really had only adds admissions that were made, from one
// source, so it can only refuse more than starting empty. Why it loses
// nothing acknowledged under `disk` durability: a vacancy's Last is the
// last member with the partition's state (its holder, or the backup the
// holder's End handed it to), every admission it acknowledged was on its
// disk first, and nobody decided for the partition since it became
// vacant.

// heir returns, for vacant partition p (record pt), the member to grant it
// to because it restarted with the data directory of pt.Last; wait is set
// while that member is listed by gossip but not yet fresh.
func (m *Machine) heir(p int, pt Partition, now int64) (to string, wait bool) {
	if pt.Last == "" || len(m.view.Heirs) == 0 || m.cfg.Mutation == MutHeirIgnored {
		return "", false
	}
	if _, live := m.table.Live(pt.Last); live {
		return "", false // Last itself may come back (lead's own rule)
	}
	for h, of := range m.view.Heirs {
		if of != pt.Last {
			continue
		}
		if m.fresh(h, now) {
			return h, false
		}
		waited := m.emptyAfter > 0 && now-m.vacantAt[p] >= m.emptyAfter
		return "", m.listed(h) && !waited
	}
	return "", false
}
