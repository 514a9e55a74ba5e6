package peer

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestRecopierNeverBlocks: while the runner does not take its events, note
// returns at once; what is noted meanwhile reaches the runner once each
// partition, at its newest epoch; and the goroutine that hands them on
// ends once the node's context ends and the runner stops (as a closing
// node's runner does), with a partition still pending.
func TestRecopierNeverBlocks(t *testing.T) {
	type ev struct {
		pid   int
		epoch uint64
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	took := make(chan ev)             // unbuffered: the runner takes one at a time
	stopped := make(chan struct{})    // the runner stopped (Runner.do returns)
	entered := make(chan struct{}, 1) // send was called
	rc := newRecopier(ctx, &wg, func(pid int, epoch uint64) {
		select {
		case entered <- struct{}{}:
		default:
		}
		select {
		case took <- ev{pid, epoch}:
		case <-stopped:
		}
	})
	rc.note(1, 3) // handed on at once: the goroutine waits in send
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first partition noted did not reach the runner")
	}
	noted := make(chan struct{})
	go func() {
		defer close(noted)
		for range 1000 {
			rc.note(2, 5)
			rc.note(2, 4) // older: owes nothing more
			rc.note(3, 1)
		}
		rc.note(3, 2)
	}()
	select {
	case <-noted:
	case <-time.After(10 * time.Second):
		t.Fatal("note blocked while the runner took nothing")
	}
	got := map[int]uint64{}
	for range 3 {
		select {
		case e := <-took:
			if _, dup := got[e.pid]; dup {
				t.Fatalf("partition %d handed on twice (epochs %d and %d); want once", e.pid, got[e.pid], e.epoch)
			}
			got[e.pid] = e.epoch
		case <-time.After(10 * time.Second):
			t.Fatalf("the runner got %v; want partitions 1, 2 and 3", got)
		}
	}
	if want := map[int]uint64{1: 3, 2: 5, 3: 2}; len(got) != len(want) || got[1] != want[1] || got[2] != want[2] || got[3] != want[3] {
		t.Fatalf("the runner got %v, want %v (each partition at its newest epoch)", got, want)
	}
	// None pending: the goroutine ended; a new note starts another.
	rc.note(4, 1)
	cancel()
	close(stopped)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the recopier's goroutine did not end with its context")
	}
	rc.note(5, 1) // after the end: nothing is started
	wg.Wait()
}
