package shard

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"
	// The tests name IANA zones; a host without zoneinfo still has them.
	_ "time/tzdata"
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("LoadLocation(%q): %v", name, err)
	}
	return loc
}

// TestPeriodBounds pins the calendar boundaries: months of every length, a
// daylight-saving day of 23 and of 25 hours, the year end, the ISO week and
// the edge instant, which starts the new period.
func TestPeriodBounds(t *testing.T) {
	utc := time.UTC
	berlin := mustZone(t, "Europe/Berlin")
	ny := mustZone(t, "America/New_York")
	santiago := mustZone(t, "America/Santiago")
	d := func(y int, m time.Month, day, h, min int, loc *time.Location) time.Time {
		return time.Date(y, m, day, h, min, 0, 0, loc)
	}
	tests := []struct {
		name       string
		unit       Period
		loc        *time.Location
		at         time.Time
		start, end time.Time
		length     time.Duration
	}{
		{"month of 28 days", CalendarMonth, utc, d(2026, 2, 15, 12, 0, utc), d(2026, 2, 1, 0, 0, utc), d(2026, 3, 1, 0, 0, utc), 28 * 24 * time.Hour},
		{"month of 29 days", CalendarMonth, utc, d(2028, 2, 29, 23, 59, utc), d(2028, 2, 1, 0, 0, utc), d(2028, 3, 1, 0, 0, utc), 29 * 24 * time.Hour},
		{"month of 30 days", CalendarMonth, utc, d(2026, 4, 1, 0, 0, utc), d(2026, 4, 1, 0, 0, utc), d(2026, 5, 1, 0, 0, utc), 30 * 24 * time.Hour},
		{"month of 31 days", CalendarMonth, utc, d(2026, 1, 31, 23, 59, utc), d(2026, 1, 1, 0, 0, utc), d(2026, 2, 1, 0, 0, utc), 31 * 24 * time.Hour},
		{"berlin month with spring change", CalendarMonth, berlin, d(2026, 3, 29, 3, 0, berlin), d(2026, 3, 1, 0, 0, berlin), d(2026, 4, 1, 0, 0, berlin), 31*24*time.Hour - time.Hour},
		{"berlin month start is 23:00 utc", CalendarMonth, berlin, d(2026, 1, 31, 23, 30, utc), d(2026, 2, 1, 0, 0, berlin), d(2026, 3, 1, 0, 0, berlin), 28 * 24 * time.Hour},
		{"berlin day of 23 hours", CalendarDay, berlin, d(2026, 3, 29, 12, 0, berlin), d(2026, 3, 29, 0, 0, berlin), d(2026, 3, 30, 0, 0, berlin), 23 * time.Hour},
		{"berlin day of 25 hours", CalendarDay, berlin, d(2026, 10, 25, 2, 30, berlin), d(2026, 10, 25, 0, 0, berlin), d(2026, 10, 26, 0, 0, berlin), 25 * time.Hour},
		{"new york day of 25 hours", CalendarDay, ny, d(2026, 11, 1, 23, 0, ny), d(2026, 11, 1, 0, 0, ny), d(2026, 11, 2, 0, 0, ny), 25 * time.Hour},
		{"utc day", CalendarDay, nil, d(2026, 3, 29, 12, 0, utc), d(2026, 3, 29, 0, 0, utc), d(2026, 3, 30, 0, 0, utc), 24 * time.Hour},
		{"last nanosecond of the year", CalendarYear, utc, time.Date(2026, 12, 31, 23, 59, 59, 999_999_999, utc), d(2026, 1, 1, 0, 0, utc), d(2027, 1, 1, 0, 0, utc), 365 * 24 * time.Hour},
		{"year edge belongs to the new year", CalendarYear, utc, d(2027, 1, 1, 0, 0, utc), d(2027, 1, 1, 0, 0, utc), d(2028, 1, 1, 0, 0, utc), 365 * 24 * time.Hour},
		{"leap year", CalendarYear, utc, d(2028, 7, 1, 0, 0, utc), d(2028, 1, 1, 0, 0, utc), d(2029, 1, 1, 0, 0, utc), 366 * 24 * time.Hour},
		{"berlin year", CalendarYear, berlin, d(2026, 12, 31, 23, 30, utc), d(2027, 1, 1, 0, 0, berlin), d(2028, 1, 1, 0, 0, berlin), 365 * 24 * time.Hour},
		{"iso week across the year end", CalendarWeek, utc, d(2026, 1, 1, 9, 0, utc), d(2025, 12, 29, 0, 0, utc), d(2026, 1, 5, 0, 0, utc), 7 * 24 * time.Hour},
		{"iso week sunday is its last day", CalendarWeek, utc, time.Date(2026, 1, 4, 23, 59, 59, 999_999_999, utc), d(2025, 12, 29, 0, 0, utc), d(2026, 1, 5, 0, 0, utc), 7 * 24 * time.Hour},
		{"iso week edge is monday 00:00", CalendarWeek, utc, d(2026, 1, 5, 0, 0, utc), d(2026, 1, 5, 0, 0, utc), d(2026, 1, 12, 0, 0, utc), 7 * 24 * time.Hour},
		{"berlin week with spring change", CalendarWeek, berlin, d(2026, 3, 29, 20, 0, berlin), d(2026, 3, 23, 0, 0, berlin), d(2026, 3, 30, 0, 0, berlin), 7*24*time.Hour - time.Hour},
		{"day edge belongs to the new day", CalendarDay, berlin, d(2026, 3, 30, 0, 0, berlin), d(2026, 3, 30, 0, 0, berlin), d(2026, 3, 31, 0, 0, berlin), 24 * time.Hour},
		// Santiago's clocks jump from 00:00 to 01:00 on 2026-09-06: that
		// midnight does not exist, time.Date gives 23:00 the day before,
		// and the hour from there belongs to 6 September.
		{"santiago 23:30 before a missing midnight", CalendarDay, santiago, d(2026, 9, 6, 3, 30, utc), d(2026, 9, 6, 3, 0, utc), d(2026, 9, 7, 3, 0, utc), 24 * time.Hour},
		{"santiago day before a missing midnight", CalendarDay, santiago, d(2026, 9, 5, 12, 0, santiago), d(2026, 9, 5, 0, 0, santiago), d(2026, 9, 6, 3, 0, utc), 23 * time.Hour},
		{"santiago week across a missing midnight", CalendarWeek, santiago, d(2026, 9, 6, 3, 30, utc), d(2026, 8, 31, 0, 0, santiago), d(2026, 9, 7, 0, 0, santiago), 7*24*time.Hour - time.Hour},
		{"month edge belongs to the new month", CalendarMonth, berlin, d(2026, 3, 1, 0, 0, berlin), d(2026, 3, 1, 0, 0, berlin), d(2026, 4, 1, 0, 0, berlin), 31*24*time.Hour - time.Hour},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start, end := tc.unit.Bounds(tc.at, tc.loc)
			if !start.Equal(tc.start) || !end.Equal(tc.end) || end.Sub(start) != tc.length {
				t.Fatalf("%v.Bounds(%v, %v) = [%v, %v) (%v), want [%v, %v) (%v)", tc.unit, tc.at, tc.loc, start, end, end.Sub(start), tc.start, tc.end, tc.length)
			}
			// The same period from nanoseconds, as the store computes it.
			s, e := tc.unit.bounds(tc.at.UnixNano(), tc.loc)
			if s != tc.start.UnixNano() || e != tc.end.UnixNano() {
				t.Fatalf("bounds(%d) = [%d, %d), want [%d, %d)", tc.at.UnixNano(), s, e, tc.start.UnixNano(), tc.end.UnixNano())
			}
		})
	}
}

