package peer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/peer/internal/membership"
	"github.com/ringlimit/ringlimit/peer/internal/ownership"
	"github.com/ringlimit/ringlimit/peer/internal/ownlog"
	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// This file drives ownership in OwnershipLog mode. The rules are the
// ownership package's (its doc states them once); ownlog runs them over
// etcd's raft. What is here only connects them to the node:
//
//   - the member ID of this process is its incarnation, name@start (the
//     random start id gossip carries), and its raft ID is the start id:
//     a restarted process is a new member and a new raft server; with a
//     data directory (datadir.go) the raft ID is the directory's and
//     gossip carries it (Meta.RaftID), so a member restarted with its
//     directory resumes its log as the same raft server under a new
//     incarnation, heir (Meta.Heir, View.Heirs) of the one before;
//   - every gossip view becomes the machine's View (ring targets, members,
//     incarnations gone for good) and autopilot's roster;
//   - raft messages travel on the node's gRPC port (ownlog.Register),
//     under the same peer authentication as every peer RPC;
//   - the runner's published state is mirrored into each partition's role,
//     holder, epoch and backup under the partition's lock, so routing,
//     replication and the decision path read what they always read; the
//     decision path asks the runner's MayDecide, from memory;
//   - a copy is the replication stream's SYNC_BEGIN, chunks and SYNC_END,
//     its SYNC_BEGIN carrying the machine's copy sequence in HolderEpoch;
//     the receiver asks the machine (OfferCopy) before installing it;
//   - replicated admissions are applied only where the runner's snapshot
//     names this member backup of that holder at that epoch.
//
// A partition has one local store here, as holder or as backup: pt.Store.

// logTick is the raft tick. The heartbeat and the election timeout come
// from LeaseDuration (ownlog.Timing, as the simulator derives them): at
// 2 s a heartbeat every 200 ms, an election after 0.5 s without a leader,
// randomized up to twice that (a shorter lease keeps 100 ms and 0.5 s,
// the floors). The election must end well within a
// holder's lease (9/10 of LeaseDuration from its last keep-alive, sent
// every half of it): a new leader makes every member extend at once.
// What a commit, a new leader or a gossip view makes possible (a grant, a
// copy, a handoff) does not wait for a tick: the runner acts on it once
// it has caught up.
const logTick = 50 * time.Millisecond

// twoMemberGrace is how long a cluster that grew to two members stays two
// before the node warns: a three-member cluster starting up is two for a
// moment (its third member joining) and is not warned about.
func (lo *logOwner) twoMemberGrace() time.Duration { return 10 * lo.env.lease }

// logFailedGone is how long a member that gossip reports failed (not
// left) stays in autopilot's roster as a live member, so that a member
// cut off for a while is still a voter when it comes back; after it,
// autopilot replaces it as a voter.
func (lo *logOwner) logFailedGone() time.Duration { return lo.env.failedGone }

