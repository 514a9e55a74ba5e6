package shard

import (
	"fmt"
	"slices"
	"time"
)

// Reservations: costs known only after the work (an LLM call's tokens, a
// query's rows). Reserve admits an estimate like Allow admits hits and
// remembers it under an id; Settle replaces the estimate with the actual
// cost, at the reservation's time:
//
//   - actual < estimate gives the difference back from the reservation's
//     run (the units admitted at its instant);
//   - actual > estimate records the excess at the reservation's instant
//     whether or not it fits: the work was already done. The excess is
//     the settlement's Overage, units spent that were never admitted, and
//     the windows holding that instant may then hold more than Limit;
//   - a reservation is pending until it is settled or its units expire
//     (a Window after it was made): an unsettled reservation is charged
//     its estimate, and a Settle after expiry changes nothing;
//   - Settle is idempotent: a settled id is no longer pending, so a second
//     Settle of it (a retry) finds nothing and changes nothing.
//
// So a window holds at most Limit units plus the overage of the
// settlements of reservations made in it: each admission (an estimate, or
// hits) was checked against every unit then counted in the window ending
// at it, a settlement to less only lowers what it checked, and the
// overage is all that was added without a check. With actual ≤ estimate,
// at most Limit. Only
// SlidingLog keys take reservations. Pending reservations travel in
// KeyState.Reservations, so a key's copy or handoff keeps them.

// reservation is one pending reservation: n units recorded at ts (the
// key's clock, rounded as the log rounds) under id.
type reservation struct {
	id    uint64
	ts, n int64
}

// MaxPendingReservations bounds one key's pending reservations: a Reserve
// beyond it is refused with ErrInvalidReservation, changing nothing.
const MaxPendingReservations = 4096

// maxSettle bounds Settle's actual cost, so no sum of counts wraps (merge
// keeps at most mergeKeep units).
const maxSettle = mergeKeep / 4

// Settlement is the outcome of Settle.
type Settlement struct {
	// Decision is the key's state after the settlement: Allowed reports
	// whether a pending reservation was settled; Remaining and ResetAfter
	// are as in Allow.
	Decision
	// Estimate is the settled reservation's estimate (0 when none was
	// pending).
	Estimate int64
	// Overage is actual − Estimate when positive: units recorded that
	// were never admitted, so the windows holding the reservation's
	// instant may hold Limit + Overage.
	Overage int64
}

// pending is a key's pending reservations, oldest first.
type pending struct {
	l []reservation
}

func (q *pending) expire(cutoff int64) {
	i := 0
	for i < len(q.l) && q.l[i].ts <= cutoff {
		i++
	}
	if i > 0 {
		q.l = slices.Delete(q.l, 0, i)
	}
}

func (q *pending) find(id uint64) int {
	for i := range q.l {
		if q.l[i].id == id {
			return i
		}
	}
	return -1
}

// Reserve admits hits units of key under p at now, as Allow does, and on
// admission records them as reservation id, pending until Settle or until
// they expire. Over limit is Allowed == false with a nil error, and
// records nothing. id must not be zero nor pending for the key, and the
// key may have at most MaxPendingReservations pending
// (ErrInvalidReservation: nothing changes). Only SlidingLog policies take
// reservations (else ErrWrongAlgorithm). Other errors are Allow's.
func (s *Store) Reserve(key Key, p Policy, hits int64, id uint64, now time.Time) (Decision, error) {
	var buf [MaxEncodedKeyLen]byte
	ek, err := reserveKey(key, &p, buf[:0])
	if err != nil {
		return Decision{}, err
	}
	if err := checkAllow(&p, hits); err != nil {
		return Decision{}, err
	}
	if id == 0 {
		return Decision{}, fmt.Errorf("%w: reservation id 0 is reserved", ErrInvalidReservation)
	}
	t := now.UnixNano()
	st := s.stripeFor(ek)
	st.mu.Lock()
	defer st.mu.Unlock()
	e, err := s.entryLocked(st, ek, p.Algorithm, t)
	if err != nil {
		return Decision{}, err
	}
	l := e.lim.(*slidingLog)
	at := max(e.last, t)
	if l.pend != nil {
		l.pend.expire(satSub(at, int64(p.Window)))
		if l.pend.find(id) >= 0 {
			return Decision{}, fmt.Errorf("%w: id %d is pending", ErrInvalidReservation, id)
		}
		if len(l.pend.l) >= MaxPendingReservations {
			return Decision{}, fmt.Errorf("%w: %d reservations of this key are pending; settle some", ErrInvalidReservation, len(l.pend.l))
		}
	}
	e.last = at
	e.window = p.Window
	var d Decision
	l.allow(at, p, hits, &d)
	if d.Allowed {
		if l.pend == nil {
			l.pend = &pending{}
		}
		// allow recorded the units in the newest run (now's slot, or a
		// later run they joined).
		l.pend.l = append(l.pend.l, reservation{id: id, ts: l.at(l.size - 1).ts, n: hits})
	}
	s.accountLocked(e)
	return d, nil
}

