package peer

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

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

// meta is what a node gossips about itself.
type meta struct {
	fingerprint uint64
	rpcAddr     string
	// draining is set by a node that is leaving gracefully, just before it
	// hands off its keys, so peers can tell a leave from a failure.
	draining bool
	// start identifies the process (random, fixed for the Node's life), so
	// peers can tell a restart on the same address from the same process
	// (see rejoin.go). Zero from a version 2 member.
	start uint64
	// cluster identifies the cluster the member belongs to: chosen at
	// random by the node that founded it (started without Join), adopted
	// by every node that joins. Zero while a joiner has not adopted one
	// yet, and from older members. Two clusters founded separately never
	// merge: each ignores the other's members (see rebuild).
	cluster uint64
	// policies is the version of the member's policy table (policy.Table.Version);
	// zero from members older than version 5. It is reported, never
	// compared: each holder decides with its own table.
	policies uint64
}

// metaVersion 5 is: version, flags, fingerprint (placement only), start
// id, cluster id, policy table version, rpc address (8-byte big-endian
// numbers). Versions 4 (without the policy version), 3 (without the
// cluster id either) and 2 (without start and cluster ids) are still
// decoded, so a rolling upgrade can read older members; their fingerprint
// also covered the policy table, so they match only members of their own
// version.
const metaVersion = 5

func (m meta) encode() []byte {
	b := make([]byte, 0, 34+len(m.rpcAddr))
	b = append(b, metaVersion)
	var flags byte
	if m.draining {
		flags |= 1
	}
	b = append(b, flags)
	b = binary.BigEndian.AppendUint64(b, m.fingerprint)
	b = binary.BigEndian.AppendUint64(b, m.start)
	b = binary.BigEndian.AppendUint64(b, m.cluster)
	b = binary.BigEndian.AppendUint64(b, m.policies)
	return append(b, m.rpcAddr...)
}

func decodeMeta(b []byte) (meta, error) {
	addrAt := 34
	switch {
	case len(b) >= 34 && b[0] == metaVersion:
	case len(b) >= 26 && b[0] == 4:
		addrAt = 26
	case len(b) >= 18 && b[0] == 3:
		addrAt = 18
	case len(b) >= 10 && b[0] == 2:
		addrAt = 10
	default:
		return meta{}, errors.New("peer: unrecognised member metadata")
	}
	m := meta{draining: b[1]&1 != 0, fingerprint: binary.BigEndian.Uint64(b[2:10]), rpcAddr: string(b[addrAt:])}
	if addrAt >= 18 {
		m.start = binary.BigEndian.Uint64(b[10:18])
	}
	if addrAt >= 26 {
		m.cluster = binary.BigEndian.Uint64(b[18:26])
	}
	if addrAt >= 34 {
		m.policies = binary.BigEndian.Uint64(b[26:34])
	}
	if _, _, err := net.SplitHostPort(m.rpcAddr); err != nil {
		return meta{}, fmt.Errorf("peer: member metadata rpc address: %w", err)
	}
	return m, nil
}

// event is one membership notification from memberlist.
type event struct {
	kind string // joined, left, updated
	name string
	addr string
}

// eventQueue collects memberlist notifications without blocking memberlist,
// and keeps the member list the rebuild reads: each member's metadata is
// copied inside the callback, because memberlist rewrites its own Node
// values after the callback returns. Log detail is bounded: past maxEvents
// the oldest event is dropped (the member list itself is always complete).
type eventQueue struct {
	mu      sync.Mutex
	evs     []event
	dropped int
	members map[string][]byte          // member name -> copy of its metadata
	addrs   map[string]memberlist.Node // member name -> copy of its gossip address
	leaving map[string]bool            // members that said they are leaving
	// failed keeps the metadata of members memberlist declared dead
	// (not those that left) until they come back or the rebuild lets
	// them go (forgetFailed).
	failed map[string][]byte
}

// forgetFailed drops name's metadata kept since gossip declared it dead.
func (q *eventQueue) forgetFailed(name string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.failed, name)
}

// gossipAddrs returns copies of the members' gossip addresses. memberlist's
// own Node values are rewritten by its goroutines, so they are copied inside
// the callbacks and never read later.
func (q *eventQueue) gossipAddrs() []memberlist.Node {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]memberlist.Node, 0, len(q.addrs))
	for _, a := range q.addrs {
		out = append(out, a)
	}
	return out
}

