package sim

import (
	"slices"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/history"
	"github.com/ringlimit/ringlimit/peer/internal/ownership"
)

// This file is the data plane: gossip views, clients, decisions,
// replication and copies. Ownership rules are the Machine's; this code
// only asks it (MayDecide, AcceptReplica, OfferCopy) and carries its
// actions out.

// gossip refreshes every running member's view: a member lists the
// incarnations it heard from within its failure-detection time, so views
// disagree during faults, as memberlist's do.
func (s *sim) gossip() {
	ids := s.sortedIDs()
	for _, xid := range ids {
		x := s.members[xid]
		if x.crashed || x.paused > s.now {
			continue
		}
		x.growHeard()
		for _, yid := range ids {
			y := s.members[yid]
			if y.crashed || y.paused > s.now || s.cut[[2]string{y.name, x.name}] || s.deaf[x.name] && y != x {
				continue
			}
			x.heard[y.ix] = s.now + 1
		}
	}
	roster := s.roster()
	// One list of the gone and one set of them for every view: the
	// machine only reads a view.
	gone := slices.Clone(s.gone)
	isGone := make(map[string]bool, len(s.gone))
	for _, id := range s.gone {
		isGone[id] = true
	}
	for _, xid := range ids {
		x := s.members[xid]
		if x.crashed || x.paused > s.now {
			continue
		}
		var view []string
		x.alive = 0
		for _, yid := range ids {
			y := s.members[yid]
			if at, ok := x.heardAt(y); ok && s.now-at < x.detect {
				x.alive++ // draining ones too, as peer's view lists them
				if !y.leaving {
					view = append(view, yid)
				}
			}
		}
		// Failed: not heard from for FailedAfter (crashed, or cut off:
		// gossip cannot tell), and not gone for good.
		xgone := gone
		var failed []string
		for _, y := range s.all {
			at, ok := x.heardAt(y)
			if !ok || s.now-at < int64(s.o.FailedAfter) || isGone[y.id] {
				continue
			}
			if s.o.Mutation == MutFailedIsGone {
				if len(xgone) == len(gone) {
					xgone = slices.Clone(gone)
				}
				xgone = append(xgone, y.id)
			} else {
				failed = append(failed, y.id)
			}
		}
		v := ownership.View{Members: view, Gone: xgone, Failed: failed}
		v.Target, v.Second = s.pl.place(view)
		v.Heirs = s.heirs()
		x.log.SetView(v, roster)
		x.schedPoke()
	}
	s.at(int64(gossipTick), s.gossip)
}

// growHeard makes room in heard for every incarnation so far.
func (m *member) growHeard() {
	if n := len(m.s.all); len(m.heard) < n {
		m.heard = append(m.heard, make([]int64, n-len(m.heard))...)
	}
}

// heardAt is when m last heard y through gossip (ok: ever).
func (m *member) heardAt(y *member) (at int64, ok bool) {
	if y == nil || y.ix >= len(m.heard) || m.heard[y.ix] == 0 {
		return 0, false
	}
	return m.heard[y.ix] - 1, true
}

// client runs one client's loop: a key, an entry member, one request,
// its answer or a timeout, a short pause, again.
func (s *sim) client(c int) {
	if s.now >= s.end {
		return
	}
	key := s.keys[s.rng.IntN(len(s.keys))]
	if s.o.Spread && s.rng.IntN(2) == 0 {
		key = s.keys[0]
	}
	var running []*member
	for _, id := range s.sortedIDs() {
		if m := s.members[id]; !m.crashed {
			running = append(running, m)
		}
	}
	next := func() { s.at(int64(s.rng.IntN(int(30*time.Millisecond))), func() { s.client(c) }) }
	if len(running) == 0 {
		next()
		return
	}
	entry := running[s.rng.IntN(len(running))]
	i, finish := s.record(key, c, next)
	// The client sits beside its entry member: a request reaches it
	// unless it is down, and the answer comes back on the same path.
	s.deliver(entry, func() {
		entry.handle(key, i, 0, func(out history.Outcome, owner string, epoch uint64) {
			s.deliver(entry, func() { finish(out, owner, epoch) })
		})
	})
}

