package peer

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/peer/internal/membership"
	"github.com/ringlimit/ringlimit/ring"
)

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
func (n *Node) announceLeave() {
	msg := membership.LeavingMsg(n.name)
	var wg sync.WaitGroup
	for _, m := range n.events.GossipAddrs() {
		if m.Name == n.name {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = n.ml.SendReliable(&m, msg)
		}()
	}
	wg.Wait()
}

func (n *Node) nudge() {
	select {
	case n.rebuildCh <- struct{}{}:
	default:
	}
}

func (n *Node) startGossip(ctx context.Context) error {
	host, portStr, _ := net.SplitHostPort(n.cfg.GossipAddr)
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return fmt.Errorf("%w: gossip port %q: %v", ErrInvalidConfig, portStr, err)
	}
	mc := memberlist.DefaultLANConfig()
	mc.Name = n.name
	mc.BindAddr = host
	mc.BindPort = port
	mc.AdvertisePort = port
	if n.cfg.GossipAdvertiseAddr != "" {
		ah, ap, _ := net.SplitHostPort(n.cfg.GossipAdvertiseAddr)
		mc.AdvertiseAddr = ah
		mc.AdvertisePort, _ = strconv.Atoi(ap)
	}
	d := &membership.Delegate{Queue: &n.events, OnEvent: func(e membership.Event) { n.noteReconnect(e); n.nudge() }, OnConflict: n.noteConflict}
	d.SetMeta(n.meta(false))
	n.delegate = d
	mc.Delegate = d
	mc.Events = d
	mc.Conflict = d
	n.gossipLog = membership.NewLog(n.log)
	mc.Logger = log.New(n.gossipLog, "", 0)
	mc.LogOutput = nil
	if len(n.cfg.GossipKey) > 0 {
		mc.SecretKey = n.cfg.GossipKey
	}
	n.cfg.GossipProfile.ApplySized(mc, n.cfg.ExpectedMembers)
	if n.cfg.Gossip != nil {
		n.cfg.Gossip(mc)
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		return fmt.Errorf("peer: start gossip on %s: %w", n.cfg.GossipAddr, err)
	}
	n.ml = ml
	if len(n.cfg.Join) == 0 {
		return nil
	}
	err = membership.Join(ctx, ml, n.cfg.Join, n.cfg.JoinTimeout, n.log)
	if errors.Is(err, membership.ErrKeyMismatch) {
		// This node's GossipKey is not the cluster's: a config error.
		err = fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if err == nil {
		err = n.duplicateName()
	}
	if err != nil {
		// Shutdown, not Leave: after a name conflict a leave would
		// announce the established member's departure.
		_ = ml.Shutdown()
		n.gossipLog.Close()
		return err
	}
	return nil
}

