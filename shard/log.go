package shard

import (
	"math/bits"
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
}

func (l *slidingLog) at(i int) *run { return &l.buf[(l.head+i)&(len(l.buf)-1)] }

// expire drops runs with ts <= cutoff: an admission exactly W old has
// expired (DESIGN.md §1).
func (l *slidingLog) expire(cutoff int64) {
	for l.size > 0 {
		r := &l.buf[l.head]
		if r.ts > cutoff {
			return
		}
		l.count -= r.n
		l.head = (l.head + 1) & (len(l.buf) - 1)
		l.size--
	}
	l.head = 0
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
	return t - r + res
}

func (l *slidingLog) allow(now int64, p Policy, hits int64) Decision {
	w := int64(p.Window)
	l.expire(now - w)
	d := Decision{Limit: p.Limit}
	if l.count+hits <= p.Limit {
		l.push(roundUp(now, p.resolution()), hits)
		d.Allowed = true
		d.Remaining = p.Limit - l.count
		d.ResetAfter = time.Duration(l.at(l.size-1).ts + w - now)
		return d
	}
	d.Remaining = max(p.Limit-l.count, 0)
	// The request fits once the oldest runs holding need units have expired;
	// the run that completes need expires at its ts + W.
	need := l.count + hits - p.Limit
	var freed int64
	for i := 0; i < l.size; i++ {
		r := l.at(i)
		freed += r.n
		if freed >= need {
			d.RetryAfter = time.Duration(r.ts + w - now)
			break
		}
	}
	d.ResetAfter = time.Duration(l.at(l.size-1).ts + w - now)
	return d
}

func (l *slidingLog) idleAt(window int64) int64 {
	if l.size == 0 {
		return minTime
	}
	return l.at(l.size-1).ts + window
}

func (l *slidingLog) export(now int64) []Run {
	out := make([]Run, l.size)
	for i := range out {
		r := l.at(i)
		out[i] = Run{Age: time.Duration(now - r.ts), Count: r.n}
	}
	return out
}

func (l *slidingLog) merge(now int64, runs []Run, p Policy) {
	if len(runs) == 0 {
		return
	}
	// Merge two timestamp-ordered sequences; equal timestamps add up. The
	// result may hold more than Limit units: that only refuses more, never
	// admits more (the sender's admissions all stay counted).
	old := make([]run, l.size)
	for i := range old {
		old[i] = *l.at(i)
	}
	l.buf, l.head, l.size, l.count = nil, 0, 0, 0
	i, j := 0, 0
	for i < len(old) || j < len(runs) {
		var r run
		if j >= len(runs) || (i < len(old) && old[i].ts <= now-int64(runs[j].Age)) {
			r = old[i]
			i++
		} else {
			r = run{ts: now - int64(runs[j].Age), n: runs[j].Count}
			j++
		}
		l.push(r.ts, r.n)
	}
	l.expire(now - int64(p.Window))
}

func (l *slidingLog) bytes() int64 { return int64(len(l.buf)) * int64(unsafe.Sizeof(run{})) }

// gcra is the token bucket as the generic cell rate algorithm: the
// theoretical arrival time of the next unit is tat + frac/den ns (den is the
// limit the fraction was computed for); the bucket is full when it is <= now.
// Each unit costs exactly W/L: keeping the fraction lets a burst of L fit and
// keeps Remaining and RetryAfter exact when L does not divide W.
type gcra struct {
	tat, frac, den int64
}

// ceilTat is the theoretical arrival time rounded up to a whole ns.
func (g *gcra) ceilTat(tat, frac int64) int64 {
	if frac > 0 {
		return tat + 1
	}
	return tat
}