// record records client c's request for key, made now, and returns its
// index in the history and finish, which records its answer once (an
// unknown outcome after clientWait without one) and then runs done.
func (s *sim) record(key string, c int, done func()) (int, func(history.Outcome, string, uint64)) {
	i := len(s.ops)
	s.ops = append(s.ops, history.Op{Key: key, Hits: 1, Call: s.now, Client: c, Outcome: history.Unknown})
	answered := false
	finish := func(out history.Outcome, owner string, epoch uint64) {
		if answered {
			return
		}
		answered = true
		o := &s.ops[i]
		o.Outcome, o.Return, o.Owner, o.Epoch = out, s.now, owner, epoch
		if out == history.Unknown {
			o.Return = 0
		}
		done()
	}
	s.at(int64(clientWait), func() { finish(history.Unknown, "", 0) })
	return i, finish
}

// handle decides for key if this member may, else forwards it once to
// the holder its table names.
func (m *member) handle(key string, op, hops int, reply func(history.Outcome, string, uint64)) {
	s := m.s
	p := s.partition(key)
	if m.mayDecide(p) {
		m.decide(p, key, op, reply)
		return
	}
	if hops == 0 && s.o.Spread && key == s.keys[0] {
		if out, ok := m.spreadDecide(p, key); ok {
			reply(out, m.id, 0)
			return
		}
	}
	h := s.members[m.own.Holder(p)]
	if hops > 0 || h == nil || h == m {
		reply(history.Unavailable, "", 0)
		return
	}
	s.send(Forward, 0, m, h, func() {
		h.handle(key, op, hops+1, func(out history.Outcome, owner string, epoch uint64) {
			s.send(Forward, 0, h, m, func() { reply(out, owner, epoch) })
		})
	})
}

func (m *member) mayDecide(p int) bool {
	s := m.s
	switch s.o.Mutation {
	case MutGossipTakeover:
		t := m.own.Table().Parts[p]
		if t.Backup == m.id {
			if at, ok := m.heardAt(s.byID(t.Holder)); !ok || s.now-at >= m.detect {
				return true
			}
		}
	}
	return m.own.MayDecide(p, m.mono())
}

// decide is the sliding log's decision at the member's clock, clamped per
// key so it never runs backward, replicated as the key's policy says: a
// sync admission is answered only once the backup has it, an async one at
// once (a replica that fails makes the partition owe a re-copy), an off
// one is not replicated. A key whose policy this member's table lacks is
// refused undecided (peer answers an unknown policy with an error).
func (m *member) decide(p int, key string, op int, reply func(history.Outcome, string, uint64)) {
	s := m.s
	pol := m.policies[key]
	if !pol.present {
		reply(history.Unavailable, "", 0)
		return
	}
	now := max(m.mono(), m.clamp[key])
	m.clamp[key] = now
	log := s.trim(m.stores[p][key], now)
	epoch := m.own.Table().Parts[p].Epoch
	s.decided(m, p, epoch)
	if s.count(log, now)+1 > s.o.Limit {
		m.stores[p][key] = log
		reply(history.Rejected, m.id, epoch)
		return
	}
	e := entry{ts: now, hits: 1, id: m.newID()}
	m.stores[p][key] = insertEntry(log, e)
	adm := s.admitted(m, p, epoch, key, e.id, pol.mode, op)
	backup, tag := m.own.Backup(p)
	b := s.members[backup]
	if backup == "" || pol.mode == ModeOff {
		adm.acked = true
		reply(history.Admitted, m.id, epoch)
		return
	}
	age := now - e.ts
	from := m.id
	apply := func() bool {
		return b.acceptReplica(p, from, tag, key, entry{ts: b.mono() - age, hits: e.hits, id: e.id})
	}
	if pol.mode == ModeAsync {
		adm.acked = true
		reply(history.Admitted, m.id, epoch)
		m.asyncPending[e.id] = asyncItem{p: p, epoch: tag}
		done := func(ok bool) {
			if _, ok := m.asyncPending[e.id]; !ok {
				return
			}
			delete(m.asyncPending, e.id)
			if !ok && s.o.Mutation != MutAsyncForget {
				m.carry(m.log.Recopy(p, tag, m.mono()))
			}
		}
		s.at(int64(ReplicaTimeout), func() { s.deliver(m, func() { done(false) }) })
		s.replicate(m, b, apply, done)
		return
	}
	ps := &pendingSync{epoch: tag}
	m.pending[e.id] = ps
	answer := func(out history.Outcome) {
		if ps.done {
			return
		}
		ps.done = true
		delete(m.pending, e.id)
		adm.acked = out == history.Admitted
		reply(out, m.id, epoch)
	}
	s.at(int64(ReplicaTimeout), func() { s.deliver(m, func() { answer(history.Unavailable) }) })
	s.replicate(m, b, apply, func(ok bool) {
		if ok {
			answer(history.Admitted)
		} else {
			answer(history.Unavailable)
		}
	})
}

