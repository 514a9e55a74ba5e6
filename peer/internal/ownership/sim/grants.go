package sim

import (
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/history"
)

// This file is a spread key's rights (Options.Spread), modelled on peer's
// spread.go and shard's grants, so that the simulator's faults and the
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
// The grantee's side, as peer's: it uses a grant only until 85 % of its
// lease has passed on its own clock, counted from before it asked; it
// records each use at the end of its 1/64 of the lease and reports the
// uses as ages shrunk by 10 % with its next request; it holds at most two
// grants, spends the oldest first, asks for more when it has none or has
// spent half its newest, and once refused rights refuses the key locally
// for a quarter of the lease.

const (
	spreadBins        = 64
	spreadUseFraction = 0.85
	spreadAgeFraction = 0.9
	maxLiveGrants     = 2
)

// rights is one member's side of the spread key as a grantee.
type rights struct {
	live, closed []*held
	asking       bool
	refusedUntil int64
}

// held is one grant held by a grantee; times are on its clock.
type held struct {
	id                  uint64
	n, left             int64
	sent, deadline, bin int64
	uses                [spreadBins]int64
}

// useRun is a report of uses: count units admitted age ago.
type useRun struct{ age, count int64 }

// ret is a closed grant's report.
type ret struct {
	id   uint64
	uses []useRun
}

func (g *held) record(now int64) {
	g.uses[min(max(now-g.sent, 0)/g.bin, spreadBins-1)]++
}

// report is g's uses as ages at now, each at its bin's end and shrunk
// for the clock-rate bound: no earlier than it happened on any clock.
func (g *held) report(now int64) []useRun {
	var out []useRun
	for i := spreadBins - 1; i >= 0; i-- {
		if g.uses[i] == 0 {
			continue
		}
		at := g.sent + int64(i+1)*g.bin
		out = append(out, useRun{age: int64(spreadAgeFraction * float64(max(now-at, 0))), count: g.uses[i]})
	}
	return out
}

func (r *rights) close(g *held) {
	r.closed = append(r.closed, g)
	if len(r.closed) > 8 {
		r.closed = r.closed[len(r.closed)-8:]
	}
}

func (r *rights) due(now int64) bool {
	if r.asking || now < r.refusedUntil || len(r.live) >= maxLiveGrants {
		return false
	}
	if len(r.live) == 0 {
		return true
	}
	g := r.live[len(r.live)-1]
	var left int64
	for _, o := range r.live {
		left += o.left
	}
	return 2*left <= g.n || now-g.sent >= (g.deadline-g.sent)/2
}

// spreadDecide decides one unit of key from this member's rights, where
// it would otherwise forward, and asks for rights when due. ok is false
// when it decided nothing (the caller forwards).
func (m *member) spreadDecide(p int, key string) (history.Outcome, bool) {
	r := m.rights[key]
	if r == nil {
		r = &rights{}
		m.rights[key] = r
	}
	now := m.mono()
	var g *held
	for len(r.live) > 0 {
		o := r.live[0]
		if now <= o.deadline && o.left > 0 {
			g = o
			break
		}
		r.close(o)
		r.live = r.live[1:]
	}
	if g != nil {
		g.left--
		g.record(now)
		m.s.used++
		if g.left == 0 {
			r.close(g)
			r.live = r.live[1:]
		}
	}
	if r.due(now) {
		m.askRights(p, key, r)
	}
	switch {
	case g != nil:
		return history.Admitted, true
	case now < r.refusedUntil:
		return history.Rejected, true
	}
	return 0, false
}

// askRights sends one grant request, with the reports of the closed
// grants, to the holder the table names.
func (m *member) askRights(p int, key string, r *rights) {
	s := m.s
	r.asking = true
	sent := m.mono()
	closed := r.closed
	r.closed = nil
	var rets []ret
	for _, g := range closed {
		rets = append(rets, ret{id: g.id, uses: g.report(sent)})
	}
	want := 1 + s.rng.Int64N(s.o.Limit)
	done := false
	answer := func(n int64, id uint64, lease int64) {
		if done {
			return
		}
		done = true
		r.asking = false
		switch {
		case n < 0: // not decided: the reports go with the next request
			r.closed = append(closed, r.closed...)
			if len(r.closed) > 8 {
				r.closed = r.closed[len(r.closed)-8:]
			}
		case n == 0:
			r.refusedUntil = sent + int64(s.o.Lease)/4
		default:
			if len(r.live) >= maxLiveGrants {
				r.close(r.live[0])
				r.live = r.live[1:]
			}
			ttl := min(lease, int64(s.o.Lease))
			r.live = append(r.live, &held{id: id, n: n, left: n, sent: sent,
				deadline: sent + int64(spreadUseFraction*float64(ttl)), bin: max(ttl/spreadBins, 1)})
		}
	}
	s.at(int64(clientWait), func() { s.deliver(m, func() { answer(-1, 0, 0) }) })
	h := s.members[m.own.Holder(p)]
	if h == nil || h == m {
		answer(-1, 0, 0)
		return
	}
	s.send(m, h, func() {
		h.grant(p, key, want, rets, func(n int64, id uint64, lease int64) {
			s.send(h, m, func() { answer(n, id, lease) })
		})
	})
}

// grant ends the returned grants and grants new rights, as the holder's
// decision: n < 0 when this member may not decide or the backup did not
// confirm, 0 when no unit is spare.
func (h *member) grant(p int, key string, want int64, rets []ret, reply func(n int64, id uint64, lease int64)) {
	s := h.s
	if !h.mayDecide(p) {
		reply(-1, 0, 0)
		return
	}
	now := max(h.mono(), h.clamp[key])
	h.clamp[key] = now
	log := s.trim(h.stores[p][key], now)
	var removed []uint64
	var added []entry
	for _, rt := range rets {
		i := -1
		for j, e := range log {
			if e.grant && e.id == rt.id {
				i = j
				break
			}
		}
		if i < 0 {
			continue // returned before, or expired: nothing is charged
		}
		left := log[i].hits
		log = append(log[:i:i], log[i+1:]...)
		removed = append(removed, rt.id)
		for _, u := range rt.uses {
			c := min(u.count, left)
			if c <= 0 {
				break
			}
			left -= c
			e := entry{ts: now - u.age, hits: c, id: h.newID()}
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
	if backup == "" || h.unreplicated {
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
	s.send(h, b, func() {
		ok := b.acceptUpdate(p, from, tag, key, removed, ages)
		s.send(b, h, func() { ack(ok) })
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
