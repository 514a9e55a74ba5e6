package peer

import (
	"context"
	"fmt"
	"net"
	"reflect"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/shard"
)

// KillForTest simulates a crash of n: the gRPC server stops at once (open
// connections are cut, nothing is drained) and gossip shuts down without
// leaving, so the other members only learn of it by failure detection. No
// key is handed off. The node's goroutines are then stopped and waited for,
// and Close afterwards returns at once: a crashed process has nothing left
// to clean up. Allow on n returns ErrClosed.
func (n *Node) KillForTest() {
	n.closeOnce.Do(func() {
		n.closing.Store(true)
		n.stopped.Store(true)
		n.grpcSrv.Stop()
		// Shutdown, not Leave: the peers must see a silent member.
		_ = n.gossiper.ml.Shutdown()
		if n.lo != nil {
			n.lo.shutdown()
		}
		n.cancel()
		n.links.stopAll()
		n.wg.Wait()
		n.closeDataDir()
		n.gossiper.mlLog.Close()
		close(n.closed)
	})
}

// SetViewForTest publishes a hand-built ring of members on n, as if its
// gossip view were stale or wrong. addrs maps members to their gRPC
// addresses; a member without one is unreachable. The view stays until
// gossip reports the next membership change. It returns the view's ring
// version.
func (n *Node) SetViewForTest(members []string, addrs map[string]string) (uint64, error) {
	g := n.gossiper
	g.viewMu.Lock()
	defer g.viewMu.Unlock()
	snap, err := ring.New(n.cfg.Ring, members, g.version+1)
	if err != nil {
		return 0, fmt.Errorf("build test view: %w", err)
	}
	g.version++
	cp := make(map[string]string, len(addrs))
	for k, v := range addrs {
		cp[k] = v
	}
	n.view.Store(&view{snap: snap, alive: cp, since: time.Now()})
	close(g.viewCh)
	g.viewCh = make(chan struct{})
	return snap.Version(), nil
}

// ExportForTest returns the log of key held by n, as admission times on n's
// clock with their counts, oldest first, and whether n holds the key. The
// log drops expired runs lazily (at the key's next decision), so runs W or
// more old may still be listed. It reads the store without changing it.
func (n *Node) ExportForTest(key Key) (runs []AdmissionRun, ok bool) {
	now := n.clock()
	pt := n.partOfForTest(key)
	pt.Mu.RLock()
	store := pt.Store
	pt.Mu.RUnlock()
	if store == nil {
		return nil, false
	}
	st, ok := store.Export(key, now)
	if !ok {
		return nil, false
	}
	runs = make([]AdmissionRun, len(st.Runs))
	for i, r := range st.Runs {
		runs[i] = AdmissionRun{At: now.Add(-r.Age), Count: r.Count}
	}
	return runs, true
}

// AdmissionRun is Count units admitted at At on the owner's clock.
type AdmissionRun struct {
	At    time.Time
	Count int64
}

// Fingerprint returns the placement fingerprint n gossips.
func (n *Node) Fingerprint() uint64 { return n.fp }

// GossipMembers returns how many members n's memberlist knows, whatever
// their fingerprint.
func (n *Node) GossipMembers() int { return n.gossiper.ml.NumMembers() }

// partOfForTest returns the partition key belongs to on n.
func (n *Node) partOfForTest(key Key) *part {
	var buf [3 * 129]byte
	ek, _ := key.AppendEncoded(buf[:0])
	return &n.pt.parts[n.view.Load().snap.Partition(placement(ek))]
}

// holdsForTest reports whether n holds key's partition and has state for
// key in it.
func (n *Node) holdsForTest(key Key) bool {
	pt := n.partOfForTest(key)
	pt.Mu.RLock()
	defer pt.Mu.RUnlock()
	return (pt.Role == partition.RoleHolder || pt.Role == partition.RoleFenced) && pt.Store != nil && pt.Store.Has(key)
}

// decisionPointForTest reports whether n could decide for key now: it
// holds key's partition (not fenced) and is not closing.
func (n *Node) decisionPointForTest(key Key) bool {
	if n.closing.Load() {
		return false
	}
	pt := n.partOfForTest(key)
	pt.Mu.RLock()
	defer pt.Mu.RUnlock()
	return pt.Role == partition.RoleHolder
}

