package peer

import (
	"context"
	"errors"
	"testing"
	"time"
)

type batchCtxKey struct{}

// TestBatchCtx checks a CheckStream worker's reusable batch context: it
// ends at the batch's deadline (DeadlineExceeded) or with the stream
// (Canceled), a later batch starts open however late the last timer
// fires, its values are the stream's, and arming it allocates nothing.
func TestBatchCtx(t *testing.T) {
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), batchCtxKey{}, "v"))
	defer cancel()
	c := newBatchCtx(parent)
	defer c.close()
	ended := func(what string) {
		t.Helper()
		select {
		case <-c.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the batch context did not end", what)
		}
	}
	open := func(what string) {
		t.Helper()
		select {
		case <-c.Done():
			t.Fatalf("%s: the batch context ended (%v)", what, c.Err())
		default:
		}
		if c.Err() != nil {
			t.Fatalf("%s: Err = %v, want nil", what, c.Err())
		}
	}

	// A batch whose deadline passes.
	dl := time.Now().Add(20 * time.Millisecond)
	c.begin(dl)
	if got, ok := c.Deadline(); !ok || !got.Equal(dl) {
		t.Fatalf("Deadline = %v, %v; want %v, true", got, ok, dl)
	}
	if c.Value(batchCtxKey{}) != "v" {
		t.Fatal("the batch context lost the stream's values")
	}
	ended("past its deadline")
	if !errors.Is(c.Err(), context.DeadlineExceeded) {
		t.Fatalf("Err = %v, want DeadlineExceeded", c.Err())
	}
	c.finish()

	// The next batch starts open, and a firing of the timer before its
	// deadline (one armed for the last batch, running late) leaves it so.
	c.begin(time.Now().Add(time.Hour))
	open("the batch after one that timed out")
	c.fire()
	open("a late timer firing")
	c.finish()

	// The timer of a batch that finished fires after its deadline, before
	// the next batch: the next one still starts open.
	c.begin(time.Now().Add(-time.Millisecond))
	ended("a batch begun past its deadline")
	c.finish()
	c.begin(time.Now().Add(time.Hour))
	open("the batch after")

	if !raceEnabled {
		if a := testing.AllocsPerRun(100, func() {
			c.finish()
			c.begin(time.Now().Add(time.Hour))
		}); a != 0 {
			t.Errorf("arming the batch context allocates %.0f times, want 0", a)
		}
	}

	// The stream ends: so does the batch, and every later one.
	cancel()
	ended("the stream ended")
	if !errors.Is(c.Err(), context.Canceled) {
		t.Fatalf("Err = %v, want Canceled", c.Err())
	}
	c.finish()
	c.begin(time.Now().Add(time.Hour))
	ended("a batch begun after the stream ended")
}
