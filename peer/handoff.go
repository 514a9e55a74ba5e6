package peer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// Handoff keeps one decision point per key while ownership moves
// (DESIGN.md §5):
//
//   - The old owner stops deciding for a key as soon as its ring says it is
//     no longer the owner, or as soon as it has given the key's state away
//     (a tombstone names the member that took it; requests then get "not
//     owner" with that member, and senders ask it directly).
//   - The old owner pushes the state of keys it no longer owns to their new
//     owners (Handoff RPC). While a key is being pushed it is "moving", and
//     a pull for it waits for the push to finish.
//   - A new owner that gets a request for a key it holds no state for,
//     within HandoffGrace of a ring change, first pulls the key from every
//     member that owned it in the recent rings (Pull RPC) and merges what
//     they return. If a previous owner cannot answer in time, the request
//     is unavailable rather than decided from an empty log.
//   - A leaving node (Close) pushes every key to the member that owns it
//     once the leaver is gone (ring.Snapshot.Backup), before it leaves
//     gossip. The receiver "adopts" the key: until its ring drops the
//     leaver, it decides for that key on requests redirected to it.
//
// States travel as ages relative to the sender's clock and are rebased on
// the receiver's (shard.Store.Import), so clock offset cannot expire
// admissions early; merging adds admissions up, which can only refuse more.
type handoffState struct {
	mu      sync.Mutex
	moving  map[string]chan struct{} // key encoding -> closed when its push ends
	gone    map[string]string        // key encoding -> member that took the state
	adopted map[string]string        // key encoding -> member that handed it to us
	pulls   map[string]*pullCall     // in-flight pulls, one per key
	// nGone and nAdopted let the decision path skip the lock when empty.
	nGone    atomic.Int64
	nAdopted atomic.Int64

	migrating atomic.Bool // a migration goroutine runs
	again     atomic.Bool // another ring change arrived meanwhile
}

type pullCall struct {
	done chan struct{}
	err  error
}

// maxTombstones bounds the tombstone and adoption maps; past it the oldest
// arbitrary entries are dropped (the ring converges long before).
const maxTombstones = 1 << 20

func (h *handoffState) init() {
	h.moving = make(map[string]chan struct{})
	h.gone = make(map[string]string)
	h.adopted = make(map[string]string)
	h.pulls = make(map[string]*pullCall)
}

