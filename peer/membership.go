package peer

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/peer/internal/membership"
	"github.com/ringlimit/ringlimit/ring"
)

// gossiper is the node's membership: memberlist, the events it reports,
// the failed members it rejoins (reconnect.go), and the views (rings)
// rebuilt from the whole member list and published to n.view. It takes
// what it needs of the node through env.
type gossiper struct {
	env *gossiperEnv

	ml       *memberlist.Memberlist
	delegate *membership.Delegate
	mlLog    *membership.Log // memberlist's log lines, bridged to slog
	events   membership.Queue
	// clusterID names the cluster this node belongs to (see
	// membership.Meta.Cluster).
	clusterID atomic.Uint64

	rebuildCh chan struct{} // nudged by memberlist's callbacks
	// kept: members gossip declared dead that the ring keeps while their
	// liveness holds (name → gossip address); the rebuild goroutine's.
	kept map[string]membership.Event
	// starts maps member names to the start id last seen in their meta.
	// Only the rebuild goroutine (or New, before it starts) touches it.
	starts map[string]uint64
	// retry is the set of failed members to rejoin (reconnect.go).
	retry reconnectState
	// conflict records another member claiming this node's name
	// (conflict.go).
	conflict conflictState

	viewMu  sync.Mutex    // guards viewCh and version
	viewCh  chan struct{} // closed and replaced on each publish
	version uint64
}

// gossiperEnv is what the membership takes from its node, set once in New.
// The funcs that reach the ownership driver (fresh, ownerView, logAddrs)
// are called only by the rebuild goroutine, which starts after the
// driver is open.
type gossiperEnv struct {
	ctx     context.Context // the node's lifetime: cancelled by Close
	wg      *sync.WaitGroup // the node's goroutines; the rebuild loop joins it
	name    string          // this node's member name
	log     *slog.Logger
	metrics Metrics
	cfg     *Config // the node's config: gossip, join, ring and lease settings
	fp      uint64  // the placement fingerprint members must share
	closing *atomic.Bool
	view    *atomic.Pointer[view] // where views are published
	hooks   *faultHooks           // freshLate, freshLost (tests)

	// meta is what this node gossips about itself.
	meta func(draining bool) membership.Meta
	// fresh asks the ownership log which of the incarnations ids are
	// live and extending, within ctx (nil: no answer in time).
	fresh func(ctx context.Context, ids []string) map[string]bool
	// ownerView passes a rebuilt view on to the ownership driver
	// (logOwner.setView); logAddrs adds the addresses its log still
	// dials (logOwner.withLogAddrs).
	ownerView func(v *view, evs []membership.Event, starts, raftIDs, heirs map[string]uint64, targets []string)
	logAddrs  func(alive map[string]string) map[string]string
	// dropLinks stops the per-peer links of members not in addrs;
	// resetLink stops the one of member name (it restarted).
	dropLinks func(addrs map[string]string)
	resetLink func(name string)
	// policyVersions takes the policy version each live member gossips;
	// reachStarts their start ids (reach.go).
	policyVersions func(pvs map[string]uint64)
	reachStarts    func(starts map[string]uint64)
	// ignore notes a member left out of the ring, and reports whether
	// that is news; commitIgnored publishes the rebuild's (ready.go).
	ignore        func(name, why string) bool
	commitIgnored func() map[string]string
	// ready recomputes the node's readiness (ready.go).
	ready func()
}

// newGossip is the node's membership, not yet started (start).
func newGossiper(e *gossiperEnv) *gossiper {
	return &gossiper{env: e, rebuildCh: make(chan struct{}, 1), kept: map[string]membership.Event{}, viewCh: make(chan struct{})}
}

// incarnationID is the ID of member name's process started as start:
// name@start, the member ID in the ownership log.
func incarnationID(name string, start uint64) string { return fmt.Sprintf("%s@%016x", name, start) }

// memberName is the member name of incarnation id ("" for "").
func memberName(id string) string {
	if i := strings.LastIndexByte(id, '@'); i >= 0 {
		return id[:i]
	}
	return id
}