// TestCalendarEdge: limit L admits exactly L in a period, and L more at the
// edge instant, whose RetryAfter is the new period's whole length.
func TestCalendarEdge(t *testing.T) {
	berlin := mustZone(t, "Europe/Berlin")
	tests := []struct {
		name string
		unit Period
		edge time.Time // start of the second period
		next time.Duration
	}{
		{"day before the 25-hour day", CalendarDay, time.Date(2026, 10, 25, 0, 0, 0, 0, berlin), 25 * time.Hour},
		{"day before the 23-hour day", CalendarDay, time.Date(2026, 3, 29, 0, 0, 0, 0, berlin), 23 * time.Hour},
		{"february 2028 to march", CalendarMonth, time.Date(2028, 3, 1, 0, 0, 0, 0, berlin), 31*24*time.Hour - time.Hour},
		{"iso week", CalendarWeek, time.Date(2026, 1, 5, 0, 0, 0, 0, berlin), 7 * 24 * time.Hour},
		{"year", CalendarYear, time.Date(2027, 1, 1, 0, 0, 0, 0, berlin), 365 * 24 * time.Hour},
	}
	const limit = 3
	for _, tc := range tests {
		p := Policy{Limit: limit, Algorithm: Calendar, Period: tc.unit, Zone: berlin}
		for _, dd := range deciders(t, p) {
			t.Run(tc.name+"/"+dd.name, func(t *testing.T) {
				before := tc.edge.Add(-time.Nanosecond)
				for i := range limit {
					got, err := dd.allow(before, 1)
					want := Decision{Allowed: true, Limit: limit, Remaining: limit - 1 - int64(i), ResetAfter: time.Nanosecond}
					if err != nil || got != want {
						t.Fatalf("admission %d at edge−1ns: got %+v, %v, want %+v", i+1, got, err, want)
					}
				}
				got, err := dd.allow(before, 1)
				want := Decision{Limit: limit, RetryAfter: time.Nanosecond, ResetAfter: time.Nanosecond}
				if err != nil || got != want {
					t.Fatalf("admission %d at edge−1ns: got %+v, %v, want %+v", limit+1, got, err, want)
				}
				for i := range limit {
					got, err := dd.allow(tc.edge, 1)
					want := Decision{Allowed: true, Limit: limit, Remaining: limit - 1 - int64(i), ResetAfter: tc.next}
					if err != nil || got != want {
						t.Fatalf("admission %d at the edge: got %+v, %v, want %+v", i+1, got, err, want)
					}
				}
				got, err = dd.allow(tc.edge.Add(time.Hour), 1)
				want = Decision{Limit: limit, RetryAfter: tc.next - time.Hour, ResetAfter: tc.next - time.Hour}
				if err != nil || got != want {
					t.Fatalf("admission %d in the new period: got %+v, %v, want %+v", limit+1, got, err, want)
				}
			})
		}
	}
}