// markLeaving notes a member's own "leaving" message.
func (q *eventQueue) markLeaving(name string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.leaving == nil {
		q.leaving = make(map[string]bool)
	}
	if len(q.leaving) < maxEvents {
		q.leaving[name] = true
	}
}

const maxEvents = 1024

// apply records one memberlist notification and returns the event to log.
func (q *eventQueue) apply(kind string, m *memberlist.Node) event {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.members == nil {
		q.members = make(map[string][]byte)
		q.addrs = make(map[string]memberlist.Node)
	}
	e := event{kind: kind, name: m.Name, addr: m.Address()}
	switch kind {
	case "left":
		// A member that announced its leave left; any other disappearance
		// is a failure (memberlist declared it dead).
		md, err := decodeMeta(q.members[m.Name])
		if !q.leaving[m.Name] && (err != nil || !md.draining) {
			e.kind = "failed"
			if q.failed == nil {
				q.failed = make(map[string][]byte)
			}
			if raw, ok := q.members[m.Name]; ok && len(q.failed) < maxEvents {
				q.failed[m.Name] = raw
			}
		}
		delete(q.members, m.Name)
		delete(q.addrs, m.Name)
		delete(q.leaving, m.Name)
	default:
		delete(q.failed, m.Name)
		q.members[m.Name] = append([]byte(nil), m.Meta...)
		q.addrs[m.Name] = memberlist.Node{Name: m.Name, Addr: append(net.IP(nil), m.Addr...), Port: m.Port}
	}
	if len(q.evs) >= maxEvents {
		q.evs = q.evs[1:]
		q.dropped++
	}
	q.evs = append(q.evs, e)
	return e
}

// take returns the pending events, a copy of the member list, and a copy
// of the metadata of members declared dead since (failed).
func (q *eventQueue) take() ([]event, int, map[string][]byte, map[string][]byte) {
	q.mu.Lock()
	defer q.mu.Unlock()
	evs, d := q.evs, q.dropped
	q.evs, q.dropped = nil, 0
	members := make(map[string][]byte, len(q.members))
	for k, v := range q.members {
		members[k] = v
	}
	var failed map[string][]byte
	if len(q.failed) > 0 {
		failed = make(map[string][]byte, len(q.failed))
		for k, v := range q.failed {
			failed[k] = v
		}
	}
	return evs, d, members, failed
}

// delegate receives memberlist callbacks. They never block: they note the
// change and nudge the rebuild goroutine.
type delegate struct {
	n    *Node
	mu   sync.Mutex
	meta []byte
}

func (d *delegate) NodeMeta(limit int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.meta) > limit {
		return nil
	}
	return d.meta
}

func (d *delegate) setMeta(m meta) {
	d.mu.Lock()
	d.meta = m.encode()
	d.mu.Unlock()
}

// NotifyMsg receives a member's "leaving" notice (see Node.announceLeave).
func (d *delegate) NotifyMsg(b []byte) {
	if len(b) > 1 && b[0] == msgLeaving {
		d.n.events.markLeaving(string(b[1:]))
	}
}

// msgLeaving tags the message a node sends each member before it leaves.
const msgLeaving = 'L'

