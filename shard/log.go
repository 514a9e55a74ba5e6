package shard

import (
	"math/bits"
	"slices"
	"time"
	"unsafe"
)

// run is count admissions recorded at timestamp ts (ns, rounded up to the
// policy resolution).
type run struct {
	ts, n int64
}

// slidingLog is the exact rolling-window log: runs in timestamp order in a
// circular buffer whose capacity is a power of two. Each run enters and
// leaves once, so a decision is amortised O(1); one decision may drop many
// expired runs.
type slidingLog struct {
	buf   []run
	head  int   // index of the oldest run
	size  int   // number of runs
	count int64 // units across all runs
	// pend is the key's pending reservations (reserve.go); nil for none.
	pend *pending
	// gr is the key's outstanding grants of rights (grant.go); nil for
	// none.
	gr *grants
}

func (l *slidingLog) at(i int) *run { return &l.buf[(l.head+i)&(len(l.buf)-1)] }

// expired returns how many of the oldest runs have ts <= cutoff, and the
// units they hold: an admission exactly W old has expired.
// It changes nothing, so peek can use it.
func (l *slidingLog) expired(cutoff int64) (runs int, units int64) {
	for runs < l.size {
		r := l.at(runs)
		if r.ts > cutoff {
			break
		}
		units += r.n
		runs++
	}
	return runs, units
}

// drop removes the n oldest runs.
func (l *slidingLog) drop(n int) {
	for ; n > 0; n-- {
		l.count -= l.buf[l.head].n
		l.head = (l.head + 1) & (len(l.buf) - 1)
		l.size--
	}
	if l.size == 0 {
		l.head = 0
	}
}

func (l *slidingLog) push(ts, n int64) {
	if l.size > 0 {
		if last := l.at(l.size - 1); last.ts >= ts {
			// Equal timestamps share a run; the count keeps them distinct.
			// An earlier ts (the resolution changed, or imported runs were
			// rounded on another grid) joins the last run too: recording
			// later only expires later, and the log stays in order, which
			// expire, RetryAfter and ResetAfter rely on.
			last.n += n
			l.count += n
			return
		}
	}
	if l.size == len(l.buf) {
		l.grow()
	}
	l.buf[(l.head+l.size)&(len(l.buf)-1)] = run{ts: ts, n: n}
	l.size++
	l.count += n
}

func (l *slidingLog) grow() {
	c := 2 * len(l.buf)
	if c == 0 {
		c = 2
	}
	nb := make([]run, c)
	for i := 0; i < l.size; i++ {
		nb[i] = *l.at(i)
	}
	l.buf, l.head = nb, 0
}

func roundUp(t, res int64) int64 {
	r := t % res
	if r == 0 {
		return t
	}
	if r < 0 {
		return t - r
	}
	return satAdd(t-r, res) // within res of MaxInt64: "never" expires
}

// expiresIn is the time from now until an admission recorded at ts expires:
// ts + w − now, saturated.
func expiresIn(ts, w, now int64) time.Duration { return time.Duration(satAdd(satSub(ts, now), w)) }

