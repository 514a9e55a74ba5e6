package peer

import (
	"context"
	"sync"
	"time"
)

// batchCtx is a CheckStream worker's context for the batch it decides: the
// stream's context, ended also at the batch's deadline (the sender's
// timeout). context.WithDeadline would cost three allocations per batch
// (the context, its timer, its channel); a batchCtx is made once per
// worker and armed for each batch, and allocates again only for a batch
// after one whose context ended.
//
// Rules: begin arms it for a batch, end disarms it; only the worker calls
// them, and the batch's users stop using it at end. Its timer may fire
// late, after end or into the next batch; it ends the context only when
// the armed deadline has passed, so a late firing cannot end a later
// batch early.
type batchCtx struct {
	parent context.Context
	stop   func() bool // unregisters from parent

	mu       sync.Mutex
	deadline time.Time
	done     chan struct{}
	err      error // why done was closed; nil while it is open
	timer    *time.Timer
}

// newBatchCtx returns a batch context under parent; stop it with close.
func newBatchCtx(parent context.Context) *batchCtx {
	c := &batchCtx{parent: parent, done: make(chan struct{})}
	c.timer = time.AfterFunc(time.Hour, c.fire)
	c.timer.Stop()
	c.stop = context.AfterFunc(parent, func() { c.end(context.Cause(parent)) })
	return c
}

// begin arms c for a batch that ends at deadline.
func (c *batchCtx) begin(deadline time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		if perr := c.parent.Err(); perr != nil {
			return // the stream has ended: so has every batch
		}
		c.done, c.err = make(chan struct{}), nil
	}
	c.deadline = deadline
	c.timer.Reset(time.Until(deadline))
}

// finish disarms c at the end of a batch.
func (c *batchCtx) finish() { c.timer.Stop() }

// close releases c's hold on its parent and its timer.
func (c *batchCtx) close() {
	c.stop()
	c.timer.Stop()
}

// fire is the timer's: it ends the batch if its deadline has passed.
func (c *batchCtx) fire() {
	c.mu.Lock()
	late := time.Now().Before(c.deadline)
	c.mu.Unlock()
	if !late {
		c.end(context.DeadlineExceeded)
	}
}

// end ends the current batch with err.
func (c *batchCtx) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = err
		close(c.done)
	}
}

func (c *batchCtx) Deadline() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.deadline, true
}

func (c *batchCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done
}

func (c *batchCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == context.DeadlineExceeded || c.err == nil {
		return c.err
	}
	// The parent ended: report it as context errors do (Canceled or
	// DeadlineExceeded), its cause aside.
	return c.parent.Err()
}

func (c *batchCtx) Value(key any) any { return c.parent.Value(key) }