func (g *gcra) allow(now int64, p Policy, hits int64) Decision {
	w := int64(p.Window)
	if g.den != p.Limit {
		// The limit changed: round the old fraction up (never adds quota).
		g.tat, g.frac, g.den = g.ceilTat(g.tat, g.frac), 0, p.Limit
	}
	tat, frac := g.tat, g.frac
	if tat < now {
		tat, frac = now, 0
	}
	// newTat = tat + (hits·W + frac)/L, exactly, as whole ns plus remainder.
	hi, lo := bits.Mul64(uint64(hits), uint64(w))
	lo, carry := bits.Add64(lo, uint64(frac), 0)
	q, r := bits.Div64(hi+carry, lo, uint64(p.Limit))
	newTat, newFrac := tat+int64(q), int64(r)
	d := Decision{Limit: p.Limit}
	if allowAt := g.ceilTat(newTat, newFrac) - w; now < allowAt {
		d.RetryAfter = time.Duration(allowAt - now)
		d.Remaining = g.remaining(now, tat, frac, p)
		d.ResetAfter = time.Duration(g.ceilTat(tat, frac) - now)
		return d
	}
	g.tat, g.frac = newTat, newFrac
	d.Allowed = true
	d.Remaining = g.remaining(now, newTat, newFrac, p)
	d.ResetAfter = time.Duration(g.ceilTat(newTat, newFrac) - now)
	return d
}

// remaining is the number of units n that fit at now:
// floor((W − (tat + frac/L − now))·L/W), for tat >= now.
func (g *gcra) remaining(now, tat, frac int64, p Policy) int64 {
	free := int64(p.Window) - (tat - now)
	if free <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(free), uint64(p.Limit))
	lo, borrow := bits.Sub64(lo, uint64(frac), 0)
	q, _ := bits.Div64(hi-borrow, lo, uint64(p.Window))
	return min(int64(q), p.Limit)
}

func (g *gcra) idleAt(int64) int64 { return g.ceilTat(g.tat, g.frac) }

func (g *gcra) export(now int64) []Run {
	// The fraction is rounded up: the receiver refills no earlier.
	return []Run{{Age: time.Duration(now - g.ceilTat(g.tat, g.frac)), Count: 0}}
}

func (g *gcra) merge(now int64, runs []Run, _ Policy) {
	for _, r := range runs {
		// The imported bucket's used capacity (its tat beyond its now) adds
		// to ours: both sides' admissions stay counted.
		debt := -int64(r.Age)
		if debt <= 0 {
			continue // that bucket was full
		}
		if g.tat < now {
			g.tat, g.frac = now, 0
		}
		g.tat += debt
	}
}

func (g *gcra) bytes() int64 { return 0 }

// fixedWindow counts units in the aligned interval starting at start.
type fixedWindow struct {
	start, count int64
}

func (f *fixedWindow) allow(now int64, p Policy, hits int64) Decision {
	w := int64(p.Window)
	if f.count == 0 || now >= f.start+w {
		// The recorded window has ended: start the aligned one holding now.
		// A window imported from a clock with another offset may be
		// unaligned here; it is kept until it ends, so a handoff never
		// resets a quota early (DESIGN.md §5).
		f.start, f.count = now-((now%w)+w)%w, 0
	}
	start := f.start
	d := Decision{Limit: p.Limit}
	if f.count+hits <= p.Limit {
		f.count += hits
		d.Allowed = true
	} else {
		d.RetryAfter = time.Duration(start + w - now)
	}
	d.Remaining = p.Limit - f.count
	if f.count > 0 {
		d.ResetAfter = time.Duration(start + w - now)
	}
	return d
}

func (f *fixedWindow) idleAt(window int64) int64 {
	if f.count == 0 {
		return minTime
	}
	return f.start + window
}

func (f *fixedWindow) export(now int64) []Run {
	return []Run{{Age: time.Duration(now - f.start), Count: f.count}}
}

func (f *fixedWindow) merge(now int64, runs []Run, p Policy) {
	w := int64(p.Window)
	for _, r := range runs {
		start := now - int64(r.Age)
		switch {
		case r.Count == 0 || start+w <= now:
			// That window has already ended: nothing left to count.
		case f.count == 0 || f.start+w <= now:
			f.start, f.count = start, r.Count
		default:
			// Both windows are current: keep both counts until the later
			// one ends, which can only refuse more.
			f.start = max(f.start, start)
			f.count += r.Count
		}
	}
}

func (f *fixedWindow) bytes() int64 { return 0 }

const minTime = -1 << 63