// errNoPeer is a member that is not in this node's view.
var errNoPeer = errors.New("peer: member not in view")

// view is one published ring with the addresses needed to reach its members.
// Published views are never mutated.
type view struct {
	// snap places partitions on the members that may be targets: live,
	// not draining.
	snap *ring.Snapshot
	// alive maps every live member (draining ones included) to its gRPC
	// address.
	alive map[string]string
	since time.Time // node clock when this member set was installed
	// stopping is set when every live member, this node included, is
	// leaving: the whole cluster is stopping and nobody will take a
	// partition over. snap is then the last ring that had a member.
	stopping bool
}

// announceLeave tells every member, over memberlist's reliable (TCP)
// channel and before the gossip leave, that this node leaves on purpose, so
// their logs say "left" rather than "failed". Bounded by memberlist's
// TCPTimeout per member; members are told concurrently; failures only cost
// the log line.
func (g *gossiper) announceLeave() {
	msg := membership.LeavingMsg(g.env.name)
	var wg sync.WaitGroup
	for _, m := range g.events.GossipAddrs() {
		if m.Name == g.env.name {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = g.ml.SendReliable(&m, msg)
		}()
	}
	wg.Wait()
}

func (g *gossiper) nudge() {
	select {
	case g.rebuildCh <- struct{}{}:
	default:
	}
}

func (g *gossiper) start(ctx context.Context) error {
	host, portStr, _ := net.SplitHostPort(g.env.cfg.GossipAddr)
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("%w: gossip port %q: %v", ErrInvalidConfig, portStr, err)
	}
	mc := memberlist.DefaultLANConfig()
	mc.Name = g.env.name
	mc.BindAddr = host
	mc.BindPort = port
	mc.AdvertisePort = port
	if g.env.cfg.GossipAdvertiseAddr != "" {
		ah, ap, _ := net.SplitHostPort(g.env.cfg.GossipAdvertiseAddr)
		mc.AdvertiseAddr = ah
		mc.AdvertisePort, _ = strconv.Atoi(ap)
	}
	// The join ends as soon as another claimant of this node's name is
	// seen (conflict.go); New then fails.
	joinCtx, endJoin := context.WithCancel(ctx)
	defer endJoin()
	g.conflict.mu.Lock()
	g.conflict.stop = endJoin
	g.conflict.mu.Unlock()
	var selfAddr atomic.Pointer[string] // set once memberlist is up
	d := &membership.Delegate{Queue: &g.events, OnEvent: func(e membership.Event) { g.noteReconnect(e); g.nudge() }, OnConflict: g.noteConflict,
		OnMerge: func(peers []*memberlist.Node) error { return g.checkMerge(selfAddr.Load(), mc.ProbeTimeout, peers) }}
	d.SetMeta(g.env.meta(false))
	g.delegate = d
	mc.Delegate = d
	mc.Events = d
	mc.Conflict = d
	mc.Merge = d
	g.mlLog = membership.NewLog(g.env.log)
	mc.Logger = log.New(g.mlLog, "", 0)
	mc.LogOutput = nil
	if len(g.env.cfg.GossipKey) > 0 {
		mc.SecretKey = g.env.cfg.GossipKey
	}
	g.env.cfg.GossipProfile.ApplySized(mc, g.env.cfg.ExpectedMembers)
	if g.env.cfg.Gossip != nil {
		g.env.cfg.Gossip(mc)
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		return fmt.Errorf("peer: start gossip on %s: %w", g.env.cfg.GossipAddr, err)
	}
	g.ml = ml
	self := ml.LocalNode().Address()
	selfAddr.Store(&self)
	if len(g.env.cfg.Join) == 0 {
		return nil
	}
	err = membership.Join(joinCtx, ml, g.env.cfg.Join, g.env.cfg.JoinTimeout, g.env.log)
	if errors.Is(err, membership.ErrKeyMismatch) {
		// This node's GossipKey is not the cluster's: a config error.
		err = fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if cerr := g.conflict.err(g.env.name); cerr != nil {
		err = cerr // the join was ended for it, or it came after
	}
	if err != nil {
		// Shutdown, not Leave: after a name conflict a leave would
		// announce the established member's departure.
		_ = ml.Shutdown()
		g.mlLog.Close()
		return err
	}
	return nil
}