// TestCalendarHandoff: the state travels as the period's start instant, so
// a receiver whose clock is behind the sender's keeps the sender's period
// (an age rebased there would fall before the edge and be dropped), and
// one whose clock is past the period's end starts afresh.
func TestCalendarHandoff(t *testing.T) {
	berlin := mustZone(t, "Europe/Berlin")
	p := Policy{Limit: 5, Algorithm: Calendar, Period: CalendarMonth, Zone: berlin}
	key := Key{Tenant: "acme", Subject: "user-1", Policy: "monthly"}
	edge := time.Date(2026, 3, 1, 0, 0, 0, 0, berlin)
	tests := []struct {
		name     string
		sent     time.Time // the sender's now: 4 admitted, exported
		received time.Time // the receiver's now at import
		want     Decision  // the receiver's answer to 2 hits at received
	}{
		{"receiver 2 s behind, sender just past the edge", edge.Add(time.Second), edge.Add(-time.Second),
			Decision{Limit: 5, Remaining: 1, RetryAfter: 31*24*time.Hour - time.Hour + time.Second, ResetAfter: 31*24*time.Hour - time.Hour + time.Second}},
		{"receiver 2 s ahead, same period", edge.Add(time.Hour), edge.Add(time.Hour + 2*time.Second),
			Decision{Limit: 5, Remaining: 1, RetryAfter: 31*24*time.Hour - 2*time.Hour - 2*time.Second, ResetAfter: 31*24*time.Hour - 2*time.Hour - 2*time.Second}},
		{"receiver 2 s ahead, past the edge", edge.Add(-time.Second), edge.Add(time.Second),
			Decision{Allowed: true, Limit: 5, Remaining: 3, ResetAfter: 31*24*time.Hour - time.Hour - time.Second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			from, _ := NewStore(Config{})
			to, _ := NewStore(Config{})
			for range 4 {
				if d, err := from.Allow(key, p, 1, tc.sent); err != nil || !d.Allowed {
					t.Fatalf("sender Allow at %v: %+v, %v", tc.sent, d, err)
				}
			}
			ks, ok := from.Take(key, tc.sent)
			if !ok {
				t.Fatal("Take: key not held")
			}
			start, _ := CalendarMonth.Bounds(tc.sent, berlin)
			if want := []Run{{Age: time.Duration(start.UnixNano()), Count: 4}}; len(ks.Runs) != 1 || ks.Runs[0] != want[0] {
				t.Fatalf("exported runs %+v, want %+v (the period start instant)", ks.Runs, want)
			}
			if err := to.Import(ks, p, tc.received); err != nil {
				t.Fatalf("Import: %v", err)
			}
			got, err := to.Allow(key, p, 2, tc.received)
			if err != nil || got != tc.want {
				t.Fatalf("receiver Allow(2) at %v: got %+v, %v, want %+v", tc.received, got, err, tc.want)
			}
		})
	}
}

