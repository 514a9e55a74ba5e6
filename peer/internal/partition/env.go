package partition

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/shard"
)

// Lease is this node's ownership lease, as the decision path asks it; the
// ownership log's runner (internal/ownlog.Runner) satisfies it. Times are
// the node's monotonic clock in nanoseconds.
type Lease interface {
	// MayDecide reports whether this node may decide for partition pid at
	// mono: the log's table names it holder at its current liveness epoch
	// and its liveness has not expired.
	MayDecide(pid int, mono int64) bool
	// LiveUntil is when this node's liveness expires.
	LiveUntil() int64
}

// Replicator queues copies of a holder's changes for a partition's backup
// (the per-peer replication link). A Copy is returned only when wait is
// set and the copy was queued; an error means it was not queued.
type Replicator interface {
	// Admission queues one admission of key, decided at at, as run.
	Admission(to string, pid int, epoch uint64, key shard.Key, alg shard.Algorithm, run shard.Run, at time.Time, wait bool) (Copy, error)
	// State queues key's whole state st (ages relative to at), replacing
	// the backup's.
	State(to string, pid int, epoch uint64, st shard.KeyState, at time.Time, wait bool) (Copy, error)
}

// Copy is a queued copy a decision waits for.
type Copy interface {
	// Done yields the backup's answer once.
	Done() <-chan error
	// Release hands the copy back once Done has yielded (never after
	// giving up on it).
	Release()
}

// Disk keeps the keys of policies kept on disk (the data directory).
type Disk interface {
	// Log records key's state in partition pid's log; the index returned
	// is to Sync before answering (0: none to wait for). A key the store
	// no longer has is logged empty.
	Log(pid int, epoch uint64, st *shard.Store, key shard.Key, dur policy.Durability, now time.Time) (uint64, error)
	// Sync returns once the log holds idx on disk. A decision that
	// also waits for its backup syncs after the backup's answer, not
	// before: the backup's round trip (its own fsync and two hops) is the
	// longer wait, and meanwhile the fsyncs this node runs as a backup
	// of other holders' partitions usually take the record with them,
	// so that Sync returns at once instead of running an fsync of its own.
	Sync(idx uint64) error
}

// Env is what the decisions on this node's partitions need from the node.
// Its fields are set before the first decision and not changed after.
type Env struct {
	Lease Lease
	Repl  Replicator
	// Disk is nil when no data directory is kept.
	Disk Disk
	// Now reads the node's clock and its monotonic clock for a decision.
	// It is read under the partition's gate, after the role check: a
	// reading taken before the gate was waited for could pass the lease
	// check after the lease ended, and record admissions too early.
	Now func() (time.Time, int64)
	// Mono reads the node's monotonic clock: the lease is checked again
	// after an admission, at the instant the decision is done.
	Mono func() int64
	// Capacity turns a store's shard.ErrCapacity for partition pid into
	// the caller's error (and warns where the operator can act).
	Capacity func(pid int, cause error) error
	// Pause, when it holds a func, runs between the lease check and the
	// decision (tests: a process paused there).
	Pause *atomic.Pointer[func()]
}

// Status says what Decide did.
type Status uint8

const (
	// Decided: a Result, or an error for the caller.
	Decided Status = iota
	// Wait: this node holds or will hold the partition but may not decide
	// yet (fenced for a move, its lease or a backup on their way).
	Wait
	// Remote: another node holds the partition.
	Remote
)

// Decide decides r on partition pt, which r's key (placed as pk) belongs
// to, if this node holds it and may decide now (Env.Now, read under the
// partition's gate): a Result in *res, or an error for the caller. For Wait and
// Remote the channel returned is closed at the partition's next change.
// alone says this node is the only live member (a synchronous policy then
// decides without a backup). *res is written only for a decision.
func (e *Env) Decide(ctx context.Context, pt *Part, r *Request, pk shard.Placed, alone bool, res *Result) (Status, <-chan struct{}, error) {
	if r.Op == OpCheck && r.Multi == nil {
		return e.check(ctx, pt, r, pk, alone, res)
	}
	return e.decide(ctx, pt, r, alone, res)
}

// gateLocked is the one check before every decision, with pt.Mu held:
// this node holds the partition, its lease lets it decide at mono, and a
// synchronous policy has its backup (unless this node is alone).
func (e *Env) gateLocked(pt *Part, r *Request, alone bool) (Status, time.Time, int64) {
	switch pt.Role {
	case RoleFenced:
		return Wait, time.Time{}, 0
	case RoleHolder:
	default:
		return Remote, time.Time{}, 0
	}
	now, mono := e.Now()
	if !e.Lease.MayDecide(pt.ID, mono) || r.Op != OpPeek && r.Sync() && pt.Backup == "" && !alone {
		// The lease ended or its renewal is late, or a synchronous
		// policy waits for the backup the holder is making.
		return Wait, now, mono
	}
	if h := e.Pause.Load(); h != nil {
		(*h)() // tests: a pause between the lease check and the decision
	}
	return Decided, now, mono
}

// leaseEnded reports whether the lease has ended, now. It is checked
// before a decision and, for admissions no backup fences, again after: a
// process paused between the check and the decision (a GC pause, SIGSTOP,
// a VM stall) may wake after its backup has taken over. A synchronous copy
// is then refused by the backup, which fences the admission; an
// asynchronous one or none is not, so the answer must not confirm it. The
// admission stays recorded here, where it can only refuse more.
func (e *Env) leaseEnded() bool { return e.Mono() >= e.Lease.LiveUntil() }

// classify turns a decision's error into the caller's.
func (e *Env) classify(pid int, err error) error {
	switch {
	case errors.Is(err, shard.ErrInvalidHits):
		return fmt.Errorf("%w: %w", ErrInvalidHits, err)
	case errors.Is(err, shard.ErrWrongAlgorithm):
		return fmt.Errorf("%w: %w", ErrWrongAlgorithm, err)
	case errors.Is(err, shard.ErrCapacity):
		return e.Capacity(pid, err)
	case errors.Is(err, ErrInvalidKey), errors.Is(err, ErrInvalidHits), errors.Is(err, ErrWrongAlgorithm), errors.Is(err, ErrUnavailable):
		return err
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// NewLeaseID returns a random lease (or reservation, or grant) id, never
// zero. A holder that takes over does not know which ids its predecessor
// handed out beyond those in its copy; random ids need no coordination,
// and the store refuses an id the key holds (the holder then draws again).
func NewLeaseID() uint64 {
	for {
		if id := rand.Uint64(); id != 0 {
			return id
		}
	}
}