// goneTo returns the member that took ek's state, or "".
func (h *handoffState) goneTo(ek []byte) string {
	if h.nGone.Load() == 0 {
		return ""
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.gone[string(ek)]
}

// adoptedFrom returns the member that handed ek's state to us, or "".
func (h *handoffState) adoptedFrom(ek []byte) string {
	if h.nAdopted.Load() == 0 {
		return ""
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.adopted[string(ek)]
}

func (h *handoffState) setGoneLocked(ek, to string) {
	if _, ok := h.gone[ek]; !ok {
		if len(h.gone) >= maxTombstones {
			for k := range h.gone {
				delete(h.gone, k)
				break
			}
		} else {
			h.nGone.Add(1)
		}
	}
	h.gone[ek] = to
}

func (h *handoffState) clearGoneLocked(ek string) {
	if _, ok := h.gone[ek]; ok {
		delete(h.gone, ek)
		h.nGone.Add(-1)
	}
}

// sweep drops tombstones and adoptions that the current ring has made
// irrelevant. Called from Node.Sweep and after each ring change.
func (h *handoffState) sweep(n *Node, v *view) {
	if h.nGone.Load() == 0 && h.nAdopted.Load() == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for ek, to := range h.gone {
		// Once our ring no longer names us as owner we will not decide
		// anyway; once the taker is gone the tombstone protects nothing.
		if v.snap.Owner([]byte(ek)) != n.name || !v.snap.Has(to) {
			delete(h.gone, ek)
			h.nGone.Add(-1)
		}
	}
	for ek, from := range h.adopted {
		if v.snap.Owner([]byte(ek)) != from {
			delete(h.adopted, ek)
			h.nAdopted.Add(-1)
		}
	}
}

// settle makes sure this node's state for key is authoritative before it
// decides: the key must not have been given away, and within the grace
// period after a ring change its previous owners must have handed it over.
func (n *Node) settle(ctx context.Context, v *view, key Key, ek []byte, p *policy) error {
	if to := n.handoff.goneTo(ek); to != "" {
		if v.snap.Has(to) && to != n.name {
			return &notOwnerError{owner: to, membersHash: v.snap.MembersHash()}
		}
		n.handoff.mu.Lock()
		n.handoff.clearGoneLocked(string(ek))
		n.handoff.mu.Unlock()
	}
	now := n.clock()
	if !n.inGrace(v, now) || n.store.Has(key) {
		return nil
	}
	from := n.previousOwners(v, ek, now)
	if len(from) == 0 {
		return n.restoreBackup(v, key, p, now)
	}
	return n.pull(ctx, key, ek, p, from)
}

// inGrace reports whether a ring change happened within HandoffGrace.
func (n *Node) inGrace(v *view, now time.Time) bool {
	if v.joined {
		return true
	}
	return len(v.prev) > 0 && now.Sub(v.prev[0].replaced) < n.cfg.HandoffGrace
}

// previousOwners lists the live members other than this node that owned ek
// in the recent rings (and, for a node that just joined, the member that
// owns it in the ring without this node).
func (n *Node) previousOwners(v *view, ek []byte, now time.Time) []string {
	var out []string
	add := func(m string) {
		if m == "" || m == n.name || !v.snap.Has(m) {
			return
		}
		for _, o := range out {
			if o == m {
				return
			}
		}
		out = append(out, m)
	}
	if v.joined && v.snap.Owner(ek) == n.name {
		add(v.snap.Backup(ek))
	}
	for _, pr := range v.prev {
		if now.Sub(pr.replaced) >= n.cfg.HandoffGrace {
			break
		}
		add(pr.snap.Owner(ek))
	}
	return out
}

// pull asks each previous owner for key's state and merges it. Concurrent
// requests for one key share one pull.
func (n *Node) pull(ctx context.Context, key Key, ek []byte, p *policy, from []string) error {
	n.handoff.mu.Lock()
	if pc := n.handoff.pulls[string(ek)]; pc != nil {
		n.handoff.mu.Unlock()
		select {
		case <-pc.done:
			return pc.err
		case <-ctx.Done():
			return fmt.Errorf("%w: waiting for handoff: %w", ErrUnavailable, ctx.Err())
		}
	}
	pc := &pullCall{done: make(chan struct{})}
	n.handoff.pulls[string(ek)] = pc
	n.handoff.mu.Unlock()

	pc.err = n.pullFrom(ctx, key, p, from)

	n.handoff.mu.Lock()
	delete(n.handoff.pulls, string(ek))
	n.handoff.mu.Unlock()
	close(pc.done)
	return pc.err
}

func (n *Node) pullFrom(ctx context.Context, key Key, p *policy, from []string) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ForwardTimeout)
	defer cancel()
	v := n.view.Load()
	var states []shard.KeyState
	for _, m := range from {
		c, err := n.client(m, v.addrs[m])
		if err != nil {
			return fmt.Errorf("%w: pull from %s: %w", ErrUnavailable, m, err)
		}
		resp, err := c.stub.Pull(ctx, &peerpb.PullRequest{
			Sender: n.name, MembersHash: v.snap.MembersHash(),
			Keys: []*peerpb.Key{{Tenant: key.Tenant, Subject: key.Subject, Policy: key.Policy}},
		})
		if err != nil {
			n.metrics.Handoff("pulled", "failed", 1)
			n.warnThrottled("handoff pull failed", "peer", m, "err", err)
			return fmt.Errorf("%w: pull from %s: %w", ErrUnavailable, m, err)
		}
		for _, ks := range resp.GetKeys() {
			st, err := stateFromWire(ks)
			if err != nil {
				return fmt.Errorf("%w: pull from %s: %w", ErrUnavailable, m, err)
			}
			states = append(states, st)
		}
	}
	now := n.clock()
	// An empty import still creates the key, which marks it settled here.
	if len(states) == 0 {
		states = append(states, shard.KeyState{Key: key, Algorithm: p.sp.Algorithm})
	}
	for _, st := range states {
		if err := n.store.Import(st, p.sp, now); err != nil {
			return fmt.Errorf("%w: import pulled state: %w", ErrUnavailable, err)
		}
	}
	n.metrics.Handoff("pulled", "ok", len(states))
	// The state is here now; any backup replica of it is stale.
	n.backup.replicas.Delete(key)
	return nil
}