// decide writes the decision allow would make at now to *d and returns how
// many of the oldest runs have expired and, when it admits, now's slot
// (now rounded up to the resolution, where allow records the admission:
// computed once, as it takes a division), changing nothing. The log never
// holds more than keepUnits(p) units (allow checks before it records,
// merge trims), so Limit − count cannot overflow and count + hits is never
// computed: with limits above 2^62 it would wrap and admit.
func (l *slidingLog) decide(now int64, p Policy, hits int64, d *Decision) (skip int, slot int64) {
	w := int64(p.Window)
	cutoff := satSub(now, w)
	skip, gone := l.expired(cutoff)
	count := l.count - gone
	if l.gr != nil {
		// Outstanding grants are charged as admissions (grant.go).
		count += l.gr.live(cutoff)
	}
	*d = Decision{Limit: p.Limit}
	if hits <= p.Limit-count {
		// push joins the last run if it is not older than now's slot.
		slot = roundUp(now, p.resolution())
		last := slot
		if skip < l.size {
			last = max(last, l.at(l.size-1).ts)
		}
		d.Allowed = true
		d.Remaining = p.Limit - count - hits
		d.ResetAfter = expiresIn(last, w, now)
		return skip, slot
	}
	d.Remaining = max(p.Limit-count, 0)
	// The request fits once the oldest runs holding need = count + hits − L
	// units have expired; the run that completes need expires at its ts + W.
	// need is written so that nothing overflows: L − hits >= 0, count >= 0.
	need := count - (p.Limit - hits)
	if l.gr != nil {
		d.RetryAfter = l.retryWithGrants(skip, cutoff, need, w, now)
		d.ResetAfter = l.resetAfter(now, w)
		return skip, 0
	}
	var freed int64
	for i := skip; i < l.size; i++ {
		r := l.at(i)
		freed += r.n
		if freed >= need {
			d.RetryAfter = expiresIn(r.ts, w, now)
			break
		}
	}
	// Refused means count > L − hits >= 0, so a live run exists.
	d.ResetAfter = expiresIn(l.at(l.size-1).ts, w, now)
	return skip, 0
}

func (l *slidingLog) allow(now int64, p Policy, hits int64, d *Decision) {
	skip, slot := l.decide(now, p, hits, d)
	l.drop(skip)
	if l.gr != nil {
		if l.gr.expire(satSub(now, int64(p.Window))); len(l.gr.l) == 0 {
			l.gr = nil
		}
	}
	if d.Allowed {
		l.push(slot, hits)
	}
}

func (l *slidingLog) peek(now int64, p Policy, hits int64) Decision {
	var d Decision
	l.decide(now, p, hits, &d)
	return d
}

// refund removes up to hits live units from the newest runs.
func (l *slidingLog) refund(now int64, p Policy, hits int64) Decision {
	w := int64(p.Window)
	skip, _ := l.expired(satSub(now, w))
	l.drop(skip)
	d := Decision{Limit: p.Limit}
	for hits > 0 && l.size > 0 {
		last := l.at(l.size - 1)
		take := min(hits, last.n)
		last.n -= take
		l.count -= take
		hits -= take
		d.Allowed = true
		if last.n == 0 {
			l.size--
		}
	}
	if l.size == 0 {
		l.head = 0
	} else {
		d.ResetAfter = expiresIn(l.at(l.size-1).ts, w, now)
	}
	d.Remaining = max(p.Limit-l.count-l.grantUnits(satSub(now, w)), 0)
	return d
}

func (l *slidingLog) idleAt(window int64) int64 {
	at := int64(minTime)
	if l.gr != nil && len(l.gr.l) > 0 {
		at = satAdd(l.gr.l[len(l.gr.l)-1].until, window)
	}
	if l.size == 0 {
		return at
	}
	// Saturated: with a long window and a late ts the sum would wrap
	// negative and Sweep would drop a key that still holds admissions.
	return max(at, satAdd(l.at(l.size-1).ts, window))
}

func (l *slidingLog) export(out []Run, now int64) []Run {
	out = slices.Grow(out, l.size)
	for i := range l.size {
		r := l.at(i)
		out = append(out, Run{Age: time.Duration(satSub(now, r.ts)), Count: r.n})
	}
	return out
}

// merge folds imported runs into the log: two timestamp-ordered sequences,
// equal timestamps adding up, expired runs dropped. Both sides' admissions
// stay counted, which can only refuse more, never admit more. The result is
// then trimmed to the newest runs holding keepUnits(p) units (the oldest of
// them cut down to what completes it). Trimming changes no decision under
// this policy or a lower limit: while those newer runs are live every
// request is refused, whatever older runs hold; RetryAfter is where freed
// >= count + hits − L, and removing d older units lowers both sides by d;
// ResetAfter depends on the newest run only. It does not trim to Limit:
// the sender may have counted under a higher limit (a policy change
// rolling out, the receiver still on the old table), and a log trimmed to
// the old limit would let the new one admit those units again. The bound
// keeps every sum of counts from wrapping however many states are
// imported.
func (l *slidingLog) merge(now int64, runs []Run, p Policy) {
	if len(runs) == 0 {
		return
	}
	cutoff := satSub(now, int64(p.Window))
	if len(runs) == 1 {
		// The backup's common case, one admission newer than the log:
		// dropping the expired runs and pushing it is what the merge
		// below computes when nothing needs trimming, without rebuilding
		// the buffer.
		ts, n := satSub(now, int64(runs[0].Age)), runs[0].Count
		skip, gone := l.expired(cutoff)
		if ts > cutoff && (skip == l.size || l.at(l.size-1).ts <= ts) && n <= keepUnits(p)-(l.count-gone) {
			l.drop(skip)
			l.push(ts, n)
			return
		}
	}
	l.mergeAll(now, runs, p)
}

