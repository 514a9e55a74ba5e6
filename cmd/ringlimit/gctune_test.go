package main

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestGCTuning: GOGC in the environment, even GOGC=100, or a headroom
// of 0 leaves Go's collector alone.
func TestGCTuning(t *testing.T) {
	env := func(vars ...string) func(string) (string, bool) {
		return func(k string) (string, bool) {
			for i := 0; i+1 < len(vars); i += 2 {
				if vars[i] == k {
					return vars[i+1], true
				}
			}
			return "", false
		}
	}
	for _, tc := range []struct {
		headroom uint64
		lookup   func(string) (string, bool)
		want     bool
	}{
		{64, env(), true},
		{64, env("GOMEMLIMIT", "1GiB"), true},
		{64, env("GOGC", "100"), false},
		{64, env("GOGC", ""), false},
		{0, env(), false},
	} {
		if got := gcTuning(tc.headroom, tc.lookup); got != tc.want {
			t.Errorf("gcTuning(%d, GOGC %v) = %v, want %v", tc.headroom, func() bool { _, ok := tc.lookup("GOGC"); return ok }(), got, tc.want)
		}
	}
}

// TestGCPercentFor: the heap goal is live + max(live, headroom), so the
// percent is Go's default once the live heap reaches the headroom, and
// capped for a tiny one.
func TestGCPercentFor(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		live, headroom uint64
		want           int
	}{
		{16 * mib, 64 * mib, 400},
		{32 * mib, 64 * mib, 200},
		{64 * mib, 64 * mib, 100},
		{1024 * mib, 64 * mib, 100},
		{1 * mib, 64 * mib, gcMaxPercent},
		{0, 64 * mib, gcMaxPercent},
	} {
		if got := gcPercentFor(tc.live, tc.headroom); got != tc.want {
			t.Errorf("gcPercentFor(%d MiB, %d MiB) = %d, want %d", tc.live/mib, tc.headroom/mib, got, tc.want)
		}
	}
}

// TestGCTunerRun: the tuner sets the percent the live heap asks for,
// leaves it while the heap moves it by a tenth or less, follows a larger
// move, and puts back the percent it found when its context ends.
func TestGCTunerRun(t *testing.T) {
	const mib = 1 << 20
	live := make(chan uint64)
	sets := make(chan int, 8)
	tick := make(chan time.Time)
	percent := 77
	tu := &gcTuner{
		headroom: 64 * mib,
		live:     func() (uint64, bool) { return <-live, true },
		set:      func(p int) int { old := percent; percent = p; sets <- p; return old },
		tick:     tick,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); tu.run(ctx) }()
	next := func(what string) int {
		t.Helper()
		timeout := time.NewTimer(10 * time.Second)
		defer timeout.Stop()
		select {
		case p := <-sets:
			return p
		case <-timeout.C:
			t.Fatalf("no percent set within 10 s: %s", what)
			return 0
		}
	}
	if p := next("at start"); p != 100 {
		t.Fatalf("first set %d, want Go's default 100 while the heap is unread", p)
	}
	live <- 16 * mib
	if p := next("16 MiB live"); p != 400 {
		t.Fatalf("16 MiB live with 64 MiB headroom: set %d, want 400", p)
	}
	tick <- time.Time{}
	live <- 17 * mib // 376: within a tenth of 400
	tick <- time.Time{}
	live <- 40 * mib // 160
	if p := next("40 MiB live"); p != 160 {
		t.Fatalf("40 MiB live: set %d, want 160 (17 MiB's 376 was within a tenth and left alone)", p)
	}
	cancel()
	// The tuner is in its select, or about to read the heap once more.
	select {
	case live <- 40 * mib:
	case <-done:
	}
	<-done
	if percent != 77 {
		t.Fatalf("after the tuner stopped the percent is %d, want the 77 it found", percent)
	}
}

// TestGCTunerOnePerProcess: while one tuner runs, a second is not
// started (it would restore, when it stopped, the percent the first had
// set); once the first has stopped and restored its percent, another
// may start.
func TestGCTunerOnePerProcess(t *testing.T) {
	percent := 77
	var mu sync.Mutex
	fake := func() (*gcTuner, func()) {
		return &gcTuner{
			headroom: 64 << 20,
			live:     func() (uint64, bool) { return 16 << 20, true },
			set: func(p int) int {
				mu.Lock()
				defer mu.Unlock()
				old := percent
				percent = p
				return old
			},
			tick: make(chan time.Time), // never: one reading
		}, func() {}
	}
	ctx1, cancel1 := context.WithCancel(context.Background())
	done1, ok := startGCTuner(ctx1, fake)
	if !ok {
		cancel1()
		t.Fatal("the first tuner did not start")
	}
	newCalled := false
	done2, ok := startGCTuner(context.Background(), func() (*gcTuner, func()) { newCalled = true; return fake() })
	if ok || newCalled {
		cancel1()
		t.Fatalf("a second tuner started (%v) or was built (%v) while the first ran", ok, newCalled)
	}
	select {
	case <-done2:
	default:
		t.Fatal("the tuner that did not start has an open done")
	}
	cancel1()
	select {
	case <-done1:
	case <-time.After(10 * time.Second):
		t.Fatal("the first tuner did not stop within 10 s of its context's end")
	}
	mu.Lock()
	got := percent
	mu.Unlock()
	if got != 77 {
		t.Fatalf("after the first tuner stopped the percent is %d, want the 77 it found", got)
	}
	ctx3, cancel3 := context.WithCancel(context.Background())
	done3, ok := startGCTuner(ctx3, fake)
	cancel3()
	if !ok {
		t.Fatal("no tuner could start after the first stopped")
	}
	<-done3
}
