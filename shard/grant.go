package shard

import (
	"fmt"
	"slices"
	"time"
	"unsafe"
)

// Rights: a hot key spread over many deciders and still exact (escrow, as
// in the demarcation protocol). The key's holder grants a node n rights
// for a lease of length T; the node then admits up to n units during the
// lease without asking anyone. The accounting rule, on the holder's
// clock:
//
//   - a grant made at g with lease T counts its n units as admitted at
//     every instant of [g, g+T]: every window (t−W, t] with
//     g ≤ t < g+T+W counts all n, so the grant holds its slots until
//     g+T+W (its charge);
//   - the grantee uses rights only inside the lease, measured on its own
//     clock from before it asked (with the clock-rate margin), so every
//     use lies in [g, g+T] on the holder's clock;
//   - the grantee may end a grant early by reporting its uses as ages
//     (Return): each use is recorded in the log at the holder's now minus
//     its age, which is no earlier than when it happened (the age was
//     taken before the report travelled), and the unused rights are
//     freed. At most n uses are recorded.
//
// Why every window holds at most Limit: a window's admissions are the
// log's runs in it plus uses of grants; a grant's uses in the window are
// at most n, and the grant is charged n in every window that can hold
// one of them (a use at u ≤ g+T is in (t−W, t] only for t < u+W ≤ g+T+W).
// Once reported, a use is a run at a time no earlier than it happened, so
// every later window that held it still counts it. What a key counts at t
// (live runs plus live charges) only grows when a unit is admitted or a
// grant made, and each of those is checked against Limit first; between
// them it only falls. So the charge never exceeds Limit, and the real
// admissions in any window never exceed the charge.
//
// Sharing: a grant takes at most half of the spare units (rounded up), so
// the holder's own decisions and other nodes' grants always find the
// rest; a key holds at most MaxGrants outstanding grants.
//
// Grants travel in KeyState.Grants (Age is the age of the lease's end,
// negative while the lease runs), so a copy or a handoff keeps charging
// them and a takeover's new holder counts them until they expire.

// grant is one outstanding grant: n rights whose lease ends at until (the
// key's clock), made at from.
type grant struct {
	id          uint64
	from, until int64
	n           int64
}

// grants is a key's outstanding grants, by lease end.
type grants struct {
	l     []grant
	units int64
}

// MaxGrants bounds a key's outstanding grants; a grant beyond it is
// refused (Granted 0), changing nothing.
const MaxGrants = 64

// MaxGrantLease bounds a grant's lease.
const MaxGrantLease = time.Hour

// maxUseRuns bounds the runs one Return records.
const maxUseRuns = 4096

// live returns the units of the grants still charged after cutoff (now −
// W): a grant is charged while until > cutoff.
func (g *grants) live(cutoff int64) int64 {
	u := g.units
	for i := range g.l {
		if g.l[i].until > cutoff {
			break
		}
		u -= g.l[i].n
	}
	return u
}

// expire drops the grants no longer charged.
func (g *grants) expire(cutoff int64) {
	i := 0
	for i < len(g.l) && g.l[i].until <= cutoff {
		g.units -= g.l[i].n
		i++
	}
	if i > 0 {
		g.l = slices.Delete(g.l, 0, i)
	}
}

func (g *grants) find(id uint64) int {
	for i := range g.l {
		if g.l[i].id == id {
			return i
		}
	}
	return -1
}

func (g *grants) add(r grant) {
	i, _ := slices.BinarySearchFunc(g.l, r.until, func(a grant, t int64) int {
		if a.until <= t {
			return -1
		}
		return 1
	})
	g.l = slices.Insert(g.l, i, r)
	g.units += r.n
}

// grantUnits is the units l's grants charge after cutoff.
func (l *slidingLog) grantUnits(cutoff int64) int64 {
	if l.gr == nil {
		return 0
	}
	return l.gr.live(cutoff)
}

// GrantResult is the outcome of Grant.
type GrantResult struct {
	// Decision is the key's state after the grant: Allowed reports
	// whether any right was granted; Remaining is the spare units left;
	// RetryAfter, when none was, is when units free.
	Decision
	// Granted is the rights granted, at most the request.
	Granted int64
	// Until is the lease's end on the key's clock.
	Until time.Time
}