// mergeKeep bounds the units an imported state keeps beyond its policy's
// Limit: far above any real count, low enough that Limit − count and the
// sums decide computes never wrap.
const mergeKeep = 1 << 62

// keepUnits is how many units merge keeps under p: every unit a sender
// counted (up to mergeKeep), or Limit when that is larger.
func keepUnits(p Policy) int64 { return max(p.Limit, mergeKeep) }

// mergeAll is merge's general case.
func (l *slidingLog) mergeAll(now int64, runs []Run, p Policy) {
	cutoff := satSub(now, int64(p.Window))
	all := make([]run, 0, l.size+len(runs))
	i, j := 0, 0
	for i < l.size || j < len(runs) {
		var r run
		if j < len(runs) {
			r = run{ts: satSub(now, int64(runs[j].Age)), n: runs[j].Count}
		}
		if j >= len(runs) || (i < l.size && l.at(i).ts <= r.ts) {
			r = *l.at(i)
			i++
		} else {
			j++
		}
		if r.ts > cutoff {
			all = append(all, r)
		}
	}
	var units int64
	keep := keepUnits(p)
	k := len(all)
	for k > 0 && units < keep {
		k--
		all[k].n = min(all[k].n, keep-units)
		units += all[k].n
	}
	l.buf, l.head, l.size, l.count = nil, 0, 0, 0
	for _, r := range all[k:] {
		l.push(r.ts, r.n)
	}
}

func (l *slidingLog) bytes() int64 {
	n := int64(len(l.buf)) * int64(unsafe.Sizeof(run{}))
	if l.pend != nil {
		n += int64(cap(l.pend.l)) * int64(unsafe.Sizeof(reservation{}))
	}
	return n + l.gr.bytes()
}

// gcra is the token bucket as the generic cell rate algorithm. The
// theoretical arrival time of the next unit is base + debt + frac/den ns
// (den is the limit the fraction was computed for); the bucket is full when
// it is <= now. Each unit costs exactly W/L: keeping the fraction lets a
// burst of L fit and keeps Remaining and RetryAfter exact when L does not
// divide W.
//
// The arrival time is kept relative to base (the time of the last change,
// never in the future) rather than as an absolute time: it lies up to a
// window ahead of now, and near the end of int64 time (year 2262, within
// 2·MaxWindow) an absolute one would have to wrap or saturate, and a
// saturated one would admit. debt only ever compares with W, and saturates
// at "never".
type gcra struct {
	base, debt, frac, den int64
}

// ceilDebt is debt + frac/den rounded up to a whole ns.
func ceilDebt(debt, frac int64) int64 {
	if frac > 0 {
		return satAdd(debt, 1)
	}
	return debt
}

// at returns the debt and fraction left at now (>= base), for den ==
// p.Limit: a limit change rounds the old fraction up (never adds quota).
func (g *gcra) at(now int64, p Policy) (debt, frac int64) {
	debt, frac = g.debt, g.frac
	if debt == 0 && frac == 0 {
		return 0, 0 // full (or fresh), whatever base is
	}
	if g.den != p.Limit {
		debt, frac = ceilDebt(debt, frac), 0
	}
	// The bucket is full once base + debt + frac/L <= now.
	elapsed := satSub(now, g.base)
	if debt < elapsed || (debt == elapsed && frac == 0) {
		return 0, 0
	}
	return debt - elapsed, frac
}

