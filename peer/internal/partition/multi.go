package partition

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/shard"
)

// decideMulti decides (or peeks) several policies of one subject as one,
// and queues the admissions for the backup. The top-level fields of the
// result describe the refusing policy, or the admitted policy with the
// least Remaining. When one refuses, nothing is recorded and every entry
// of Limits is what a peek of the same request would answer now.
func decideMulti(c *call) error {
	r, pt, res := &c.r, c.pt, &c.res
	now := c.now
	res.Limits = make([]PolicyDecision, len(r.Multi))
	var out [shard.MaxMulti]shard.Decision
	refused := -1
	// Policies an Unlimited override exempts take no part: they admit,
	// record nothing, and are never the top-level answer unless all are.
	counted := 0
	for i, p := range r.Multi {
		if p.Unlimited {
			out[i] = shard.Decision{Allowed: true, Remaining: math.MaxInt64}
		} else {
			counted++
		}
	}
	if r.Op == OpPeek {
		for i, p := range r.Multi {
			if p.Unlimited {
				continue
			}
			k := shard.Key{Tenant: r.Key.Tenant, Subject: r.Key.Subject, Policy: p.Name}
			sd, err := pt.Store.Peek(k, p.Shard, r.Hits, now)
			if err != nil {
				return err
			}
			out[i] = sd
			if !sd.Allowed && refused < 0 {
				refused = i
			}
		}
	} else if counted > 0 {
		var itemBuf [shard.MaxMulti]shard.MultiItem
		var idxBuf [shard.MaxMulti]int
		items, idx := itemBuf[:0], idxBuf[:0] // idx[j]: items[j] is r.Multi[idx[j]]
		for i, p := range r.Multi {
			if !p.Unlimited {
				items = append(items, shard.MultiItem{Policy: p.Name, P: p.Shard, Hits: r.Hits})
				idx = append(idx, i)
			}
		}
		var sds [shard.MaxMulti]shard.Decision
		j, at, err := pt.Store.AllowMultiAt(r.Key.Tenant, r.Key.Subject, items, now, sds[:len(items)])
		if err != nil {
			if errors.Is(err, shard.ErrInvalidMulti) {
				return fmt.Errorf("%w: %w", ErrInvalidKey, err)
			}
			return err
		}
		if at != now.UnixNano() {
			// A key's clock was ahead of ours: the decision, and every
			// admission of it, is recorded at that time (as in check), so
			// report and copy that time.
			now = time.Unix(0, at)
			res.DecidedAt = now
		}
		for k, i := range idx {
			out[i] = sds[k]
		}
		if j >= 0 {
			refused = idx[j]
		}
	}
	top := 0
	for i, p := range r.Multi {
		sd := out[i]
		if p.Unlimited {
			res.Limits[i] = PolicyDecision{Policy: p.Name, Allowed: true}
		} else {
			// A refused check recorded nothing: each policy's entry is
			// what a peek of the same request answers (the shard decided
			// them so), an admitting one counting the hits as taken, as
			// an admitted check's and a peek's do, so that the three agree.
			res.Limits[i] = PolicyDecision{Policy: p.Name, Allowed: sd.Allowed, Limit: sd.Limit, Remaining: sd.Remaining, RetryAfter: sd.RetryAfter, ResetAfter: sd.ResetAfter}
		}
		if sd.Remaining < out[top].Remaining {
			top = i
		}
	}
	if refused >= 0 {
		top = refused
		res.RefusedBy = r.Multi[refused].Name
	}
	res.fill(out[top], ReasonAdmitted)
	res.Allowed = refused < 0
	switch {
	case counted == 0:
		res.Allowed, res.Limit, res.Remaining, res.RetryAfter, res.ResetAfter, res.Reason = true, 0, 0, 0, 0, ReasonUnlimited
		c.admitted = true
		return nil
	case r.Op == OpPeek:
		res.Reason = ReasonPeek
		return nil
	case refused >= 0:
		res.Reason = ReasonOverLimit
		shadow := true
		for _, p := range r.Multi {
			shadow = shadow && p.Config.Shadow
		}
		if shadow {
			res.Allowed, res.Reason = true, ReasonShadow
		}
		c.admitted = res.Allowed
		return nil
	}
	c.admitted = true
	if pt.Backup == "" {
		return nil
	}
	for i, p := range r.Multi {
		if p.Config.Replication == policy.ReplicateOff || p.Unlimited {
			continue
		}
		k := shard.Key{Tenant: r.Key.Tenant, Subject: r.Key.Subject, Policy: p.Name}
		sync := p.Config.Replication == policy.ReplicateSync
		w, err := c.e.Repl.Admission(pt.Backup, pt.ID, pt.Epoch, k, p.Shard.Algorithm, AdmissionRun(p, out[i], r.Hits, now), now, sync)
		if err != nil {
			if sync {
				return err
			}
			continue
		}
		if w != nil {
			c.waits = append(c.waits, w)
		}
	}
	return nil
}