// ownerEnv is everything the ownership driver (logOwner: the log, its
// view of the members, copies sent, takeovers, the leave) takes from its
// node, set once when the node opens its log and never changed. The
// driver reaches nothing else of the node: what it reads is here, what it
// changes is the partitions' published state (under each partition's
// lock) and what the funcs below do, and its goroutines join the node's
// group and end with the node's context.
type ownerEnv struct {
	ctx     context.Context // the node's lifetime: cancelled by Close
	wg      *sync.WaitGroup // the node's goroutines; the driver's join it
	name    string          // this node's member name
	start   uint64          // this process's start id (its incarnation)
	raftID  uint64          // this member's raft ID (datadir.go)
	log     *slog.Logger
	metrics Metrics
	clock   func() time.Time // the node's clock: a copy's ages
	mono    func() int64     // the node's monotonic clock: leases

	parts          []part        // every ring partition, as the node publishes it
	lease          time.Duration // Config.LeaseDuration
	failedGone     time.Duration // Config.FailedMemberTimeout
	forwardTimeout time.Duration // Config.ForwardTimeout
	chunkBytes     int           // Config.TransferChunkBytes
	founder        bool          // started without Join: founds the log
	emptyAfter     time.Duration // the log's first EmptyAfter (policies.go)
	disk           *ownlog.Disk  // the log on disk; nil without a data directory

	view  *atomic.Pointer[view] // the node's current view (ring, members)
	table *policyTable          // the node's policy table: what a copy carries
	// copyUnsent (tests) fails the copies it returns true for.
	copyUnsent *atomic.Pointer[func(pid int, to string) bool]

	// newStore is an empty store for one partition's keys.
	newStore func() *shard.Store
	// restore refills st with partition pid's state at epoch from the
	// data directory and reports whether it did; transition tells the
	// data directory of a change of this member's part in pid. Both nil
	// without a data directory.
	restore    func(pid int, epoch uint64, st *shard.Store) bool
	transition func(pid int, had, holds, backs bool, epoch uint64, st *shard.Store)
	// linkConn is the connection and Limiter stub of the per-peer link
	// to member name (dialled at addr when addr is set, else at the
	// address its view lists).
	linkConn func(name, addr string) (*grpc.ClientConn, peerpb.LimiterClient, error)
	// barrier waits until the replication queued to member to is
	// answered, within ctx (replicate.go).
	barrier func(ctx context.Context, to string) error
	// policyStamp sets a replication message's policy version and the
	// windows of the policies its operations carry (replicate.go).
	policyStamp func(req *peerpb.ReplicateRequest, member string)
	// warn logs a degraded-service warning, throttled node-wide.
	warn func(msg string, args ...any)
	// ready recomputes the node's readiness (ready.go).
	ready func()
	// leaveRing takes this node out of its own ring and waits, briefly,
	// for the view without it (membership.go).
	leaveRing func(ctx context.Context)
}

// logOwner is the node's side of log ownership: it drives the log's
// member, mirrors what it publishes into the node's partitions, sends
// the copies it asks for and leaves the log on Close (logleave.go). It
// takes what it needs of the node through env (ownerEnv, built in
// assemble.go).
type logOwner struct {
	env    *ownerEnv
	self   string // this incarnation's member ID
	member *ownlog.Member
	run    *ownlog.Runner
	tr     *ownlog.GRPCTransport
	recv   raftReceived // raft messages and bytes received (RaftTraffic)
	peers  atomic.Pointer[logPeers]
	// restarts is, per partition, the table's Restarts last logged (the
	// runner's goroutine only).
	restarts []uint64
	// last is each partition as last published (the runner's goroutine
	// only).
	last  []ownlog.PartState
	ready chan struct{} // nudged by Publish: readiness may have changed
	// raftDrop, when set (tests only), drops every raft message it
	// returns true for before it is sent: a cut of the log's traffic.
	raftDrop atomic.Pointer[func(to uint64) bool]
	stop     context.CancelFunc
	done     chan struct{}
	// tookOver is the partitions taken over, for their summary lines
	// (takeovers.go).
	tookOver takeovers

	mu sync.Mutex // guards what follows (rebuild's bookkeeping)
	// known is every incarnation gossip has shown, with its raft ID and
	// when it was last live (node monotonic ns), for autopilot's roster;
	// gone marks the ones that left or were replaced by a later start.
	known map[string]*logKnown
	cur   map[string]string // member name → its current incarnation
}

type logKnown struct {
	raft     uint64
	addr     string // its RPC address, as gossip last listed it
	lastLive int64
	gone     bool
	leaving  bool
	// forgotten: the transport's stream to it was closed once it was gone.
	forgotten bool
}

// logPeers is what the transport and the replication path look up
// without locks: raft ID → member name, member name → incarnation, and
// member name → RPC address for the log's transport.
//
// The log keeps its own addresses: a member gossip declared failed (or
// never heard from again, its view cut) is still dialed for raft while
// it is not gone for good. The log's liveness, not gossip, says who is
// live; a member whose view lost the others must not thereby lose the log
// too (it could no longer extend, and would be ended with every backup
// it keeps).
type logPeers struct {
	raft map[uint64]string
	inc  map[string]string
	addr map[string]string
}

// maxKnown bounds the incarnations remembered for the roster.
const maxKnown = 4096

