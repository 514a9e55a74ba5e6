package shard

import (
	"fmt"
	"time"
)

// MaxMulti bounds the number of policies of one AllowMulti call, which
// bounds the work done under one stripe lock.
const MaxMulti = 16

// MultiItem is one policy of an AllowMulti call: the policy's name (the
// key's third part), the policy itself and the request's cost under it.
type MultiItem struct {
	Policy string
	P      Policy
	Hits   int64
}

// AllowMulti decides several policies of one (tenant, subject) as one
// atomic decision at now: the request is admitted only if every policy
// admits its hits, and then every policy records them; otherwise none does.
// Every policy's key shares one lock stripe (see Key.AppendPlacement), so
// no other decision on any of them can interleave.
//
// out[i] receives reqs[i]'s Decision as that policy alone would give it
// (Store.Allow, or Store.Peek when the request is refused overall, so an
// Allowed entry in a refused call recorded nothing). refused is the index
// of the first policy that refused, or -1 if the request was admitted (or
// on error). out must hold at least len(reqs) decisions; the caller owns it,
// so a call on existing keys does not allocate.
//
// reqs must hold 1 to MaxMulti items with distinct policy names; each key,
// policy and hits is checked as in Allow. Any error (ErrInvalidMulti,
// ErrInvalidKey, ErrInvalidPolicy, ErrInvalidHits, ErrWrongAlgorithm for a
// Concurrency policy, ErrCapacity) changes nothing. The decision's time is
// now clamped to the latest clock of its keys (see AllowMultiAt).
func (s *Store) AllowMulti(tenant, subject string, reqs []MultiItem, now time.Time, out []Decision) (refused int, err error) {
	refused, _, err = s.AllowMultiAt(tenant, subject, reqs, now, out)
	return refused, err
}

// AllowMultiAt is AllowMulti that also returns the decision's time in Unix
// nanoseconds: now, or the latest clock among the keys if one is ahead of
// now (a decision that read the clock later took the lock first). The whole
// decision is taken, and every admission recorded, at that one time, as
// Allow records at the key's clamped time: never earlier than a decision
// already recorded on any of the keys.
func (s *Store) AllowMultiAt(tenant, subject string, reqs []MultiItem, now time.Time, out []Decision) (refused int, at int64, err error) {
	t := now.UnixNano()
	if err := checkMulti(tenant, subject, reqs, out); err != nil {
		return -1, t, err
	}
	var buf [MaxEncodedKeyLen]byte
	pre := appendPlacement(buf[:0], tenant, subject)
	// key appends a policy name after pre, reusing buf's tail.
	key := func(policy string) []byte {
		ek := append(pre, byte(len(policy)))
		return append(ek, policy...)
	}
	st := s.stripeForPlacement(pre)
	var ents [MaxMulti]*entry
	st.mu.Lock()
	defer st.mu.Unlock()
	refused = -1
	missing := int64(0)
	for i := range reqs {
		ents[i] = st.m[string(key(reqs[i].Policy))]
		if ents[i] == nil {
			missing++
		} else {
			t = max(t, ents[i].last)
		}
	}
	for i := range reqs {
		r := &reqs[i]
		out[i] = s.peekLocked(ents[i], r.P, r.Hits, t)
		if !out[i].Allowed && refused < 0 {
			refused = i
		}
	}
	if refused >= 0 {
		return refused, t, nil
	}
	if missing > 0 {
		// Reserve every new key before creating any, so that ErrCapacity
		// leaves nothing behind. Reclaiming idle entries may remove some
		// of ents (idle means equivalent to fresh, so every decision
		// above still holds): look them up again and reserve the extra.
		if err := s.reserveLocked(st, missing, t, false); err != nil {
			s.sweepStripeLocked(st, t)
			missing = 0
			for i := range reqs {
				if ents[i] = st.m[string(key(reqs[i].Policy))]; ents[i] == nil {
					missing++
				}
			}
			if err := s.reserveLocked(st, missing, t, false); err != nil {
				return -1, t, err
			}
		}
		for i := range reqs {
			if ents[i] == nil {
				// Valid parts (checkMulti) always decode.
				if ents[i], err = s.newEntryLocked(st, key(reqs[i].Policy), reqs[i].P.Algorithm); err != nil {
					return -1, t, err
				}
			}
		}
	}
	for i := range reqs {
		r, e := &reqs[i], ents[i]
		if e.alg != r.P.Algorithm {
			s.resetLocked(e, r.P.Algorithm)
		}
		e.last = t // t is at least every key's clock
		e.window = r.P.Window
		// The same state at the same time as the peek above: admitted.
		allowLimiter(e.lim, t, r.P, r.Hits, &out[i])
		if e.alg == SlidingLog {
			s.accountLocked(e)
		}
	}
	return -1, t, nil
}

// checkMulti validates an AllowMulti call without allocating unless it
// fails.
func checkMulti(tenant, subject string, reqs []MultiItem, out []Decision) error {
	if len(reqs) == 0 || len(reqs) > MaxMulti {
		return fmt.Errorf("%w: %d policies, want 1 to %d", ErrInvalidMulti, len(reqs), MaxMulti)
	}
	if len(out) < len(reqs) {
		return fmt.Errorf("%w: out holds %d decisions for %d policies", ErrInvalidMulti, len(out), len(reqs))
	}
	for i := range reqs {
		r := &reqs[i]
		if !validFast(tenant) || !validFast(subject) || !validFast(r.Policy) {
			return Key{Tenant: tenant, Subject: subject, Policy: r.Policy}.Validate()
		}
		if !r.P.valid() {
			return fmt.Errorf("%w (policy %q)", r.P.Validate(), r.Policy)
		}
		if r.Hits <= 0 || r.Hits > r.P.Limit {
			return fmt.Errorf("%w (policy %q)", checkHits(&r.P, r.Hits), r.Policy)
		}
		if r.P.Algorithm == Concurrency {
			return fmt.Errorf("%w (policy %q)", errNeedsLease(), r.Policy)
		}
		for j := range i {
			if reqs[j].Policy == r.Policy {
				return fmt.Errorf("%w: policy %q given twice (items %d and %d)", ErrInvalidMulti, r.Policy, j, i)
			}
		}
	}
	return nil
}
