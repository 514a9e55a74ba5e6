package peer

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/shard"
)

// Handoff keeps one decision point per key while ownership moves
// (DESIGN.md §5). The rule behind every step: a key's state is held by at
// most one node at a time, and only the holder decides.
//
//   - Giving state away is atomic with deciding: the state is taken out of
//     the store under the key's gate (a striped read-write lock that every
//     decision holds in read mode from its tombstone check to the end of
//     shard.Store.Allow), so no decision can land on a log that has just
//     left. The giver leaves a tombstone naming the taker; from then on it
//     answers "not owner, ask <taker>" for the key.
//   - The old owner pushes keys it no longer owns to their new owners
//     (Handoff RPC). While a key's push is in flight the key is "moving":
//     requests for it on the old owner wait for the push to end (bounded by
//     their deadline) and are then redirected; a pull for it waits too.
//   - A new owner that gets a request for a key it holds no state for,
//     within HandoffGrace of a ring change, first pulls the key from every
//     live member that owned it in the recent rings (Pull RPC) and merges
//     what they return. If a previous owner cannot answer, or answers that
//     the state went to a third member, the request is unavailable rather
//     than decided from an empty log. A previous owner that has just left
//     this node's ring (it left, failed, or was wrongly declared failed) is
//     asked too, at its last address, best effort: if it answers, its
//     state moves here; if it cannot be reached it is skipped, and the key
//     continues from its crash backup, if any (backup.go).
//   - A failed push keeps the state on the sender and keeps the tombstone,
//     marked uncertain (the receiver may or may not have imported it).
//     The sender does not decide on it until it has pulled the key back
//     from the receiver; a retry merges into whatever the receiver holds.
//     Duplicated admissions refuse more, never admit more.
//   - A leaving node (Close) pushes every key to the member that owns it
//     once the leaver is gone (ring.Snapshot.Backup), then stops deciding,
//     pushes whatever arrived meanwhile, and retries failures until the
//     drain deadline, before it leaves gossip. The receiver "adopts" the
//     key: until its ring drops the leaver it decides for the key on
//     requests that reach it. Keys that could not be handed off are
//     logged, counted (Metrics.Handoff "sent"/"failed") and reported by
//     Close.
//
// States travel as ages relative to the sender's clock and are rebased on
// the receiver's (shard.Store.Import), so clock offset cannot expire
// admissions early; merging adds admissions up, which can only refuse more.
//
// What it does not do: two members that cannot reach each other while
// both are in the ring, or a live member wrongly declared failed that then
// cannot be reached, make two decision points; that is the crash case, with
// the crash bound (backup.go). During HandoffGrace after a ring change, the
// first request for a key its new owner does not hold costs one Pull RPC per
// previous owner, even for a key nobody ever saw.
type handoffState struct {
	stripes [gateStripes]handoffStripe

	// Counters let the decision path skip the stripe maps entirely while
	// no handoff is in progress.
	nGone    atomic.Int64
	nMoving  atomic.Int64
	nAdopted atomic.Int64

	pullMu sync.Mutex
	pulls  map[string]*pullCall // in-flight fetches, one per key

	departedMu sync.Mutex
	departed   map[string]*departure // members that left the ring recently

	// migrateTok serialises migrations (ring-change pushes and the drain).
	migrateTok chan struct{}
	migrating  atomic.Bool   // a migration goroutine runs
	kick       chan struct{} // wakes a migration waiting to retry

	// graceEpoch is non-zero while a handoff grace period may be open:
	// each ring change sets a new value (after publishing the view), and
	// the first decision that finds the grace over clears it.
	graceEpoch atomic.Uint64
	graceSeq   atomic.Uint64
	again      atomic.Bool // another ring change arrived meanwhile
	retry      atomic.Bool // a migration left keys behind; Sweep retries

	// stopped is set by drain before its final pass: the node decides
	// nothing new. drained is closed when the drain is over.
	stopped atomic.Bool
	drained chan struct{}

	faults atomic.Pointer[faultFunc] // test fault injection; nil in production
}

// handoffStripe is the gate and the handoff bookkeeping of the keys that
// hash to it. A decision holds mu in read mode; taking a key's state away
// or changing its tombstone holds it in write mode.
type handoffStripe struct {
	mu      sync.RWMutex
	gone    map[string]*tombstone    // key encoding -> where its state went
	moving  map[string]chan struct{} // key encoding -> closed when its push ends
	adopted map[string]string        // key encoding -> member that handed it to us
	_       [64 - 24 - 3*8]byte      // one stripe per cache line
}

// tombstone records that a key's state left this node.
type tombstone struct {
	to string    // the member that took it
	at time.Time // node clock when it left
	// seen is set once to has been in this node's ring: a taker that is
	// then gone has left (or failed) and the tombstone protects nothing.
	seen bool
	// uncertain marks a push that failed: the state is back here, but the
	// receiver may have imported it too. Before deciding as owner, this
	// node pulls the key back from the receiver.
	uncertain bool
	// given is the state a Pull took, kept until the tombstone expires so
	// that a repeated pull by the same taker (whose first answer was lost)
	// gets it again instead of nothing.
	given *shard.KeyState
}

// live reports whether the tombstone still points at the key's holder.
func (t *tombstone) live(v *view, now time.Time, grace time.Duration) bool {
	if now.Sub(t.at) >= grace {
		return false
	}
	return v.snap.Has(t.to) || !t.seen
}

