package partition

import (
	"context"
	"fmt"
	"math/bits"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/shard"
)

// check is the single-policy check's path, the hot one: the gate in read
// mode, one store decision, the admission's copy queued for the backup
// before the gate is released, then (outside the gate) the disk and the
// backup waited for. It allocates nothing.
func (e *Env) check(ctx context.Context, pt *Part, r *Request, pk shard.Placed, alone bool, res *Result) (Status, <-chan struct{}, error) {
	p, hits := r.P, r.Hits
	pt.Mu.RLock()
	ch := pt.Changed
	st, now, mono := e.gateLocked(pt, r, alone)
	if st != Decided {
		pt.Mu.RUnlock()
		return st, ch, nil
	}
	if p.Unlimited {
		// The holder's table exempts the key: nothing to count or copy.
		pt.Mu.RUnlock()
		res.unlimited(now)
		res.Mono = mono
		return Decided, nil, nil
	}
	var sd shard.Decision
	at, err := pt.Store.AllowPlaced(pk, p.Shard, hits, now, &sd)
	if err != nil {
		pt.Mu.RUnlock()
		return Decided, nil, e.classify(pt.ID, err)
	}
	if at != now.UnixNano() {
		// The key's clock was ahead of ours (a decision that read the
		// clock after us took the key's lock before us): the admission is
		// recorded at the key's time, so report and copy that time.
		now = time.Unix(0, at)
	}
	sync := p.Config.Replication == policy.ReplicateSync
	var cp Copy
	var rerr error
	if sd.Allowed && pt.Backup != "" && p.Config.Replication != policy.ReplicateOff {
		cp, rerr = e.Repl.Admission(pt.Backup, pt.ID, pt.Epoch, r.Key, p.Shard.Algorithm, AdmissionRun(p, sd, hits, now), now, sync)
	}
	var didx uint64
	var derr error
	if sd.Allowed && p.Config.Durability != policy.DurabilityMemory && e.Disk != nil {
		// Kept on disk; under disk answered once fsynced.
		didx, derr = e.Disk.Log(pt.ID, pt.Epoch, pt.Store, r.Key, p.Config.Durability, now)
	}
	pt.Mu.RUnlock()
	if rerr != nil && sync {
		return Decided, nil, rerr
	}
	// syncAfter: the record is synced once the backup has answered
	// (see Disk.Sync).
	syncAfter := uint64(0)
	if derr == nil && didx != 0 && !r.DeferWait {
		if cp != nil {
			syncAfter = didx
		} else {
			derr = e.Disk.Sync(didx)
		}
		didx = 0
	}
	if derr != nil {
		return Decided, nil, derr
	}
	if sd.Allowed && !sync && e.leaseEnded() {
		return Decided, nil, ErrLeaseEnded
	}
	r.DurIdx = didx // DeferWait: the batch's receiver syncs it
	if cp != nil && r.DeferWait {
		r.Wait = cp
	} else if cp != nil {
		// The admission is recorded here; it is answered only once the
		// backup has it too (and, kept on disk, once it is on this
		// node's disk). If either does not confirm, the caller gets
		// unavailable and the admission stays counted (it can only
		// refuse more).
		select {
		case err := <-cp.Done():
			cp.Release()
			if err != nil {
				return Decided, nil, err
			}
		case <-ctx.Done():
			return Decided, nil, fmt.Errorf("%w: waiting for the backup: %w", ErrUnavailable, ctx.Err())
		}
		if syncAfter != 0 {
			if err := e.Disk.Sync(syncAfter); err != nil {
				return Decided, nil, err
			}
		}
	}
	// Field by field: a composite literal is built aside and then copied
	// in, and the copy stalls on the bytes just written.
	res.Allowed, res.Limit, res.Remaining = sd.Allowed, sd.Limit, sd.Remaining
	res.RetryAfter, res.ResetAfter, res.Reason = sd.RetryAfter, sd.ResetAfter, ReasonAdmitted
	res.DecidedAt, res.Limits, res.RefusedBy, res.Counted, res.Mono = now, nil, "", true, mono
	if !sd.Allowed {
		res.refused(p)
	}
	return Decided, nil, nil
}

// unlimited is the holder's answer for a key an Unlimited override covers.
func (res *Result) unlimited(now time.Time) {
	*res = Result{Allowed: true, Reason: ReasonUnlimited, DecidedAt: now}
}

// AdmissionRun is the admission just decided at now, as a run to add to
// the backup's copy: exact for the sliding log, fixed window and calendar,
// an upper bound on the bucket's debt for the token bucket (the copy
// refills no earlier).
func AdmissionRun(p *policy.Entry, sd shard.Decision, hits int64, now time.Time) shard.Run {
	switch p.Shard.Algorithm {
	case shard.TokenBucket:
		// debt = ceil(hits × W / L), the bucket's fill for hits units.
		hi, lo := bits.Mul64(uint64(hits), uint64(p.Shard.Window))
		q, r := bits.Div64(hi%uint64(p.Shard.Limit), lo, uint64(p.Shard.Limit))
		if r > 0 {
			q++
		}
		return shard.Run{Age: -time.Duration(q)}
	case shard.FixedWindow:
		// The window started W − ResetAfter before the decision.
		return shard.Run{Age: p.Shard.Window - sd.ResetAfter, Count: hits}
	case shard.Calendar:
		// Not an age: the start instant of the decided period (see
		// shard.Calendar). That period ends at now + ResetAfter (now may
		// trail the key's clamped time, which only moves this instant
		// earlier inside the period), so its last nanosecond names it.
		start, _ := p.Shard.Period.Bounds(now.Add(sd.ResetAfter-1), p.Shard.Zone)
		return shard.Run{Age: time.Duration(start.UnixNano()), Count: hits}
	default:
		return shard.Run{Age: 0, Count: hits}
	}
}
