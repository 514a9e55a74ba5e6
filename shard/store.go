package shard

import (
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// Stripes is the number of lock stripes, rounded up to a power of two.
	// Zero means 256. At most MaxStripes.
	Stripes int
	// MaxKeys bounds how many keys the store holds. A new key past it gets
	// ErrCapacity (after reclaiming expired keys in its stripe); existing
	// keys keep working. Zero means 1 048 576.
	MaxKeys int
}

// Store holds many keys' state and makes atomic per-key decisions on the
// owner's clock. It is safe for concurrent use. The zero value is not usable;
// call NewStore.
type Store struct {
	stripes []stripe
	mask    uint64
	maxKeys int64
	keys    atomic.Int64
	bytes   atomic.Int64
	cursor  atomic.Uint64
}

type stripe struct {
	mu sync.Mutex
	m  map[string]*entry
	// Padding keeps neighbouring stripes' locks on separate cache lines:
	// the mutex and the map pointer take 16 bytes, a line 64.
	_ [48]byte
}

// entry is one key's state. ek is the key's canonical encoding (the map
// key); key's parts share its memory. The fields a decision touches come
// first, next to the limiter state allocated with the entry (newEntry).
type entry struct {
	last int64 // latest now seen, for the per-key clock clamp
	alg  Algorithm
	lim  limiter
	// window is the window of the policy last applied, which bounds how
	// long the state matters (for reclamation).
	window time.Duration
	size   int64 // bytes accounted for this entry
	key    Key
	ek     string
}

// entryWith is an entry allocated together with its first limiter's state.
// With many keys a decision usually finds both out of the cache; side by
// side they cost one trip to memory (the next line is fetched with the
// first) where two separate allocations cost two dependent ones.
type entryWith[L any] struct {
	e entry
	l L
}

// newEntry returns an entry under a, its limiter's state beside it.
func newEntry(a Algorithm) *entry {
	switch a {
	case Concurrency:
		b := &entryWith[leases]{}
		b.e.lim = &b.l
		return &b.e
	case TokenBucket:
		b := &entryWith[gcra]{}
		b.e.lim = &b.l
		return &b.e
	case FixedWindow:
		b := &entryWith[fixedWindow]{}
		b.e.lim = &b.l
		return &b.e
	case Calendar:
		b := &entryWith[calendarWindow]{}
		b.e.lim = &b.l
		return &b.e
	default:
		b := &entryWith[slidingLog]{}
		b.e.lim = &b.l
		return &b.e
	}
}

// Fixed per-key costs used by Bytes: the map slot (string header, pointer,
// control byte and load-factor slack), the entry and its limiter struct.
const (
	mapSlotBytes = 40
	entryBytes   = int64(unsafe.Sizeof(entry{}))
	limBytes     = 48
)

// MaxStripes bounds Config.Stripes, so a configuration value can never make
// NewStore allocate without bound (or panic).
const MaxStripes = 1 << 16

// NewStore returns an empty store. Negative Config fields, or Stripes above
// MaxStripes, are an error.
func NewStore(cfg Config) (*Store, error) {
	if cfg.Stripes < 0 || cfg.MaxKeys < 0 {
		return nil, fmt.Errorf("shard: stripes %d and max keys %d must not be negative", cfg.Stripes, cfg.MaxKeys)
	}
	if cfg.Stripes > MaxStripes {
		return nil, fmt.Errorf("shard: stripes %d exceed %d", cfg.Stripes, MaxStripes)
	}
	if cfg.Stripes == 0 {
		cfg.Stripes = 256
	}
	if cfg.MaxKeys == 0 {
		cfg.MaxKeys = 1 << 20
	}
	n := 1 << bits.Len(uint(cfg.Stripes-1))
	s := &Store{stripes: make([]stripe, n), mask: uint64(n - 1), maxKeys: int64(cfg.MaxKeys)}
	for i := range s.stripes {
		s.stripes[i].m = make(map[string]*entry)
	}
	return s, nil
}

// stripeFor returns the stripe of an encoded key. It hashes the (tenant,
// subject) prefix only (Key.AppendPlacement), so every policy of one subject
// shares a stripe and AllowMulti can decide them under one lock.
func (s *Store) stripeFor(ek []byte) *stripe {
	return s.stripeForPlacement(ek[:placementLen(ek)])
}

// stripeForPlacement returns the stripe of an encoded (tenant, subject).
func (s *Store) stripeForPlacement(pre []byte) *stripe {
	return s.stripeOfHash(xxhash.Sum64(pre))
}