type pullCall struct {
	done chan struct{}
	got  int
	err  error
}

// faultFunc is a test hook called at named points of the handoff RPCs; a
// non-nil error makes the RPC fail there.
type faultFunc func(point string) error

// Fault points.
const (
	faultHandoffBefore = "handoff-before-import"
	faultHandoffAfter  = "handoff-after-import"
	faultPullAfter     = "pull-after-take"
	faultPushSend      = "handoff-send" // on the sender, before the RPC
	faultBackup        = "backup"       // Backup handler, before storing
)

const (
	// gateStripes is the number of gate stripes (a power of two).
	gateStripes = 256
	// maxTombstonesPerStripe bounds the tombstones and adoptions of one
	// stripe; past it an arbitrary old entry is dropped (rings converge
	// long before, and tombstones expire after HandoffGrace anyway).
	maxTombstonesPerStripe = 1 << 12
	// handoffBatch is the number of keys per Handoff or Backup RPC.
	handoffBatch = 1024
	// pushParallel bounds the Handoff RPCs a migration has in flight.
	pushParallel = 4
	// migrateRetryMin and migrateRetryMax bound the backoff between
	// retries of a ring-change migration that failed (about 1.5 s in all);
	// after that the next Sweep retries.
	migrateRetryMin = 50 * time.Millisecond
	migrateRetryMax = 800 * time.Millisecond
	// drainRetries bounds the passes a drain makes over keys whose push
	// failed, drainRetryPause apart, within the Close deadline.
	drainRetries    = 10
	drainRetryPause = 50 * time.Millisecond
)

func (h *handoffState) init() {
	h.pulls = make(map[string]*pullCall)
	h.departed = make(map[string]*departure)
	h.graceEpoch.Store(h.graceSeq.Add(1)) // the first views: just joined
	h.migrateTok = make(chan struct{}, 1)
	h.kick = make(chan struct{}, 1)
	h.drained = make(chan struct{})
}

func (h *handoffState) stripe(ek []byte) *handoffStripe {
	return &h.stripes[xxhash.Sum64(ek)&(gateStripes-1)]
}

func (h *handoffState) stripeString(ek string) *handoffStripe {
	return &h.stripes[xxhash.Sum64String(ek)&(gateStripes-1)]
}

func (h *handoffState) fault(point string) error {
	if f := h.faults.Load(); f != nil {
		return (*f)(point)
	}
	return nil
}

// adoptedFrom returns the member that handed ek's state to us, or "".
func (h *handoffState) adoptedFrom(ek []byte) string {
	if h.nAdopted.Load() == 0 {
		return ""
	}
	s := h.stripe(ek)
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.adopted[string(ek)]
}

func (h *handoffState) setGoneLocked(s *handoffStripe, ek string, t *tombstone) {
	if s.gone == nil {
		s.gone = make(map[string]*tombstone)
	}
	putBounded(s.gone, ek, t, &h.nGone)
}

// putBounded sets m[k] = v, keeping m at most maxTombstonesPerStripe long by
// dropping an arbitrary entry for a new key, and n equal to the number of
// entries across the maps it counts.
func putBounded[V any](m map[string]V, k string, v V, n *atomic.Int64) {
	if _, ok := m[k]; !ok {
		if len(m) >= maxTombstonesPerStripe {
			for old := range m {
				delete(m, old)
				n.Add(-1)
				break
			}
		}
		n.Add(1)
	}
	m[k] = v
}

func (h *handoffState) clearGoneLocked(s *handoffStripe, ek string) {
	if _, ok := s.gone[ek]; ok {
		delete(s.gone, ek)
		h.nGone.Add(-1)
	}
}

func (h *handoffState) setAdoptedLocked(s *handoffStripe, ek, from string) {
	if s.adopted == nil {
		s.adopted = make(map[string]string)
	}
	putBounded(s.adopted, ek, from, &h.nAdopted)
}

func (h *handoffState) setMovingLocked(s *handoffStripe, ek string, ch chan struct{}) {
	if s.moving == nil {
		s.moving = make(map[string]chan struct{})
	}
	s.moving[ek] = ch
	h.nMoving.Add(1)
}

func (h *handoffState) clearMovingLocked(s *handoffStripe, ek string) {
	if _, ok := s.moving[ek]; ok {
		delete(s.moving, ek)
		h.nMoving.Add(-1)
	}
}

// sweep drops tombstones that no longer point at a holder and adoptions
// the ring has caught up with, and re-arms a migration that left keys
// behind. Called from Node.Sweep and after each ring change.
func (h *handoffState) sweep(n *Node, v *view) {
	if h.retry.Load() && !n.closing.Load() && n.ctx.Err() == nil {
		h.retry.Store(false)
		n.kickMigrate()
	}
	if h.nGone.Load() == 0 && h.nAdopted.Load() == 0 {
		return
	}
	now := n.clock()
	for i := range h.stripes {
		s := &h.stripes[i]
		s.mu.Lock()
		for ek, t := range s.gone {
			if v.snap.Has(t.to) {
				t.seen = true
			}
			if _, moving := s.moving[ek]; !moving && !t.live(v, now, n.cfg.HandoffGrace) {
				delete(s.gone, ek)
				h.nGone.Add(-1)
			}
		}
		for ek, from := range s.adopted {
			if v.snap.Owner([]byte(ek)) != from {
				delete(s.adopted, ek)
				h.nAdopted.Add(-1)
			}
		}
		s.mu.Unlock()
	}
}

