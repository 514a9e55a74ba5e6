package shard

import (
	"fmt"
	"time"
)

// Period is the calendar unit of a Calendar policy: the limit counts per
// calendar day, ISO week, month or year in the policy's Zone.
type Period uint8

const (
	// NoPeriod is the zero value: the policy is not a Calendar policy.
	NoPeriod Period = iota
	// CalendarDay runs from midnight to midnight in the zone: 23 or 25
	// hours on a daylight-saving change.
	CalendarDay
	// CalendarWeek is the ISO week: Monday 00:00 to the next Monday 00:00.
	CalendarWeek
	// CalendarMonth runs from the first of the month 00:00 to the first of
	// the next (28, 29, 30 or 31 days).
	CalendarMonth
	// CalendarYear runs from 1 January 00:00 to the next 1 January 00:00.
	CalendarYear
	numPeriods
)

var periodNames = [numPeriods]string{"", "calendar_day", "calendar_week", "calendar_month", "calendar_year"}

// String returns the period's stable name: calendar_day, calendar_week,
// calendar_month, calendar_year, or "" for NoPeriod.
func (u Period) String() string {
	if u < numPeriods {
		return periodNames[u]
	}
	return fmt.Sprintf("period(%d)", uint8(u))
}

// ParsePeriod maps a stable name (see String) to its Period. An unknown
// name is an error wrapping ErrInvalidPolicy that lists the names.
func ParsePeriod(s string) (Period, error) {
	for i, n := range periodNames[1:] {
		if n == s {
			return Period(i + 1), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown calendar period %q (want calendar_day, calendar_week, calendar_month or calendar_year)", ErrInvalidPolicy, s)
}

// Bounds returns the calendar period of unit u holding t in loc (nil means
// UTC): start ≤ t < end. The start is the period's calendar boundary in
// loc, so the instant of an edge belongs to the period it starts. A period
// is computed from the calendar date alone, so two nodes with the same
// unit, zone and zone rules agree on every boundary whatever their clocks
// say. For NoPeriod it returns t, t.
//
// Where a boundary's midnight does not exist (a daylight-saving jump at
// 00:00, as in America/Santiago), time.Date gives the instant an hour
// earlier, and the last wall-clock hour before it belongs to the next
// period: boundaries still only increase, so periods tile time without
// gaps or overlaps.
func (u Period) Bounds(t time.Time, loc *time.Location) (start, end time.Time) {
	if u == NoPeriod || u >= numPeriods {
		return t, t
	}
	if loc == nil {
		loc = time.UTC
	}
	y, m, d := t.In(loc).Date()
	start, end = u.boundary(y, m, d, 0, loc), u.boundary(y, m, d, 1, loc)
	switch {
	case !t.Before(end):
		start, end = end, u.boundary(y, m, d, 2, loc)
	case t.Before(start):
		start, end = u.boundary(y, m, d, -1, loc), start
	}
	return start, end
}

// boundary is the start of the k-th period after the one holding the date
// y-m-d (k = 0: that period), in loc.
func (u Period) boundary(y int, m time.Month, d, k int, loc *time.Location) time.Time {
	switch u {
	case CalendarDay:
		return time.Date(y, m, d+k, 0, 0, 0, 0, loc)
	case CalendarWeek:
		// ISO 8601: weeks start on Monday (time.Sunday is 0). The date's
		// weekday does not depend on the zone.
		back := (int(time.Date(y, m, d, 12, 0, 0, 0, time.UTC).Weekday()) + 6) % 7
		return time.Date(y, m, d-back+7*k, 0, 0, 0, 0, loc)
	case CalendarMonth:
		return time.Date(y, m+time.Month(k), 1, 0, 0, 0, 0, loc)
	default:
		return time.Date(y+k, 1, 1, 0, 0, 0, 0, loc)
	}
}

// bounds is Bounds on nanoseconds. A time.Date boundary can fall outside
// the int64 nanosecond range only for years beyond ±292; such a now is
// not a real clock, and the period is then clamped to [now, now+1).
func (u Period) bounds(now int64, loc *time.Location) (start, end int64) {
	s, e := u.Bounds(time.Unix(0, now), loc)
	start, end = s.UnixNano(), e.UnixNano()
	if start > now || end <= now {
		return now, satAdd(now, 1)
	}
	return start, end
}

// calendarWindow counts units in one calendar period [start, end).
//
// Its exported state is the period's start as an instant (Run.Age holds
// start's Unix nanoseconds, not an age), and the receiver finds the period
// holding that instant with its own calendar. An age would be wrong here:
// the period is named by the calendar, not by the sender's clock. Rebased
// on a receiver whose clock runs δ behind, an age puts the start δ before
// the boundary, in the previous period, which has ended; the count would
// be dropped and the quota reset mid-period. The start instant names the
// same period on every node with the same zone and period (the policy
// fingerprint compares them). Clock offset then only moves when each node
// sees the edge: a receiver δ behind keeps counting the period δ longer,
// one δ ahead starts the next one δ early, exactly as its own decisions
// would. A start moved a little later (peer adds queueing delay to ages)
// stays in the same period.
type calendarWindow struct {
	start, end, count int64
}

// decide writes the decision allow would make at now to *d and returns,
// if it admits, the period's new bounds and count, changing nothing.
func (c *calendarWindow) decide(now int64, p Policy, hits int64, d *Decision) (start, end, count int64) {
	start, end, count = c.start, c.end, c.count
	if count == 0 || now >= end {
		// The recorded period has ended: count in the one holding now. A
		// period merged from a node whose clock is ahead may start after
		// now; it is kept until it ends, which can only refuse more.
		start, end = p.Period.bounds(now, p.Zone)
		count = 0
	}
	*d = Decision{Limit: p.Limit}
	// count <= keepUnits(p) (merge clamps), so Limit − count cannot
	// overflow.
	if hits <= p.Limit-count {
		count += hits
		d.Allowed = true
	} else {
		d.RetryAfter = time.Duration(end - now)
	}
	d.Remaining = max(p.Limit-count, 0)
	if count > 0 {
		d.ResetAfter = time.Duration(end - now)
	}
	return start, end, count
}

func (c *calendarWindow) allow(now int64, p Policy, hits int64, d *Decision) {
	start, end, count := c.decide(now, p, hits, d)
	if d.Allowed {
		c.start, c.end, c.count = start, end, count
	}
}

func (c *calendarWindow) peek(now int64, p Policy, hits int64) Decision {
	var d Decision
	c.decide(now, p, hits, &d)
	return d
}

// refund lowers the current period's count by up to hits, never below
// zero; a period that has ended has nothing to give back.
func (c *calendarWindow) refund(now int64, p Policy, hits int64) Decision {
	d := Decision{Limit: p.Limit, Remaining: p.Limit}
	if c.count == 0 || now >= c.end {
		return d
	}
	c.count = max(c.count-hits, 0)
	d.Allowed = true
	d.Remaining = max(p.Limit-c.count, 0)
	if c.count > 0 {
		d.ResetAfter = time.Duration(c.end - now)
	}
	return d
}

// idleAt ignores window: a period ends at its own calendar edge.
func (c *calendarWindow) idleAt(int64) int64 {
	if c.count == 0 {
		return minTime
	}
	return c.end
}

func (c *calendarWindow) export(dst []Run, _ int64) []Run {
	return append(dst, Run{Age: time.Duration(c.start), Count: c.count})
}

func (c *calendarWindow) merge(now int64, runs []Run, p Policy) {
	for _, r := range runs {
		if r.Count == 0 {
			continue
		}
		// The period holding the sender's start, by our calendar.
		start, end := p.Period.bounds(int64(r.Age), p.Zone)
		switch {
		case now >= end:
			// That period has ended here: nothing left to count.
		case c.count == 0 || now >= c.end:
			c.start, c.end, c.count = start, end, min(r.Count, keepUnits(p))
		default:
			// Both periods are current (one may be the next period of a
			// clock ahead of ours): keep both counts until the later one
			// ends, which can only refuse more. A count above Limit is
			// kept, as in fixedWindow.merge.
			if start > c.start {
				c.start, c.end = start, end
			}
			c.count = min(satAdd(c.count, r.Count), keepUnits(p))
		}
	}
}

func (c *calendarWindow) bytes() int64 { return 0 }