// stripeOfHash returns the stripe of the (tenant, subject) whose xxhash64
// is h: the one rule that maps a key to its lock.
func (s *Store) stripeOfHash(h uint64) *stripe { return &s.stripes[h&s.mask] }

// placementLen returns the length of ek's (tenant, subject) prefix, or
// len(ek) if ek is too short to hold one (such an encoding matches no held
// key, so any stripe will do).
func placementLen(ek []byte) int {
	if len(ek) == 0 {
		return 0
	}
	n := 1 + int(ek[0])
	if n >= len(ek) {
		return len(ek)
	}
	return min(n+1+int(ek[n]), len(ek))
}

// Allow decides whether hits units of key may be admitted under p at now, and
// records them if so. now is clamped per key so a key's time never
// decreases (the owner's clock is the authority; a step back is treated as
// no time passing). Over limit is Allowed == false with a nil error. Invalid
// key, policy or hits, a Concurrency policy (ErrWrongAlgorithm: use
// Acquire), or ErrCapacity for a new key, return an error and change
// nothing. It does not allocate for an existing key.
func (s *Store) Allow(key Key, p Policy, hits int64, now time.Time) (Decision, error) {
	var buf [MaxEncodedKeyLen]byte
	ek, ok := key.AppendEncoded(buf[:0])
	if !ok {
		return Decision{}, key.Validate()
	}
	return s.AllowEncoded(ek, p, hits, now)
}

// AllowEncoded is Allow for a key already in its canonical encoding (see
// Key.AppendEncoded), for callers that encoded it anyway, such as to place
// it on a ring. A malformed encoding cannot match a held key and is
// rejected with ErrInvalidKey when it would be inserted. It does not retain
// ek.
func (s *Store) AllowEncoded(ek []byte, p Policy, hits int64, now time.Time) (Decision, error) {
	d, _, err := s.AllowEncodedAt(ek, p, hits, now)
	return d, err
}

// AllowEncodedAt is AllowEncoded that also returns the key's clock, in Unix
// nanoseconds, that it decided at: now, or the key's later clock when now
// was behind it (the per-key clamp). An admission is recorded at that
// time, so a caller that reports or copies the admission's time uses it.
func (s *Store) AllowEncodedAt(ek []byte, p Policy, hits int64, now time.Time) (d Decision, at int64, err error) {
	if err := checkAllow(&p, hits); err != nil {
		return Decision{}, 0, err
	}
	at, err = s.allowAt(s.stripeFor(ek), ek, p, hits, now, &d)
	return d, at, err
}

// AllowPlaced is AllowEncodedAt for a key whose placement hash is already
// known (Place): the decision path hashes each key once, for its ring
// partition and its lock stripe alike. The decision is written to *d,
// which is left alone on error: a caller on a hot path keeps it where it
// is used rather than copying it out of a return (see allowAt).
func (s *Store) AllowPlaced(pk Placed, p Policy, hits int64, now time.Time, d *Decision) (at int64, err error) {
	if err := checkAllow(&p, hits); err != nil {
		return 0, err
	}
	return s.allowAt(s.stripeOfHash(pk.hash), pk.ek, p, hits, now, d)
}

// checkAllow returns the error Allow reports for p and hits, or nil.
func checkAllow(p *Policy, hits int64) error {
	if !p.valid() {
		return p.Validate()
	}
	if hits <= 0 || hits > p.Limit {
		return checkHits(p, hits)
	}
	if p.Algorithm == Concurrency {
		return errNeedsLease()
	}
	return nil
}

// allowAt is AllowEncodedAt's decision on ek's stripe st, after checkAllow:
// it writes the decision to *d (left alone on error) and returns the key's
// clock it decided at. The decision is written in place, not returned: a
// Decision is copied through the stack at every return (it has too many
// fields for registers), and the copy right after its Allowed byte was
// written stalls the load that copies it.
func (s *Store) allowAt(st *stripe, ek []byte, p Policy, hits int64, now time.Time, d *Decision) (int64, error) {
	t := now.UnixNano()
	st.mu.Lock()
	e, err := s.entryLocked(st, ek, p.Algorithm, t)
	if err != nil {
		st.mu.Unlock()
		return 0, err
	}
	e.last = max(e.last, t)
	e.window = p.Window
	at := e.last
	allowLimiter(e.lim, at, p, hits, d)
	if e.alg == SlidingLog {
		s.accountLocked(e)
	}
	st.mu.Unlock()
	return at, nil
}

