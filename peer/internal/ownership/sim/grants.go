package sim

import (
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/grantee"
	"github.com/ringlimit/ringlimit/peer/internal/history"
)

// This file is a spread key's rights (Options.Spread): the holder's side
// modelled on peer's spread.go and shard's grants, the grantee's side
// peer's own code, so that the simulator's faults and the
// history checker test the accounting rule where it is hardest: while
// holders crash, pause, move and take over.
//
// The holder's side: a grant of n rights with lease T made at g is an
// entry of n at g+T in the key's log, and count's one rule charges it in
// every window until g+T+W. It takes at most half the spare units
// (rounded up), is decided only by a member that may decide (its lease
// valid), and under sync replication is answered only once the backup has
// it; copies carry it like an admission. A return replaces a grant's
// entry by its uses, recorded at the holder's now minus their ages.
//
// The grantee's side is peer's own code, internal/grantee's State, whose
// package doc has its rules. Only the size asked for is the simulator's
// own: a random 1 to L, not peer's 1.5 × rate × lease.

// spreadDecide decides one unit of key from this member's rights
// (grantee.State, the code peer runs), where it would otherwise forward,
// and asks for rights when due. ok is false when it decided nothing (the
// caller forwards).
func (m *member) spreadDecide(p int, key string) (history.Outcome, bool) {
	now := m.mono()
	r := m.rights[key]
	if r == nil {
		r = grantee.New(now)
		m.rights[key] = r
	}
	// A threshold of 0: the key is always hot.
	sp := r.Spend(now, 1, 0)
	if sp.Grant != nil {
		m.s.used++
	}
	if sp.Refill {
		m.askRights(p, key, r)
	}
	switch {
	case sp.Grant != nil:
		return history.Admitted, true
	case now < sp.RefusedUntil:
		return history.Rejected, true
	}
	return 0, false
}

// askRights sends one grant request, with the reports of the closed
// grants, to the holder the table names.
func (m *member) askRights(p int, key string, r *grantee.State) {
	s := m.s
	_, closed := r.Ask(m.mono(), s.o.Lease, s.o.Limit)
	sent := m.mono()
	rets := grantee.Returns(closed, sent)
	want := 1 + s.rng.Int64N(s.o.Limit)
	done := false
	answer := func(n int64, id uint64, lease int64) {
		if done {
			return
		}
		done = true
		switch {
		case n < 0: // not decided: the reports go with the next request
			r.Requeue(closed)
		case n == 0:
			r.Refuse(sent, s.o.Lease/4)
		default:
			r.Install(sent, id, n, time.Duration(min(lease, int64(s.o.Lease))))
		}
	}
	s.at(int64(clientWait), func() { s.deliver(m, func() { answer(-1, 0, 0) }) })
	h := s.members[m.own.Holder(p)]
	if h == nil || h == m {
		answer(-1, 0, 0)
		return
	}
	s.send(Rights, 0, m, h, func() {
		h.grant(p, key, want, rets, func(n int64, id uint64, lease int64) {
			s.send(Rights, 0, h, m, func() { answer(n, id, lease) })
		})
	})
}

// grant ends the returned grants and grants new rights, as the holder's
// decision: n < 0 when this member may not decide or the backup did not
// confirm, 0 when no unit is spare.
func (h *member) grant(p int, key string, want int64, rets []grantee.Return, reply func(n int64, id uint64, lease int64)) {
	s := h.s
	if !h.mayDecide(p) {
		reply(-1, 0, 0)
		return
	}
	now := max(h.mono(), h.clamp[key])
	h.clamp[key] = now
	log := s.trim(h.stores[p][key], now)
	s.decided(h, p, h.own.Table().Parts[p].Epoch)
	var removed []uint64
	var added []entry
	for _, rt := range rets {
		i := -1
		for j, e := range log {
			if e.grant && e.id == rt.ID {
				i = j
				break
			}
		}
		if i < 0 {
			continue // returned before, or expired: nothing is charged
		}
		left := log[i].hits
		log = append(log[:i:i], log[i+1:]...)
		removed = append(removed, rt.ID)
		for _, u := range rt.Uses {
			c := min(u.Count, left)
			if c <= 0 {
				break
			}
			left -= c
			e := entry{ts: now - int64(u.Age), hits: c, id: h.newID()}
			log = insertEntry(log, e)
			added = append(added, e)
		}
	}
	var n int64
	var id uint64
	if spare := s.o.Limit - s.count(log, now); spare > 0 {
		n = min(want, (spare+1)/2)
		id = h.newID()
		e := entry{ts: now + int64(s.o.Lease), hits: n, id: id, grant: true}
		log = insertEntry(log, e)
		added = append(added, e)
	}
	h.stores[p][key] = log
	lease := int64(s.o.Lease)
	if len(removed) == 0 && len(added) == 0 {
		reply(0, 0, lease)
		return
	}
	backup, tag := h.own.Backup(p)
	b := s.members[backup]
	if s.o.Mutation == MutGrantsNotReplicated {
		var kept []entry
		for _, e := range added {
			if !e.grant {
				kept = append(kept, e)
			}
		}
		added = kept
	}
	if n > 0 {
		s.granted += n
	}
	if backup == "" || h.policies[key].mode == ModeOff {
		reply(n, id, lease)
		return
	}
	ages := make([]entry, len(added))
	for i, e := range added {
		ages[i] = entry{ts: now - e.ts, hits: e.hits, id: e.id, grant: e.grant}
	}
	from := h.id
	ack := func(ok bool) {}
	if n > 0 {
		// A grant is answered only once the backup has it, as a sync
		// admission is.
		done := false
		ack = func(ok bool) {
			if done {
				return
			}
			done = true
			if ok {
				reply(n, id, lease)
			} else {
				reply(-1, 0, 0)
			}
		}
		s.at(int64(500*time.Millisecond), func() { s.deliver(h, func() { ack(false) }) })
	} else {
		reply(0, 0, lease)
	}
	if b == nil {
		return
	}
	s.send(Replica, 0, h, b, func() {
		ok := b.acceptUpdate(p, from, tag, key, removed, ages)
		s.send(Replica, 0, b, h, func() { ack(ok) })
	})
}

// acceptUpdate applies a key's change at the backup: the returned grants
// removed, the new entries (as ages on the sender's clock) added once.
func (b *member) acceptUpdate(p int, from string, epoch uint64, key string, removed []uint64, ages []entry) bool {
	if !b.own.AcceptReplica(p, from, epoch) {
		return false
	}
	log := b.stores[p][key]
	for _, id := range removed {
		for j, e := range log {
			if e.grant && e.id == id {
				log = append(log[:j:j], log[j+1:]...)
				break
			}
		}
	}
	now := b.mono()
next:
	for _, a := range ages {
		for _, e := range log {
			if e.id == a.id {
				continue next // a duplicate
			}
		}
		log = insertEntry(log, entry{ts: now - a.ts, hits: a.hits, id: a.id, grant: a.grant})
	}
	b.stores[p][key] = log
	return true
}