// announceLeave tells every member, over memberlist's reliable (TCP)
// channel and before the gossip leave, that this node leaves on purpose, so
// their logs say "left" rather than "failed". Bounded by memberlist's
// TCPTimeout per member; members are told concurrently; failures only cost
// the log line.
func (n *Node) announceLeave() {
	msg := append([]byte{msgLeaving}, n.name...)
	var wg sync.WaitGroup
	for _, m := range n.events.gossipAddrs() {
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
func (d *delegate) GetBroadcasts(int, int) [][]byte { return nil }
func (d *delegate) LocalState(bool) []byte          { return nil }
func (d *delegate) MergeRemoteState([]byte, bool)   {}

func (d *delegate) NotifyJoin(m *memberlist.Node)   { d.note("joined", m) }
func (d *delegate) NotifyLeave(m *memberlist.Node)  { d.note("left", m) }
func (d *delegate) NotifyUpdate(m *memberlist.Node) { d.note("updated", m) }

func (d *delegate) note(kind string, m *memberlist.Node) {
	d.n.noteReconnect(d.n.events.apply(kind, m))
	d.n.nudge()
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
	d := &delegate{n: n, meta: n.meta(false).encode()}
	n.delegate = d
	mc.Delegate = d
	mc.Events = d
	mc.Conflict = d
	n.gossipLog = newMemberlistLog(n.log)
	mc.Logger = log.New(n.gossipLog, "", 0)
	mc.LogOutput = nil
	if len(n.cfg.GossipKey) > 0 {
		mc.SecretKey = n.cfg.GossipKey
	}
	n.cfg.GossipProfile.Apply(mc)
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
	err = n.join(ctx, ml)
	if err == nil {
		err = n.duplicateName()
	}
	if err != nil {
		// Shutdown, not Leave: after a name conflict a leave would
		// announce the established member's departure.
		_ = ml.Shutdown()
		n.gossipLog.close()
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
		n.updateReady()
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
		md, err := decodeMeta(raw)
		if err != nil || md.start == 0 {
			n.events.forgetFailed(name)
			continue
		}
		id := incarnationID(name, md.start)
		ids = append(ids, id)
		byID[id] = name
	}
	var fresh map[string]bool
	if len(ids) > 0 {
		ctx, cancel := context.WithTimeout(n.ctx, time.Second)
		fresh = n.lo.run.Fresh(ctx, ids)
		cancel()
	}
	var keep map[string][]byte
	for _, id := range ids {
		name := byID[id]
		if !fresh[id] {
			n.events.forgetFailed(name)
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
	evs, dropped, members, failed := n.events.take()
	keep := n.keepFailed(failed, members)
	for name, raw := range keep {
		members[name] = raw
		kept = true
	}
	for _, e := range evs {
		if _, ok := keep[e.name]; ok && e.kind == "failed" {
			n.kept[e.name] = e.addr
		}
	}
	for name, addr := range n.kept {
		if _, ok := keep[name]; ok {
			continue
		}
		delete(n.kept, name)
		if _, back := members[name]; !back {
			// Its liveness lapsed: the failure gossip saw now counts.
			evs = append(evs, event{kind: "failed", name: name, addr: addr})
		}
	}
	names := make([]string, 0, len(members))
	alive := make(map[string]string)
	draining := n.closing.Load()
	mine := n.adoptCluster(members)
	starts := make(map[string]uint64, len(members))
	pvs := make(map[string]uint64, len(members))
	for name, raw := range members {
		md, err := decodeMeta(raw)
		switch {
		case err != nil:
			if n.ignore(name, "unreadable metadata") {
				n.log.Warn("member ignored", "peer", name, "err", err)
			}
			continue
		case md.fingerprint != n.fp:
			if n.ignore(name, "placement fingerprint differs") {
				n.log.Warn("member ignored: placement fingerprint differs", "peer", name,
					"fingerprint", fmt.Sprintf("%016x", md.fingerprint), "want", fmt.Sprintf("%016x", n.fp))
			}
			continue
		case md.cluster != 0 && mine != 0 && md.cluster != mine:
			if n.ignore(name, "member of another cluster (started separately; restart one side with Join pointing at the other)") {
				n.log.Warn("member ignored: it belongs to another cluster, founded separately", "peer", name,
					"cluster", fmt.Sprintf("%016x", md.cluster), "want", fmt.Sprintf("%016x", mine))
			}
			continue
		}
		alive[name] = md.rpcAddr
		starts[name] = md.start
		pvs[name] = md.policies
		if md.draining || name == n.name && draining {
			continue // never a target
		}
		names = append(names, name)
	}
	n.notePolicyVersions(pvs)
	n.noteRestarts(evs, starts)
	n.noteIncarnations(starts)
	ignored := n.commitIgnored()
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
		evs = []event{{kind: "joined", name: n.name}}
	}
	for _, e := range evs {
		if _, ok := ignored[e.name]; ok && (e.kind == "joined" || e.kind == "updated") {
			// Gossip knows it, the ring does not: not a join.
			e.kind = "ignored"
		}
		if _, ok := keep[e.name]; ok && e.kind == "failed" {
			n.log.Info("gossip membership: member declared dead stays on the ring while its liveness holds", "event", e.kind, "member", e.name, "member_addr", e.addr,
				"ring_version", v.snap.Version(), "members", v.snap.Len(), "partitions_owned", owned)
			continue
		}
		n.log.Info("gossip membership", "event", e.kind, "member", e.name, "member_addr", e.addr,
			"ring_version", v.snap.Version(), "members", v.snap.Len(), "partitions_owned", owned)
	}
	if dropped > 0 {
		n.log.Warn("gossip membership events dropped", "dropped", dropped)
	}
	n.lo.setView(v, evs, starts, names)
	if !changed {
		return
	}
	n.metrics.Ring(v.snap.Version(), v.snap.Len())
	n.dropClients(alive)
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

// memberlistLog bridges memberlist's standard logger into slog: each line's
// bracketed level becomes the slog level, with component=memberlist.
// memberlist's "[ERR]" (a failed probe, push/pull or send) is degraded
// service, so it becomes Warn: Error is kept for lost state. A send on a
// connection closed by our own shutdown is Debug.
//
// A starved or cut-off node repeats the same warning every probe (a failed
// ping, a refuted suspicion) and would bury everything else; so each kind
// of warning (its text up to the first ':' or '(') is logged at most once
// per memberlistWarnEvery, the next one saying how many were held back
// (repeated=N), and the ones in between go to Debug.
type memberlistLog struct {
	log  *slog.Logger
	now  func() time.Time
	mu   sync.Mutex
	off  bool
	seen map[string]*warnKind
}

// memberlistWarnEvery is how often one kind of memberlist warning is
// logged at Warn.
const memberlistWarnEvery = 10 * time.Second

// warnKind is when a kind of warning was last logged at Warn and how many
// were held back since.
type warnKind struct {
	at   time.Time
	held int
}

func newMemberlistLog(l *slog.Logger) *memberlistLog {
	return &memberlistLog{log: l.With("component", "memberlist"), now: time.Now, seen: map[string]*warnKind{}}
}

func (w *memberlistLog) Write(p []byte) (int, error) {
	line := bytes.TrimSpace(p)
	level := slog.LevelInfo
	for _, l := range []struct {
		tag   string
		level slog.Level
	}{{"[DEBUG]", slog.LevelDebug}, {"[INFO]", slog.LevelInfo}, {"[WARN]", slog.LevelWarn}, {"[ERR]", slog.LevelWarn}, {"[ERROR]", slog.LevelWarn}} {
		if bytes.HasPrefix(line, []byte(l.tag)) {
			level = l.level
			line = bytes.TrimSpace(line[len(l.tag):])
			break
		}
	}
	line = bytes.TrimPrefix(line, []byte("memberlist: "))
	if bytes.Contains(line, []byte("use of closed network connection")) {
		// memberlist's own goroutines racing its shutdown: not news.
		level = slog.LevelDebug
	}
	w.mu.Lock()
	if w.off {
		w.mu.Unlock()
		return len(p), nil
	}
	held := 0
	if level == slog.LevelWarn {
		kind := string(line)
		if i := strings.IndexAny(kind, ":("); i > 0 {
			kind = kind[:i]
		}
		now := w.now()
		switch k := w.seen[kind]; {
		case k == nil:
			if len(w.seen) >= 64 {
				clear(w.seen) // kinds are few; a flood of new ones starts afresh
			}
			w.seen[kind] = &warnKind{at: now}
		case now.Sub(k.at) < memberlistWarnEvery:
			k.held++
			level = slog.LevelDebug
		default:
			held, k.at, k.held = k.held, now, 0
		}
	}
	w.mu.Unlock()
	if held > 0 {
		w.log.Log(context.Background(), level, string(line), "repeated", held)
	} else {
		w.log.Log(context.Background(), level, string(line))
	}
	return len(p), nil
}

// close silences the bridge: memberlist may still log from its last
// goroutines after Shutdown returns.
func (w *memberlistLog) close() {
	w.mu.Lock()
	w.off = true
	w.mu.Unlock()
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
		md, err := decodeMeta(raw)
		if err != nil || md.fingerprint != n.fp {
			continue
		}
		id := md.cluster
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
	n.delegate.setMeta(n.meta(n.closing.Load()))
	// Best effort: the id also travels with the next gossip of our meta.
	_ = n.ml.UpdateNode(100 * time.Millisecond)
	return mine
}