// settle makes sure this node may decide for key: its state has not been
// given away (or is back), and within the grace period after a ring change
// its previous owners have handed it over. It returns a *notOwnerError
// naming the holder when the state is elsewhere, and an error wrapping
// ErrUnavailable when the state cannot be settled in time.
func (n *Node) settle(ctx context.Context, v *view, key Key, ek []byte, p *policy) error {
	if err := n.awaitHolder(ctx, v, key, ek, p); err != nil {
		return err
	}
	// Outside any grace period there is nothing to settle, and no clock
	// read either: the decision reads the clock once (STYLE.md §2).
	e := n.handoff.graceEpoch.Load()
	if e == 0 {
		return nil
	}
	now := n.clock()
	if !n.inGrace(v, now) {
		if cur := n.view.Load(); !n.inGrace(cur, now) {
			// Fails if a ring change started a new grace meanwhile.
			n.handoff.graceEpoch.CompareAndSwap(e, 0)
		}
		return nil
	}
	if n.store.Has(key) {
		return nil
	}
	_, err := n.fetch(ctx, key, ek, p, n.previousOwners(v, ek, now), false)
	return err
}

// awaitHolder waits while key is moving and while a leaving node runs its
// final pass, drops stale tombstones, pulls back a key whose push failed
// when this node owns it, and returns a *notOwnerError while the key's
// state is with another member.
func (n *Node) awaitHolder(ctx context.Context, v *view, key Key, ek []byte, p *policy) error {
	h := &n.handoff
	if h.nGone.Load() == 0 && h.nMoving.Load() == 0 && !h.stopped.Load() {
		return nil
	}
	s := h.stripe(ek)
	for {
		s.mu.RLock()
		ch := s.moving[string(ek)]
		tp := s.gone[string(ek)]
		var t tombstone // a copy: sweep and push update tombstones under the lock
		if tp != nil {
			t = *tp
		}
		s.mu.RUnlock()
		switch {
		case ch != nil:
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return fmt.Errorf("%w: waiting for handoff: %w", ErrUnavailable, ctx.Err())
			}
		case tp != nil && t.live(v, n.clock(), n.cfg.HandoffGrace):
			if !t.uncertain || v.snap.Owner(ek) != n.name {
				return &notOwnerError{owner: t.to, membersHash: v.snap.MembersHash()}
			}
			// Our push failed and we own the key: the receiver may hold a
			// copy. Take it back before deciding, so only one holder is left.
			if _, err := n.fetch(ctx, key, ek, p, []pullTarget{{name: t.to, addr: v.addrs[t.to]}}, true); err != nil {
				return err
			}
			continue
		case tp != nil:
			s.mu.Lock()
			if s.gone[string(ek)] == tp {
				h.clearGoneLocked(s, string(ek))
			}
			s.mu.Unlock()
			continue
		case h.stopped.Load():
			select {
			case <-h.drained:
			case <-ctx.Done():
				return fmt.Errorf("%w: waiting for handoff: %w", ErrUnavailable, ctx.Err())
			}
		}
		return nil
	}
}