// replicate carries one replica from holder m to backup b (nil: gone) and
// its answer back: done(true) once b applied it, done(false) when b
// refused it or its batch failed. A share of batches (ReplicaFail) fail at
// once, as a broken pipe does, and replicas between a blipped pair vanish
// (FaultBlip); others may be lost, delayed or duplicated like any message.
func (s *sim) replicate(m, b *member, apply func() bool, done func(ok bool)) {
	if b == nil {
		return
	}
	if s.blip[[2]string{m.name, b.name}] {
		return
	}
	if s.rng.Float64() < s.o.ReplicaFail {
		s.at(int64(time.Millisecond), func() { s.deliver(m, func() { done(false) }) })
		return
	}
	s.send(Replica, 0, m, b, func() {
		ok := apply()
		s.send(Replica, 0, b, m, func() { done(ok) })
	})
}

func (b *member) acceptReplica(p int, from string, epoch uint64, key string, e entry) bool {
	if !b.own.AcceptReplica(p, from, epoch) {
		return false
	}
	log := b.stores[p][key]
	for _, x := range log {
		if x.id == e.id {
			return true // a duplicate
		}
	}
	// Replicas may arrive reordered: insertEntry keeps time order.
	b.stores[p][key] = insertEntry(log, e)
	return true
}

// newID is a unique id for an admission or a grant made here.
func (m *member) newID() uint64 {
	m.admSeq++
	return m.admSeq<<16 | uint64(m.raftID&0xffff)
}

// trim drops the entries of log (in time order) that no window at now or
// later can count: an admission at ts ≤ now − W, and a grant whose charge
// ended (its lease's end ≤ now − W).
func (s *sim) trim(log []entry, now int64) []entry {
	i := 0
	for i < len(log) && log[i].ts <= now-int64(s.o.Window) {
		i++
	}
	return log[i:]
}

// count is what log charges the window (now − W, now]: every admission in
// it, and every grant still charged. A grant is stored at its lease's end
// u, so the one rule covers both: a grant counts its n units in every
// window at t with u > t − W, that is until u + W (shard's accounting
// rule).
func (s *sim) count(log []entry, now int64) int64 {
	var n int64
	for _, e := range log {
		if e.ts <= now-int64(s.o.Window) {
			continue
		}
		if e.grant && s.o.Mutation == MutGrantLeaseOnly && e.ts <= now {
			continue // the broken rule: a grant's charge ends with its lease
		}
		n += e.hits
	}
	return n
}

// insertEntry inserts e into log in time order (after equal times).
func insertEntry(log []entry, e entry) []entry {
	i := len(log)
	for i > 0 && log[i-1].ts > e.ts {
		i--
	}
	return slices.Insert(log, i, e)
}