// rebuildLoop rebuilds the ring whenever memberlist reports a change,
// and while it keeps members gossip declared dead (rebuild), again every
// quarter lease until it lets them go.
func (g *gossiper) rebuildLoop() {
	defer g.env.wg.Done()
	recheck := time.NewTimer(time.Hour)
	recheck.Stop()
	defer recheck.Stop()
	for {
		select {
		case <-g.env.ctx.Done():
			return
		case <-g.rebuildCh:
		case <-recheck.C:
		}
		if g.rebuild() {
			recheck.Reset(g.env.cfg.LeaseDuration / 4)
		}
		g.env.ready()
	}
}

// keepFailed returns, of the members gossip declared dead (failed: name →
// metadata), those the ownership log still finds live and extending: they
// stay on the ring. Gossip's failure detector runs on probes of 100 ms to
// a few seconds; on a starved or briefly lossy host it declares members
// dead that come back a moment later, and each such flap moved a fifth
// of the partitions away and back, copies and all. The log's liveness is
// what decides who may hold a partition, so it also decides when a
// member leaves the ring: once its liveness has lapsed here (or it came
// back, or it restarted under a new incarnation). Members let go are
// forgotten.
func (g *gossiper) keepFailed(failed, members map[string][]byte) map[string][]byte {
	if len(failed) == 0 {
		return nil
	}
	ids := make([]string, 0, len(failed))
	byID := make(map[string]string, len(failed))
	for name, raw := range failed {
		if _, back := members[name]; back {
			continue
		}
		md, err := membership.DecodeMeta(raw)
		if err != nil || md.Start == 0 {
			g.events.ForgetFailed(name)
			continue
		}
		id := incarnationID(name, md.Start)
		ids = append(ids, id)
		byID[id] = name
	}
	var fresh map[string]bool
	if len(ids) > 0 {
		ctx, cancel := context.WithTimeout(g.env.ctx, time.Second)
		fresh = g.env.fresh(ctx, ids)
		cancel()
		if g.env.hooks.freshLate.Load() {
			fresh = nil
		}
	}
	var keep map[string][]byte
	for _, id := range ids {
		name := byID[id]
		if fresh == nil && !g.env.hooks.freshLost.Load() {
			// The log did not answer in time (a loaded runner): no
			// news is not a lapsed liveness. Keep the member for now;
			// it is looked at again soon. Dropping it made a loaded
			// member's view lose every other one at once, and a
			// leaver alone in its view left with the only copy of a
			// partition.
			if keep == nil {
				keep = make(map[string][]byte)
			}
			keep[name] = failed[name]
			continue
		}
		if !fresh[id] || g.env.hooks.freshLost.Load() {
			g.events.ForgetFailed(name)
			continue
		}
		if keep == nil {
			keep = make(map[string][]byte)
		}
		keep[name] = failed[name]
	}
	return keep
}