// TestCalendarExportAheadKeepsStart: a key whose clock is ahead of the
// export's now exports its period start unshifted (ages are shifted, an
// instant is not), so an edge start is not moved into the previous period.
func TestCalendarExportAheadKeepsStart(t *testing.T) {
	p := Policy{Limit: 5, Algorithm: Calendar, Period: CalendarDay}
	key := Key{Tenant: "acme", Subject: "user-1", Policy: "daily"}
	edge := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	s, _ := NewStore(Config{})
	if _, err := s.Allow(key, p, 1, edge); err != nil {
		t.Fatal(err)
	}
	ks, _ := s.Export(key, edge.Add(-time.Second))
	if len(ks.Runs) != 1 || ks.Runs[0].Age != time.Duration(edge.UnixNano()) {
		t.Fatalf("exported %+v, want start %d", ks.Runs, edge.UnixNano())
	}
}

// TestCalendarMergeBothCurrent: a state from the next period (a sender
// ahead) merged into a current one keeps both counts until the later ends.
func TestCalendarMergeBothCurrent(t *testing.T) {
	p := Policy{Limit: 5, Algorithm: Calendar, Period: CalendarDay}
	key := Key{Tenant: "acme", Subject: "user-1", Policy: "daily"}
	edge := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	s, _ := NewStore(Config{})
	now := edge.Add(-time.Second)
	if _, err := s.Allow(key, p, 2, now); err != nil {
		t.Fatal(err)
	}
	ks := KeyState{Key: key, Algorithm: Calendar, Runs: []Run{{Age: time.Duration(edge.UnixNano()), Count: 2}}}
	if err := s.Import(ks, p, now); err != nil {
		t.Fatal(err)
	}
	got, _ := s.Peek(key, p, 2, now)
	want := Decision{Limit: 5, Remaining: 1, RetryAfter: 24*time.Hour + time.Second, ResetAfter: 24*time.Hour + time.Second}
	if got != want {
		t.Fatalf("Peek(2) after merge: got %+v, want %+v", got, want)
	}
}

// TestCalendarRefundAndSweep: refund gives back within the period; the key
// is reclaimed at the period's end.
func TestCalendarRefundAndSweep(t *testing.T) {
	p := Policy{Limit: 5, Algorithm: Calendar, Period: CalendarWeek}
	key := Key{Tenant: "acme", Subject: "user-1", Policy: "weekly"}
	mon := time.Date(2026, 1, 5, 0, 0, 0, 0, time.UTC)
	s, _ := NewStore(Config{})
	if _, err := s.Allow(key, p, 5, mon.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	d, err := s.Refund(key, p, 2, mon.Add(2*time.Hour))
	if want := (Decision{Allowed: true, Limit: 5, Remaining: 2, ResetAfter: 7*24*time.Hour - 2*time.Hour}); err != nil || d != want {
		t.Fatalf("Refund: got %+v, %v, want %+v", d, err, want)
	}
	if n := s.Sweep(mon.Add(7*24*time.Hour-time.Nanosecond), 0); n != 0 || s.Len() != 1 {
		t.Fatalf("Sweep before the week ends: evicted %d, len %d, want 0, 1", n, s.Len())
	}
	if n := s.Sweep(mon.Add(7*24*time.Hour), 0); n != 1 || s.Len() != 0 {
		t.Fatalf("Sweep at the week's end: evicted %d, len %d, want 1, 0", n, s.Len())
	}
}

func TestCalendarValidate(t *testing.T) {
	tests := []struct {
		name string
		p    Policy
		ok   bool
	}{
		{"month", Policy{Limit: 1, Algorithm: Calendar, Period: CalendarMonth}, true},
		{"no period", Policy{Limit: 1, Algorithm: Calendar}, false},
		{"unknown period", Policy{Limit: 1, Algorithm: Calendar, Period: numPeriods}, false},
		{"with a window", Policy{Limit: 1, Window: time.Hour, Algorithm: Calendar, Period: CalendarDay}, false},
		{"with a resolution", Policy{Limit: 1, Resolution: time.Millisecond, Algorithm: Calendar, Period: CalendarDay}, false},
		{"period on the sliding log", Policy{Limit: 1, Window: time.Hour, Period: CalendarDay}, false},
		{"zero limit", Policy{Algorithm: Calendar, Period: CalendarDay}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Validate()
			if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalidPolicy)) {
				t.Fatalf("Validate(%+v) = %v, want ok %t", tc.p, err, tc.ok)
			}
			if tc.p.valid() != tc.ok {
				t.Fatalf("valid(%+v) = %t, want %t", tc.p, tc.p.valid(), tc.ok)
			}
		})
	}
}