// Settle replaces pending reservation id's estimate with actual (≥ 0, at
// most 2^60) at the reservation's instant (see the reservation rules),
// and reports what it did. An id that is not pending (settled already,
// expired a Window after it was made, lost with a Delete, or never made)
// is Allowed == false with a nil error and changes nothing. now is
// clamped per key as in Allow. A policy of another algorithm is
// ErrWrongAlgorithm; invalid key, policy or actual return an error and
// change nothing.
func (s *Store) Settle(key Key, p Policy, id uint64, actual int64, now time.Time) (Settlement, error) {
	var buf [MaxEncodedKeyLen]byte
	ek, err := reserveKey(key, &p, buf[:0])
	if err != nil {
		return Settlement{}, err
	}
	if actual < 0 || actual > maxSettle {
		return Settlement{}, fmt.Errorf("%w: actual cost %d must be between 0 and %d", ErrInvalidHits, actual, int64(maxSettle))
	}
	t := now.UnixNano()
	st := s.stripeFor(ek)
	st.mu.Lock()
	defer st.mu.Unlock()
	e := st.m[string(ek)]
	if e == nil || e.alg != p.Algorithm {
		return Settlement{Decision: Decision{Limit: p.Limit, Remaining: p.Limit}}, nil
	}
	e.last = max(e.last, t)
	e.window = p.Window
	l := e.lim.(*slidingLog)
	w := int64(p.Window)
	skip, _ := l.expired(satSub(e.last, w))
	l.drop(skip)
	var out Settlement
	if l.pend != nil {
		l.pend.expire(satSub(e.last, w))
		if i := l.pend.find(id); i >= 0 {
			r := l.pend.l[i]
			l.pend.l = slices.Delete(l.pend.l, i, i+1)
			l.adjust(r.ts, actual-r.n)
			out.Allowed, out.Estimate, out.Overage = true, r.n, max(actual-r.n, 0)
		}
		if len(l.pend.l) == 0 {
			l.pend = nil
		}
	}
	out.Limit = p.Limit
	out.Remaining = max(p.Limit-l.count-l.grantUnits(satSub(e.last, w)), 0)
	if l.size > 0 {
		out.ResetAfter = expiresIn(l.at(l.size-1).ts, w, e.last)
	}
	s.accountLocked(e)
	return out, nil
}

// reserveKey validates key and p for Reserve and Settle and appends key's
// encoding to buf.
func reserveKey(key Key, p *Policy, buf []byte) ([]byte, error) {
	ek, ok := key.AppendEncoded(buf)
	if !ok {
		return nil, key.Validate()
	}
	if !p.valid() {
		return nil, p.Validate()
	}
	if p.Algorithm != SlidingLog {
		return nil, fmt.Errorf("%w: reservations need a sliding_log policy, not %v", ErrWrongAlgorithm, p.Algorithm)
	}
	return ek, nil
}

// adjust adds delta units (negative: removes up to −delta) to the run at
// ts, inserting one for a positive delta when none is there (its units
// were refunded). A negative delta finding no run there (refunded, or
// trimmed by a merge) removes nothing: that can only refuse more.
func (l *slidingLog) adjust(ts, delta int64) {
	if delta == 0 {
		return
	}
	i := l.size - 1
	for i >= 0 && l.at(i).ts > ts {
		i--
	}
	if i >= 0 && l.at(i).ts == ts {
		r := l.at(i)
		if delta < 0 {
			delta = -min(-delta, r.n)
		}
		r.n += delta
		l.count += delta
		if r.n == 0 {
			all := l.runs()
			l.rebuild(slices.Delete(all, i, i+1))
		}
		return
	}
	if delta > 0 {
		l.rebuild(slices.Insert(l.runs(), i+1, run{ts: ts, n: delta}))
	}
}

// runs returns the log's runs in order, in a new slice.
func (l *slidingLog) runs() []run {
	all := make([]run, l.size, l.size+1)
	for k := range all {
		all[k] = *l.at(k)
	}
	return all
}

// rebuild replaces the log's runs with all, which are in timestamp order.
func (l *slidingLog) rebuild(all []run) {
	l.buf, l.head, l.size, l.count = nil, 0, 0, 0
	for _, r := range all {
		if l.size == len(l.buf) {
			l.grow()
		}
		l.buf[l.size] = r
		l.size++
		l.count += r.n
	}
}

// exportPending returns the pending reservations as runs (Age relative to
// now, Count the estimate, ID the reservation), oldest first.
func (l *slidingLog) exportPending(out []Run, now int64) []Run {
	if l.pend == nil || len(l.pend.l) == 0 {
		return out
	}
	out = slices.Grow(out, len(l.pend.l))
	for _, r := range l.pend.l {
		out = append(out, Run{Age: time.Duration(satSub(now, r.ts)), Count: r.n, ID: r.id})
	}
	return out
}

// mergePending folds imported pending reservations in: an id already
// pending here keeps its record; expired ones are dropped; beyond
// MaxPendingReservations the oldest go (charged their estimate).
func (l *slidingLog) mergePending(now int64, rs []Run, p Policy) {
	if len(rs) == 0 {
		return
	}
	if l.pend == nil {
		l.pend = &pending{}
	}
	cutoff := satSub(now, int64(p.Window))
	for _, r := range rs {
		ts := satSub(now, int64(r.Age))
		if ts > cutoff && l.pend.find(r.ID) < 0 {
			l.pend.l = append(l.pend.l, reservation{id: r.ID, ts: ts, n: r.Count})
		}
	}
	slices.SortStableFunc(l.pend.l, func(a, b reservation) int {
		switch {
		case a.ts < b.ts:
			return -1
		case a.ts > b.ts:
			return 1
		}
		return 0
	})
	l.pend.expire(cutoff)
	if k := len(l.pend.l) - MaxPendingReservations; k > 0 {
		l.pend.l = slices.Delete(l.pend.l, 0, k)
	}
	if len(l.pend.l) == 0 {
		l.pend = nil
	}
}