// rebuild builds a fresh snapshot from the whole member list (never from
// deltas), publishes it if the member set changed, and logs one "gossip
// membership" line per event. It reports whether it kept members gossip
// declared dead whose liveness holds (keepFailed): those are looked at
// again soon.
func (g *gossiper) rebuild() (kept bool) {
	evs, dropped, members, failed := g.events.Take()
	keep := g.keepFailed(failed, members)
	for name, raw := range keep {
		members[name] = raw
		kept = true
	}
	for _, e := range evs {
		if _, ok := keep[e.Name]; ok && (e.Kind == "failed" || e.Kind == "left") {
			g.kept[e.Name] = e
		}
	}
	for name, e := range g.kept {
		if _, ok := keep[name]; ok {
			continue
		}
		delete(g.kept, name)
		if _, back := members[name]; !back {
			// Its liveness lapsed (or ended): the failure, or the leave,
			// gossip saw now counts.
			evs = append(evs, e)
		}
	}
	names := make([]string, 0, len(members))
	alive := make(map[string]string)
	draining := g.env.closing.Load()
	mine := g.adoptCluster(members)
	starts := make(map[string]uint64, len(members))
	raftIDs, heirs := make(map[string]uint64, len(members)), map[string]uint64{}
	pvs := make(map[string]uint64, len(members))
	for name, raw := range members {
		md, err := membership.DecodeMeta(raw)
		switch {
		case err != nil:
			if g.env.ignore(name, "unreadable metadata") {
				g.env.log.Warn("member ignored", "peer", name, "err", err)
			}
			continue
		case md.Fingerprint != g.env.fp:
			if g.env.ignore(name, "placement fingerprint differs") {
				g.env.log.Warn("member ignored: placement fingerprint differs", "peer", name,
					"fingerprint", fmt.Sprintf("%016x", md.Fingerprint), "want", fmt.Sprintf("%016x", g.env.fp))
			}
			continue
		case md.Cluster != 0 && mine != 0 && md.Cluster != mine:
			if g.env.ignore(name, "member of another cluster (started separately; restart one side with Join pointing at the other)") {
				g.env.log.Warn("member ignored: it belongs to another cluster, founded separately", "peer", name,
					"cluster", fmt.Sprintf("%016x", md.Cluster), "want", fmt.Sprintf("%016x", mine))
			}
			continue
		}
		alive[name] = md.RPCAddr
		starts[name] = md.Start
		raftIDs[name] = md.Raft()
		if md.Heir != 0 {
			heirs[name] = md.Heir
		}
		pvs[name] = md.Policies
		if md.Draining || name == g.env.name && draining {
			continue // never a target
		}
		names = append(names, name)
	}
	g.env.policyVersions(pvs)
	g.noteRestarts(evs, starts)
	g.env.reachStarts(starts)
	ignored := g.env.commitIgnored()
	if len(alive) == 0 {
		// Only after our own leave: memberlist no longer lists us. Keep
		// the last ring; the node is shutting down.
		return
	}
	old := g.env.view.Load()
	now := time.Now()
	stopping := len(names) == 0
	g.viewMu.Lock()
	changed := old == nil || old.stopping != stopping || !sameAlive(old, alive) || !stopping && !sameTargets(old, names)
	v := old
	if changed {
		snap := old.snapOrNil()
		if len(names) > 0 {
			var err error
			snap, err = ring.New(g.env.cfg.Ring, names, g.version+1)
			if err != nil {
				g.viewMu.Unlock()
				// Only an impossible member list gets here; keep the old
				// ring rather than route nowhere.
				g.env.log.Error("ring rebuild failed", "err", err, "members", len(names))
				return
			}
			g.version++
		}
		v = &view{snap: snap, alive: alive, since: now, stopping: stopping}
		g.env.view.Store(v)
		close(g.viewCh)
		g.viewCh = make(chan struct{})
	}
	g.viewMu.Unlock()

	owned := v.snap.PartitionsOwned(g.env.name)
	if len(evs) == 0 && changed && old == nil {
		evs = []membership.Event{{Kind: "joined", Name: g.env.name}}
	}
	for _, e := range evs {
		if _, ok := ignored[e.Name]; ok && (e.Kind == "joined" || e.Kind == "updated") {
			// Gossip knows it, the ring does not: not a join.
			e.Kind = "ignored"
		}
		if _, ok := keep[e.Name]; ok && e.Kind == "left" {
			g.env.log.Info("gossip membership: member leaving, out of gossip, stays a member while its liveness holds", "event", e.Kind, "member", e.Name, "member_addr", e.Addr,
				"ring_version", v.snap.Version(), "members", v.snap.Len(), "partitions_owned", owned)
			continue
		}
		if _, ok := keep[e.Name]; ok && e.Kind == "failed" {
			g.env.log.Info("gossip membership: member declared dead stays on the ring while its liveness holds", "event", e.Kind, "member", e.Name, "member_addr", e.Addr,
				"ring_version", v.snap.Version(), "members", v.snap.Len(), "partitions_owned", owned)
			continue
		}
		g.env.log.Info("gossip membership", "event", e.Kind, "member", e.Name, "member_addr", e.Addr,
			"ring_version", v.snap.Version(), "members", v.snap.Len(), "partitions_owned", owned)
	}
	if dropped > 0 {
		g.env.log.Warn("gossip membership events dropped", "dropped", dropped)
	}
	g.env.ownerView(v, evs, starts, raftIDs, heirs, names)
	if !changed {
		return
	}
	g.env.metrics.Ring(v.snap.Version(), v.snap.Len())
	g.env.dropLinks(g.env.logAddrs(alive))
	return kept
}