func TestParsePeriod(t *testing.T) {
	for u := CalendarDay; u < numPeriods; u++ {
		if got, err := ParsePeriod(u.String()); err != nil || got != u {
			t.Fatalf("ParsePeriod(%q) = %v, %v, want %v", u.String(), got, err, u)
		}
	}
	for _, s := range []string{"", "calendar_days", "month", "Calendar_Day"} {
		if _, err := ParsePeriod(s); !errors.Is(err, ErrInvalidPolicy) {
			t.Fatalf("ParsePeriod(%q) = %v, want ErrInvalidPolicy", s, err)
		}
	}
	if a, err := ParseAlgorithm("calendar"); err != nil || a != Calendar {
		t.Fatalf("ParseAlgorithm(calendar) = %v, %v", a, err)
	}
}

// TestCalendarMatchesModel compares the store with the simplest model of a
// calendar quota (every admission kept; a request fits if the admissions
// in now's period plus its hits are at most the limit) on seeded random
// sequences across Berlin's daylight-saving changes and a year end.
func TestCalendarMatchesModel(t *testing.T) {
	berlin := mustZone(t, "Europe/Berlin")
	key := Key{Tenant: "acme", Subject: "user-1", Policy: "cal"}
	santiago := mustZone(t, "America/Santiago")
	starts := []time.Time{
		time.Date(2026, 3, 27, 0, 0, 0, 0, berlin),
		time.Date(2026, 10, 23, 0, 0, 0, 0, berlin),
		time.Date(2026, 12, 29, 0, 0, 0, 0, berlin),
		time.Date(2026, 9, 4, 0, 0, 0, 0, santiago), // a missing midnight on 6 September
	}
	for _, unit := range []Period{CalendarDay, CalendarWeek, CalendarMonth, CalendarYear} {
		for seed := int64(1); seed <= 20; seed++ {
			rng := rand.New(rand.NewPCG(uint64(seed), 25))
			now := starts[seed%int64(len(starts))]
			zone := now.Location()
			p := Policy{Limit: 1 + rng.Int64N(8), Algorithm: Calendar, Period: unit, Zone: zone}
			s, _ := NewStore(Config{})
			type adm struct {
				at   time.Time
				hits int64
			}
			var log []adm
			for step := range 300 {
				now = now.Add(time.Duration(rng.Int64N(int64(3 * time.Hour))))
				if rng.IntN(10) == 0 {
					// Land exactly on an edge.
					_, now = unit.Bounds(now, zone)
				}
				hits := 1 + rng.Int64N(p.Limit)
				start, _ := unit.Bounds(now, zone)
				var used int64
				for _, a := range log {
					if as, _ := unit.Bounds(a.at, zone); as.Equal(start) {
						used += a.hits
					}
				}
				want := used+hits <= p.Limit
				d, err := s.Allow(key, p, hits, now)
				if err != nil || d.Allowed != want {
					t.Fatalf("%v seed %d step %d at %v: Allow(%d) = %+v, %v; model (used %d of %d) says %t", unit, seed, step, now, hits, d, err, used, p.Limit, want)
				}
				if want {
					log = append(log, adm{now, hits})
				}
			}
		}
	}
}

// TestPeriodsTile: walked across two years in zones with daylight-saving
// changes (one with a missing midnight), periods follow each other without
// gap or overlap, each start is a local midnight (or, where midnight is
// missing, the hour before the jump), and both ends map to the period.
func TestPeriodsTile(t *testing.T) {
	for _, name := range []string{"UTC", "Europe/Berlin", "America/Santiago", "America/New_York", "Australia/Lord_Howe"} {
		loc := mustZone(t, name)
		for _, unit := range []Period{CalendarDay, CalendarWeek, CalendarMonth, CalendarYear} {
			start, end := unit.Bounds(time.Date(2025, 12, 31, 12, 0, 0, 0, loc), loc)
			for start.Year() < 2028 {
				if !end.After(start) {
					t.Fatalf("%s %v: empty period [%v, %v)", name, unit, start, end)
				}
				for _, at := range []time.Time{start, end.Add(-time.Nanosecond)} {
					if s, e := unit.Bounds(at, loc); !s.Equal(start) || !e.Equal(end) {
						t.Fatalf("%s %v: Bounds(%v) = [%v, %v), want [%v, %v)", name, unit, at, s, e, start, end)
					}
				}
				if s, _ := unit.Bounds(end, loc); !s.Equal(end) {
					t.Fatalf("%s %v: the period after [%v, %v) starts at %v", name, unit, start, end, s)
				}
				if l := start.In(loc); (l.Hour() != 0 && l.Hour() != 23) || l.Minute() != 0 && l.Minute() != 30 {
					t.Fatalf("%s %v: period starts at %v, not at midnight", name, unit, l)
				}
				start, end = unit.Bounds(end, loc)
			}
		}
	}
}