// namedHolderForTest reports whether n's table names n key's holder, whether or
// not it may decide at this instant (a holder is fenced for a moment
// while its liveness is renewed late or a copy is raised).
func (n *Node) namedHolderForTest(key Key) bool {
	if n.closing.Load() {
		return false
	}
	pt := n.partOfForTest(key)
	pt.Mu.RLock()
	defer pt.Mu.RUnlock()
	return pt.Role == partition.RoleHolder || pt.Role == partition.RoleFenced
}

// backupOwnerForTest returns the member that would own key if its owner
// left, in n's ring.
func (n *Node) backupOwnerForTest(key Key) string {
	var buf [3 * 129]byte
	ek, _ := key.AppendEncoded(buf[:0])
	return n.view.Load().snap.Backup(placement(ek))
}

// holdersForTest returns, per partition, the node's role and epoch.
func (n *Node) roleForTest(pid int) (partition.Role, string, uint64) {
	pt := &n.pt.parts[pid]
	pt.Mu.RLock()
	defer pt.Mu.RUnlock()
	return pt.Role, pt.Holder, pt.Epoch
}

// stopRPCForTest stops n's gRPC server at once and leaves gossip running:
// peers still see n as a member, but every RPC to it fails.
func (n *Node) stopRPCForTest() { n.grpcSrv.Stop() }

// restartRPCForTest serves n's gRPC services again, on the address of the
// server stopRPCForTest stopped (gossip still lists it), as if a wedged
// port came back.
func (n *Node) restartRPCForTest() error {
	lis, err := net.Listen("tcp", n.RPCAddr())
	if err != nil {
		return err
	}
	n.serveRPC(lis)
	return nil
}

// setPortDeadForTest makes n's routing take f's answer for whether a
// member's port is dead (nil: ask the connection).
func (n *Node) setPortDeadForTest(f func(member string) bool) {
	if f == nil {
		n.hooks.portDead.Store(nil)
		return
	}
	n.hooks.portDead.Store(&f)
}

// setCheckHookForTest makes n's Check handler call f before deciding (for
// example to hang until the caller gives up).
func (n *Node) setCheckHookForTest(f func(ctx context.Context)) { n.hooks.check.Store(&f) }

// partIDForTest returns key's partition.
func (n *Node) partIDForTest(key Key) int {
	var buf [3 * 129]byte
	ek, _ := key.AppendEncoded(buf[:0])
	return n.view.Load().snap.Partition(placement(ek))
}

// ringWithForTest returns the ring n's members plus extra would form.
func (n *Node) ringWithForTest(extra string) *ring.Snapshot {
	snap, err := ring.New(n.cfg.Ring, append(n.Members(), extra), 1)
	if err != nil {
		panic(err)
	}
	return snap
}

// backupForTest returns the backup n uses for partition pid it holds.
func (n *Node) backupForTest(pid int) string {
	pt := &n.pt.parts[pid]
	pt.Mu.RLock()
	defer pt.Mu.RUnlock()
	return pt.Backup
}

// sameDecision compares decisions ignoring DecidedAt.
func sameDecision(a, b Decision) bool {
	a.DecidedAt, b.DecidedAt = time.Time{}, time.Time{}
	return reflect.DeepEqual(a, b)
}

// unsettledForTest describes the partitions that keep n from being
// settled, for failure messages.
func (n *Node) unsettledForTest() string {
	v := n.view.Load()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var b strings.Builder
	shown := 0
	for _, p := range n.unsettledPids() {
		st := n.lo.run.Part(p)
		if shown++; shown <= 2 {
			fmt.Fprintf(&b, " [p%d target %s %+v may %v", p, v.snap.PartitionOwner(p), st, n.lo.run.MayDecide(p, n.mono()))
			if tb, ok := n.lo.run.Table(ctx); !ok {
				fmt.Fprintf(&b, " table unknown]")
			} else {
				fmt.Fprintf(&b, " table %+v]", tb.Parts[p])
			}
		}
	}
	return fmt.Sprintf("%s: settled %v, voters %d, %d unsettled%s; raft %+v; %s", n.name, n.Settled(), n.lo.run.Voters(), shown, b.String(), n.RaftTraffic(), n.lo.run.Describe(ctx))
}

