package peer

import (
	"testing"
	"time"
)

// TestWallClockReadsTheWallClock: between two time.Now readings, the
// default clock reads a time between them, and a monotonic reading that
// moves with the monotonic clock.
func TestWallClockReadsTheWallClock(t *testing.T) {
	origin := time.Now()
	c := newWallClock(origin)
	var lastMono int64
	for i := range 10000 {
		t0 := time.Now()
		got, mono := c.read()
		t1 := time.Now()
		// The two clocks are slewed alike, so the offset is exact; a
		// microsecond covers the rounding of the readings.
		if got.Before(t0.Add(-time.Microsecond)) || got.After(t1.Add(time.Microsecond)) {
			t.Fatalf("read %d: %v, not between %v and %v", i, got, t0, t1)
		}
		if mono < lastMono || mono < int64(t0.Sub(origin)) || mono > int64(t1.Sub(origin)) {
			t.Fatalf("read %d: mono %d, last %d, want between %d and %d", i, mono, lastMono, t0.Sub(origin), t1.Sub(origin))
		}
		lastMono = mono
	}
}

// TestWallClockSeesAStep: a wall clock step (here: an offset off by an
// hour, as after the wall clock was stepped back) is read until the next
// full reading, due wallAnchorEvery after the last one; that reading
// takes the wall clock again.
func TestWallClockSeesAStep(t *testing.T) {
	origin := time.Now()
	c := newWallClock(origin)
	c.read()
	mono := int64(time.Since(origin))
	c.anchored.Store(mono)
	c.offset.Add(int64(time.Hour)) // the wall clock was an hour behind
	got, _ := c.read()
	if d := got.Sub(time.Now()); d < 59*time.Minute {
		t.Fatalf("within the anchor interval: read %v ahead of the wall clock, want the old offset (an hour)", d)
	}
	c.anchored.Store(mono - int64(wallAnchorEvery))
	t0 := time.Now()
	got, _ = c.read()
	t1 := time.Now()
	if got.Before(t0) || got.After(t1) {
		t.Fatalf("after the anchor interval: read %v, want between %v and %v", got, t0, t1)
	}
	// And it keeps the new offset.
	if got, _ = c.read(); got.Before(t1) || got.After(time.Now()) {
		t.Fatalf("after the new anchor: read %v, want the wall clock", got)
	}
}