// Pull gives up the state of the requested keys to the sender: each key is
// taken out of the store (waiting for a push already under way) and
// tombstoned, so this node never decides for it again until it gets the
// state back or the taker leaves.
func (s *server) Pull(ctx context.Context, req *peerpb.PullRequest) (*peerpb.PullResponse, error) {
	n := s.n
	if len(req.GetKeys()) > maxWireBatch {
		return nil, errBatchTooLarge(len(req.GetKeys()))
	}
	if req.GetSender() == "" {
		return nil, statusInvalid("pull without sender")
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
		n.handoff.mu.Lock()
		// Take and tombstone under one lock: no decision can slip between.
		st, ok := n.store.Take(key, n.clock())
		n.handoff.setGoneLocked(string(ek), req.GetSender())
		n.handoff.mu.Unlock()
		if ok {
			resp.Keys = append(resp.Keys, stateToWire(st))
		}
	}
	return resp, nil
}

func (n *Node) waitMoving(ctx context.Context, ek []byte) error {
	n.handoff.mu.Lock()
	ch := n.handoff.moving[string(ek)]
	n.handoff.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Handoff imports pushed states. A key whose owner in this node's ring is
// still the sender is adopted: this node decides for it when asked
// directly, until its ring catches up.
func (s *server) Handoff(ctx context.Context, req *peerpb.HandoffRequest) (*peerpb.HandoffResponse, error) {
	n := s.n
	if len(req.GetKeys()) > maxWireBatch {
		return nil, errBatchTooLarge(len(req.GetKeys()))
	}
	states := make([]shard.KeyState, 0, len(req.GetKeys()))
	for _, ks := range req.GetKeys() {
		st, err := stateFromWire(ks)
		if err != nil {
			return nil, statusInvalid(err.Error())
		}
		p := n.policies[st.Key.Policy]
		if p == nil || p.sp.Algorithm != st.Algorithm {
			return nil, statusInvalid(fmt.Sprintf("key %s: policy %q unknown here or has another algorithm", st.Key, st.Key.Policy))
		}
		states = append(states, st)
	}
	now := n.clock()
	v := n.view.Load()
	var accepted uint32
	for _, st := range states {
		if err := n.store.Import(st, n.policies[st.Key.Policy].sp, now); err != nil {
			n.log.Error("handoff import failed", "peer", req.GetSender(), "err", err)
			continue
		}
		accepted++
		var buf [shard.MaxEncodedKeyLen]byte
		ek, _ := st.Key.AppendEncoded(buf[:0])
		n.handoff.mu.Lock()
		n.handoff.clearGoneLocked(string(ek))
		if owner := v.snap.Owner(ek); owner != n.name && owner == req.GetSender() {
			if _, ok := n.handoff.adopted[string(ek)]; !ok && len(n.handoff.adopted) < maxTombstones {
				n.handoff.nAdopted.Add(1)
			}
			n.handoff.adopted[string(ek)] = req.GetSender()
		}
		n.handoff.mu.Unlock()
		n.backup.replicas.Delete(st.Key)
	}
	n.metrics.Handoff("received", "ok", int(accepted))
	if int(accepted) < len(states) {
		n.metrics.Handoff("received", "failed", len(states)-int(accepted))
	}
	return &peerpb.HandoffResponse{Accepted: accepted}, nil
}

// onRingChange starts (or re-arms) the migration of keys this node no longer
// owns, and tidies handoff bookkeeping.
func (n *Node) onRingChange(_, v *view) {
	n.handoff.sweep(n, v)
	if n.closing.Load() {
		return
	}
	n.handoff.again.Store(true)
	if !n.handoff.migrating.CompareAndSwap(false, true) {
		return
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		for n.handoff.again.Swap(false) {
			res := n.migrate(n.ctx, func(v *view, ek []byte) string { return v.snap.Owner(ek) })
			if res.failed > 0 && n.ctx.Err() == nil {
				n.log.Warn("handoff incomplete; will retry on next sweep", "keys_failed", res.failed)
			}
		}
		n.handoff.migrating.Store(false)
	}()
}

// migrateResult counts keys a migration moved and failed to move.
type migrateResult struct{ moved, failed, kept int }

const handoffBatch = 1024

// migrate pushes every held key whose target (as computed by target from the
// current view) is another member to that member, in batches.
func (n *Node) migrate(ctx context.Context, target func(*view, []byte) string) migrateResult {
	var res migrateResult
	groups := make(map[string][]Key)
	v := n.view.Load()
	n.store.Range(func(k Key) bool {
		var buf [shard.MaxEncodedKeyLen]byte
		ek, _ := k.AppendEncoded(buf[:0])
		t := target(v, ek)
		switch {
		case t == n.name:
		case t == "":
			res.kept++
		default:
			groups[t] = append(groups[t], k)
		}
		return true
	})
	for to, keys := range groups {
		for len(keys) > 0 {
			b := keys[:min(len(keys), handoffBatch)]
			keys = keys[len(b):]
			m, f := n.push(ctx, v, to, b)
			res.moved += m
			res.failed += f
		}
	}
	return res
}

// push moves keys to member to: each is marked moving and taken out of the
// store and tombstoned, then sent in one Handoff RPC. On failure the states
// are put back, the tombstones lifted, and the failure reported.
func (n *Node) push(ctx context.Context, v *view, to string, keys []Key) (moved, failed int) {
	now := n.clock()
	req := &peerpb.HandoffRequest{Sender: n.name, MembersHash: v.snap.MembersHash()}
	var taken []shard.KeyState
	var encs []string
	ch := make(chan struct{})
	n.handoff.mu.Lock()
	for _, k := range keys {
		st, ok := n.store.Take(k, now)
		if !ok {
			continue
		}
		var buf [shard.MaxEncodedKeyLen]byte
		ek, _ := k.AppendEncoded(buf[:0])
		// Tombstone at once: from here on this node answers "not owner,
		// ask <to>" for the key, even before the push lands.
		n.handoff.moving[string(ek)] = ch
		n.handoff.setGoneLocked(string(ek), to)
		taken = append(taken, st)
		encs = append(encs, string(ek))
		req.Keys = append(req.Keys, stateToWire(st))
	}
	n.handoff.mu.Unlock()
	if len(taken) == 0 {
		close(ch)
		return 0, 0
	}
	var err error
	var resp *peerpb.HandoffResponse
	c, err := n.client(to, v.addrs[to])
	if err == nil {
		rctx, cancel := context.WithTimeout(ctx, max(n.cfg.ForwardTimeout, 5*time.Second))
		resp, err = c.stub.Handoff(rctx, req)
		cancel()
		if err == nil && int(resp.GetAccepted()) != len(taken) {
			err = fmt.Errorf("peer: %s accepted %d of %d keys", to, resp.GetAccepted(), len(taken))
		}
	}
	n.handoff.mu.Lock()
	for i, ek := range encs {
		if err != nil {
			// Put the state back: it stays here, undecided, until a later
			// migration or a pull moves it. Nothing is silently lost.
			if ierr := n.store.Import(taken[i], n.policies[taken[i].Key.Policy].sp, n.clock()); ierr != nil {
				n.log.Error("handoff failed and state could not be restored", "peer", to, "err", ierr)
			}
			n.handoff.clearGoneLocked(ek)
		}
		delete(n.handoff.moving, ek)
	}
	n.handoff.mu.Unlock()
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
// gone, before the node leaves gossip. It reports keys it could not hand
// off in the returned error.
func (n *Node) drain(ctx context.Context) error {
	v := n.view.Load()
	if v.snap.Len() <= 1 {
		if k := n.store.Len(); k > 0 {
			n.log.Info("handoff skipped: no other members", "keys", k)
		}
		return nil
	}
	start := time.Now()
	res := n.migrate(ctx, func(v *view, ek []byte) string {
		if o := v.snap.Owner(ek); o != n.name {
			return o
		}
		return v.snap.Backup(ek)
	})
	n.log.Info("handoff on leave", "keys_moved", res.moved, "keys_failed", res.failed, "duration", time.Since(start))
	if res.failed > 0 {
		return fmt.Errorf("peer: handoff on leave: %d keys not handed off", res.failed)
	}
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