// newLogOwner makes the node's log member; a node started without Join
// founds the log as its only voter. Its goroutine starts with start.
func newLogOwner(e *ownerEnv) (*logOwner, error) {
	parts := len(e.parts)
	lo := &logOwner{env: e, self: incarnationID(e.name, e.start), ready: make(chan struct{}, 1), done: make(chan struct{}),
		known: map[string]*logKnown{}, cur: map[string]string{}, restarts: make([]uint64, parts),
		last: make([]ownlog.PartState, parts)}
	lo.peers.Store(&logPeers{raft: map[uint64]string{}, inc: map[string]string{e.name: lo.self}, addr: map[string]string{}})
	beat, election := ownlog.Timing(e.lease, logTick)
	cfg := ownlog.Config{RaftID: e.raftID, Partitions: parts, HeartbeatTicks: beat, ElectionTicks: election,
		Ownership: ownership.Config{ID: lo.self, Liveness: e.lease, EmptyAfter: e.emptyAfter}}
	if e.disk != nil {
		cfg.Disk = e.disk // a log on disk is resumed; Bootstrap is then ignored
	}
	if e.founder {
		cfg.Bootstrap = &pb.ConfState{Voters: []uint64{e.raftID}}
	}
	m, err := ownlog.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	lo.member = m
	lo.tr = ownlog.NewGRPCTransport(lo.dial)
	lo.run = ownlog.NewRunner(m, logTransport{lo}, lo, logTick, e.mono, func(p int) *sync.RWMutex { return &e.parts[p].Mu })
	lo.run.SetFrom(lo.fromMember)
	if s, ok := e.metrics.(RaftTrafficSource); ok {
		s.RaftTrafficFrom(lo.traffic)
	}
	return lo, nil
}

// fromMember reports whether a raft message from raftID may be stepped:
// its sender is an incarnation gossip has shown and that is not gone (a
// member, live or failed but still waited for; logPeers.raft). Others are
// dropped before raft sees them: raft adopts any message's term before it
// asks whether the sender is in its configuration, so a forged message
// from an unknown ID with a huge term deposed the leader (issue 53 item
// 5). A member that has just joined may see its first messages dropped
// until its view lists the sender; raft sends them again.
func (lo *logOwner) fromMember(raftID uint64) bool {
	if _, ok := lo.peers.Load().raft[raftID]; ok {
		return true
	}
	lo.env.warn("raft message from a non-member dropped", "raft_id", raftID)
	return false
}

// traffic reads the log's counters (lock-free).
func (lo *logOwner) traffic() RaftTraffic {
	t := lo.run.Traffic()
	return RaftTraffic{MessagesSent: t.MsgsSent, BytesSent: t.BytesSent, MessagesDropped: t.MsgsDropped, MessagesShed: t.MsgsShed,
		MessagesReceived: lo.recv.msgs.Load(), BytesReceived: lo.recv.bytes.Load(),
		Proposals: t.Proposals, ConfChanges: t.ConfChanges, Applied: t.Applied}
}

// logTransport is the transport the runner sends through: the gRPC one,
// behind the tests' cut.
type logTransport struct{ lo *logOwner }

func (t logTransport) Send(to uint64, msg []byte) {
	if h := t.lo.raftDrop.Load(); h != nil && (*h)(to) {
		return
	}
	t.lo.tr.Send(to, msg)
}

// Traffic is the gRPC transport's counts (ownlog.TrafficCounter).
func (t logTransport) Traffic() ownlog.Traffic { return t.lo.tr.Traffic() }

// register adds the log's service to the node's gRPC server.
func (lo *logOwner) register(s grpc.ServiceRegistrar) {
	ownlog.Register(s, lo.recv.counting(lo.run.Receive), lo.env.ctx.Done())
}

