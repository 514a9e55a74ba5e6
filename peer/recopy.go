package peer

import (
	"context"
	"sync"
)

// recopier hands the ownership runner the partitions whose async
// replication failed (issue 52, hole 1). An admission, grant, reservation
// or lease replicated without waiting stays counted on the holder whatever
// the backup answers; when its batch fails, is refused or only partly
// accepted, or it is never queued, the backup lacks it, and a holder crash
// would admit it again until the window passes. So the holder copies the
// partition to its backup again (ownership.Machine.Recopy): the copy is
// taken from the holder's store, which holds every admission the backup
// missed, and the loss lasts until that copy.
//
// The runner takes events on its own goroutine, and a sender that queues
// one may wait for it (ownlog.Runner.Recopy does); the senders here are
// the replication loop, a pipe's receiver and the decision path, which must
// not wait for the runner (it runs copies, whose replication barrier waits
// for the very loop that failed). So note only records the partition and
// its epoch, one pending epoch per partition (the set is bounded by the
// partition count), and one goroutine the node owns hands them on, started
// when the first is noted and ending once none is left or the node closes.
// Safe for concurrent use.
type recopier struct {
	ctx context.Context // the node's lifetime: nothing is noted once it ends
	wg  *sync.WaitGroup // the node's goroutines; the handing-on one joins them
	// send tells the runner; it may block until the runner takes it (or
	// stops).
	send func(pid int, epoch uint64)

	mu sync.Mutex
	// pending maps a partition to the newest epoch of its failed items not
	// yet handed on: an older epoch owes nothing (Machine.Recopy: the copy
	// that made the current backup already held those admissions).
	pending map[int]uint64
	// running: the handing-on goroutine runs and will see what is pending.
	running bool
}

// newRecopier returns a recopier that hands partitions to send on
// goroutines counted in wg, until ctx ends.
func newRecopier(ctx context.Context, wg *sync.WaitGroup, send func(pid int, epoch uint64)) *recopier {
	return &recopier{ctx: ctx, wg: wg, send: send, pending: map[int]uint64{}}
}

// note records that an item of partition pid replicated at epoch without
// waiting did not reach the backup. It never blocks on the runner.
func (rc *recopier) note(pid int, epoch uint64) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.ctx.Err() != nil {
		return // closing: the node decides nothing more
	}
	if e, ok := rc.pending[pid]; ok && e >= epoch {
		return
	}
	rc.pending[pid] = epoch
	if rc.running {
		return
	}
	rc.running = true
	rc.wg.Add(1)
	go rc.handOn()
}

// handOn tells the runner of each pending partition, one at a time, until
// none is left or the node closes.
func (rc *recopier) handOn() {
	defer rc.wg.Done()
	for {
		rc.mu.Lock()
		pid, epoch, ok := -1, uint64(0), false
		if rc.ctx.Err() == nil {
			for p, e := range rc.pending {
				pid, epoch, ok = p, e, true
				break
			}
		}
		if !ok {
			clear(rc.pending)
			rc.running = false
			rc.mu.Unlock()
			return
		}
		delete(rc.pending, pid)
		rc.mu.Unlock()
		// Not holding mu: the runner may take a while, and notes go on
		// meanwhile. It returns once the runner has the event or has
		// stopped (which a closing node's runner does first).
		rc.send(pid, epoch)
	}
}