// insertLocked adds a fresh entry to st, whose lock is held. At capacity it
// entryLocked returns ek's entry in st (whose lock the caller holds),
// inserted (at time t) if the key is new. A key kept under another
// algorithm starts fresh under alg: the policy table changed the key's
// algorithm, and the old state means nothing to the new one.
func (s *Store) entryLocked(st *stripe, ek []byte, alg Algorithm, t int64) (*entry, error) {
	e := st.m[string(ek)]
	if e == nil {
		return s.insertLocked(st, ek, alg, t)
	}
	if e.alg != alg {
		s.resetLocked(e, alg)
	}
	return e, nil
}

// first reclaims st's idle entries.
func (s *Store) insertLocked(st *stripe, ek []byte, a Algorithm, now int64) (*entry, error) {
	if err := s.reserveLocked(st, 1, now, true); err != nil {
		return nil, err
	}
	return s.newEntryLocked(st, ek, a)
}

// reserveLocked counts n new keys against MaxKeys. If they do not fit and
// sweep is set, it first reclaims st's idle entries (st's lock is held).
func (s *Store) reserveLocked(st *stripe, n int64, now int64, sweep bool) error {
	if s.keys.Add(n) <= s.maxKeys {
		return nil
	}
	s.keys.Add(-n)
	if sweep {
		s.sweepStripeLocked(st, now)
		if s.keys.Add(n) <= s.maxKeys {
			return nil
		}
		s.keys.Add(-n)
	}
	return fmt.Errorf("%w: %d keys held", ErrCapacity, s.maxKeys)
}

// newEntryLocked adds a fresh entry for ek to st, whose lock is held, after
// reserveLocked counted it.
func (s *Store) newEntryLocked(st *stripe, ek []byte, a Algorithm) (*entry, error) {
	k := string(ek) // one allocation per new key: the map key, shared by e.key
	dk, err := DecodeKey(k)
	if err != nil {
		s.keys.Add(-1)
		return nil, err
	}
	e := newEntry(a)
	e.key, e.ek, e.last, e.alg = dk, k, minTime, a
	st.m[k] = e
	s.accountLocked(e)
	return e, nil
}

func (s *Store) resetLocked(e *entry, a Algorithm) {
	e.alg, e.lim = a, newLimiter(a)
	s.accountLocked(e)
}

// accountLocked refreshes e's share of Bytes.
func (s *Store) accountLocked(e *entry) {
	n := mapSlotBytes + entryBytes + limBytes + int64(len(e.ek)) + e.lim.bytes()
	if n != e.size {
		s.bytes.Add(n - e.size)
		e.size = n
	}
}

func (s *Store) removeLocked(st *stripe, e *entry) {
	delete(st.m, e.ek)
	s.keys.Add(-1)
	s.bytes.Add(-e.size)
}

// sweepStripeLocked removes st's idle entries: those whose state is empty at
// now, so removing them changes no future decision.
func (s *Store) sweepStripeLocked(st *stripe, now int64) int {
	n := 0
	for _, e := range st.m {
		if e.lim.idleAt(int64(e.window)) <= max(now, e.last) {
			s.removeLocked(st, e)
			n++
		}
	}
	return n
}

// Sweep reclaims idle keys, examining stripes round-robin from where the last
// sweep stopped until at least limit keys have been examined (limit <= 0
// means every stripe once). It returns the number of keys removed. Call it
// periodically; Store starts no goroutine of its own.
func (s *Store) Sweep(now time.Time, limit int) int {
	t := now.UnixNano()
	removed, examined := 0, 0
	for i := 0; i < len(s.stripes); i++ {
		st := &s.stripes[s.cursor.Add(1)&s.mask]
		st.mu.Lock()
		examined += len(st.m)
		removed += s.sweepStripeLocked(st, t)
		st.mu.Unlock()
		if limit > 0 && examined >= limit {
			break
		}
	}
	return removed
}

// Len returns the number of keys held.
func (s *Store) Len() int { return int(s.keys.Load()) }

// Bytes returns an estimate of the memory held by keys' state: map slots,
// entries, encoded keys and log buffers. Tests check it against the heap.
func (s *Store) Bytes() int64 { return s.bytes.Load() }

// Export returns key's state with ages relative to now, and whether the key
// is held. The store keeps the key.
func (s *Store) Export(key Key, now time.Time) (KeyState, bool) {
	var ks KeyState
	ok := s.export(key, now, false, &ks)
	return ks, ok
}

// ExportInto is Export into *dst, reusing the memory of its slices (their
// contents are replaced): for a caller that exports on every decision
// (a data directory logging each admission) without allocating. It
// reports false, leaving *dst's contents unspecified, when the store does
// not hold the key.
func (s *Store) ExportInto(key Key, now time.Time, dst *KeyState) bool {
	return s.export(key, now, false, dst)
}

