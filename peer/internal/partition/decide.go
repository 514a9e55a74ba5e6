package partition

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/shard"
)

// call is one decision under way, under the partition's gate.
type call struct {
	e  *Env
	pt *Part
	// r is the request, copied in and its answers copied out (as res).
	r   Request
	now time.Time
	// res is the decision, copied out at the end: a pointer to the
	// caller's here would move it to the heap with whatever the
	// collaborators are given.
	res Result
	// waits are the backup's copies to wait for before answering.
	waits []Copy
	// admitted: the decision admitted units (checked against the lease
	// again after, unless a synchronous copy fences them).
	admitted bool
}

// decide is the path of every operation but the single check: the gate
// (in write mode for an exclusive operation), the operation's decision
// and its copies queued, the disk, the lease again, then the backup's
// answers.
func (e *Env) decide(ctx context.Context, pt *Part, r *Request, alone bool, res *Result) (Status, <-chan struct{}, error) {
	spec := r.Op.Spec()
	if spec.decide == byNone {
		return Decided, nil, fmt.Errorf("%w: unknown operation %v", ErrInvalidKey, r.Op)
	}
	lock, unlock := pt.Mu.RLock, pt.Mu.RUnlock
	if spec.Exclusive {
		lock, unlock = pt.Mu.Lock, pt.Mu.Unlock
	}
	lock()
	ch := pt.Changed
	st, now, mono := e.gateLocked(pt, r, alone)
	if st != Decided {
		unlock()
		return st, ch, nil
	}
	c := call{e: e, pt: pt, r: *r, now: now, res: Result{DecidedAt: now, Mono: mono}}
	var err error
	if r.Multi != nil {
		err = decideMulti(&c)
	} else {
		err = c.run(spec.decide)
	}
	var didx uint64
	if e.Disk != nil && err == nil {
		didx, err = c.log()
	}
	unlock()
	*r = c.r
	if err == nil && didx != 0 {
		err = e.Disk.Sync(didx)
	}
	if err == nil && spec.Admits && c.admitted && !r.fenced() && e.leaseEnded() {
		// As in check: not confirmed without a fencing copy.
		err = ErrLeaseEnded
	}
	if err != nil {
		return Decided, nil, e.classify(pt.ID, err)
	}
	for _, w := range c.waits {
		select {
		case err := <-w.Done():
			w.Release()
			if err != nil && !spec.Frees {
				return Decided, nil, err
			}
		case <-ctx.Done():
			if !spec.Frees {
				return Decided, nil, fmt.Errorf("%w: waiting for the backup: %w", ErrUnavailable, ctx.Err())
			}
			*res = c.res
			return Decided, nil, nil
		}
	}
	*res = c.res
	return Decided, nil, nil
}

// copyState queues the key's whole new state for the partition's backup
// (the gate is held in write mode). A policy with replication off sends
// nothing. The error (the copy was not queued) is returned only when
// wait is set; otherwise the change stands here all the same and the
// backup keeps the state of before it, which only refuses more after a
// takeover.
func (c *call) copyState(wait bool) error {
	pt, r := c.pt, &c.r
	if pt.Backup == "" || r.P.Config.Replication == policy.ReplicateOff {
		return nil
	}
	st, ok := pt.Store.Export(r.Key, c.now)
	if !ok {
		st = shard.KeyState{Key: r.Key, Algorithm: r.P.Shard.Algorithm}
	}
	w, err := c.e.Repl.State(pt.Backup, pt.ID, pt.Epoch, st, c.now, wait)
	if err != nil {
		if wait {
			return err
		}
		return nil
	}
	if w != nil {
		c.waits = append(c.waits, w)
	}
	return nil
}

// log records, for each of the request's policies kept on disk, the state
// the operation left; a peek, or a check refused, changed nothing.
func (c *call) log() (uint64, error) {
	r := &c.r
	if r.Op == OpPeek || r.Op == OpCheck && !c.res.Allowed && r.Multi == nil {
		return 0, nil
	}
	if r.Multi == nil {
		return c.logKey(r.P, r.Key, 0)
	}
	var last uint64
	for _, q := range r.Multi {
		k := r.Key
		k.Policy = q.Name
		var err error
		if last, err = c.logKey(q, k, last); err != nil {
			return 0, err
		}
	}
	return last, nil
}

// logKey records key's state when its policy p is kept on disk, and
// returns the index to Sync (last when nothing new is to wait for).
func (c *call) logKey(p *policy.Entry, key shard.Key, last uint64) (uint64, error) {
	if p == nil || p.Unlimited || p.Config.Durability == policy.DurabilityMemory {
		return last, nil
	}
	idx, err := c.e.Disk.Log(c.pt.ID, c.pt.Epoch, c.pt.Store, key, p.Config.Durability, c.now)
	if idx != 0 {
		last = idx
	}
	return last, err
}

func decidePeek(c *call) error {
	r := &c.r
	if r.P.Unlimited {
		c.res.unlimited(c.now)
		return nil
	}
	sd, err := c.pt.Store.Peek(r.Key, r.P.Shard, r.Hits, c.now)
	c.res.fill(sd, ReasonPeek)
	return err
}

