package main

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// serve's garbage collector: Go's default (GOGC=100) collects each time
// the heap doubles, which for a node whose live heap is a few tens of
// MiB means a collection every few thousand decisions, and each one's
// assists and pauses land on the decisions in flight. serve gives the
// collector a floor of headroom instead: the heap may grow by
// max(live heap, headroom) between collections. A node whose key state
// is larger than the headroom collects as Go's default; a small one
// collects less often, for at most headroom more memory.
//
// The rules: GOGC in the environment wins (serve then leaves the
// collector alone), --gc-headroom 0 disables it, GOMEMLIMIT still
// bounds the heap, and the percent is re-read from the live heap every
// gcTuneEvery, changed only when it moves by more than a tenth.

const (
	gcTuneEvery = time.Second
	// gcMaxPercent bounds the percent a tiny live heap would ask for.
	gcMaxPercent = 1000
)

// gcTuning reports whether serve tunes the collector: a headroom is set
// and GOGC is not in the environment (lookup is os.LookupEnv).
func gcTuning(headroomMiB uint64, lookup func(string) (string, bool)) bool {
	_, set := lookup("GOGC")
	return headroomMiB > 0 && !set
}

// gcPercentFor is the GC percent whose heap goal is live + max(live,
// headroom): at least 100 (Go's default), at most gcMaxPercent.
func gcPercentFor(live, headroom uint64) int {
	if headroom <= live {
		return 100
	}
	if live == 0 {
		return gcMaxPercent
	}
	return int(min(headroom*100/live, gcMaxPercent))
}

// gcTuner sets the GC percent from the live heap: runServe's goroutine
// runs it until its context ends.
type gcTuner struct {
	headroom uint64
	// live reads the live heap (false when unavailable); set sets the
	// percent and returns the previous one (debug.SetGCPercent); tick
	// paces the readings.
	live func() (uint64, bool)
	set  func(int) int
	tick <-chan time.Time
}

// newGCTuner is the process's tuner, reading the live heap every
// gcTuneEvery; stop releases its ticker.
func newGCTuner(headroom uint64) (tu *gcTuner, stop func()) {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	t := time.NewTicker(gcTuneEvery)
	return &gcTuner{
		headroom: headroom,
		live: func() (uint64, bool) {
			metrics.Read(sample)
			if sample[0].Value.Kind() != metrics.KindUint64 {
				return 0, false
			}
			return sample[0].Value.Uint64(), true
		},
		set:  debug.SetGCPercent,
		tick: t.C,
	}, t.Stop
}

// run tunes until ctx ends, then restores the percent it found.
func (tu *gcTuner) run(ctx context.Context) {
	prev := tu.set(100)
	defer tu.set(prev)
	cur := 100
	for {
		if live, ok := tu.live(); ok {
			if p := gcPercentFor(live, tu.headroom); p*10 > cur*11 || p*11 < cur*10 {
				tu.set(p)
				cur = p
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tu.tick:
		}
	}
}

// gcTunerSlot is held by the one tuner a process runs. A second serve in
// the same process (tests run several) leaves the collector to the
// first, so that neither restores, when it stops, a percent the other
// set.
var gcTunerSlot sync.Mutex

// startGCTuner runs newTuner's tuner on a goroutine until ctx ends,
// unless another tuner of this process is running: started is then
// false and done is closed already. done closes once the tuner has
// restored the percent it found.
func startGCTuner(ctx context.Context, newTuner func() (*gcTuner, func())) (done <-chan struct{}, started bool) {
	ch := make(chan struct{})
	if !gcTunerSlot.TryLock() {
		close(ch)
		return ch, false
	}
	tu, stop := newTuner()
	go func() {
		defer close(ch)
		defer gcTunerSlot.Unlock()
		defer stop()
		tu.run(ctx)
	}()
	return ch, true
}
