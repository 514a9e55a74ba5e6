package shard

import (
	"fmt"
	"slices"
	"time"
)

// lease is one live lease of a Concurrency key: n units held until exp
// (ns, exclusive: at exp the lease has expired).
type lease struct {
	id  uint64
	exp int64
	n   int64
}

// leases is a Concurrency key's state: its live leases in expiry order
// (oldest first), so expired leases are a prefix and leave in one step, and
// the units they hold. Each lease enters once and leaves once (released,
// expired or replaced by a later copy of itself). Release finds a lease by
// a linear scan: a key holds at most Limit leases (every lease holds at
// least one unit, and acquire checks before it records), and concurrency
// limits are small.
//
// held may exceed Limit only after merge (two copies of a partition's
// state add up, which can only refuse more); acquire compares hits ≤
// Limit − held, which never overflows because held is a saturated sum.
type leases struct {
	l    []lease
	held int64
}

// expired returns how many of the oldest leases have exp <= now and the
// units they hold. It changes nothing, so peek can use it.
func (c *leases) expired(now int64) (k int, units int64) {
	for k < len(c.l) && c.l[k].exp <= now {
		units += c.l[k].n
		k++
	}
	return k, units
}

// expire drops the leases expired at now.
func (c *leases) expire(now int64) {
	k, units := c.expired(now)
	if k == 0 {
		return
	}
	c.l = c.l[:copy(c.l, c.l[k:])]
	c.held -= units
}

// decide is the decision acquire would make at now, changing nothing:
// skip leases have expired and hold gone units.
func (c *leases) decide(now int64, p Policy, hits int64) Decision {
	skip, gone := c.expired(now)
	held := c.held - gone
	d := Decision{Limit: p.Limit}
	if hits <= p.Limit-held {
		d.Allowed = true
		d.Remaining = p.Limit - held - hits
		// The new lease expires last: leases are taken in time order and
		// share the TTL (a changed TTL is why insert keeps them sorted).
		last := satAdd(now, int64(p.Window))
		if skip < len(c.l) {
			last = max(last, c.l[len(c.l)-1].exp)
		}
		d.ResetAfter = time.Duration(last - now)
		return d
	}
	d.Remaining = max(p.Limit-held, 0)
	// Assuming nobody releases, the request fits once the oldest leases
	// holding need = held + hits − L units have expired.
	need := held - (p.Limit - hits)
	var freed int64
	for i := skip; i < len(c.l); i++ {
		freed += c.l[i].n
		if freed >= need {
			d.RetryAfter = time.Duration(c.l[i].exp - now)
			break
		}
	}
	d.ResetAfter = time.Duration(c.l[len(c.l)-1].exp - now)
	return d
}

// acquire records a lease id of hits units at now if it fits. The caller
// checked that id is not held (find).
func (c *leases) acquire(now int64, p Policy, hits int64, id uint64) Decision {
	c.expire(now)
	d := c.decide(now, p, hits)
	if d.Allowed {
		c.insert(lease{id: id, exp: satAdd(now, int64(p.Window)), n: hits})
	}
	return d
}

// insert adds a lease in expiry order (after those expiring at the same
// time, so equal expiries keep their arrival order).
func (c *leases) insert(ls lease) {
	i := len(c.l)
	for i > 0 && c.l[i-1].exp > ls.exp {
		i--
	}
	c.l = slices.Insert(c.l, i, ls)
	c.held = satAdd(c.held, ls.n)
}

// find returns the index of the live lease id at now, or -1.
func (c *leases) find(now int64, id uint64) int {
	for i := range c.l {
		if c.l[i].id == id && c.l[i].exp > now {
			return i
		}
	}
	return -1
}

// release ends lease id at now and returns the state after it: Allowed
// reports whether a live lease was ended (an unknown or expired id changes
// nothing else).
func (c *leases) release(now int64, p Policy, id uint64) Decision {
	c.expire(now)
	released := false
	if i := c.find(now, id); i >= 0 {
		c.held -= c.l[i].n
		c.l = slices.Delete(c.l, i, i+1)
		released = true
	}
	d := c.state(now, p)
	d.Allowed = released
	return d
}

// state describes the leases at now (after expire): Remaining and
// ResetAfter, with Allowed false.
func (c *leases) state(now int64, p Policy) Decision {
	d := Decision{Limit: p.Limit, Remaining: max(p.Limit-c.held, 0)}
	if len(c.l) > 0 {
		d.ResetAfter = time.Duration(c.l[len(c.l)-1].exp - now)
	}
	return d
}

// allow is never reached: Store and Limiter refuse Allow on a Concurrency
// policy before they get here. It refuses, recording nothing.
func (c *leases) allow(now int64, p Policy, hits int64, d *Decision) {
	*d = c.peek(now, p, hits)
	d.Allowed = false
}

func (c *leases) peek(now int64, p Policy, hits int64) Decision {
	return c.decide(now, p, hits)
}

// refund is never reached (Refund refuses a Concurrency policy); it gives
// nothing back.
func (c *leases) refund(now int64, p Policy, _ int64) Decision {
	c.expire(now)
	return c.state(now, p)
}

func (c *leases) idleAt(int64) int64 {
	if len(c.l) == 0 {
		return minTime
	}
	return c.l[len(c.l)-1].exp
}