// Grant grants up to want rights of key under p at now for a lease of
// length lease (see the rights rules), as grant id. It grants at most
// half the spare units (rounded up); with no spare unit, or MaxGrants
// outstanding, it grants none (Allowed false, a nil error). id must not
// be zero nor outstanding, want must be 1..Limit, lease 1 ns..MaxGrantLease
// (ErrInvalidReservation or ErrInvalidHits: nothing changes). Only
// SlidingLog policies take grants (ErrWrongAlgorithm).
func (s *Store) Grant(key Key, p Policy, want int64, lease time.Duration, id uint64, now time.Time) (GrantResult, error) {
	var buf [MaxEncodedKeyLen]byte
	ek, err := reserveKey(key, &p, buf[:0])
	if err != nil {
		return GrantResult{}, err
	}
	if err := checkAllow(&p, want); err != nil {
		return GrantResult{}, err
	}
	if id == 0 {
		return GrantResult{}, fmt.Errorf("%w: grant id 0 is reserved", ErrInvalidReservation)
	}
	if lease <= 0 || lease > MaxGrantLease {
		return GrantResult{}, fmt.Errorf("%w: lease %v must be in (0, %v]", ErrInvalidReservation, lease, MaxGrantLease)
	}
	t := now.UnixNano()
	st := s.stripeFor(ek)
	st.mu.Lock()
	defer st.mu.Unlock()
	e, err := s.entryLocked(st, ek, p.Algorithm, t)
	if err != nil {
		return GrantResult{}, err
	}
	l := e.lim.(*slidingLog)
	at := max(e.last, t)
	w := int64(p.Window)
	cutoff := satSub(at, w)
	if l.gr != nil {
		l.gr.expire(cutoff)
		if l.gr.find(id) >= 0 {
			return GrantResult{}, fmt.Errorf("%w: grant %d is outstanding", ErrInvalidReservation, id)
		}
	}
	e.last = at
	e.window = p.Window
	skip, _ := l.expired(cutoff)
	l.drop(skip)
	spare := p.Limit - l.count - l.grantUnits(cutoff)
	var out GrantResult
	out.Limit = p.Limit
	if spare > 0 && (l.gr == nil || len(l.gr.l) < MaxGrants) {
		n := min(want, spare-spare/2)
		if l.gr == nil {
			l.gr = &grants{}
		}
		until := satAdd(at, int64(lease))
		l.gr.add(grant{id: id, from: at, until: until, n: n})
		out.Allowed, out.Granted, out.Until = true, n, time.Unix(0, until)
		spare -= n
	} else if spare <= 0 {
		var d Decision
		l.decide(at, p, 1, &d)
		out.RetryAfter = d.RetryAfter
	} else {
		out.RetryAfter = time.Duration(satSub(l.gr.l[0].until+w, at))
	}
	out.Remaining = max(spare, 0)
	out.ResetAfter = l.resetAfter(at, w)
	s.accountLocked(e)
	return out, nil
}

// ReturnResult is the outcome of Return.
type ReturnResult struct {
	// Found reports whether the grant was outstanding.
	Found bool
	// Granted, Used and Unused are the grant's rights, the uses recorded
	// and the rights freed (Granted − Used).
	Granted, Used, Unused int64
	// Remaining is the spare units after the return.
	Remaining int64
}