// rebuildLoop rebuilds the ring whenever memberlist reports a change,
// and while it keeps members gossip declared dead (rebuild), again every
// quarter lease until it lets them go.
func (n *Node) rebuildLoop() {
	defer n.wg.Done()
	recheck := time.NewTimer(time.Hour)
	recheck.Stop()
	defer recheck.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-n.rebuildCh:
		case <-recheck.C:
		}
		if n.rebuild() {
			recheck.Reset(n.cfg.LeaseDuration / 4)
		}
		n.ops.ready.update()
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
func (n *Node) keepFailed(failed, members map[string][]byte) map[string][]byte {
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
			n.events.ForgetFailed(name)
			continue
		}
		id := incarnationID(name, md.Start)
		ids = append(ids, id)
		byID[id] = name
	}
	var fresh map[string]bool
	if len(ids) > 0 {
		ctx, cancel := context.WithTimeout(n.ctx, time.Second)
		fresh = n.lo.run.Fresh(ctx, ids)
		cancel()
		if n.hooks.freshLate.Load() {
			fresh = nil
		}
	}
	var keep map[string][]byte
	for _, id := range ids {
		name := byID[id]
		if fresh == nil && !n.hooks.freshLost.Load() {
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
		if !fresh[id] || n.hooks.freshLost.Load() {
			n.events.ForgetFailed(name)
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
func (n *Node) rebuild() (kept bool) {
	evs, dropped, members, failed := n.events.Take()
	keep := n.keepFailed(failed, members)
	for name, raw := range keep {
		members[name] = raw
		kept = true
	}
	for _, e := range evs {
		if _, ok := keep[e.Name]; ok && (e.Kind == "failed" || e.Kind == "left") {
			n.kept[e.Name] = e
		}
	}
	for name, e := range n.kept {
		if _, ok := keep[name]; ok {
			continue
		}
		delete(n.kept, name)
		if _, back := members[name]; !back {
			// Its liveness lapsed (or ended): the failure, or the leave,
			// gossip saw now counts.
			evs = append(evs, e)
		}
	}
	names := make([]string, 0, len(members))
	alive := make(map[string]string)
	draining := n.closing.Load()
	mine := n.adoptCluster(members)
	starts := make(map[string]uint64, len(members))
	raftIDs, heirs := make(map[string]uint64, len(members)), map[string]uint64{}
	pvs := make(map[string]uint64, len(members))
	for name, raw := range members {
		md, err := membership.DecodeMeta(raw)
		switch {
		case err != nil:
			if n.ops.ready.ignore(name, "unreadable metadata") {
				n.log.Warn("member ignored", "peer", name, "err", err)
			}
			continue
		case md.Fingerprint != n.fp:
			if n.ops.ready.ignore(name, "placement fingerprint differs") {
				n.log.Warn("member ignored: placement fingerprint differs", "peer", name,
					"fingerprint", fmt.Sprintf("%016x", md.Fingerprint), "want", fmt.Sprintf("%016x", n.fp))
			}
			continue
		case md.Cluster != 0 && mine != 0 && md.Cluster != mine:
			if n.ops.ready.ignore(name, "member of another cluster (started separately; restart one side with Join pointing at the other)") {
				n.log.Warn("member ignored: it belongs to another cluster, founded separately", "peer", name,
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
		if md.Draining || name == n.name && draining {
			continue // never a target
		}
		names = append(names, name)
	}
	n.table.noteMembers(pvs)
	n.noteRestarts(evs, starts)
	n.reach.noteStarts(starts, n.name)
	ignored := n.ops.ready.commitIgnored()
	if len(alive) == 0 {
		// Only after our own leave: memberlist no longer lists us. Keep
		// the last ring; the node is shutting down.
		return
	}
	old := n.view.Load()
	now := time.Now()
	stopping := len(names) == 0
	n.viewMu.Lock()
	changed := old == nil || old.stopping != stopping || !sameAlive(old, alive) || !stopping && !sameTargets(old, names)
	v := old
	if changed {
		snap := old.snapOrNil()
		if len(names) > 0 {
			var err error
			snap, err = ring.New(n.cfg.Ring, names, n.version+1)
			if err != nil {
				n.viewMu.Unlock()
				// Only an impossible member list gets here; keep the old
				// ring rather than route nowhere.
				n.log.Error("ring rebuild failed", "err", err, "members", len(names))
				return
			}
			n.version++
		}
		v = &view{snap: snap, alive: alive, since: now, stopping: stopping}
		n.view.Store(v)
		close(n.viewCh)
		n.viewCh = make(chan struct{})
	}
	n.viewMu.Unlock()

	owned := v.snap.PartitionsOwned(n.name)
	if len(evs) == 0 && changed && old == nil {
		evs = []membership.Event{{Kind: "joined", Name: n.name}}
	}
	for _, e := range evs {
		if _, ok := ignored[e.Name]; ok && (e.Kind == "joined" || e.Kind == "updated") {
			// Gossip knows it, the ring does not: not a join.
			e.Kind = "ignored"
		}
		if _, ok := keep[e.Name]; ok && e.Kind == "left" {
			n.log.Info("gossip membership: member leaving, out of gossip, stays a member while its liveness holds", "event", e.Kind, "member", e.Name, "member_addr", e.Addr,
				"ring_version", v.snap.Version(), "members", v.snap.Len(), "partitions_owned", owned)
			continue
		}
		if _, ok := keep[e.Name]; ok && e.Kind == "failed" {
			n.log.Info("gossip membership: member declared dead stays on the ring while its liveness holds", "event", e.Kind, "member", e.Name, "member_addr", e.Addr,
				"ring_version", v.snap.Version(), "members", v.snap.Len(), "partitions_owned", owned)
			continue
		}
		n.log.Info("gossip membership", "event", e.Kind, "member", e.Name, "member_addr", e.Addr,
			"ring_version", v.snap.Version(), "members", v.snap.Len(), "partitions_owned", owned)
	}
	if dropped > 0 {
		n.log.Warn("gossip membership events dropped", "dropped", dropped)
	}
	n.lo.setView(v, evs, starts, raftIDs, heirs, names)
	if !changed {
		return
	}
	n.metrics.Ring(v.snap.Version(), v.snap.Len())
	n.links.drop(n.lo.withLogAddrs(alive))
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

// viewChanged returns a channel closed at the next publish.
func (n *Node) viewChanged() <-chan struct{} {
	n.viewMu.Lock()
	defer n.viewMu.Unlock()
	return n.viewCh
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
func (n *Node) adoptCluster(members map[string][]byte) uint64 {
	mine := n.clusterID.Load()
	count := map[uint64]int{}
	for name, raw := range members {
		md, err := membership.DecodeMeta(raw)
		if err != nil || md.Fingerprint != n.fp {
			continue
		}
		id := md.Cluster
		if name == n.name {
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
	n.clusterID.Store(best)
	mine = best
	n.delegate.SetMeta(n.meta(n.closing.Load()))
	// Best effort: the id also travels with the next gossip of our meta.
	_ = n.ml.UpdateNode(100 * time.Millisecond)
	return mine
}