// start runs the member and the readiness refresher on goroutines the node
// owns; stop ends them.
func (lo *logOwner) start() {
	e := lo.env
	ctx, cancel := context.WithCancel(e.ctx)
	lo.stop = cancel
	e.wg.Add(2)
	go func() {
		defer e.wg.Done()
		defer close(lo.done)
		lo.run.Run(ctx)
	}()
	go func() {
		defer e.wg.Done()
		// Readiness also changes with time alone (a log without a leader
		// for too long): look again every lease.
		t := time.NewTicker(e.lease)
		defer t.Stop()
		warned := false
		var twoSince time.Time
		twoWarned := false
		for {
			select {
			case <-ctx.Done():
				lo.logTakeovers(true) // the summaries not yet due
				return
			case <-lo.ready:
			case <-t.C:
			}
			if e.view.Load() == nil {
				// New starts the log before its first rebuild publishes
				// a view; that rebuild computes readiness itself. (A
				// 32-member start under load got here first: nil view.)
				continue
			}
			e.ready()
			lo.logTakeovers(false)
			// A log of two members has one voter: say so once a cluster
			// has stayed at two members (a three-member cluster starting
			// up is two for a moment).
			switch v := e.view.Load(); {
			case len(v.alive) != 2:
				twoSince, twoWarned = time.Time{}, false
			case twoSince.IsZero():
				twoSince = time.Now()
			case !twoWarned && time.Since(twoSince) >= lo.twoMemberGrace():
				twoWarned = true
				e.log.Warn("cluster of two members: the ownership log has one voter, so losing that member stops every decision (losing the other, its partitions are taken over); run three or more",
					"two_since", twoSince.UTC().Format(time.RFC3339))
			}
			since := lo.run.Leaderless()
			switch {
			case since != 0 && !warned && e.mono()-since > 2*int64(e.lease):
				warned = true
				e.log.Warn("ownership log has no leader: a majority of its voters is unreachable; no holder decides until it is back (restart the cluster to recover from voters lost for good)",
					"for", time.Duration(e.mono()-since).Round(time.Second))
			case since == 0 && warned:
				warned = false
				e.log.Info("ownership log has a leader again")
			}
		}
	}()
}

// logTakeovers warns once per failed holder whose partitions were taken
// over, once no more of them have been for a lease (a crash's takeovers
// spread over several reconcile rounds): how many partitions and keys,
// over how long. Each partition also has a Debug line. With all, every
// tally is logged now (the node is closing).
func (lo *logOwner) logTakeovers(all bool) {
	e := lo.env
	for holder, t := range lo.tookOver.due(e.mono(), int64(e.lease), all) {
		e.log.Warn("partitions taken over from failed holder", "peer", holder, "partitions", t.partitions, "keys", t.keys, "took", time.Duration(t.last-t.first))
	}
}

// rpcTimeout bounds one ownership RPC (one chunk of a copy).
func (lo *logOwner) rpcTimeout() time.Duration { return max(10*lo.env.forwardTimeout, 5*time.Second) }

// awaitFounded waits, within ctx and at most 10 s, until the founder holds
// every partition: its log elected it, it joined and extended, and the
// grants committed. A founder that is not settled by then still starts:
// requests wait for the grants within their deadlines.
func (lo *logOwner) awaitFounded(ctx context.Context) {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	limit := time.NewTimer(10 * time.Second)
	defer limit.Stop()
	for !lo.settled(lo.env.view.Load()) {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		case <-limit.C:
			return
		}
	}
}

// shutdown stops the member and its transport; idempotent.
func (lo *logOwner) shutdown() {
	if lo.stop != nil {
		lo.stop()
		<-lo.done
	}
	lo.tr.Close()
}

func (lo *logOwner) dial(_ context.Context, to uint64) (grpc.ClientConnInterface, error) {
	name, ok := lo.peers.Load().raft[to]
	if !ok {
		return nil, fmt.Errorf("%w: raft member %016x", errNoPeer, to)
	}
	// The log's own address when it keeps one (logPeers), else the view's.
	conn, _, err := lo.env.linkConn(name, lo.peers.Load().addr[name])
	if err != nil {
		return nil, err
	}
	return conn, nil
}

// withLogAddrs returns alive with the address of every member the log
// still dials (logPeers), for peerLinks.drop: a link the log's transport
// uses is not stopped because gossip lost its member.
func (lo *logOwner) withLogAddrs(alive map[string]string) map[string]string {
	la := lo.peers.Load().addr
	out := make(map[string]string, len(alive)+len(la))
	for name, a := range la {
		out[name] = a
	}
	for name, a := range alive {
		out[name] = a
	}
	return out
}

// incarnation returns member name's current incarnation ("" if unknown).
func (lo *logOwner) incarnation(name string) string { return lo.peers.Load().inc[name] }