// Return ends grant id of key: uses (Age from now, at most the grant's
// rights in all, the rest ignored) are recorded in the log at now − Age,
// no later than now, and the grant's charge ends. A grant not
// outstanding (returned already, expired, never made) is Found false and
// changes nothing, so a retried Return is harmless. More than 4096 uses
// is ErrInvalidState.
func (s *Store) Return(key Key, p Policy, id uint64, uses []Run, now time.Time) (ReturnResult, error) {
	var buf [MaxEncodedKeyLen]byte
	ek, err := reserveKey(key, &p, buf[:0])
	if err != nil {
		return ReturnResult{}, err
	}
	if len(uses) > maxUseRuns {
		return ReturnResult{}, fmt.Errorf("%w: %d uses, at most %d", ErrInvalidState, len(uses), maxUseRuns)
	}
	for i, u := range uses {
		if u.Count < 0 {
			return ReturnResult{}, fmt.Errorf("%w: use %d has count %d", ErrInvalidState, i, u.Count)
		}
	}
	t := now.UnixNano()
	st := s.stripeFor(ek)
	st.mu.Lock()
	defer st.mu.Unlock()
	e := st.m[string(ek)]
	if e == nil || e.alg != p.Algorithm {
		return ReturnResult{Remaining: p.Limit}, nil
	}
	e.last = max(e.last, t)
	e.window = p.Window
	l := e.lim.(*slidingLog)
	w := int64(p.Window)
	cutoff := satSub(e.last, w)
	var out ReturnResult
	if l.gr != nil {
		l.gr.expire(cutoff)
		if i := l.gr.find(id); i >= 0 {
			g := l.gr.l[i]
			l.gr.l = slices.Delete(l.gr.l, i, i+1)
			l.gr.units -= g.n
			if len(l.gr.l) == 0 {
				l.gr = nil
			}
			out.Found, out.Granted = true, g.n
			runs := make([]Run, 0, len(uses))
			left := g.n
			for _, u := range uses {
				c := min(u.Count, left)
				if c == 0 {
					continue
				}
				left -= c
				ts := min(max(satSub(e.last, int64(u.Age)), g.from), e.last)
				runs = append(runs, Run{Age: time.Duration(e.last - roundUp(ts, p.resolution())), Count: c})
			}
			out.Used, out.Unused = g.n-left, left
			slices.SortStableFunc(runs, func(a, b Run) int {
				switch {
				case a.Age > b.Age:
					return -1
				case a.Age < b.Age:
					return 1
				}
				return 0
			})
			if len(runs) > 0 {
				l.mergeAll(e.last, runs, p)
			}
		}
	}
	skip, _ := l.expired(cutoff)
	l.drop(skip)
	out.Remaining = max(p.Limit-l.count-l.grantUnits(cutoff), 0)
	s.accountLocked(e)
	return out, nil
}

// resetAfter is when l holds nothing, from now: its newest run's or
// grant's expiry.
func (l *slidingLog) resetAfter(now, w int64) time.Duration {
	var d time.Duration
	if l.size > 0 {
		d = expiresIn(l.at(l.size-1).ts, w, now)
	}
	if l.gr != nil && len(l.gr.l) > 0 {
		d = max(d, expiresIn(l.gr.l[len(l.gr.l)-1].until, w, now))
	}
	return d
}

// exportGrants returns the outstanding grants as runs: Age is now minus
// the lease's end (negative while it runs), Count the rights, ID the
// grant.
func (l *slidingLog) exportGrants(out []Run, now int64) []Run {
	if l.gr == nil || len(l.gr.l) == 0 {
		return out
	}
	out = slices.Grow(out, len(l.gr.l))
	for _, g := range l.gr.l {
		out = append(out, Run{Age: time.Duration(satSub(now, g.until)), Count: g.n, ID: g.id})
	}
	return out
}

// mergeGrants folds imported grants in: an id already outstanding here
// keeps its record; expired ones are dropped; all others are kept, even
// beyond MaxGrants (which limits new grants only), so no charge is lost.
func (l *slidingLog) mergeGrants(now int64, gs []Run, p Policy) {
	if len(gs) == 0 {
		return
	}
	if l.gr == nil {
		l.gr = &grants{}
	}
	cutoff := satSub(now, int64(p.Window))
	for _, r := range gs {
		until := satSub(now, int64(r.Age))
		if until > cutoff && l.gr.find(r.ID) < 0 {
			// The lease's start is unknown here: uses are placed no
			// earlier than a lease before its end.
			l.gr.add(grant{id: r.ID, from: satSub(until, int64(MaxGrantLease)), until: until, n: r.Count})
		}
	}
	if len(l.gr.l) == 0 {
		l.gr = nil
	}
}

func (g *grants) bytes() int64 {
	if g == nil {
		return 0
	}
	return int64(cap(g.l))*int64(unsafe.Sizeof(grant{})) + int64(unsafe.Sizeof(*g))
}

// retryWithGrants is decide's RetryAfter when grants are charged: when
// need units have freed, runs (from skip, freeing at ts + W) and live
// grants (freeing at until + W) merged by the time they free.
func (l *slidingLog) retryWithGrants(skip int, cutoff, need, w, now int64) time.Duration {
	gs := l.gr.l
	j := 0
	for j < len(gs) && gs[j].until <= cutoff {
		j++
	}
	var freed int64
	i := skip
	for i < l.size || j < len(gs) {
		var at int64
		if j >= len(gs) || (i < l.size && l.at(i).ts <= gs[j].until) {
			at = l.at(i).ts
			freed += l.at(i).n
			i++
		} else {
			at = gs[j].until
			freed += gs[j].n
			j++
		}
		if freed >= need {
			return expiresIn(at, w, now)
		}
	}
	return 0
}