// decide writes the decision allow would make at now to *d and returns,
// if it admits, the new debt, changing nothing.
func (g *gcra) decide(now int64, p Policy, hits int64, d *Decision) (newDebt, newFrac int64) {
	w := int64(p.Window)
	debt, frac := g.at(now, p)
	// newDebt = debt + (hits·W + frac)/L, exactly, as whole ns plus
	// remainder. hits <= L and frac < L, so the quotient is at most W.
	hi, lo := bits.Mul64(uint64(hits), uint64(w))
	lo, carry := bits.Add64(lo, uint64(frac), 0)
	q, r := bits.Div64(hi+carry, lo, uint64(p.Limit))
	newDebt, newFrac = satAdd(debt, int64(q)), int64(r)
	*d = Decision{Limit: p.Limit}
	// Admit iff the new arrival time minus W is not after now.
	if over := ceilDebt(newDebt, newFrac) - w; over > 0 {
		d.RetryAfter = time.Duration(over)
		d.Remaining = remainingGCRA(debt, frac, p)
		d.ResetAfter = time.Duration(ceilDebt(debt, frac))
		return 0, 0
	}
	d.Allowed = true
	d.Remaining = remainingGCRA(newDebt, newFrac, p)
	d.ResetAfter = time.Duration(ceilDebt(newDebt, newFrac))
	return newDebt, newFrac
}

func (g *gcra) allow(now int64, p Policy, hits int64, d *Decision) {
	debt, frac := g.decide(now, p, hits, d)
	if d.Allowed {
		g.base, g.debt, g.frac, g.den = now, debt, frac, p.Limit
	}
}

func (g *gcra) peek(now int64, p Policy, hits int64) Decision {
	var d Decision
	g.decide(now, p, hits, &d)
	return d
}

// refund moves the theoretical arrival time back by hits·W/L, exactly, but
// never before now: a full bucket holds Limit units and no more.
func (g *gcra) refund(now int64, p Policy, hits int64) Decision {
	w, lim := int64(p.Window), p.Limit
	debt, frac := g.at(now, p)
	d := Decision{Limit: lim, Remaining: lim}
	if debt == 0 && frac == 0 {
		return d // full: nothing admitted still counts
	}
	// back = hits·W/L as whole ns plus r2/L. hits may exceed L, so split it:
	// (q1·L + r1)·W/L = q1·W + r1·W/L; the first part saturates, the second
	// is below W.
	q1, r1 := hits/lim, hits%lim
	hi, lo := bits.Mul64(uint64(r1), uint64(w))
	q2, r2 := bits.Div64(hi, lo, uint64(lim))
	back := satAdd(satMul(q1, w), int64(q2))
	if back > debt || (back == debt && int64(r2) >= frac) {
		debt, frac = 0, 0
	} else {
		debt, frac = debt-back, frac-int64(r2)
		if frac < 0 {
			debt, frac = debt-1, frac+lim
		}
	}
	d.Allowed = true
	g.base, g.debt, g.frac, g.den = now, debt, frac, lim
	d.Remaining = remainingGCRA(debt, frac, p)
	d.ResetAfter = time.Duration(ceilDebt(debt, frac))
	return d
}

// remainingGCRA is the number of units n that fit with debt + frac/L
// outstanding: floor((W − debt − frac/L)·L/W), at most L.
func remainingGCRA(debt, frac int64, p Policy) int64 {
	free := int64(p.Window) - debt
	if free <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(free), uint64(p.Limit))
	lo, borrow := bits.Sub64(lo, uint64(frac), 0)
	q, _ := bits.Div64(hi-borrow, lo, uint64(p.Window))
	return min(int64(q), p.Limit)
}

func (g *gcra) idleAt(int64) int64 {
	if g.debt == 0 && g.frac == 0 {
		return minTime
	}
	return satAdd(g.base, ceilDebt(g.debt, g.frac))
}

func (g *gcra) export(dst []Run, now int64) []Run {
	// Age is now minus the arrival time; the fraction is rounded up, so the
	// receiver refills no earlier.
	debt := ceilDebt(g.debt, g.frac)
	return append(dst, Run{Age: time.Duration(satSub(satSub(now, g.base), debt)), Count: 0})
}