// heldForTest describes what n still holds and why up to three of those
// partitions have not moved, for failure messages of a leave.
func (n *Node) heldForTest() string {
	parts, keys := heldPartitions(n.pt.parts)
	var pids []int
	for p := range n.pt.parts {
		pt := &n.pt.parts[p]
		pt.Mu.RLock()
		if (pt.Role == partition.RoleHolder || pt.Role == partition.RoleFenced) && len(pids) < 3 {
			pids = append(pids, p)
		}
		pt.Mu.RUnlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return fmt.Sprintf("%s holds %d partitions (%d keys): %s; raft %+v; %s", n.name, parts, keys,
		strings.Join(n.lo.run.Explain(ctx, pids), "; "), n.RaftTraffic(), n.lo.run.Describe(ctx))
}

// partForTest describes partition pid as n knows it, for failure messages.
func (n *Node) partForTest(pid int) string {
	v := n.view.Load()
	pt := &n.pt.parts[pid]
	pt.Mu.RLock()
	defer pt.Mu.RUnlock()
	return fmt.Sprintf("%s: p%d role=%v holder=%s epoch=%d target=%s backup=%s rep=%s@%d complete=%v next=%s@%d",
		n.name, pid, pt.Role, pt.Holder, pt.Epoch, v.snap.PartitionOwner(pid), pt.Backup,
		pt.Rep.Holder, pt.Rep.Epoch, pt.Rep.Complete, pt.Next.Holder, pt.Next.Epoch)
}

// unsettledPids lists the partitions that keep n from being settled.
func (n *Node) unsettledPids() []int {
	v := n.view.Load()
	var out []int
	for p := range n.pt.parts {
		st := n.lo.run.Part(p)
		mine, target := st.Holder == n.lo.self, v.snap.PartitionOwner(p)
		if mine != (target == n.name) || mine && (!n.lo.run.MayDecide(p, n.mono()) || len(v.alive) > 1 && st.Backup == "") {
			out = append(out, p)
		}
	}
	return out
}

// dropCopyForTest makes n forget its copy of partition pid.
func (n *Node) dropCopyForTest(pid int) {
	pt := &n.pt.parts[pid]
	pt.Mu.Lock()
	defer pt.Mu.Unlock()
	pt.Rep = replica{}
	pt.Next = replica{}
}

// setStreamDropForTest makes n's CheckStream receiver swallow the requests
// f returns true for (nil: none): they are never answered, as if lost.
func (n *Node) setStreamDropForTest(f func(*peerpb.CheckRequest) bool) {
	if f == nil {
		n.hooks.streamDrop.Store(nil)
		return
	}
	n.hooks.streamDrop.Store(&f)
}

// pipeBreaksForTest is how many of n's streams to peers have broken.
func (n *Node) pipeBreaksForTest() int64 { return n.links.pipeBreaks.Load() }

// setDecideHookForTest makes n call f in every local decision, between its
// lease check and the decision itself.
func (n *Node) setDecideHookForTest(f func()) { n.hooks.decide.Store(&f) }

// setReplDropForTest makes n lose the replication requests f returns
// true for: its ReplicateStream receiver swallows them (neither applied
// nor answered), its unary Replicate fails them Unavailable, unapplied.
func (n *Node) setReplDropForTest(f func(*peerpb.ReplicateRequest) bool) { n.hooks.replDrop.Store(&f) }

// setReplHoldForTest runs f before n applies each replication request it
// receives; f may block, and the func it returns (if any) runs once the
// request is applied.
func (n *Node) setReplHoldForTest(f func(*peerpb.ReplicateRequest) func()) {
	n.hooks.replHold.Store(&f)
}

// setCopyUnsentForTest makes n fail, unsent, every copy of a partition
// it would send that f returns true for (nil: none).
func (n *Node) setCopyUnsentForTest(f func(pid int, to string) bool) {
	if f == nil {
		n.hooks.copyUnsent.Store(nil)
		return
	}
	n.hooks.copyUnsent.Store(&f)
}

// fillForTest merges ks into n's own store of partition pid, which n
// holds, as admissions decided at now under policy: a quick way to build a
// large state (no replication; the test checks copies made after it).
func (n *Node) fillForTest(pid int, ks shard.KeyState, policy string, now time.Time) error {
	p := n.table.Load().Lookup(policy)
	if p == nil {
		return fmt.Errorf("no policy %q", policy)
	}
	pt := &n.pt.parts[pid]
	pt.Mu.RLock()
	defer pt.Mu.RUnlock()
	if pt.Role != partition.RoleHolder {
		return fmt.Errorf("partition %d is not held here (%v)", pid, pt.Role)
	}
	return pt.Store.Import(ks, p.Shard, now)
}

// fillCopyForTest merges ks into n's complete copy of partition pid kept
// for holder, as fillForTest does into the holder's store: what
// replication would have brought it.
func (n *Node) fillCopyForTest(pid int, holder string, ks shard.KeyState, policy string, now time.Time) error {
	p := n.table.Load().Lookup(policy)
	if p == nil {
		return fmt.Errorf("no policy %q", policy)
	}
	st := n.copyForTest(pid, holder)
	if st == nil {
		return fmt.Errorf("%s keeps no complete copy of partition %d for %s", n.Name(), pid, holder)
	}
	return st.Import(ks, p.Shard, now)
}

// copyForTest returns n's complete copy of partition pid kept for holder,
// or nil when n keeps none.
func (n *Node) copyForTest(pid int, holder string) *shard.Store {
	pt := &n.pt.parts[pid]
	pt.Mu.RLock()
	defer pt.Mu.RUnlock()
	if !pt.Rep.Complete || pt.Rep.Holder != holder {
		return nil
	}
	return pt.Store // a backup's complete copy is the partition's store
}

// replicaEpochForTest is the epoch a holder's replication to n, the
// backup of pid, carries: the partition's epoch in the log's table.
func (n *Node) replicaEpochForTest(pid int) uint64 { return n.lo.run.Part(pid).Epoch }

// pipeForTest names the kind of n's forward pipe to member: "framed",
// "grpc", or "" without one.
func (n *Node) pipeForTest(member string) string { return n.pipeKindForTest(member, false) }

// replPipeForTest is pipeForTest for n's replication pipe to member.
func (n *Node) replPipeForTest(member string) string { return n.pipeKindForTest(member, true) }

func (n *Node) pipeKindForTest(member string, repl bool) string {
	n.links.mu.Lock()
	c := n.links.m[member]
	n.links.mu.Unlock()
	if c == nil {
		return ""
	}
	k := c.pipe.kind.Load()
	if repl {
		k = c.repl.pipe.kind.Load()
	}
	switch k {
	case 2:
		return "framed"
	case 1:
		return "grpc"
	default:
		return ""
	}
}

// framedConnsForTest counts the connections n's framed server is sniffing
// or serving.
func (n *Node) framedConnsForTest() int {
	return n.grpcSrv.framed.Conns()
}

// setGatherForTest sets how long n's batches wait for the message in
// flight on their pipe before taking another slot.
func (n *Node) setGatherForTest(d time.Duration) { n.links.gather.Store(int64(d)) }

// replQueuedForTest is how many replication items wait in n's queue to
// member to (0 without a client for it).
func (n *Node) replQueuedForTest(to string) int {
	n.links.mu.Lock()
	defer n.links.mu.Unlock()
	if c := n.links.m[to]; c != nil {
		return len(c.repl.queue)
	}
	return 0
}

// spreadDeadlineForTest returns the latest deadline (mono) of the grants
// n holds for key, 0 when it holds none.
func (n *Node) spreadDeadlineForTest(key Key) int64 {
	ek, _ := key.AppendEncoded(nil)
	n.spread.table.mu.RLock()
	k := n.spread.table.keys[string(ek)]
	n.spread.table.mu.RUnlock()
	if k == nil {
		return 0
	}
	return k.Describe(n.mono()).Deadline
}