// Take is Export followed by removal, atomically: after it returns, this
// store no longer holds the key (used when ownership moves away).
func (s *Store) Take(key Key, now time.Time) (KeyState, bool) {
	var ks KeyState
	ok := s.export(key, now, true, &ks)
	return ks, ok
}

// export fills *ks (appending to its slices' memory from length 0).
func (s *Store) export(key Key, now time.Time, remove bool, ks *KeyState) bool {
	var buf [MaxEncodedKeyLen]byte
	ek, ok := key.AppendEncoded(buf[:0])
	if !ok {
		return false
	}
	st := s.stripeFor(ek)
	st.mu.Lock()
	defer st.mu.Unlock()
	e := st.m[string(ek)]
	if e == nil {
		return false
	}
	t := max(now.UnixNano(), e.last)
	ks.Key, ks.Algorithm, ks.Runs = e.key, e.alg, e.lim.export(ks.Runs[:0], t)
	ks.Reservations, ks.Grants = ks.Reservations[:0], ks.Grants[:0]
	if l, ok := e.lim.(*slidingLog); ok {
		ks.Reservations = l.exportPending(ks.Reservations, t)
		ks.Grants = l.exportGrants(ks.Grants, t)
	}
	// A calendar state is an instant (the period start), not an age.
	if shift := t - now.UnixNano(); shift > 0 && e.alg != Calendar {
		// The key's clock is ahead of now (a decision that read the clock
		// later took the lock first, or the clock stepped back): the
		// state is read at the key's time, but its ages must be relative
		// to now, the time the caller sends them with. Relative to the
		// key's time, a receiver would place every admission shift
		// earlier and let it expire that much early.
		for i := range ks.Runs {
			ks.Runs[i].Age = time.Duration(satSub(int64(ks.Runs[i].Age), shift))
		}
		for i := range ks.Reservations {
			ks.Reservations[i].Age = time.Duration(satSub(int64(ks.Reservations[i].Age), shift))
		}
		for i := range ks.Grants {
			ks.Grants[i].Age = time.Duration(satSub(int64(ks.Grants[i].Age), shift))
		}
	}
	if remove {
		s.removeLocked(st, e)
	}
	return true
}

// Import merges an exported state into the store, rebasing ages on now. If
// the key already has state here, both are kept (their admissions add up),
// which can only refuse more, never admit more. A malformed state returns an
// error wrapping ErrInvalidState and changes nothing; a new key past
// MaxKeys returns ErrCapacity.
func (s *Store) Import(ks KeyState, p Policy, now time.Time) error {
	if err := ks.Validate(); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return err
	}
	if p.Algorithm != ks.Algorithm {
		return fmt.Errorf("%w: state is %v but policy is %v", ErrInvalidState, ks.Algorithm, p.Algorithm)
	}
	var buf [MaxEncodedKeyLen]byte
	ek, _ := ks.Key.AppendEncoded(buf[:0])
	t := now.UnixNano()
	st := s.stripeFor(ek)
	st.mu.Lock()
	defer st.mu.Unlock()
	e, err := s.entryLocked(st, ek, ks.Algorithm, t)
	if err != nil {
		return err
	}
	e.last = max(e.last, t)
	e.lim.merge(e.last, ks.Runs, p)
	if l, ok := e.lim.(*slidingLog); ok {
		l.mergePending(e.last, ks.Reservations, p)
		l.mergeGrants(e.last, ks.Grants, p)
	}
	e.window = p.Window
	s.accountLocked(e)
	return nil
}

// Delete removes key's state and reports whether it was held. It is the
// reset primitive: afterwards the key decides as if it had never been seen
// (a full quota, no clock clamp). It changes no other key, including the
// subject's other policies.
func (s *Store) Delete(key Key) bool {
	var buf [MaxEncodedKeyLen]byte
	ek, ok := key.AppendEncoded(buf[:0])
	if !ok {
		return false
	}
	st := s.stripeFor(ek)
	st.mu.Lock()
	defer st.mu.Unlock()
	e := st.m[string(ek)]
	if e != nil {
		s.removeLocked(st, e)
	}
	return e != nil
}

// Range calls fn for every key held, one stripe at a time, until fn returns
// false. fn runs without any store lock held, so it may call the store; keys
// added or removed during Range may or may not be seen.
func (s *Store) Range(fn func(Key) bool) {
	var keys []Key
	for i := range s.stripes {
		st := &s.stripes[i]
		st.mu.Lock()
		keys = keys[:0]
		for _, e := range st.m {
			keys = append(keys, e.key)
		}
		st.mu.Unlock()
		for _, k := range keys {
			if !fn(k) {
				return
			}
		}
	}
}