// setView passes a rebuilt gossip view on: targets from the ring, the
// members that may be targets, the incarnations gone for good, and the
// roster autopilot keeps voters from. starts are the live members' start
// ids, targets the members that may be targets (live, not draining).
// raftIDs and heirs are, per live member, its raft ID and the start id of
// the incarnation whose data directory it has (0 for none).
func (lo *logOwner) setView(v *view, evs []membership.Event, starts, raftIDs, heirs map[string]uint64, targets []string) {
	e := lo.env
	now := e.mono()
	// A member that left gossip is gone for good once the table says it
	// ended its liveness for good (a completed leave does so before it
	// leaves gossip). Until then it may still be draining, cut off from
	// gossip, or the log may be between leaders: the log keeps talking to
	// it, and counts its vote, as for a member gossip declared failed
	// (gone after FailedMemberTimeout). Taking its "left" for gone lost
	// the log its majority when another voter had crashed.
	var left []string
	lo.mu.Lock()
	for _, e := range evs {
		if e.Kind == "left" && starts[e.Name] == 0 {
			if id, ok := lo.cur[e.Name]; ok {
				left = append(left, id)
			}
		}
	}
	lo.mu.Unlock()
	var ended map[string]bool
	if len(left) > 0 {
		ctx, cancel := context.WithTimeout(e.ctx, time.Second)
		ended = lo.run.Ended(ctx, left)
		cancel()
	}
	lo.mu.Lock()
	for _, id := range left {
		if k := lo.known[id]; k != nil && ended[id] {
			k.gone = true
		}
	}
	isTarget := make(map[string]bool, len(targets))
	for _, t := range targets {
		isTarget[t] = true
	}
	for name, st := range starts {
		if st == 0 {
			continue
		}
		id := incarnationID(name, st)
		if old, ok := lo.cur[name]; ok && old != id {
			if k := lo.known[old]; k != nil {
				k.gone = true // a later process runs under the name
			}
		}
		lo.cur[name] = id
		k := lo.known[id]
		if k == nil {
			if len(lo.known) >= maxKnown {
				lo.forgetOldest()
			}
			k = &logKnown{raft: st}
			if r := raftIDs[name]; r != 0 {
				k.raft = r
			}
			lo.known[id] = k
		}
		k.lastLive, k.leaving = now, !isTarget[name]
		if a := v.alive[name]; a != "" {
			k.addr = a
		}
	}
	peers := &logPeers{raft: map[uint64]string{}, inc: map[string]string{}, addr: map[string]string{}}
	var gone, failed []string
	var roster []ownlog.Peer
	for id, k := range lo.known {
		failedFor := time.Duration(now - k.lastLive)
		g := k.gone || failedFor > lo.logFailedGone()
		// Only a member that left or runs a later incarnation is gone for
		// good to the ownership table. One gossip gave up on may be cut
		// off with the state of partitions that wait for it (a long
		// split is one fault): it is Failed, ended for good only once
		// nothing waits for it, and a vacancy waits for it until
		// EmptyAfter.
		switch {
		case k.gone:
			gone = append(gone, id)
		case g:
			failed = append(failed, id)
		}
		if g {
			if !k.forgotten && !lo.raftInUse(k.raft, id) {
				// Raft sends a removed member nothing: its stream and
				// goroutine would idle until Close.
				k.forgotten = true
				lo.tr.Forget(k.raft)
			}
		} else {
			peers.raft[k.raft] = memberName(id)
			if k.addr != "" && id == lo.cur[memberName(id)] {
				peers.addr[memberName(id)] = k.addr
			}
		}
		roster = append(roster, ownlog.Peer{RaftID: k.raft, Member: id, Gone: g, Leaving: k.leaving && failedFor == 0})
	}
	for name, id := range lo.cur {
		peers.inc[name] = id
	}
	peers.inc[e.name] = lo.self
	roster = oneIncarnationPerRaftID(roster)
	heirOf := lo.heirsLocked(heirs)
	gone = withHeirsGone(gone, heirOf)
	lo.mu.Unlock()
	lo.peers.Store(peers)

	parts := len(e.parts)
	ov := ownership.View{Target: make([]string, parts), Second: make([]string, parts), Gone: gone, Failed: failed, Heirs: heirOf}
	for _, t := range targets {
		if id := peers.inc[t]; id != "" {
			ov.Members = append(ov.Members, id)
		}
	}
	if v.snap != nil && v.snap.Len() > 0 {
		for p := range parts {
			ov.Target[p] = peers.inc[v.snap.PartitionOwner(p)]
			if b := v.snap.PartitionBackup(p); b != "" {
				ov.Second[p] = peers.inc[b]
			}
		}
	}
	lo.run.SetView(ov, roster)
}