// admit is the decision itself, made under the key's gate so that no
// handoff can take the state between the tombstone check and the store's
// decision. It returns a *notOwnerError when the state has left, and an
// error wrapping ErrUnavailable when the node is leaving or the store is
// full.
func (n *Node) admit(v *view, key Key, ek []byte, p *policy, hits int64, now time.Time) (shard.Decision, error) {
	h := &n.handoff
	s := h.stripe(ek)
	s.mu.RLock()
	if h.nGone.Load() > 0 {
		if t := s.gone[string(ek)]; t != nil {
			s.mu.RUnlock()
			return shard.Decision{}, &notOwnerError{owner: t.to, membersHash: v.snap.MembersHash()}
		}
	}
	if h.stopped.Load() {
		s.mu.RUnlock()
		return shard.Decision{}, fmt.Errorf("%w: node is leaving", ErrUnavailable)
	}
	d, err := n.store.AllowEncoded(ek, p.sp, hits, now)
	s.mu.RUnlock()
	if err != nil {
		// Only ErrCapacity gets here: key, policy and hits were validated.
		return d, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if cur := n.view.Load(); cur != v && cur.snap.Owner(ek) != n.name && h.adoptedFrom(ek) == "" {
		// The ring changed during this decision: its migration may have
		// scanned the store before the decision created the key here.
		// The new owner pulls it within the grace; make sure it moves
		// even if nobody asks.
		n.kickMigrate()
	}
	return d, nil
}

// inGrace reports whether a ring change happened within HandoffGrace (or
// the node joined within it).
func (n *Node) inGrace(v *view, now time.Time) bool {
	if n.joinedRecently(v, now) {
		return true
	}
	return len(v.prev) > 0 && now.Sub(v.prev[0].replaced) < n.cfg.HandoffGrace
}

// joinedRecently reports whether v is one of the node's first views (each
// within HandoffGrace of the one before) and was installed within
// HandoffGrace: a view stays marked joined when no later change replaces
// it, so the flag alone would keep the grace open forever.
func (n *Node) joinedRecently(v *view, now time.Time) bool {
	return v.joined && now.Sub(v.since) < n.cfg.HandoffGrace
}

// pullTarget is a member a new owner asks for a key's state.
type pullTarget struct {
	name, addr string
	// departed: the member has just left this node's ring. It is asked
	// anyway, because a member wrongly declared failed (or still lingering
	// after a leave) may hold the state; if it cannot be reached it is
	// skipped (and not asked again while it stays gone).
	departed bool
}

// previousOwners lists the members other than this node that may hold ek's
// state: its owners in the recent rings (and, for a node that just joined,
// the member that owns it in the ring without this node). When a previous
// owner has left the ring, both the member it would have handed the key to
// (its backup in that ring) and, best effort, the departed owner itself
// are listed.
func (n *Node) previousOwners(v *view, ek []byte, now time.Time) []pullTarget {
	var out []pullTarget
	has := func(m string) bool {
		for _, o := range out {
			if o.name == m {
				return true
			}
		}
		return m == "" || m == n.name
	}
	add := func(m string) {
		if !has(m) && v.snap.Has(m) {
			out = append(out, pullTarget{name: m, addr: v.addrs[m]})
		}
	}
	if n.joinedRecently(v, now) && v.snap.Owner(ek) == n.name {
		add(v.snap.Backup(ek))
	}
	for _, pr := range v.prev {
		if now.Sub(pr.replaced) >= n.cfg.HandoffGrace {
			break
		}
		o := pr.snap.Owner(ek)
		if v.snap.Has(o) {
			add(o)
			continue
		}
		add(pr.snap.Backup(ek))
		if addr, ok := n.handoff.departedAddr(o); ok && !has(o) {
			out = append(out, pullTarget{name: o, addr: addr, departed: true})
		}
	}
	return out
}

// departure is a member that left this node's ring recently.
type departure struct {
	addr        string
	at          time.Time // node clock when it left
	unreachable bool      // a pull to it failed: do not ask again
}

// noteDepartures records the members that old had and v has not, and
// forgets members that are back or left longer than HandoffGrace ago.
func (h *handoffState) noteDepartures(n *Node, old, v *view, now time.Time) {
	h.departedMu.Lock()
	defer h.departedMu.Unlock()
	for _, m := range old.snap.Members() {
		if m != n.name && !v.snap.Has(m) {
			h.departed[m] = &departure{addr: old.addrs[m], at: now}
		}
	}
	for m, d := range h.departed {
		if v.snap.Has(m) || now.Sub(d.at) >= n.cfg.HandoffGrace {
			delete(h.departed, m)
		}
	}
}

func (h *handoffState) departedAddr(m string) (string, bool) {
	h.departedMu.Lock()
	defer h.departedMu.Unlock()
	d := h.departed[m]
	if d == nil || d.unreachable {
		return "", false
	}
	return d.addr, true
}

func (h *handoffState) markUnreachable(m, addr string) {
	h.departedMu.Lock()
	defer h.departedMu.Unlock()
	if d := h.departed[m]; d != nil && d.addr == addr {
		d.unreachable = true
	}
}

// fetch makes key's state authoritative here: it pulls the key from each of
// from and merges what they return; if they return nothing it restores the
// crash backup of the key, if this node holds one. It always leaves the key
// in the store (an empty import marks it settled). Concurrent callers for
// one key share one fetch. With force, it fetches even if the key is held
// (pulling back a key whose push failed) and then lifts its tombstone.
func (n *Node) fetch(ctx context.Context, key Key, ek []byte, p *policy, from []pullTarget, force bool) (int, error) {
	h := &n.handoff
	h.pullMu.Lock()
	if pc := h.pulls[string(ek)]; pc != nil {
		h.pullMu.Unlock()
		select {
		case <-pc.done:
			return pc.got, pc.err
		case <-ctx.Done():
			return 0, fmt.Errorf("%w: waiting for handoff: %w", ErrUnavailable, ctx.Err())
		}
	}
	// A fetch that finished just now imported before it left the map, so
	// this check cannot miss it and pull (and merge) the same state twice.
	if !force && n.store.Has(key) {
		h.pullMu.Unlock()
		return 0, nil
	}
	pc := &pullCall{done: make(chan struct{})}
	h.pulls[string(ek)] = pc
	h.pullMu.Unlock()

	pc.got, pc.err = n.pullFrom(ctx, key, p, from, !force)
	if pc.err == nil && force {
		s := h.stripe(ek)
		s.mu.Lock()
		if t := s.gone[string(ek)]; t != nil && t.uncertain {
			h.clearGoneLocked(s, string(ek))
		}
		s.mu.Unlock()
	}

	h.pullMu.Lock()
	delete(h.pulls, string(ek))
	h.pullMu.Unlock()
	close(pc.done)
	return pc.got, pc.err
}

// pullFrom pulls key from each of from and imports what they return; with
// restore, it falls back to the key's crash backup when nobody returned
// state. A departed target that cannot be reached is skipped; any other
// failure, or an answer that the state went to a member not among from,
// makes the key unavailable.
func (n *Node) pullFrom(ctx context.Context, key Key, p *policy, from []pullTarget, restore bool) (int, error) {
	v := n.view.Load()
	var states []shard.KeyState
	if len(from) > 0 {
		ctx, cancel := context.WithTimeout(ctx, n.cfg.ForwardTimeout)
		defer cancel()
		for _, m := range from {
			c, err := n.client(m.name, m.addr)
			if err != nil {
				return 0, fmt.Errorf("%w: pull from %s: %w", ErrUnavailable, m.name, err)
			}
			resp, err := c.stub.Pull(ctx, &peerpb.PullRequest{
				Sender: n.name, MembersHash: v.snap.MembersHash(),
				Keys: []*peerpb.Key{{Tenant: key.Tenant, Subject: key.Subject, Policy: key.Policy}},
			})
			if holder, ok := movedTo(err); ok && slices.ContainsFunc(from, func(t pullTarget) bool { return t.name == holder }) {
				continue // we ask the holder too
			}
			if err != nil && m.departed {
				if _, moved := movedTo(err); !moved {
					// Gone for real, as the failure detector said: its
					// state is lost with it (or was handed off to a member
					// we ask too). A timeout costs this request, once.
					n.handoff.markUnreachable(m.name, m.addr)
					if ctx.Err() == nil {
						continue
					}
				}
			}
			if err != nil {
				n.metrics.Handoff("pulled", "failed", 1)
				n.warnThrottled("handoff pull failed", "peer", m.name, "err", err)
				return 0, fmt.Errorf("%w: pull from %s: %w", ErrUnavailable, m.name, err)
			}
			for _, ks := range resp.GetKeys() {
				st, err := stateFromWire(ks)
				if err != nil || st.Key != key {
					n.metrics.Handoff("pulled", "failed", 1)
					return 0, fmt.Errorf("%w: pull from %s: bad state: %v", ErrUnavailable, m.name, err)
				}
				states = append(states, st)
			}
		}
	}
	now := n.clock()
	got := len(states)
	if got > 0 {
		// The state is here now; any crash backup of it is stale.
		n.backup.replicas.Delete(key)
	} else if restore {
		if st, ok := n.backup.replicas.Take(key, now); ok {
			// Nobody alive held the key: its owner failed. Continue from
			// the backup (DESIGN.md §5, bounded loss).
			states = append(states, st)
			n.metrics.Backup("restored", "ok", 1)
		}
	}
	// An empty import still creates the key, which marks it settled here.
	if len(states) == 0 {
		states = append(states, shard.KeyState{Key: key, Algorithm: p.sp.Algorithm})
	}
	for _, st := range states {
		if err := n.store.Import(st, p.sp, now); err != nil {
			n.log.Error("handoff import failed; state lost", "err", err)
			n.metrics.Handoff("pulled", "failed", 1)
			return 0, fmt.Errorf("%w: import pulled state: %w", ErrUnavailable, err)
		}
	}
	if got > 0 {
		n.metrics.Handoff("pulled", "ok", got)
	}
	n.noteBackup(key)
	return got, nil
}

// Pull gives up the state of the requested keys to the sender. Each key is
// taken out of the store (after a push already under way ends) and
// tombstoned in one step under the key's gate, so this node never decides
// for it again until it gets the state back. A key whose state this node
// already gave to another live member is an error (Aborted, with an
// ErrorInfo naming the holder, see errMovedTo): answering "nothing here"
// would let the sender decide from an empty log.
func (s *server) Pull(ctx context.Context, req *peerpb.PullRequest) (*peerpb.PullResponse, error) {
	n := s.n
	if len(req.GetKeys()) > maxWireBatch {
		return nil, errBatchTooLarge(len(req.GetKeys()))
	}
	sender := req.GetSender()
	if sender == "" {
		return nil, statusInvalid("pull without sender")
	}
	v := n.firstView(ctx)
	if v == nil {
		return nil, status.Error(codes.Unavailable, "peer: node starting")
	}
	resp := &peerpb.PullResponse{}
	for _, pk := range req.GetKeys() {
		key := Key{Tenant: pk.GetTenant(), Subject: pk.GetSubject(), Policy: pk.GetPolicy()}
		var buf [shard.MaxEncodedKeyLen]byte
		ek, ok := key.AppendEncoded(buf[:0])
		if !ok {
			return nil, statusInvalid(fmt.Sprintf("key: %v", key.Validate()))
		}
		if err := n.waitMoving(ctx, ek); err != nil {
			return nil, ToStatus(fmt.Errorf("%w: %w", ErrUnavailable, err))
		}
		st, err := n.giveUp(v, key, ek, sender)
		if err != nil {
			return nil, err
		}
		if st != nil {
			resp.Keys = append(resp.Keys, stateToWire(*st))
		}
	}
	if err := n.handoff.fault(faultPullAfter); err != nil {
		return nil, err
	}
	return resp, nil
}

// giveUp takes key's state for sender (nil if there is none) and
// tombstones the key, under the key's gate.
func (n *Node) giveUp(v *view, key Key, ek []byte, sender string) (*shard.KeyState, error) {
	h := &n.handoff
	s := h.stripe(ek)
	now := n.clock()
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.gone[string(ek)]
	st, ok := n.store.Take(key, now)
	switch {
	case ok:
		h.setGoneLocked(s, string(ek), &tombstone{to: sender, at: now, seen: v.snap.Has(sender), given: &st})
		return &st, nil
	case t != nil && t.to == sender:
		if t.given == nil {
			return nil, nil
		}
		// The sender asks again: its first answer was lost. The copy ages
		// on this node's clock like the log would have.
		cp := shard.KeyState{Key: t.given.Key, Algorithm: t.given.Algorithm, Runs: make([]shard.Run, len(t.given.Runs))}
		for i, r := range t.given.Runs {
			cp.Runs[i] = shard.Run{Age: r.Age + now.Sub(t.at), Count: r.Count}
		}
		return &cp, nil
	case t != nil && t.live(v, now, n.cfg.HandoffGrace):
		return nil, errMovedTo(key, t.to)
	default:
		h.setGoneLocked(s, string(ek), &tombstone{to: sender, at: now, seen: v.snap.Has(sender)})
		return nil, nil
	}
}

// firstView returns the node's view, waiting (bounded by ctx) for the first
// one: peers can see a joining node, and push to it, before its first ring
// is built. It returns nil if ctx ends first.
func (n *Node) firstView(ctx context.Context) *view {
	for {
		if v := n.view.Load(); v != nil {
			return v
		}
		ch := n.viewChanged()
		if v := n.view.Load(); v != nil {
			return v
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil
		case <-n.ctx.Done():
			return nil
		}
	}
}

// stateMoved is the ErrorInfo reason of a Pull answered "the state went to
// another member"; the member is in the metadata under "holder".
const stateMoved = "STATE_MOVED"

func errMovedTo(key Key, holder string) error {
	st := status.Newf(codes.Aborted, "peer: state of %s went to %s", key, holder)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: stateMoved, Domain: "ringlimit", Metadata: map[string]string{"holder": holder}}); err == nil {
		st = d
	}
	return st.Err()
}