// Has reports whether key has state in the store.
func (s *Store) Has(key Key) bool {
	var buf [MaxEncodedKeyLen]byte
	ek, ok := key.AppendEncoded(buf[:0])
	if !ok {
		return false
	}
	st := s.stripeFor(ek)
	st.mu.Lock()
	_, ok = st.m[string(ek)]
	st.mu.Unlock()
	return ok
}

// Peek returns the decision Allow would make for the same arguments at now,
// recording nothing: it changes neither the key's state nor its clock (now
// is clamped to the key's latest time for the answer only), and does not
// create the key. Errors are Allow's, except that it never returns
// ErrCapacity. It does not allocate.
func (s *Store) Peek(key Key, p Policy, hits int64, now time.Time) (Decision, error) {
	var buf [MaxEncodedKeyLen]byte
	ek, ok := key.AppendEncoded(buf[:0])
	if !ok {
		return Decision{}, key.Validate()
	}
	if !p.valid() {
		return Decision{}, p.Validate()
	}
	if hits <= 0 || hits > p.Limit {
		return Decision{}, checkHits(&p, hits)
	}
	t := now.UnixNano()
	st := s.stripeFor(ek)
	st.mu.Lock()
	d := s.peekLocked(st.m[string(ek)], p, hits, t)
	st.mu.Unlock()
	return d, nil
}

// peekLocked is the decision at t for e (nil if not held), changing nothing.
// A key whose state belongs to another algorithm decides as a fresh one,
// as Allow would after resetting it.
func (s *Store) peekLocked(e *entry, p Policy, hits int64, t int64) Decision {
	if e == nil {
		return peekFresh(t, p, hits)
	}
	t = max(t, e.last)
	if e.alg != p.Algorithm {
		return peekFresh(t, p, hits)
	}
	return e.lim.peek(t, p, hits)
}

// peekFresh is the decision of an empty state at now. The zero states are
// stack values called directly (not through limiter) so nothing escapes.
func peekFresh(now int64, p Policy, hits int64) Decision {
	switch p.Algorithm {
	case TokenBucket:
		var g gcra
		return g.peek(now, p, hits)
	case FixedWindow:
		var f fixedWindow
		return f.peek(now, p, hits)
	case Calendar:
		var c calendarWindow
		return c.peek(now, p, hits)
	case Concurrency:
		var c leases
		return c.peek(now, p, hits)
	default:
		var l slidingLog
		return l.peek(now, p, hits)
	}
}

// Refund gives back up to hits units of key's admissions that still count
// at now, newest first: the sliding log removes units from its newest runs;
// the token bucket moves its theoretical arrival time back by hits·W/L, but
// never before now (never more than a full bucket); the fixed window lowers
// the current window's count, never below zero. It never goes below an
// empty state. now is clamped per key as in Allow, and advances the key's
// clock.
//
// The returned Decision describes the state after the refund: Allowed
// reports whether anything was given back, Remaining and ResetAfter are as
// in Allow, RetryAfter is zero. A key not held (or held under another
// algorithm, which Allow would reset) has nothing to give back and is not
// created. hits must be at least 1 (ErrInvalidHits) and may exceed the
// limit. A Concurrency policy is ErrWrongAlgorithm (use Release). Errors
// change nothing. It does not allocate.
func (s *Store) Refund(key Key, p Policy, hits int64, now time.Time) (Decision, error) {
	var buf [MaxEncodedKeyLen]byte
	ek, ok := key.AppendEncoded(buf[:0])
	if !ok {
		return Decision{}, key.Validate()
	}
	if !p.valid() {
		return Decision{}, p.Validate()
	}
	if hits <= 0 {
		return Decision{}, checkHits(&p, hits)
	}
	if p.Algorithm == Concurrency {
		return Decision{}, errNeedsLease()
	}
	t := now.UnixNano()
	st := s.stripeFor(ek)
	st.mu.Lock()
	defer st.mu.Unlock()
	e := st.m[string(ek)]
	if e == nil {
		return Decision{Limit: p.Limit, Remaining: p.Limit}, nil
	}
	if e.alg != p.Algorithm {
		s.resetLocked(e, p.Algorithm)
	}
	e.last = max(e.last, t)
	e.window = p.Window
	d := e.lim.refund(e.last, p, hits)
	s.accountLocked(e)
	return d, nil
}