// raftInUse reports whether an incarnation other than id that is not gone
// uses raft ID r (a member restarted with its data directory keeps its
// raft ID): the log's stream to r is then still needed. Called with
// lo.mu held.
func (lo *logOwner) raftInUse(r uint64, id string) bool {
	for other, k := range lo.known {
		if other != id && k.raft == r && !k.gone {
			return true
		}
	}
	return false
}

// oneIncarnationPerRaftID keeps, of roster entries sharing a raft ID (the
// incarnations of one member restarted with its data directory), the one
// not gone (autopilot keys its roster by raft ID: a gone entry would
// remove the member that resumed that raft ID).
func oneIncarnationPerRaftID(roster []ownlog.Peer) []ownlog.Peer {
	live := map[uint64]bool{}
	for _, p := range roster {
		if !p.Gone {
			live[p.RaftID] = true
		}
	}
	out := roster[:0]
	for _, p := range roster {
		if p.Gone && live[p.RaftID] {
			continue
		}
		out = append(out, p)
	}
	return out
}

// heirsLocked is the view's Heirs: each live member's incarnation mapped
// to the one whose data directory it restarted with. Called with lo.mu
// held.
func (lo *logOwner) heirsLocked(heirs map[string]uint64) map[string]string {
	if len(heirs) == 0 {
		return nil
	}
	out := make(map[string]string, len(heirs))
	for name, h := range heirs {
		if id, old := lo.cur[name], incarnationID(name, h); id != "" && id != old {
			out[id] = old
		}
	}
	return out
}

// withHeirsGone adds to gone every incarnation an heir restarted from: a
// later incarnation runs with its data directory, so it is gone for good
// (after a restart of every member nobody saw it end in gossip).
func withHeirsGone(gone []string, heirOf map[string]string) []string {
	for _, old := range heirOf {
		if !slices.Contains(gone, old) {
			gone = append(gone, old)
		}
	}
	return gone
}

// forgetOldest drops the gone incarnation seen live longest ago. Called
// with mu held.
func (lo *logOwner) forgetOldest() {
	var oldest string
	var at int64
	for id, k := range lo.known {
		if k.gone && (oldest == "" || k.lastLive < at) {
			oldest, at = id, k.lastLive
		}
	}
	if oldest != "" {
		delete(lo.known, oldest)
	}
}

// Reset empties partition p's local state: it was granted here empty.
// Called by the runner with the partition's lock held.
func (lo *logOwner) Reset(p int) {
	e := lo.env
	pt := &e.parts[p]
	pt.Store = e.newStore()
	pt.Rep, pt.Next = replica{}, replica{}
	restored := false
	if e.restore != nil {
		restored = e.restore(p, lo.member.Own().Table().Parts[p].Epoch, pt.Store)
	}
	// The runner's goroutine owns the member: its table may be read here.
	if r := lo.member.Own().Table().Parts[p].Restarts; r > lo.restarts[p] {
		lo.restarts[p] = r
		if restored {
			return // its state came back from the data directory (logged there)
		}
		e.log.Error("partition restarted empty: its holder and its backup are gone for good, so its keys start over (up to each limit again)",
			"partition", p, "restarts", r)
		e.metrics.Handoff("lost", "orphaned", 1)
		return
	}
	e.log.Debug("partition granted here empty", "partition", p)
}