// movedTo returns the holder named by a Pull error from errMovedTo.
func movedTo(err error) (string, bool) {
	st, ok := status.FromError(err)
	if !ok || err == nil || st.Code() != codes.Aborted {
		return "", false
	}
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetReason() == stateMoved {
			return ei.GetMetadata()["holder"], true
		}
	}
	return "", false
}

func (n *Node) waitMoving(ctx context.Context, ek []byte) error {
	if n.handoff.nMoving.Load() == 0 {
		return nil
	}
	s := n.handoff.stripe(ek)
	for {
		s.mu.RLock()
		ch := s.moving[string(ek)]
		s.mu.RUnlock()
		if ch == nil {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Handoff imports pushed states. A key whose owner in this node's ring is
// still the sender is adopted: this node decides for it until its ring
// catches up. A leaving node refuses pushes (the sender keeps the keys and
// retries elsewhere once its ring drops this node).
func (s *server) Handoff(ctx context.Context, req *peerpb.HandoffRequest) (*peerpb.HandoffResponse, error) {
	n := s.n
	if len(req.GetKeys()) > maxWireBatch {
		return nil, errBatchTooLarge(len(req.GetKeys()))
	}
	v := n.firstView(ctx)
	switch {
	case v == nil:
		return nil, status.Error(codes.Unavailable, "peer: node starting")
	case n.closing.Load():
		return nil, status.Error(codes.Unavailable, "peer: node is leaving")
	}
	if err := n.handoff.fault(faultHandoffBefore); err != nil {
		return nil, err
	}
	states := make([]shard.KeyState, 0, len(req.GetKeys()))
	for _, ks := range req.GetKeys() {
		st, p, err := n.decodeState(ks)
		if err != nil {
			return nil, statusInvalid(err.Error())
		}
		if p == nil {
			return nil, statusInvalid(fmt.Sprintf("key %s: policy %q unknown here or has another algorithm", st.Key, st.Key.Policy))
		}
		states = append(states, st)
	}
	h := &n.handoff
	now := n.clock()
	var accepted uint32
	unowned := false
	for _, st := range states {
		if err := n.store.Import(st, n.policies[st.Key.Policy].sp, now); err != nil {
			n.log.Error("handoff import failed", "peer", req.GetSender(), "err", err)
			continue
		}
		accepted++
		var buf [shard.MaxEncodedKeyLen]byte
		ek, _ := st.Key.AppendEncoded(buf[:0])
		sp := h.stripe(ek)
		sp.mu.Lock()
		h.clearGoneLocked(sp, string(ek))
		switch owner := v.snap.Owner(ek); {
		case owner == n.name:
		case owner == req.GetSender():
			h.setAdoptedLocked(sp, string(ek), owner)
		default:
			unowned = true
		}
		sp.mu.Unlock()
		n.backup.replicas.Delete(st.Key)
		n.noteBackup(st.Key)
	}
	n.metrics.Handoff("received", "ok", int(accepted))
	if int(accepted) < len(states) {
		n.metrics.Handoff("received", "failed", len(states)-int(accepted))
	}
	if unowned {
		// The sender's ring differs from ours: pass the keys on to the
		// owner we see rather than leave them stranded here.
		n.kickMigrate()
	}
	if err := h.fault(faultHandoffAfter); err != nil {
		return nil, err
	}
	return &peerpb.HandoffResponse{Accepted: accepted}, nil
}

// onRingChange starts (or re-arms) the migration of keys this node no longer
// owns, and tidies handoff bookkeeping.
func (n *Node) onRingChange(old, v *view) {
	n.handoff.graceEpoch.Store(n.handoff.graceSeq.Add(1))
	n.handoff.noteDepartures(n, old, v, n.clock())
	n.handoff.sweep(n, v)
	if n.cfg.Backup {
		// Backup members move with the ring: resend every owned key.
		n.backup.full.Store(true)
	}
	if n.closing.Load() {
		return
	}
	n.kickMigrate()
}

// kickMigrate runs a migration in the background, or asks the running one
// to go round again.
func (n *Node) kickMigrate() {
	n.handoff.again.Store(true)
	select {
	case n.handoff.kick <- struct{}{}:
	default:
	}
	if n.closing.Load() || !n.handoff.migrating.CompareAndSwap(false, true) {
		return
	}
	n.wg.Add(1)
	go n.migrateLoop()
}

func (n *Node) migrateLoop() {
	defer n.wg.Done()
	h := &n.handoff
	backoff := migrateRetryMin
	for {
		for h.again.Swap(false) {
			if n.closing.Load() || n.ctx.Err() != nil {
				break // Close drains instead.
			}
			res := n.migrate(n.ctx, false)
			if res.failed == 0 || n.ctx.Err() != nil {
				backoff = migrateRetryMin
				continue
			}
			if backoff > migrateRetryMax {
				h.retry.Store(true)
				n.log.Warn("handoff incomplete; will retry on next sweep", "keys_failed", res.failed)
				backoff = migrateRetryMin
				continue
			}
			// The receiver may be starting or briefly unreachable: retry
			// soon, backing off, before leaving it to the sweep.
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
				h.again.Store(true)
			case <-h.kick: // a ring change: go round now
			case <-n.ctx.Done():
			}
			t.Stop()
			backoff *= 2
		}
		h.migrating.Store(false)
		// A kick between the loop's last check and the store above found
		// migrating set and left the work to us.
		if !h.again.Load() || !h.migrating.CompareAndSwap(false, true) {
			return
		}
	}
}

// migrateResult counts keys a migration moved, failed to move, and kept
// because there was nobody to move them to.
type migrateResult struct{ moved, failed, kept int }

// migrate pushes every held key whose target is another member to that
// member, in batches, several in flight. The target is the key's owner in
// the current ring; for a leaving node (leaving) it is the owner once this
// node is gone. A key adopted from a member that the ring still names as
// owner stays put on a ring change (the ring has not caught up), and goes
// to the owner without both of us on leave.
func (n *Node) migrate(ctx context.Context, leaving bool) migrateResult {
	var res migrateResult
	select {
	case n.handoff.migrateTok <- struct{}{}:
	case <-ctx.Done():
		return res
	}
	defer func() { <-n.handoff.migrateTok }()

	v := n.view.Load()
	without := make(map[string]*ring.Snapshot)
	target := func(ek []byte) string {
		o := v.snap.Owner(ek)
		from := n.handoff.adoptedFrom(ek)
		switch {
		case o == n.name && leaving:
			return v.snap.Backup(ek)
		case o == n.name:
			return o
		case from == "" || from != o:
			return o
		case !leaving:
			return n.name
		}
		r, ok := without[o]
		if !ok {
			var ms []string
			for _, m := range v.snap.Members() {
				if m != o && m != n.name {
					ms = append(ms, m)
				}
			}
			r, _ = ring.New(n.cfg.Ring, ms, 0) // nil when nobody is left
			without[o] = r
		}
		if r == nil {
			return ""
		}
		return r.Owner(ek)
	}
	groups := make(map[string][]Key)
	n.store.Range(func(k Key) bool {
		var buf [shard.MaxEncodedKeyLen]byte
		ek, _ := k.AppendEncoded(buf[:0])
		switch t := target(ek); t {
		case n.name:
		case "":
			res.kept++
		default:
			groups[t] = append(groups[t], k)
		}
		return true
	})

	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, pushParallel)
	for to, keys := range groups {
		for len(keys) > 0 {
			b := keys[:min(len(keys), handoffBatch)]
			keys = keys[len(b):]
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				m, f := n.push(ctx, v, to, b)
				<-sem
				mu.Lock()
				res.moved += m
				res.failed += f
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	return res
}

// push moves keys to member to: each is taken out of the store, tombstoned
// and marked moving under its gate, then all are sent in one Handoff RPC.
// On failure the states are put back, the tombstones stay (marked
// uncertain: the receiver may have imported them) and the failure is
// logged and counted; nothing is dropped silently.
func (n *Node) push(ctx context.Context, v *view, to string, keys []Key) (moved, failed int) {
	h := &n.handoff
	now := n.clock()
	req := &peerpb.HandoffRequest{Sender: n.name, MembersHash: v.snap.MembersHash()}
	var taken []shard.KeyState
	var encs []string
	ch := make(chan struct{})
	seen := v.snap.Has(to)
	for _, k := range keys {
		var buf [shard.MaxEncodedKeyLen]byte
		ek, _ := k.AppendEncoded(buf[:0])
		s := h.stripe(ek)
		s.mu.Lock()
		if s.moving[string(ek)] != nil {
			s.mu.Unlock()
			continue
		}
		st, ok := n.store.Take(k, now)
		if ok {
			// From here on this node answers "not owner, ask <to>" for
			// the key; requests wait while it is moving.
			e := string(ek)
			h.setMovingLocked(s, e, ch)
			h.setGoneLocked(s, e, &tombstone{to: to, at: now, seen: seen})
			encs = append(encs, e)
		}
		s.mu.Unlock()
		if ok {
			taken = append(taken, st)
			req.Keys = append(req.Keys, stateToWire(st))
		}
	}
	if len(taken) == 0 {
		close(ch)
		return 0, 0
	}
	err := h.fault(faultPushSend)
	var c *client
	if err == nil {
		c, err = n.client(to, v.addrs[to])
	}
	if err == nil {
		rctx, cancel := context.WithTimeout(ctx, max(n.cfg.ForwardTimeout, 5*time.Second))
		var resp *peerpb.HandoffResponse
		resp, err = c.stub.Handoff(rctx, req)
		cancel()
		if err == nil && int(resp.GetAccepted()) != len(taken) {
			err = fmt.Errorf("peer: %s accepted %d of %d keys", to, resp.GetAccepted(), len(taken))
		}
	}
	if err != nil {
		// Put the states back: they stay here, undecided, until a retry
		// or a pull moves them.
		lost := 0
		rnow := n.clock()
		for i := range taken {
			if ierr := n.store.Import(taken[i], n.policies[taken[i].Key.Policy].sp, rnow); ierr != nil {
				lost++
			}
		}
		if lost > 0 {
			n.log.Error("handoff failed and state could not be restored", "peer", to, "keys", lost)
		}
	}
	for _, e := range encs {
		s := h.stripeString(e)
		s.mu.Lock()
		if err != nil {
			if t := s.gone[e]; t != nil {
				t.uncertain = true
			}
		}
		h.clearMovingLocked(s, e)
		s.mu.Unlock()
	}
	close(ch)
	if err != nil {
		n.metrics.Handoff("sent", "failed", len(taken))
		n.log.Warn("handoff failed", "peer", to, "keys", len(taken), "err", err)
		return 0, len(taken)
	}
	n.metrics.Handoff("sent", "ok", len(taken))
	return len(taken), 0
}

// drain hands every held key to the member that owns it once this node is
// gone, before the node leaves gossip. It runs a bulk pass while the node
// still decides for keys not yet moved, then stops deciding, waits for
// decisions in flight, and pushes whatever arrived meanwhile, retrying
// failures until ctx's deadline. Keys still held at the end are lost when
// the node leaves: they are logged at Error level and reported in the
// returned error (each failed push was also counted by Metrics.Handoff).
func (n *Node) drain(ctx context.Context) error {
	h := &n.handoff
	defer func() {
		h.stopped.Store(true)
		close(h.drained)
	}()
	v := n.view.Load()
	if v.snap.Len() <= 1 {
		if k := n.store.Len(); k > 0 {
			n.log.Info("handoff skipped: no other members", "keys", k)
		}
		return nil
	}
	start := time.Now()
	res := n.migrate(ctx, true)
	h.stopped.Store(true)
	for i := range h.stripes {
		// Wait for decisions that passed their checks before the stop:
		// taking each stripe's write lock once is the barrier.
		h.stripes[i].mu.Lock()
		//lint:ignore SA2001 the empty critical section is the barrier
		h.stripes[i].mu.Unlock()
	}
	failedPushes := res.failed
	for attempt := 0; ; attempt++ {
		r := n.migrate(ctx, true)
		res.moved += r.moved
		failedPushes += r.failed
		if r.failed == 0 || attempt >= drainRetries || ctx.Err() != nil {
			break
		}
		t := time.NewTimer(drainRetryPause)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	left := n.store.Len()
	if left > 0 {
		n.log.Error("handoff on leave incomplete: keys lost", "keys_moved", res.moved, "keys_lost", left,
			"failed_pushes", failedPushes, "duration", time.Since(start), "err", ctx.Err())
		return fmt.Errorf("peer: handoff on leave: %d keys not handed off", left)
	}
	n.log.Info("handoff on leave", "keys_moved", res.moved, "failed_pushes", failedPushes, "duration", time.Since(start))
	return nil
}

func stateToWire(st shard.KeyState) *peerpb.KeyState {
	out := &peerpb.KeyState{
		Key:       &peerpb.Key{Tenant: st.Key.Tenant, Subject: st.Key.Subject, Policy: st.Key.Policy},
		Algorithm: int32(st.Algorithm),
		Runs:      make([]*peerpb.Run, len(st.Runs)),
	}
	for i, r := range st.Runs {
		out.Runs[i] = &peerpb.Run{AgeNs: int64(r.Age), Count: r.Count}
	}
	return out
}

func stateFromWire(ks *peerpb.KeyState) (shard.KeyState, error) {
	pk := ks.GetKey()
	if ks.GetAlgorithm() < 0 || ks.GetAlgorithm() > 255 {
		return shard.KeyState{}, fmt.Errorf("%w: algorithm %d", shard.ErrInvalidState, ks.GetAlgorithm())
	}
	st := shard.KeyState{
		Key:       Key{Tenant: pk.GetTenant(), Subject: pk.GetSubject(), Policy: pk.GetPolicy()},
		Algorithm: shard.Algorithm(ks.GetAlgorithm()),
		Runs:      make([]shard.Run, len(ks.GetRuns())),
	}
	for i, r := range ks.GetRuns() {
		st.Runs[i] = shard.Run{Age: time.Duration(r.GetAgeNs()), Count: r.GetCount()}
	}
	return st, st.Validate()
}

// decodeState decodes a pushed key state and finds the local policy it
// belongs to. A malformed state is an error; a state whose policy is
// unknown here or uses another algorithm comes back with a nil policy, for
// the caller to refuse or skip.
func (n *Node) decodeState(ks *peerpb.KeyState) (shard.KeyState, *policy, error) {
	st, err := stateFromWire(ks)
	if err != nil {
		return st, nil, err
	}
	p := n.policies[st.Key.Policy]
	if p == nil || p.sp.Algorithm != st.Algorithm {
		return st, nil, nil
	}
	return st, p, nil
}
