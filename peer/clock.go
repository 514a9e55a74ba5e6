package peer

import (
	"sync/atomic"
	"time"
)

// The default clock (Config.Clock nil) reads the wall clock through the
// monotonic one: a decision reads the monotonic clock once and adds the
// wall clock's offset from it, taken from a full reading (time.Now, which
// reads both clocks) at most every wallAnchorEvery. On this kind of
// machine a monotonic reading costs about half of time.Now, and the
// decision path reads the clock once per decision.
//
// The result is the wall clock: the kernel slews both clocks alike, so
// their offset changes only when the wall clock is stepped (by an
// operator, an NTP step, a resume from suspend), and such a step takes
// effect within wallAnchorEvery of monotonic time, as if the step had
// happened that much later. Nothing on the node can tell the difference:
// decisions are timed on the node's own clock, keys are clamped so their
// time never decreases (a step back then waits for the clock to catch
// up, as with time.Now), and leases use the monotonic clock alone.
type wallClock struct {
	origin time.Time // a reading with its monotonic part: mono's origin
	// offset is the wall clock in Unix ns minus ns since origin on the
	// monotonic clock, as of the last full reading at anchored (ns since
	// origin).
	offset   atomic.Int64
	anchored atomic.Int64
}

// wallAnchorEvery bounds how long a wall clock step goes unseen.
const wallAnchorEvery = 100 * time.Millisecond

func newWallClock(origin time.Time) *wallClock {
	c := &wallClock{origin: origin}
	c.offset.Store(origin.UnixNano())
	return c
}

// read returns the wall clock and the monotonic clock (ns since origin).
func (c *wallClock) read() (time.Time, int64) {
	mono := int64(time.Since(c.origin))
	if mono-c.anchored.Load() >= int64(wallAnchorEvery) {
		// A full reading: two goroutines may both take one, and either
		// offset is right.
		t := time.Now()
		mono = int64(t.Sub(c.origin))
		c.offset.Store(t.UnixNano() - mono)
		c.anchored.Store(mono)
		return t, mono
	}
	return time.Unix(0, mono+c.offset.Load()), mono
}

// now is read's wall clock (Config.Clock's default).
func (c *wallClock) now() time.Time {
	t, _ := c.read()
	return t
}