// snapOrNil returns v's snapshot, or nil for a nil view.
func (v *view) snapOrNil() *ring.Snapshot {
	if v == nil {
		return nil
	}
	return v.snap
}

// sameTargets reports whether v's ring has exactly the members names.
func sameTargets(v *view, names []string) bool {
	if v.snap.Len() != len(names) {
		return false
	}
	for _, name := range names {
		if !v.snap.Has(name) {
			return false
		}
	}
	return true
}

// sameAlive reports whether v lists exactly the live members of alive, at
// the same addresses.
func sameAlive(v *view, alive map[string]string) bool {
	if len(v.alive) != len(alive) {
		return false
	}
	for name, addr := range alive {
		if v.alive[name] != addr {
			return false
		}
	}
	return true
}

// excludeSelf rebuilds the node's ring without itself (it is draining, so
// it is nobody's target) and waits, briefly, for the new view. When every
// member is leaving (this one the last), the rebuild keeps the ring and
// marks the view stopping: that view ends the wait too.
func (g *gossiper) excludeSelf(ctx context.Context) {
	ch := g.viewChanged()
	g.nudge()
	t := time.NewTimer(200 * time.Millisecond)
	defer t.Stop()
	for v := g.env.view.Load(); v.snap.Has(g.env.name) && !v.stopping; v = g.env.view.Load() {
		select {
		case <-ch:
			ch = g.viewChanged()
		case <-t.C:
			return // no other member: the ring keeps only us
		case <-ctx.Done():
			return
		}
	}
}

// Restarts. A member that crashes and restarts on the same address under the same
// name looks, to gossip, like the same member: memberlist may see nothing
// but an incarnation bump, and the ring (names and addresses) does not
// change. Our cached gRPC connection to it, though, has been failing since
// the crash and sits in gRPC's reconnect backoff (1 s, growing), so the
// first forwards after the restart would fail with "connection refused"
// although the member is serving. Each process therefore gossips a random
// start id (membership.Meta.Start); when a member's start id changes, or memberlist
// reports it joining (again), its client is dropped and the next forward
// dials afresh. The ring itself is left alone: the member set did not
// change, and handoff is decided by the ring, not by connections.

// noteRestarts compares the members' start ids with the last seen ones and
// drops the client of each member that restarted or (re)joined. Called by
// the rebuild goroutine with the pending events and the start ids of the
// members in the new view.
func (g *gossiper) noteRestarts(evs []membership.Event, starts map[string]uint64) {
	for name, s := range starts {
		if name == g.env.name {
			continue
		}
		if prev, ok := g.starts[name]; ok && prev != s {
			g.env.resetLink(name)
			g.env.log.Info("peer restarted", "peer", name)
		}
	}
	for _, e := range evs {
		if e.Kind == "joined" && e.Name != g.env.name {
			g.env.resetLink(e.Name)
		}
	}
	g.starts = starts
}

// checkMerge is the membership delegate's OnMerge: it refuses the member
// list of a join's state exchange, this node's or a joiner's, that names
// another member that may hold this node's name (membership.OtherClaimant),
// and records the claimant. self is this node's gossip address (nil until
// memberlist is up: no one has joined it yet). Called on memberlist's
// goroutines; waits at most probeTimeout per entry under this node's name
// in a state that needs a look.
func (g *gossiper) checkMerge(self *string, probeTimeout time.Duration, peers []*memberlist.Node) error {
	if self == nil {
		return nil
	}
	other := membership.OtherClaimant(g.env.name, *self, peers, probeTimeout)
	if other == nil {
		return nil
	}
	if g.conflict.claim(other.Address()) {
		g.env.log.Warn("another member uses this node's name", "member_addr", other.Address(), "state", membership.StateName(other.State))
	}
	return fmt.Errorf("%w: %q is claimed by the member at %s too", ErrDuplicateName, g.env.name, other.Address())
}