// sendCopy exports a partition as ages on this member's clock and sends
// it; the receiver rebases them on its own clock, so a transfer's delay
// only makes entries expire later.
func (m *member) sendCopy(a ownership.Action) {
	s := m.s
	to := s.members[a.To]
	if to == nil || s.lsb != nil && s.losesCopy(m, to, a) {
		return
	}
	now := m.mono()
	type aged struct {
		key   string
		age   int64
		hits  int64
		id    uint64
		grant bool
	}
	var state []aged
	for _, key := range sortedKeys(m.stores[a.P]) {
		for _, e := range m.stores[a.P][key] {
			if e.grant && s.o.Mutation == MutGrantsNotReplicated {
				continue
			}
			state = append(state, aged{key, now - e.ts, e.hits, e.id, e.grant})
		}
	}
	from, p, epoch, seq := m.id, a.P, a.Epoch, a.Seq
	send := func(fn func()) { s.send(Copy, 0, m, to, fn) }
	if s.lateCopy {
		hold := int64(1200*time.Millisecond) + s.rng.Int64N(int64(1800*time.Millisecond))
		send = func(fn func()) { s.at(hold, func() { s.send(Copy, 0, m, to, fn) }) }
	}
	send(func() {
		// A leaving member refuses copies before asking its machine, as
		// peer's does once Close began.
		if to.leaving || !to.own.OfferCopy(p, from, epoch, seq) {
			s.send(Copy, 0, to, m, func() {
				m.carry(m.log.CopyFailed(p, to.id, epoch, seq, m.mono()))
			})
			return
		}
		st := map[string][]entry{}
		tn := to.mono()
		for _, x := range state {
			st[x.key] = append(st[x.key], entry{ts: tn - x.age, hits: x.hits, id: x.id, grant: x.grant})
		}
		to.stores[p] = st
		if to == s.behind && m == s.behindFrom && !m.crashed {
			// Installed, not yet acknowledged: the copy's Move or
			// SetBackup never commits.
			s.note("%s installs a copy of p%d from %s (epoch %d, #%d); crash %s", to.id, p, from, epoch, seq, m.id)
			s.crash(m, false)
		}
		s.send(Copy, 0, to, m, func() {
			m.carry(m.log.CopyAcked(p, to.id, epoch, seq, m.mono()))
		})
	})
}

func sortedKeys(m map[string][]entry) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// longestGap is the longest stretch during which every answer for some
// key was unavailable or unknown, from the first such call to the next
// decided answer's call.
func (s *sim) longestGap() time.Duration {
	return s.gapFrom(0, func(string) bool { return true })
}

// crashGaps is longestGap after the leader crashed (FaultLeaderCrash),
// apart for the keys of the partitions it held and for the others.
func (s *sim) crashGaps() CrashGaps {
	if s.leaderHeld == nil {
		return CrashGaps{}
	}
	own := func(k string) bool { return s.leaderHeld[s.partition(k)] }
	g := CrashGaps{Own: s.gapFrom(s.leaderAt, own), Others: s.gapFrom(s.leaderAt, func(k string) bool { return !own(k) }), Measured: true}
	for _, k := range s.keys {
		if own(k) {
			g.OwnKeys++
		}
	}
	return g
}

// gapFrom is the longest such stretch, among the keys for which in
// reports true, that began at from or later.
func (s *sim) gapFrom(from int64, in func(string) bool) time.Duration {
	var worst int64
	since := map[string]int64{}
	for _, o := range s.ops {
		if o.Call < from || !in(o.Key) {
			continue
		}
		switch o.Outcome {
		case history.Unavailable, history.Unknown:
			if _, ok := since[o.Key]; !ok {
				since[o.Key] = o.Call
			}
		default:
			if t, ok := since[o.Key]; ok {
				worst = max(worst, o.Call-t)
				delete(since, o.Key)
			}
		}
	}
	return time.Duration(worst)
}