func (g *gcra) merge(now int64, runs []Run, p Policy) {
	for _, r := range runs {
		// The imported bucket's used capacity (its arrival time beyond its
		// now) adds to ours: both sides' admissions stay counted.
		debt := satSub(0, int64(r.Age))
		if debt <= 0 {
			continue // that bucket was full
		}
		cur, frac := g.at(now, p)
		g.base, g.debt, g.frac, g.den = now, satAdd(cur, debt), frac, p.Limit
	}
}

func (g *gcra) bytes() int64 { return 0 }

// fixedWindow counts units in the aligned interval starting at start.
type fixedWindow struct {
	start, count int64
}

// decide writes the decision allow would make at now to *d and returns,
// if it admits, the window's new start and count, changing nothing.
func (f *fixedWindow) decide(now int64, p Policy, hits int64, d *Decision) (start, count int64) {
	w := int64(p.Window)
	start, count = f.start, f.count
	if count == 0 || satSub(now, start) >= w {
		// The recorded window has ended: start the aligned one holding now.
		// A window imported from a clock with another offset may be
		// unaligned here; it is kept until it ends, so a handoff never
		// resets a quota early. now%w + w < 2·MaxWindow fits.
		start, count = satSub(now, ((now%w)+w)%w), 0
	}
	*d = Decision{Limit: p.Limit}
	// count <= keepUnits(p) (merge clamps), so Limit − count cannot
	// overflow.
	if hits <= p.Limit-count {
		count += hits
		d.Allowed = true
	} else {
		d.RetryAfter = expiresIn(start, w, now)
	}
	d.Remaining = max(p.Limit-count, 0)
	if count > 0 {
		d.ResetAfter = expiresIn(start, w, now)
	}
	return start, count
}

func (f *fixedWindow) allow(now int64, p Policy, hits int64, d *Decision) {
	start, count := f.decide(now, p, hits, d)
	if d.Allowed {
		f.start, f.count = start, count
	}
}

func (f *fixedWindow) peek(now int64, p Policy, hits int64) Decision {
	var d Decision
	f.decide(now, p, hits, &d)
	return d
}

// refund lowers the current window's count by up to hits, never below zero;
// a window that has ended has nothing to give back.
func (f *fixedWindow) refund(now int64, p Policy, hits int64) Decision {
	w := int64(p.Window)
	d := Decision{Limit: p.Limit, Remaining: p.Limit}
	if f.count == 0 || satSub(now, f.start) >= w {
		return d
	}
	f.count = max(f.count-hits, 0)
	d.Allowed = true
	d.Remaining = max(p.Limit-f.count, 0)
	if f.count > 0 {
		d.ResetAfter = expiresIn(f.start, w, now)
	}
	return d
}

func (f *fixedWindow) idleAt(window int64) int64 {
	if f.count == 0 {
		return minTime
	}
	return satAdd(f.start, window)
}

func (f *fixedWindow) export(dst []Run, now int64) []Run {
	return append(dst, Run{Age: time.Duration(satSub(now, f.start)), Count: f.count})
}

func (f *fixedWindow) merge(now int64, runs []Run, p Policy) {
	w := int64(p.Window)
	for _, r := range runs {
		start := satSub(now, int64(r.Age))
		// A count above Limit refuses exactly what Limit refuses until the
		// window ends. It is kept, not clamped to Limit (the sender may
		// have counted under a higher limit, see slidingLog.merge);
		// clamping to keepUnits keeps Limit − count from overflowing.
		switch {
		case r.Count == 0 || satSub(now, start) >= w:
			// That window has already ended: nothing left to count.
		case f.count == 0 || satSub(now, f.start) >= w:
			f.start, f.count = start, min(r.Count, keepUnits(p))
		default:
			// Both windows are current: keep both counts until the later
			// one ends, which can only refuse more.
			f.start = max(f.start, start)
			f.count = min(satAdd(f.count, r.Count), keepUnits(p))
		}
	}
}

func (f *fixedWindow) bytes() int64 { return 0 }

const minTime = -1 << 63