// Publish mirrors partition p's applied record into the node's partition
// table. Called by the runner with the partition's lock held.
func (lo *logOwner) Publish(p int, st ownlog.PartState) {
	e := lo.env
	pt := &e.parts[p]
	prev := lo.last[p]
	lo.last[p] = st
	switch {
	case prev.Holder != "" && prev.Holder != lo.self && st.Holder == lo.self && prev.Backup == lo.self && st.Backup == "":
		// The holder's liveness ended and its backup, this member, holds
		// the partition with its replica.
		keys := 0
		if pt.Store != nil {
			keys = pt.Store.Len()
		}
		e.log.Debug("partition taken over from failed holder", "partition", p, "peer", memberName(prev.Holder), "epoch", st.Epoch, "keys", keys)
		e.metrics.Handoff("takeover", "ok", keys)
		// One Warn per ended member: logTakeovers
		// sums its takeovers once they have been quiet for a lease.
		lo.tookOver.tally(memberName(prev.Holder), keys, e.mono())
	case prev.Holder == lo.self && st.Holder != lo.self && st.Holder != "" && st.Backup == lo.self:
		keys := 0
		if pt.Store != nil {
			keys = pt.Store.Len()
		}
		e.log.Debug("partition transferred", "partition", p, "peer", memberName(st.Holder), "epoch", st.Epoch, "keys", keys)
		e.metrics.Handoff("sent", "ok", keys)
	}
	switch {
	case st.Holder == lo.self:
		r := partition.RoleFenced
		if st.May {
			r = partition.RoleHolder
		}
		if pt.Store == nil {
			pt.Store = e.newStore()
		}
		pt.Backup = memberName(st.Backup)
		pt.SetRoleLocked(r, e.name, st.Epoch)
	case st.Holder != "":
		pt.Backup = ""
		pt.SetRoleLocked(partition.RoleHint, memberName(st.Holder), st.Epoch)
	default:
		pt.Backup = ""
		pt.SetRoleLocked(partition.RoleNone, "", 0)
	}
	if e.transition != nil {
		e.transition(p, prev.Holder == lo.self || prev.Backup == lo.self, st.Holder == lo.self, st.Backup == lo.self, st.Epoch, pt.Store)
	}
	select {
	case lo.ready <- struct{}{}:
	default:
	}
}

// SendCopy sends a copy of partition a.P on a goroutine the node owns;
// when the receiver installed it, the machine hears CopyAcked. The
// runner calls it with the partition's gate held, after publishing the
// partition fenced: no decision is on it, and none starts until the
// machine lifts the fence (the copy's ack, or its timeout, whose copy then
// counts for nothing). So the keys are exported on that goroutine, not
// here: a large partition's export (seconds for millions of admissions)
// must not hold up the runner, whose ticks extend this member's liveness
// for every partition it holds.
//
// The copy carries every key the holder keeps that its current table can
// decide: a key whose policy the table lacks (removed, the holder keeps
// its state until swept) or has with another algorithm is left out,
// because the receiver, which checks each key against its own table,
// refuses a copy carrying a key it cannot record. Such a key's state is
// then on the holder only; adding its policy back (or its algorithm) is a
// raise (replicationRaised), so the partition is copied again, the key
// included, before it decides again. A partition that moves to another
// holder meanwhile leaves the key behind: the new holder decides it again
// from nothing when the policy comes back. TODO(issue 52): carry every
// key, which needs the receiver to record keys its table cannot decide.
func (lo *logOwner) SendCopy(a ownership.Action) {
	e := lo.env
	st := e.parts[a.P].Store
	to := memberName(a.To)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		// Admissions decided before the fence may still be on their way
		// to the receiver (async ones, or sync ones not yet answered). A
		// backup adds what it receives to its copy, so one that landed
		// after this copy, which already holds it, would count twice:
		// wait until the replication queued for the receiver so far is
		// answered. Past ForwardTimeout the copy goes anyway (a late
		// admission can then only refuse more, never admit more).
		bctx, bcancel := context.WithTimeout(e.ctx, e.forwardTimeout)
		if err := e.barrier(bctx, to); err != nil {
			e.log.Debug("partition copy sent with replication to the receiver still unanswered", "partition", a.P, "to", to, "err", err)
		}
		bcancel()
		var keys []*peerpb.KeyState
		if st != nil {
			now := e.clock()
			tab := e.table.Load()
			st.Range(func(k Key) bool {
				ks, ok := st.Export(k, now)
				if ok {
					// Only keys the receiver can record: see above.
					if p := tab.Lookup(k.Policy); p != nil && p.Shard.Algorithm == ks.Algorithm {
						keys = append(keys, stateToWire(ks))
					}
				}
				return e.ctx.Err() == nil
			})
		}
		ctx, cancel := context.WithTimeout(e.ctx, lo.rpcTimeout())
		defer cancel()
		if err := lo.sendCopy(ctx, a, to, keys); err != nil {
			e.log.Debug("partition copy failed", "partition", a.P, "to", to, "err", err)
			e.metrics.Backup("sent", "error", 1)
			lo.run.CopyFailed(a.P, a.To, a.Epoch, a.Seq)
			return
		}
		e.metrics.Backup("sent", "ok", 1)
		lo.run.CopyAcked(a.P, a.To, a.Epoch, a.Seq)
	}()
}