// noteConflict is the membership delegate's OnConflict: another member
// claims this node's name. Called on memberlist's goroutines; never
// blocks.
func (g *gossiper) noteConflict(existing, other *memberlist.Node) {
	if g.conflict.note(g.env.name, existing, other) {
		g.env.log.Warn("another member uses this node's name", "member_addr", other.Address())
	}
}

// noteReconnect updates the reconnect set (reconnect.go) from one
// membership event. Called from memberlist's callbacks; never blocks.
func (g *gossiper) noteReconnect(e membership.Event) {
	if e.Name == g.env.name {
		return
	}
	g.retry.note(e)
}

// reconnect makes one round: it joins one remembered failed member (at
// random), and the seeds if the node knows no other member. Runs on the
// node's reconnect goroutine every Config.ReconnectInterval; each join is
// bounded by memberlist's TCPTimeout.
func (g *gossiper) reconnect() {
	if g.env.closing.Load() {
		return
	}
	name, addr := g.retry.pick(time.Now(), g.env.cfg.ReconnectTimeout)
	if addr != "" {
		if _, err := g.ml.Join([]string{addr}); err != nil {
			g.env.log.Debug("reconnect to failed member failed", "peer", name, "member_addr", addr, "err", err)
		} else {
			g.env.log.Info("reconnected to failed member", "peer", name, "member_addr", addr)
		}
	}
	if len(g.env.cfg.Join) > 0 && g.ml.NumMembers() <= 1 && !g.env.closing.Load() {
		if _, err := g.ml.Join(g.env.cfg.Join); err != nil {
			g.env.log.Debug("rejoin through seeds failed", "seeds", g.env.cfg.Join, "err", err)
		} else {
			g.env.log.Info("rejoined through seeds", "seeds", g.env.cfg.Join)
		}
	}
}

// viewChanged returns a channel closed at the next publish.
func (g *gossiper) viewChanged() <-chan struct{} {
	g.viewMu.Lock()
	defer g.viewMu.Unlock()
	return g.viewCh
}

// adoptCluster returns the node's cluster id. A node that joined and has
// none yet adopts the id of the cluster it sees (they are the cluster it
// joined) and gossips it.
//
// Two clusters founded separately can meet (a second node started without
// Join, a DNS lookup that found nobody). They must not simply merge: each
// holds every partition, which would give every partition two holders. So
// the smaller cluster (fewer members seen; at equal size, the larger id)
// gives way: its nodes drop every partition and copy they hold — their
// keys restart empty on the other side, logged at Error and counted — and
// join the other cluster, which then moves partitions to them as to any
// joiner. Members of a cluster that has not given way yet are ignored.
// With log ownership no cluster gives way: each keeps its own log and
// ignores the other's members, and both sides are not ready.
// Called by the rebuild goroutine.
func (g *gossiper) adoptCluster(members map[string][]byte) uint64 {
	mine := g.clusterID.Load()
	count := map[uint64]int{}
	for name, raw := range members {
		md, err := membership.DecodeMeta(raw)
		if err != nil || md.Fingerprint != g.env.fp {
			continue
		}
		id := md.Cluster
		if name == g.env.name {
			id = mine
		}
		if id != 0 {
			count[id]++
		}
	}
	best := mine
	for id, c := range count {
		if best == 0 || c > count[best] || c == count[best] && id < best {
			best = id
		}
	}
	if best == 0 || best == mine {
		return mine
	}
	if mine != 0 {
		// A cluster is its log, and two logs never merge. The other
		// cluster's members stay ignored (logged, and this node is not
		// ready) until one side restarts with Join pointing at the other.
		return mine
	}
	g.clusterID.Store(best)
	mine = best
	g.delegate.SetMeta(g.env.meta(g.env.closing.Load()))
	// Best effort: the id also travels with the next gossip of our meta.
	_ = g.ml.UpdateNode(100 * time.Millisecond)
	return mine
}