func decideRefund(c *call) error {
	r := &c.r
	sd, err := c.pt.Store.Refund(r.Key, r.P.Shard, r.Hits, c.now)
	c.res.fill(sd, ReasonRefunded)
	if err != nil {
		return err
	}
	_ = c.copyState(r.P.Config.Replication == policy.ReplicateSync) // Frees: never fails it
	return nil
}

func decideReset(c *call) error {
	r := &c.r
	c.pt.Store.Delete(r.Key)
	c.res = Result{Allowed: true, Limit: r.P.Shard.Limit, Remaining: r.P.Shard.Limit, Reason: ReasonReset, DecidedAt: c.now}
	_ = c.copyState(r.P.Config.Replication == policy.ReplicateSync) // Frees: never fails it
	return nil
}

// decideRelease ends a lease. Its copy is not waited for: if the holder
// fails before the backup has it, the backup keeps the lease until its
// TTL, which only refuses more.
func decideRelease(c *call) error {
	r := &c.r
	sd, err := c.pt.Store.Release(r.Key, r.P.Shard, r.Lease, c.now)
	if err != nil {
		return err
	}
	c.res.fill(sd, ReasonReleased)
	if sd.Allowed {
		_ = c.copyState(false)
	}
	return nil
}

// decideAcquire takes a lease; under ReplicateSync it is answered only
// once the backup has it, so a crash of the holder loses no lease.
func decideAcquire(c *call) error {
	return c.takeID(false)
}

// decideReserve admits an estimate, pending under a new id; a drawn id
// already pending is drawn again, and a key at MaxPendingReservations
// fails every draw (ErrInvalidHits: the caller must settle some first).
func decideReserve(c *call) error {
	err := c.takeID(true)
	if errors.Is(err, shard.ErrInvalidReservation) {
		return fmt.Errorf("%w: %w", ErrInvalidHits, err)
	}
	return err
}

// takeID is acquire's and reserve's decision: an id drawn (again while the
// store refuses it as taken), the key's new state copied, waited for under
// ReplicateSync.
func (c *call) takeID(reserve bool) error {
	r, p := &c.r, c.r.P
	r.LeaseTTL = p.Shard.Window
	if p.Unlimited {
		r.Lease = NewLeaseID()
		c.res.unlimited(c.now)
		c.admitted = true
		return nil
	}
	var sd shard.Decision
	var err error
	for range 4 {
		r.Lease = NewLeaseID()
		if reserve {
			if sd, err = c.pt.Store.Reserve(r.Key, p.Shard, r.Hits, r.Lease, c.now); !errors.Is(err, shard.ErrInvalidReservation) {
				break
			}
		} else if sd, err = c.pt.Store.Acquire(r.Key, p.Shard, r.Hits, r.Lease, c.now); !errors.Is(err, shard.ErrInvalidLease) {
			break
		}
	}
	if err != nil {
		return err
	}
	c.res.fill(sd, ReasonAdmitted)
	if !sd.Allowed {
		// Shadow admits without an id the store holds: it ends harmlessly.
		c.res.refused(p)
		c.admitted = c.res.Allowed
		return nil
	}
	c.admitted = true
	return c.copyState(p.Config.Replication == policy.ReplicateSync)
}

// decideSettle settles a reservation. Its copy is waited for but cannot
// fail it: it took effect here, and a retry finds nothing pending.
func decideSettle(c *call) error {
	r := &c.r
	st, err := c.pt.Store.Settle(r.Key, r.P.Shard, r.Lease, r.Actual, c.now)
	if err != nil {
		return err
	}
	c.res.fill(st.Decision, ReasonSettled)
	r.Estimate, r.Overage = st.Estimate, st.Overage
	if st.Allowed {
		_ = c.copyState(true)
	}
	return nil
}

// decideGrant ends the returned grants and grants new rights (a spread
// key); a grant is waited for under ReplicateSync, so a takeover's new
// holder charges it.
func decideGrant(c *call) error {
	r, p := &c.r, c.r.P
	if p.Config.Spread == policy.SpreadOff || p.Unlimited {
		// The holder's table does not spread this policy (a table change
		// under way): grant nothing, so the grantee forwards.
		c.res.Limit, c.res.Reason = p.Shard.Limit, ReasonAdmitted
		return nil
	}
	changed := false
	for _, ret := range r.Returns {
		res, err := c.pt.Store.Return(r.Key, p.Shard, ret.ID, ret.Uses, c.now)
		if err != nil {
			return err
		}
		changed = changed || res.Found
	}
	var g shard.GrantResult
	var err error
	for range 4 {
		r.Lease = NewLeaseID()
		if g, err = c.pt.Store.Grant(r.Key, p.Shard, r.Hits, p.Config.Lease(), r.Lease, c.now); !errors.Is(err, shard.ErrInvalidReservation) {
			break
		}
	}
	if err != nil {
		return err
	}
	c.res.fill(g.Decision, ReasonAdmitted)
	r.Granted, r.LeaseTTL = g.Granted, p.Config.Lease()
	c.admitted = g.Granted > 0
	if g.Granted == 0 {
		r.Lease = 0
		if !changed {
			return nil
		}
	}
	return c.copyState(g.Granted > 0 && p.Config.Replication == policy.ReplicateSync)
}