// errCopyUnsent is a copy a test failed before it was sent.
var errCopyUnsent = errors.New("peer: copy not sent (test)")

// sendCopy sends keys as one copy of a.P to member to, in requests of at
// most TransferChunkBytes, and reports whether every request was applied.
func (lo *logOwner) sendCopy(ctx context.Context, a ownership.Action, to string, keys []*peerpb.KeyState) error {
	e := lo.env
	if f := e.copyUnsent.Load(); f != nil && (*f)(a.P, to) {
		return errCopyUnsent
	}
	_, stub, err := e.linkConn(to, "")
	if err != nil {
		return err
	}
	part, epoch := uint32(a.P), a.Epoch
	ops := []*peerpb.PartitionOp{{Kind: peerpb.PartitionOp_KIND_SYNC_BEGIN, Partition: part, Epoch: epoch, HolderEpoch: a.Seq}}
	size := 0
	flush := func(last bool) error {
		if last {
			ops = append(ops, &peerpb.PartitionOp{Kind: peerpb.PartitionOp_KIND_SYNC_END, Partition: part, Epoch: epoch, HolderEpoch: a.Seq})
		}
		req := &peerpb.ReplicateRequest{Sender: e.name, Ops: ops}
		e.policyStamp(req, to)
		resp, err := stub.Replicate(ctx, req)
		if err != nil {
			return withCtxErr(ctx, err)
		}
		if len(resp.Results) != len(ops) {
			return fmt.Errorf("%s answered %d results for %d operations", to, len(resp.Results), len(ops))
		}
		for i, r := range resp.Results {
			if r.Status != peerpb.OpStatus_OP_STATUS_OK {
				return fmt.Errorf("%s refused partition %d's copy: %v", to, a.P, r.Status)
			}
			if carried := len(ops[i].Keys); int(r.Accepted) < carried {
				return fmt.Errorf("%s recorded %d of %d keys of partition %d's copy", to, r.Accepted, carried, a.P)
			}
		}
		ops, size = ops[:0], 0
		return nil
	}
	for _, w := range keys {
		sz := 64 + len(w.GetKey().GetTenant()) + len(w.GetKey().GetSubject()) + len(w.GetKey().GetPolicy()) + 12*len(w.GetRuns())
		if size+sz > e.chunkBytes && size > 0 {
			if err := flush(false); err != nil {
				return err
			}
		}
		if len(ops) == 0 || ops[len(ops)-1].Kind != peerpb.PartitionOp_KIND_SYNC_CHUNK {
			ops = append(ops, &peerpb.PartitionOp{Kind: peerpb.PartitionOp_KIND_SYNC_CHUNK, Partition: part, Epoch: epoch, HolderEpoch: a.Seq})
		}
		op := ops[len(ops)-1]
		op.Keys = append(op.Keys, w)
		size += sz
	}
	return flush(true)
}

// settled is Settled: the log has the voters autopilot keeps
// (ownlog.VotersFor), and the node holds, deciding, every partition
// its ring gives it, each with a backup when there is another member, and
// no other.
func (lo *logOwner) settled(v *view) bool {
	if lo.run.Voters() < min(ownlog.VotersFor(len(v.alive)), len(v.alive)) {
		return false
	}
	return lo.unsettled(v) < 0
}

// unsettled is the first partition that keeps settled false, -1 for none.
func (lo *logOwner) unsettled(v *view) int {
	mono := lo.env.mono()
	for p := range lo.env.parts {
		st := lo.run.Part(p)
		mine := st.Holder == lo.self
		if mine != (v.snap.PartitionOwner(p) == lo.env.name) {
			return p
		}
		if mine && (!lo.run.MayDecide(p, mono) || len(v.alive) > 1 && st.Backup == "") {
			return p
		}
	}
	return -1
}