func (c *leases) export(out []Run, now int64) []Run {
	skip, _ := c.expired(now)
	if skip == len(c.l) {
		return out
	}
	out = slices.Grow(out, len(c.l)-skip)
	for _, ls := range c.l[skip:] {
		out = append(out, Run{Age: time.Duration(satSub(now, ls.exp)), Count: ls.n, ID: ls.id})
	}
	return out
}

// merge adds imported leases (Age = now − expiry). A lease already held
// (the same id: a repeated copy) keeps the later expiry and the larger
// count, so a duplicated message never counts a lease twice; distinct
// leases add up.
func (c *leases) merge(now int64, runs []Run, _ Policy) {
	c.expire(now)
	for _, r := range runs {
		exp := satSub(now, int64(r.Age))
		if exp <= now || r.ID == 0 || r.Count <= 0 {
			continue
		}
		ls := lease{id: r.ID, exp: exp, n: r.Count}
		if i := c.find(now, r.ID); i >= 0 {
			old := c.l[i]
			c.held -= old.n
			c.l = slices.Delete(c.l, i, i+1)
			ls.exp, ls.n = max(ls.exp, old.exp), max(ls.n, old.n)
		}
		c.insert(ls)
	}
}

// leaseBytes is the memory of one lease slot.
const leaseBytes = 24

func (c *leases) bytes() int64 { return int64(cap(c.l)) * leaseBytes }

// Acquire takes a lease of hits units of key under p, a Concurrency
// policy, at now, if the key's live leases leave room: it first drops the
// leases expired at now (expiry <= now), then admits if held + hits ≤
// Limit and records lease id, expiring at now + Window. Over the limit is
// Allowed == false with a nil error, and records nothing; RetryAfter is
// then the time until enough leases expire for the request to fit if none
// is released. id must not be zero nor a lease the key holds
// (ErrInvalidLease: retry with another id). now is clamped per key as in
// Allow. Invalid key, policy or hits, a policy of another algorithm
// (ErrWrongAlgorithm), or ErrCapacity for a new key return an error and
// change nothing.
func (s *Store) Acquire(key Key, p Policy, hits int64, id uint64, now time.Time) (Decision, error) {
	var buf [MaxEncodedKeyLen]byte
	ek, err := leaseKey(key, &p, buf[:0])
	if err != nil {
		return Decision{}, err
	}
	if hits <= 0 || hits > p.Limit {
		return Decision{}, checkHits(&p, hits)
	}
	if id == 0 {
		return Decision{}, fmt.Errorf("%w: lease id 0 is reserved", ErrInvalidLease)
	}
	t := now.UnixNano()
	st := s.stripeFor(ek)
	st.mu.Lock()
	defer st.mu.Unlock()
	e, err := s.entryLocked(st, ek, p.Algorithm, t)
	if err != nil {
		return Decision{}, err
	}
	c := e.lim.(*leases)
	if c.find(max(e.last, t), id) >= 0 {
		return Decision{}, fmt.Errorf("%w: lease %d is already held", ErrInvalidLease, id)
	}
	e.last = max(e.last, t)
	e.window = p.Window
	d := c.acquire(e.last, p, hits, id)
	s.accountLocked(e)
	return d, nil
}

// Release ends key's lease id at now. The returned Decision describes the
// key's leases after it: Allowed reports whether a live lease was ended;
// an unknown, already released or expired id (expiry <= now) is Allowed ==
// false with a nil error and changes nothing but dropping expired leases.
// A key not held (or held under another algorithm) is not created. now is
// clamped per key as in Allow. Invalid key or policy, or a policy of
// another algorithm (ErrWrongAlgorithm), return an error.
func (s *Store) Release(key Key, p Policy, id uint64, now time.Time) (Decision, error) {
	var buf [MaxEncodedKeyLen]byte
	ek, err := leaseKey(key, &p, buf[:0])
	if err != nil {
		return Decision{}, err
	}
	t := now.UnixNano()
	st := s.stripeFor(ek)
	st.mu.Lock()
	defer st.mu.Unlock()
	e := st.m[string(ek)]
	if e == nil || e.alg != p.Algorithm {
		return Decision{Limit: p.Limit, Remaining: p.Limit}, nil
	}
	e.last = max(e.last, t)
	e.window = p.Window
	d := e.lim.(*leases).release(e.last, p, id)
	s.accountLocked(e)
	return d, nil
}

// leaseKey validates key and p for Acquire and Release and appends key's
// encoding to buf.
func leaseKey(key Key, p *Policy, buf []byte) ([]byte, error) {
	ek, ok := key.AppendEncoded(buf)
	if !ok {
		return nil, key.Validate()
	}
	return ek, checkLease(p)
}

// checkLease validates a policy for Acquire and Release.
func checkLease(p *Policy) error {
	if !p.valid() {
		return p.Validate()
	}
	if p.Algorithm != Concurrency {
		return fmt.Errorf("%w: acquire and release need a concurrency policy, not %v", ErrWrongAlgorithm, p.Algorithm)
	}
	return nil
}

// errNeedsLease is the error of Allow, AllowMulti and Refund on a
// Concurrency policy.
func errNeedsLease() error {
	return fmt.Errorf("%w: a concurrency policy is taken with Acquire and given back with Release", ErrWrongAlgorithm)
}
