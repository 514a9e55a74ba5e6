package peer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"

	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// This file runs ownership (partition.go explains the rules): the
// reconcile loop that transfers partitions to their targets, keeps each
// held partition's backup complete, renews leases, takes over partitions of
// failed holders and restarts orphaned ones.

// mono returns the node's monotonic clock in nanoseconds. Leases are timed
// on it, never on Config.Clock: a paused process does not stop it, and wall
// clock steps cannot move it.
func (n *Node) mono() int64 { return int64(time.Since(n.started)) }

// now returns the node clock and the monotonic clock for one decision,
// reading the system clock once when Config.Clock is the default.
func (n *Node) now() (time.Time, int64) {
	if n.wall != nil {
		return n.wall.read()
	}
	return n.clock(), n.mono()
}

// holderLease is the part of a granted lease the holder counts on: 9/10,
// from when it sent the request, so that it ends before the backup's record
// of it while the clocks' rates differ by less than 10 %.
func holderLease(d time.Duration) int64 { return int64(d) / 10 * 9 }

// ownState is the node's ownership bookkeeping besides the partitions.
type ownState struct {
	mu     sync.Mutex
	failed map[string]time.Time // members that failed (not left), when seen failed
	// founded is set on a node that started without Join: it held every
	// partition at epoch 1 from the start.
	kick chan struct{}
	// working marks partitions with a transfer or copy in progress, so the
	// reconcile loop does not start a second one; sem bounds the steps
	// running at once.
	working map[int]bool
	sem     chan struct{}
	stopped bool // the drain of Close has ended: take nothing new over
	// starts is each member's last seen process start id, restartedAt
	// (monotonic ns) when a member last came back as a new process: the old
	// process is gone, whatever gossip says, so its partitions may be taken
	// over once its lease has expired.
	starts      map[string]uint64
	restartedAt map[string]int64
	// unreachable marks members whose gRPC port does not answer although
	// gossip lists them (a "ghost": a blocked port, a wedged server), node
	// monotonic ns when first seen so. A holder whose ring-chosen backup is
	// marked keeps its copies on another member instead; a mark older
	// than unreachableHold is checked again, and cleared when the member
	// answers.
	unreachable map[string]int64
	// marked is len(unreachable), readable without mu: the request path
	// asks about unreachable members only when there are any.
	marked   atomic.Int32
	checking map[string]bool // reachability checks in flight
	// tookOver tallies, per failed holder, the partitions (and keys) taken
	// over and not yet logged: one warning per failed holder once its
	// takeovers have gone quiet, rather than one per partition.
	tookOver map[string]takeoverTally
}

// takeoverTally is partitions and keys taken over from one holder, for its
// summary line: first and last are when the first and the latest were
// taken over, and wait the longest time from the end of the lease this
// node had granted to the takeover (node monotonic ns).
type takeoverTally struct {
	partitions, keys  int
	first, last, wait int64
}

// unreachableHold is how long after being marked unreachable a member is
// checked again (and, once it answers, used again as the ring chooses).
func (n *Node) unreachableHold() int64 { return int64(10 * n.cfg.LeaseDuration) }

// markUnreachable records (or renews) that member's gRPC port did not
// answer.
func (n *Node) markUnreachable(member string) {
	n.own.mu.Lock()
	defer n.own.mu.Unlock()
	_, known := n.own.unreachable[member]
	if known || len(n.own.unreachable) < maxEvents {
		n.own.unreachable[member] = n.mono()
		n.own.marked.Store(int32(len(n.own.unreachable)))
	}
	if !known {
		n.log.Warn("member unreachable over gRPC although gossip lists it: partitions it backs up get another backup", "peer", member)
	}
}

// checkReachable asks member, on a goroutine of its own, for an empty
// probe; no answer within ForwardTimeout marks it unreachable, an answer
// clears the mark. One check per member at a time.
func (n *Node) checkReachable(member string) {
	n.own.mu.Lock()
	if n.own.checking[member] || n.own.stopped {
		n.own.mu.Unlock()
		return
	}
	n.own.checking[member] = true
	n.own.mu.Unlock()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer func() {
			n.own.mu.Lock()
			delete(n.own.checking, member)
			n.own.mu.Unlock()
		}()
		c, err := n.peerClient(member)
		if err == nil {
			ctx, cancel := context.WithTimeout(n.ctx, n.cfg.ForwardTimeout)
			_, err = c.stub.Probe(ctx, &peerpb.ProbeRequest{Sender: n.name})
			cancel()
		}
		switch {
		case n.ctx.Err() != nil:
		case err != nil:
			n.markUnreachable(member)
			n.kickOwnership()
		default:
			n.clearUnreachable(member)
		}
	}()
}

// clearUnreachable records that member answered.
func (n *Node) clearUnreachable(member string) {
	n.own.mu.Lock()
	defer n.own.mu.Unlock()
	delete(n.own.unreachable, member)
	n.own.marked.Store(int32(len(n.own.unreachable)))
}

// isUnreachable reports whether member is marked unreachable. A mark
// older than unreachableHold starts a new check (an empty probe, which
// fences nothing) and stays until the member answers it.
func (n *Node) isUnreachable(member string) bool {
	if n.own.marked.Load() == 0 {
		return false
	}
	n.own.mu.Lock()
	at, ok := n.own.unreachable[member]
	n.own.mu.Unlock()
	if ok && n.mono()-at > n.unreachableHold() {
		n.checkReachable(member)
	}
	return ok
}

// noteIncarnations records members that restarted (a new start id under a
// known name). Called by the rebuild goroutine with every live member's
// start id.
func (n *Node) noteIncarnations(starts map[string]uint64) {
	n.own.mu.Lock()
	defer n.own.mu.Unlock()
	for name, s := range starts {
		if name == n.name || s == 0 {
			continue
		}
		prev, ok := n.own.starts[name]
		if ok && prev != s {
			n.own.restartedAt[name] = n.mono()
			// A new process: whatever its old one's port did says
			// nothing about this one.
			delete(n.own.unreachable, name)
			n.own.marked.Store(int32(len(n.own.unreachable)))
		}
		if ok || len(n.own.starts) < maxEvents {
			n.own.starts[name] = s
		}
	}
}

// restartedSince reports whether member came back as a new process after
// mono time t.
func (n *Node) restartedSince(member string, t int64) bool {
	n.own.mu.Lock()
	defer n.own.mu.Unlock()
	at, ok := n.own.restartedAt[member]
	return ok && at > t
}

func (n *Node) kickOwnership() {
	select {
	case n.own.kick <- struct{}{}:
	default:
	}
}

// noteFailed records members that disappeared without leaving, and forgets
// members that came back. Called by the rebuild goroutine.
func (n *Node) noteMembership(failed []string, back []string) {
	n.own.mu.Lock()
	defer n.own.mu.Unlock()
	now := time.Now()
	for _, m := range failed {
		if len(n.own.failed) < maxEvents {
			n.own.failed[m] = now
		}
	}
	for _, m := range back {
		delete(n.own.failed, m)
	}
}

// quorum reports whether the node sees a strict majority of the cluster:
// live members against live plus recently failed ones.
func (n *Node) quorum() bool {
	v := n.view.Load()
	if v == nil {
		return false // not started yet
	}
	alive := len(v.alive)
	n.own.mu.Lock()
	defer n.own.mu.Unlock()
	failed := 0
	for m, at := range n.own.failed {
		if time.Since(at) > n.cfg.FailedMemberTimeout {
			delete(n.own.failed, m)
			continue
		}
		failed++
	}
	total := alive + failed
	if 2*alive != total {
		return 2*alive > total
	}
	// Exactly half: the half with the smallest member name wins, so two
	// halves of a split never both act (and a two-member cluster survives
	// the loss of its larger-named member).
	smallest := ""
	for m := range v.alive {
		if smallest == "" || m < smallest {
			smallest = m
		}
	}
	for m := range n.own.failed {
		if m < smallest {
			return false
		}
	}
	return true
}

// alive reports whether member is live in the node's gossip view (draining
// members are live).
func (n *Node) alive(member string) bool {
	_, ok := n.view.Load().alive[member]
	return ok
}

// desiredBackup is the member that should keep the copy of partition pid
// held by this node: the target while this node is not the target (so a
// transfer finds its copy in place), else the ring's owner without this
// node; "" when there is no other member. If the ring's backup is marked
// unreachable, another ring member that is not is chosen (spread by
// partition): who keeps the copy matters only to the holder, since a
// takeover goes to whoever keeps the newest complete copy.
func (n *Node) desiredBackup(v *view, pid int) string {
	t := v.snap.PartitionOwner(pid)
	if t != "" && t != n.name && !n.isUnreachable(t) {
		return t
	}
	// This node is the target, or keeps the partition because the target
	// does not answer: the ring's backup, unless it is this node or does
	// not answer either.
	b := v.snap.PartitionBackup(pid)
	if b == "" || b != n.name && !n.isUnreachable(b) {
		return b
	}
	var others []string
	for _, m := range v.snap.Members() {
		if m != n.name && m != b && m != t && !n.isUnreachable(m) {
			others = append(others, m)
		}
	}
	if len(others) == 0 {
		if b == n.name {
			return ""
		}
		return b
	}
	return others[pid%len(others)]
}

// keepsAsTarget reports whether this node should treat itself as partition
// pid's target: it is, or the ring's target is a member whose port does
// not answer (it keeps the partition rather than move it nowhere).
func (n *Node) keepsAsTarget(v *view, pid int) bool {
	t := v.snap.PartitionOwner(pid)
	return t == n.name || t != "" && n.isUnreachable(t)
}

// ownerLoop runs reconcile on every ring change, every LeaseDuration/4
// (lease renewal), and when kicked.
func (n *Node) ownerLoop() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.LeaseDuration / 4)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			n.logTakeovers(true) // the summaries not yet due
			return
		case <-t.C:
		case <-n.own.kick:
		}
		n.reconcile()
	}
}

// reconcile looks at every partition once and starts what is due: a
// transfer to the target, a complete copy to a new backup, a lease
// renewal, a takeover or an orphan restart. Long steps run on their own
// goroutines (one per partition at a time, bounded by reconcileParallel);
// reconcile itself does not block on the network except for heartbeats,
// which it sends without waiting.
func (n *Node) reconcile() {
	n.logTakeovers(false)
	// Failed members age out of the quorum count without a membership
	// event: refresh the decision path's copy here too.
	n.storeQuorum()
	v := n.view.Load()
	beats := map[string][]*peerpb.PartitionOp{}
	var jobs []func(context.Context)
	nowMono := n.mono()
	for i := range n.pt.parts {
		pt := &n.pt.parts[i]
		if n.isWorking(i) {
			continue
		}
		pt.mu.RLock()
		r, epoch, backup, needSync := pt.role, pt.epoch, pt.backup, pt.needSync
		rep := pt.rep
		pt.mu.RUnlock()
		switch r {
		case roleHolder:
			target := v.snap.PartitionOwner(i)
			want := n.desiredBackup(v, i)
			switch {
			case target != "" && target != n.name && n.alive(target) && !n.isUnreachable(target):
				jobs = append(jobs, n.job(i, func(ctx context.Context) { n.transfer(ctx, i, target) }))
			case want != "" && (want != backup || needSync):
				jobs = append(jobs, n.job(i, func(ctx context.Context) { n.establishBackup(ctx, i, want) }))
			case want == "" && backup != "" && n.quorum():
				// No other member may keep a copy (we are alone, the
				// others are leaving): let the old backup go. Not without
				// a majority: alone because the others failed, this node
				// may be the one cut off, while they, a majority, take its
				// partitions over from the backup's copy. Without a backup
				// the holding would need no lease, and the node would
				// decide from its old state once the cut heals.
				n.dropBackup(i, epoch, backup)
			case backup != "":
				// A backup that has not renewed the lease for a whole
				// lease's length does not answer (gossip may still list
				// it): mark it, so the next round copies to another member.
				if nowMono-pt.leaseUntil.Load() > int64(n.cfg.LeaseDuration) {
					n.checkReachable(backup)
				}
				// Renew the lease at a quarter of its length; admissions
				// renew it too, so an idle partition costs one op here.
				if pt.leaseUntil.Load()-nowMono < holderLease(n.cfg.LeaseDuration)*3/4 {
					beats[backup] = append(beats[backup], &peerpb.PartitionOp{Kind: peerpb.PartitionOp_KIND_HEARTBEAT, Partition: uint32(i), Epoch: epoch})
				}
			}
		case roleFenced:
			// A transfer whose promote failed: settle it.
			jobs = append(jobs, n.job(i, func(ctx context.Context) { n.settleFenced(ctx, i) }))
		default:
			// A copy is never dropped for silence alone: a holder starved
			// of CPU renews late, and its copy is all a crash would leave.
			// A copy that is stale because its holder moved on is found
			// out by the probe before any takeover.
			gone := !n.alive(rep.holder) || n.restartedSince(rep.holder, rep.made)
			if rep.complete && gone && nowMono > rep.leaseEnd {
				jobs = append(jobs, n.job(i, func(ctx context.Context) { n.takeOver(ctx, i) }))
			} else if v.snap.PartitionOwner(i) == n.name && n.orphanSuspect(v, pt) {
				jobs = append(jobs, n.job(i, func(ctx context.Context) { n.claimOrphan(ctx, i) }))
			}
		}
	}
	for to, ops := range beats {
		n.sendOps(to, ops)
	}
	// Settling changes readiness without a membership event.
	n.updateReady()
	// Steps run on their own goroutines (owned by the node, at most
	// reconcileParallel at once) so that a long copy never holds up the
	// next round's lease renewals. They run under the node's lifetime, not
	// the caller's: Close cancels it only after the drain.
	for _, j := range jobs {
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			select {
			case n.own.sem <- struct{}{}:
			case <-n.ctx.Done():
				j(nil) // unmark only
				return
			}
			defer func() { <-n.own.sem }()
			j(n.ctx)
		}()
	}
}

// logTakeovers warns once per failed holder whose partitions were taken
// over, once no more of them have been for a lease (a crash's takeovers
// spread over several reconcile rounds): how many partitions and keys,
// over how long, and how long after the lease ended at most. Each
// partition also has a Debug line. With all, every tally is logged now (the
// node is closing).
func (n *Node) logTakeovers(all bool) {
	n.own.mu.Lock()
	if len(n.own.tookOver) == 0 {
		n.own.mu.Unlock()
		return
	}
	now := n.mono()
	quiet := make(map[string]takeoverTally)
	for holder, t := range n.own.tookOver {
		if all || now-t.last >= int64(n.cfg.LeaseDuration) {
			quiet[holder] = t
			delete(n.own.tookOver, holder)
		}
	}
	n.own.mu.Unlock()
	for holder, t := range quiet {
		attrs := []any{"peer", holder, "partitions", t.partitions, "keys", t.keys, "took", time.Duration(t.last - t.first)}
		if t.wait > 0 {
			// Gossip mode knows when the holder's lease ended; log mode
			// takes over only after the liveness expired, by its rule.
			attrs = append(attrs, "after_lease_end", time.Duration(t.wait))
		}
		n.log.Warn("partitions taken over from failed holder", attrs...)
	}
}

// reconcileParallel bounds the partition steps running at once.
const reconcileParallel = 8

// job marks partition pid as worked on and returns fn wrapped to unmark it.
func (n *Node) job(pid int, fn func(context.Context)) func(context.Context) {
	n.own.mu.Lock()
	n.own.working[pid] = true
	n.own.mu.Unlock()
	return func(ctx context.Context) {
		defer func() {
			n.own.mu.Lock()
			delete(n.own.working, pid)
			n.own.mu.Unlock()
		}()
		if ctx == nil {
			return // the node stopped before the step could start
		}
		// No overall deadline: a copy of a large partition takes as many
		// messages as it needs; each RPC has its own (rpcTimeout).
		fn(ctx)
	}
}

func (n *Node) isWorking(pid int) bool {
	n.own.mu.Lock()
	defer n.own.mu.Unlock()
	return n.own.working[pid]
}

// rpcTimeout bounds one ownership RPC (one chunk of a copy, a promote).
func (n *Node) rpcTimeout() time.Duration { return max(10*n.cfg.ForwardTimeout, 5*time.Second) }

// fence stops decisions for partition pid if this node holds it at epoch,
// waiting for decisions in progress (they hold the gate in read mode). It
// reports whether the partition is now fenced.
func (n *Node) fence(pid int, epoch uint64) bool {
	pt := &n.pt.parts[pid]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if pt.role != roleHolder || pt.epoch != epoch {
		return false
	}
	pt.setRoleLocked(roleFenced, n.name, epoch, n.clock())
	return true
}

// unfence lets the node decide for pid again.
func (n *Node) unfence(pid int) {
	pt := &n.pt.parts[pid]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if pt.role == roleFenced {
		pt.setRoleLocked(roleHolder, n.name, pt.epoch, n.clock())
	}
}

// copyFailed logs a failed copy of partition pid to member to: at Debug
// while copies of the partition have been failing for less than a lease,
// then at Warn (throttled). A member that has just joined refuses copies
// until it has built its first view of the cluster, and reconcile tries
// again at once: that is not worth a warning; a copy that keeps failing is.
func (n *Node) copyFailed(pid int, msg, to string, err error) {
	pt := &n.pt.parts[pid]
	now := n.mono()
	pt.mu.Lock()
	if pt.copyFailingSince == 0 {
		pt.copyFailingSince = now
	}
	failing := time.Duration(now - pt.copyFailingSince)
	pt.mu.Unlock()
	if failing < n.cfg.LeaseDuration {
		n.log.Debug(msg, "partition", pid, "peer", to, "err", err)
		return
	}
	n.warnThrottled(msg, "partition", pid, "peer", to, "err", err, "failing_for", failing)
}

// establishBackup gives partition pid a complete copy on member to, at a
// new epoch, and makes it the partition's backup. The partition is fenced
// while the copy is made, so the copy is exactly the holder's state; the
// old backup is told to drop its copy. On failure the partition stays
// with its old backup (and lease), and reconcile tries again.
func (n *Node) establishBackup(ctx context.Context, pid int, to string) {
	pt := &n.pt.parts[pid]
	pt.mu.RLock()
	epoch, old := pt.epoch, pt.backup
	pt.mu.RUnlock()
	if !n.reachableForCopy(ctx, pid, to) || !n.stillHolder(ctx, pid, epoch, old, to) {
		return
	}
	if !n.fence(pid, epoch) {
		return
	}
	defer n.unfence(pid)
	n.log.Debug("partition backup moving", "partition", pid, "peer", to, "from", old)
	if err := n.copyTo(ctx, pid, to, n.copyEpoch(pid)); err != nil {
		n.copyFailed(pid, "partition copy failed", to, err)
		if errors.Is(err, errCopyUncertain) {
			n.afterUncertainCopy(ctx, pid, to)
		}
		return
	}
	n.clearUnreachable(to)
	if old != "" && old != to {
		n.release(old, pid, epoch)
	}
}

// stillHolder reports whether this node, holding partition pid at epoch
// with backup old, may copy it to member to. While its lease lasts, yes:
// the backup that granted it cannot have taken the partition over. After
// the lease ended, the backup may have taken the partition over meanwhile
// (this node paused, or was cut off), and a member that has not heard of
// it would take the copy and grant a lease: two members would decide, the
// paused one from its old state. That holds for a copy to the backup
// itself too: it refuses a copy once it has taken over, but only as the
// process that did; one restarted since has forgotten the takeover (and
// where it handed the partition on) and takes the copy like any member
// that has not heard, and this node cannot count on having seen the
// restart (gossip reaches a node that paused or was cut off later than
// its own requests reach the backup's address). So every live member is
// asked first (one marked unreachable too, since the mark may be old and
// that member may be the old backup itself, which tells nobody else of
// its takeover before its own first copy; a marked one that is silent is
// asked again through the members that answered, since its port may be
// unreachable from this node only; only the silence of one that no relay
// reaches either, such as a crashed backup gossip still lists, is borne);
// a newer holding, or a complete copy of one, known anywhere makes this
// node learn it instead.
func (n *Node) stillHolder(ctx context.Context, pid int, epoch uint64, old, to string) bool {
	pt := &n.pt.parts[pid]
	if old == "" || n.mono() < pt.leaseUntil.Load() {
		return true
	}
	newest, ok := n.probeQuiet(ctx, pid, n.isUnreachable)
	if !ok {
		return false
	}
	if newest.otherEpoch > epoch {
		n.learn(pid, newest.other, newest.otherEpoch)
		n.log.Warn("partition lost to a newer holder while this node's lease had ended", "partition", pid, "owner", newest.other, "epoch", newest.otherEpoch)
		return false
	}
	return true
}

// copyTo streams partition pid (fenced by the caller) to member to as a
// complete copy at epoch newEpoch, in chunks of at most TransferChunkBytes.
// On success the partition is at newEpoch with to as its backup and a
// fresh lease.
func (n *Node) copyTo(ctx context.Context, pid int, to string, newEpoch uint64) error {
	pt := &n.pt.parts[pid]
	pt.mu.RLock()
	st := pt.store
	pt.mu.RUnlock()
	c, err := n.peerClient(to)
	if err != nil {
		return err
	}
	now := n.clock()
	pt.mu.RLock()
	holderEpoch, old := pt.epoch, pt.backup
	pt.mu.RUnlock()
	ops := []*peerpb.PartitionOp{{Kind: peerpb.PartitionOp_KIND_SYNC_BEGIN, Partition: uint32(pid), Epoch: newEpoch, HolderEpoch: holderEpoch}}
	size := 0
	flush := func(last bool) error {
		if last {
			ops = append(ops, &peerpb.PartitionOp{Kind: peerpb.PartitionOp_KIND_SYNC_END, Partition: uint32(pid), Epoch: newEpoch})
		}
		if st, ok := connReady(ctx, c.conn, n.cfg.ForwardTimeout); !ok {
			// Nothing is sent on a connection that is not up: the copy
			// fails with a known outcome (a member whose port never
			// answers does not leave the holder guessing).
			return fmt.Errorf("%w: copy partition %d to %s: connection %v", ErrUnavailable, pid, to, st)
		}
		sent := n.mono()
		fault := copySend
		if h := n.copyFault.Load(); h != nil {
			fault = (*h)(pid, to, last)
		}
		if fault == copyUnsent {
			return fmt.Errorf("%w: copy partition %d to %s: %w", ErrUnavailable, pid, to, errCopyUnsent)
		}
		rctx, cancel := context.WithTimeout(ctx, n.rpcTimeout())
		req := &peerpb.ReplicateRequest{Sender: n.name, Ops: ops}
		n.stampPolicies(req, to, opsPolicies(ops))
		resp, err := c.stub.Replicate(rctx, req)
		cancel()
		if err == nil && fault == copyAnswerLost {
			err = errCopyAnswerLost
		}
		if err == nil && len(resp.Results) != len(ops) {
			err = fmt.Errorf("%s answered %d results for %d operations", to, len(resp.Results), len(ops))
		}
		if err != nil {
			if last {
				// The request that completes the copy may have been
				// applied: the outcome is unknown.
				err = fmt.Errorf("%w: %w", errCopyUncertain, err)
			}
			return fmt.Errorf("%w: copy partition %d to %s: %w", ErrUnavailable, pid, to, withCtxErr(ctx, err))
		}
		for i, r := range resp.Results {
			if r.Status != peerpb.OpStatus_OP_STATUS_OK {
				e := ops[i].Epoch
				if r.Status == peerpb.OpStatus_OP_STATUS_STALE && r.Holder != n.name {
					// A copy refused as stale names the newer holding the
					// receiver knows of. Compare it with the epoch this
					// node holds the partition at, not the copy's: the copy
					// epoch is above ours and, after a few refusals, above
					// the newer holder's too, and a stale holder would then
					// never learn it, retrying its copy at ever higher
					// epochs.
					e = holderEpoch
				}
				n.applyOpResult(pid, e, to, r, sent)
				return fmt.Errorf("%w: %s refused partition %d copy: %v", ErrUnavailable, to, pid, r.Status)
			}
			if carried := len(ops[i].Keys); ops[i].Kind == peerpb.PartitionOp_KIND_SYNC_CHUNK && int(r.Accepted) < carried {
				// The receiver skipped keys of a policy its table does not
				// have, or has with another algorithm (a policy change
				// rolling out). A copy without them is not complete: as
				// backup or new holder it would start them empty. The
				// copy is retried until the tables agree.
				return fmt.Errorf("%w: %s recorded %d of %d keys of partition %d's copy (a policy it does not have, or has with another algorithm)",
					ErrUnavailable, to, r.Accepted, carried, pid)
			}
		}
		if last {
			if old != "" && old != to && n.mono() >= pt.leaseUntil.Load() {
				// The lease from the old backup ended before this copy was
				// known complete: the old backup may have taken the
				// partition over meanwhile (this node stalled after
				// stillHolder, or the copy was slow), and to, having heard
				// of nothing, has just granted a lease on our old state.
				if err := n.confirmHolding(ctx, pid, holderEpoch, to, newEpoch); err != nil {
					return err
				}
			}
			pt.mu.Lock()
			if pt.role == roleFenced || pt.role == roleHolder {
				pt.epoch = newEpoch
				pt.backup = to
				pt.needSync = false
				pt.leaseUntil.Store(sent + min(resp.Results[len(ops)-1].LeaseNs, int64(n.cfg.LeaseDuration))/10*9)
			}
			pt.copyFailingSince = 0
			pt.mu.Unlock()
			n.metrics.Backup("sent", "ok", 1)
		}
		ops, size = ops[:0], 0
		return nil
	}
	var ferr error
	tab := n.table.Load()
	if st != nil {
		st.Range(func(k Key) bool {
			ks, ok := st.Export(k, now)
			if !ok {
				return true
			}
			if p := tab.Lookup(k.Policy); p == nil || p.Shard.Algorithm != ks.Algorithm {
				// State this node no longer decides with: its policy was
				// removed, or changed algorithm (the key starts fresh at
				// its next decision). A receiver would skip it too.
				return true
			}
			w := stateToWire(ks)
			sz := 64 + len(k.Tenant) + len(k.Subject) + len(k.Policy) + 12*len(ks.Runs)
			if size+sz > n.cfg.TransferChunkBytes && size > 0 {
				if ferr = flush(false); ferr != nil {
					return false
				}
			}
			if len(ops) == 0 || ops[len(ops)-1].Kind != peerpb.PartitionOp_KIND_SYNC_CHUNK {
				ops = append(ops, &peerpb.PartitionOp{Kind: peerpb.PartitionOp_KIND_SYNC_CHUNK, Partition: uint32(pid), Epoch: newEpoch})
			}
			op := ops[len(ops)-1]
			op.Keys = append(op.Keys, w)
			size += sz
			return true
		})
	}
	if ferr != nil {
		return ferr
	}
	return flush(true)
}

// confirmHolding asks every live member (as stillHolder does) whether
// anyone holds partition pid, which this node held at epoch and has just
// copied to member to at newEpoch, at a newer epoch. Only when
// nobody does may the copy's lease be used. Otherwise the copy is released
// (it holds a stale state and equals the newer holding's epoch, so a
// takeover from it would not know it stale) and an error returned: the
// newer holder is learned, or, when some member did not answer, the
// partition stays with its old backup, whose lease has ended, until a copy
// can be confirmed.
func (n *Node) confirmHolding(ctx context.Context, pid int, epoch uint64, to string, newEpoch uint64) error {
	newest, ok := n.probeQuiet(ctx, pid, n.isUnreachable)
	if ok && newest.otherEpoch <= epoch {
		return nil
	}
	n.release(to, pid, newEpoch)
	if !ok {
		return fmt.Errorf("%w: copy partition %d to %s: the lease ended during the copy and not every member answered whether the partition was taken over", ErrUnavailable, pid, to)
	}
	n.learn(pid, newest.other, newest.otherEpoch)
	n.log.Warn("partition lost to a newer holder while this node copied it", "partition", pid, "owner", newest.other, "epoch", newest.otherEpoch, "peer", to)
	return fmt.Errorf("%w: copy partition %d to %s: %s holds it at epoch %d", ErrUnavailable, pid, to, newest.other, newest.otherEpoch)
}

// reachableForCopy reports whether partition pid's copy to member to can
// start: its connection is up. Checked before the partition is fenced, so
// a member whose port does not answer (a new target or backup) does not
// fence the partition round after round for nothing.
func (n *Node) reachableForCopy(ctx context.Context, pid int, to string) bool {
	c, err := n.peerClient(to)
	if err != nil {
		n.copyFailed(pid, "partition copy failed", to, err)
		return false
	}
	if st, ok := connReady(ctx, c.conn, n.cfg.ForwardTimeout); !ok {
		n.copyFailed(pid, "partition copy failed", to, fmt.Errorf("%w: connection to %s %v", ErrUnavailable, to, st))
		if st == connectivity.TransientFailure && n.ctx.Err() == nil {
			// Gossip lists it, its port does not answer: neither a
			// target nor a backup while the mark lasts (it is probed
			// again every ten leases).
			n.markUnreachable(to)
			n.kickOwnership()
		}
		return false
	}
	return true
}

// connReady reports whether conn is up, connecting it if idle and waiting
// at most d while it connects. A connection that failed is not waited for.
func connReady(ctx context.Context, conn *grpc.ClientConn, d time.Duration) (connectivity.State, bool) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	for {
		st := conn.GetState()
		switch st {
		case connectivity.Ready:
			return st, true
		case connectivity.Idle:
			conn.Connect()
		case connectivity.TransientFailure, connectivity.Shutdown:
			return st, false
		}
		if !conn.WaitForStateChange(ctx, st) {
			return st, false
		}
	}
}

// copyFault is what a test makes of one request of a partition copy.
type copyFault uint8

const (
	copySend       copyFault = iota // as usual
	copyAnswerLost                  // sent and applied; the answer is lost
	copyUnsent                      // never sent
)

var (
	errCopyAnswerLost = errors.New("peer: copy answer lost (test)")
	errCopyUnsent     = errors.New("peer: copy request not sent (test)")
	// errCopyUncertain marks a copy whose completing request got no
	// answer: the receiver may keep it complete.
	errCopyUncertain = errors.New("peer: outcome unknown")
)

// copyEpoch returns the epoch for a new copy of partition pid, which this
// node holds: above its holding and above every copy it has begun before,
// and records it.
func (n *Node) copyEpoch(pid int) uint64 {
	pt := &n.pt.parts[pid]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	pt.copiedEpoch = max(pt.epoch, pt.copiedEpoch) + 1
	return pt.copiedEpoch
}

// afterUncertainCopy handles a copy of partition pid (fenced) to member to
// whose completing request got no answer: to may keep a complete copy at a
// newer epoch than the backup's, which would win a takeover. The current
// backup, if another member, gets a new copy at a newer epoch still, at
// once, and the partition goes on with it; else (no backup, or it is to,
// or that copy fails too) copyUncertain.
func (n *Node) afterUncertainCopy(ctx context.Context, pid int, to string) {
	pt := &n.pt.parts[pid]
	pt.mu.RLock()
	backup := pt.backup
	pt.mu.RUnlock()
	if backup != "" && backup != to && n.alive(backup) {
		err := n.copyTo(ctx, pid, backup, n.copyEpoch(pid))
		if err == nil {
			n.log.Info("partition copy's outcome unknown: copied again to the backup at a newer epoch", "partition", pid, "peer", to, "backup", backup)
			return
		}
		if errors.Is(err, errCopyUncertain) {
			to = backup // the newest copy that may exist
		}
	}
	n.copyUncertain(pid, to)
}

// copyUncertain records that the last request of a copy of partition pid
// to member to, the one that completes it, got no answer: to may now keep
// a complete copy, newer than the backup's. Until a new copy succeeds, to
// counts as the backup and the partition has no lease, so nothing is
// decided that to's copy would lack; the next copy has a newer epoch, so
// it supersedes to's copy wherever it lands.
func (n *Node) copyUncertain(pid int, to string) {
	pt := &n.pt.parts[pid]
	pt.mu.Lock()
	if pt.role == roleHolder || pt.role == roleFenced {
		pt.backup = to
		pt.needSync = true
		pt.leaseUntil.Store(0)
	}
	pt.mu.Unlock()
}

// transfer moves partition pid to its target: a complete copy on the
// target first (it becomes the backup), then, fenced, Promote. After the
// target accepts, this node keeps a forwarding record. If the promote's
// outcome is unknown the partition stays fenced: settleFenced finds out.
func (n *Node) transfer(ctx context.Context, pid int, to string) {
	pt := &n.pt.parts[pid]
	pt.mu.RLock()
	epoch, backup := pt.epoch, pt.backup
	pt.mu.RUnlock()
	if !n.reachableForCopy(ctx, pid, to) || !n.stillHolder(ctx, pid, epoch, backup, to) {
		return
	}
	if !n.fence(pid, epoch) {
		return
	}
	// Always a fresh complete copy, made while fenced: even when the
	// target is already the backup, its copy lacks the admissions of
	// async policies still in flight and every admission of policies with
	// replication off, and a graceful move must keep them all.
	if err := n.copyTo(ctx, pid, to, n.copyEpoch(pid)); err != nil {
		if errors.Is(err, errCopyUncertain) {
			n.afterUncertainCopy(ctx, pid, to)
		}
		n.unfence(pid)
		n.copyFailed(pid, "partition transfer: copy failed", to, err)
		return
	}
	if backup != "" && backup != to {
		n.release(backup, pid, epoch)
	}
	n.promote(ctx, pid, to)
}

// promote asks to (the backup with our complete copy) to take partition
// pid over; the partition is fenced.
func (n *Node) promote(ctx context.Context, pid int, to string) {
	pt := &n.pt.parts[pid]
	pt.mu.Lock()
	epoch := pt.epoch
	pt.promotedAt = n.mono()
	pt.mu.Unlock()
	c, err := n.peerClient(to)
	if err == nil {
		var resp *peerpb.PromoteResponse
		rctx, cancel := context.WithTimeout(ctx, n.rpcTimeout())
		resp, err = c.stub.Promote(rctx, n.promoteRequest(pid, epoch))
		cancel()
		if err == nil && !resp.Ok {
			if resp.Epoch > epoch && resp.Holder != "" {
				// Someone already holds it at a newer epoch.
				n.learn(pid, resp.Holder, resp.Epoch)
				return
			}
			// Refused (for example the target is closing): stay holder;
			// reconcile tries again with the next ring.
			n.unfence(pid)
			n.warnThrottled("partition transfer refused", "partition", pid, "peer", to, "err", resp.Error)
			return
		}
	}
	if err != nil {
		// Unknown outcome: the target may hold the partition now. Stay
		// fenced; settleFenced asks again or finds out who holds it.
		n.warnThrottled("partition transfer: promote failed", "partition", pid, "peer", to, "err", err)
		return
	}
	pt.mu.Lock()
	if pt.role == roleFenced && pt.epoch == epoch {
		keys := 0
		if pt.store != nil {
			keys = pt.store.Len()
		}
		// Our fenced state is exactly what the new holder started from:
		// it becomes our copy of its partition at the new epoch, and the
		// lease the new holder counts on starts now on our clock (after it
		// started on the new holder's).
		if pt.releasedBy != to || pt.releasedEpoch < epoch+1 {
			pt.rep = replica{holder: to, epoch: epoch + 1, holderEpoch: epoch + 1, complete: pt.store != nil, store: pt.store, leaseEnd: n.mono() + int64(n.cfg.LeaseDuration), made: n.mono()}
		}
		pt.store = nil
		pt.backup = ""
		pt.leaseUntil.Store(0)
		pt.setRoleLocked(roleMoved, to, epoch+1, n.clock())
		n.metrics.Handoff("sent", "ok", keys)
	}
	pt.mu.Unlock()
	n.log.Debug("partition transferred", "partition", pid, "peer", to, "epoch", epoch+1)
}

// settleFenced resolves a fenced partition whose promote failed: ask the
// target again while it lives; once it is gone, wait out the lease the
// promote may have given it, then ask every member whether anyone holds
// the partition at a newer epoch, and if nobody does, take it back (our
// copy is complete: the target could not decide before it established its
// own backup for synchronous policies).
//
// A promote whose answer was lost may have taken effect: the target then
// held the partition at epoch + 1, deciding under a lease that counts from
// when it applied the promote, and may have made this node its backup
// since (a copy at a newer epoch, kept in rep). A target gossip calls
// failed may still run (cut off, or its failure detected faster than its
// lease ends), and a promote delayed before the target applies it gives
// it a lease only within 9/10 of the promote's timeout of the copy's
// completion, on the target's clock (server.promote): so this node
// takes nothing back before the promote's timeout and that lease have
// passed on its own clock since it sent the promote (as a backup waits
// out the lease it granted), continues from its copy of the target's
// holding if it has one (the takeover path), and otherwise takes the
// partition back above every epoch the target may hold it at, so the
// target's messages are stale.
func (n *Node) settleFenced(ctx context.Context, pid int) {
	pt := &n.pt.parts[pid]
	pt.mu.RLock()
	epoch, backup, promotedAt := pt.epoch, pt.backup, pt.promotedAt
	pt.mu.RUnlock()
	if backup != "" && n.alive(backup) {
		n.promote(ctx, pid, backup)
		return
	}
	if promotedAt != 0 && n.mono()-promotedAt <= int64(n.rpcTimeout()+n.cfg.LeaseDuration) {
		// The target may still decide under the promote's lease: it
		// takes one only within 9/10 of rpcTimeout of the copy's
		// completion (before we sent the promote) and counts it from
		// then.
		return
	}
	if !n.quorum() {
		return
	}
	newest, ok := n.probe(ctx, pid)
	if !ok {
		return
	}
	if newest.epoch > epoch {
		n.learn(pid, newest.holder, newest.epoch)
		return
	}
	pt.mu.Lock()
	if pt.role != roleFenced || pt.epoch != epoch {
		pt.mu.Unlock()
		return
	}
	if pt.rep.complete && pt.rep.epoch > epoch {
		// The promote took effect and the target made us its backup: it
		// holds the partition. Our copy of its holding is what a takeover
		// continues from, once the lease we granted it has ended.
		holder, repEpoch := pt.rep.holder, pt.rep.epoch
		pt.learnLocked(holder, repEpoch, n.clock())
		pt.mu.Unlock()
		n.log.Warn("partition transfer settled: the target holds the partition with this node as its backup", "partition", pid, "peer", holder, "epoch", repEpoch)
		return
	}
	pt.backup = ""
	pt.needSync = false
	// Above epoch + 1 (the promote's) and any copy begun towards us.
	pt.epoch = max(epoch+1, newest.epoch, pt.rep.epoch, pt.next.epoch) + 1
	pt.setRoleLocked(roleHolder, n.name, pt.epoch, n.clock())
	pt.mu.Unlock()
	n.log.Warn("partition transfer abandoned: target gone, partition kept", "partition", pid, "peer", backup)
}

// takeOver makes this node, the backup of a failed holder, the holder of
// partition pid at the copy's epoch + 1, once the lease has expired, the
// node sees a majority, no live member knows a newer epoch, no live
// member holds the partition at the copy's epoch or above the epoch the
// copy's holder held it at when the copy began, no other member keeps a
// complete copy at the copy's epoch that comes first (copyClaim.above),
// and the holder has neither probed this node nor renewed its lease
// between the takeover's probe and its commit.
func (n *Node) takeOver(ctx context.Context, pid int) {
	n.own.mu.Lock()
	stopped := n.own.stopped
	n.own.mu.Unlock()
	if stopped || !n.quorum() {
		return
	}
	pt := &n.pt.parts[pid]
	pt.mu.RLock()
	rep := pt.rep
	probes := pt.holderProbes.Load()
	pt.mu.RUnlock()
	newest, ok := n.probe(ctx, pid)
	if !ok {
		return
	}
	if h := n.takeoverHook.Load(); h != nil {
		(*h)(pid)
	}
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if !pt.rep.complete || pt.rep.epoch != rep.epoch || pt.role == roleHolder || pt.role == roleFenced {
		return
	}
	if pt.holderProbes.Load() != probes || n.mono() <= pt.rep.leaseEnd {
		// Between our probe and now, the copy's holder probed us, and we
		// answered that we keep only its copy: it may have confirmed a
		// new copy's lease on that (confirmHolding, stillHolder) and
		// decide. Or we granted it a lease again (a heartbeat or an
		// admission arrived). Either way it is alive: no takeover now;
		// reconcile tries again, and the next probe finds its new copy.
		n.log.Info("partition takeover given up: its holder reached this node during the takeover", "partition", pid, "peer", rep.holder, "epoch", rep.epoch)
		return
	}
	if newest.epoch > rep.epoch || newest.heldBy != "" && newest.heldBy != rep.holder && (newest.heldEpoch >= rep.epoch || rep.holderEpoch != 0 && newest.heldEpoch > rep.holderEpoch) {
		// Our copy is stale: someone moved on. A live member holding the
		// partition at our copy's very epoch counts too: epochs of a
		// takeover and of a copy begun by a holder that stalled can be
		// equal (a copy whose release was lost after its holder found it
		// taken over), and a tie must never go to the copy of a holder
		// that is gone, while the other decides. So does a live member
		// holding it above the epoch our copy's holder held it at when
		// the copy began, even below the copy's own epoch: a copy's epoch
		// runs ahead of its holder's (attempts that failed spend epochs),
		// and a member that took the partition over from that holder (at
		// holder epoch + 1) may decide at it, with no copy of its own
		// made yet.
		holder, epoch := newest.holder, newest.epoch
		if epoch <= rep.epoch {
			holder, epoch = newest.heldBy, newest.heldEpoch
		}
		pt.rep = replica{}
		pt.next = replica{}
		pt.learnLocked(holder, epoch, n.clock())
		return
	}
	mine := copyClaim{keeper: n.name, holder: rep.holder, epoch: rep.epoch, holderEpoch: rep.holderEpoch}
	if top := newest.topCopy; top.keeper != "" && top.epoch == rep.epoch && top.above(mine) {
		// Another member keeps a complete copy at our copy's very epoch,
		// of another holding (or one we cannot order against ours): a
		// holder that stalled mid-copy completed its copy after it had
		// been taken over, and the release of that copy was lost; both
		// holders are gone. Each of the two copies' keepers would take
		// over at epoch + 1 and decide. Only the first copy in copyClaim
		// order is taken over (the newer holding's): we keep ours, unused,
		// until the next probe finds the other keeper's holding, at a
		// newer epoch, and drops it (or finds that copy gone).
		n.log.Info("partition takeover deferred: another member keeps a copy at the same epoch that comes first", "partition", pid, "peer", rep.holder, "epoch", rep.epoch,
			"holder_epoch", rep.holderEpoch, "other", top.keeper, "other_holder", top.holder, "other_holder_epoch", top.holderEpoch)
		return
	}
	pt.store = rep.store
	if pt.store == nil {
		pt.store = n.newPartStore()
	}
	pt.rep = replica{}
	pt.next = replica{}
	pt.backup = ""
	pt.needSync = false
	pt.leaseUntil.Store(0)
	pt.setRoleLocked(roleHolder, n.name, rep.epoch+1, n.clock())
	keys := pt.store.Len()
	n.metrics.Handoff("takeover", "ok", keys)
	n.log.Debug("partition taken over from failed holder", "partition", pid, "peer", rep.holder, "epoch", rep.epoch+1, "keys", keys)
	n.tallyTakeover(rep.holder, keys, rep.leaseEnd)
}

// tallyTakeover adds one partition (and its keys) taken over from holder
// to the tally logTakeovers logs; leaseEnd is when holder's lease ended
// (monotonic ns; 0 when not known, as in log mode).
func (n *Node) tallyTakeover(holder string, keys int, leaseEnd int64) {
	now := n.mono()
	n.own.mu.Lock()
	defer n.own.mu.Unlock()
	t := n.own.tookOver[holder]
	t.partitions++
	t.keys += keys
	if t.first == 0 {
		t.first = now
	}
	t.last = now
	if leaseEnd != 0 {
		t.wait = max(t.wait, now-leaseEnd)
	}
	n.own.tookOver[holder] = t
}

// orphanSuspect reports whether partition pt, whose target this node is,
// may have no holder at all: the node knows no live holder, and has known
// none for longer than two leases plus failure detection could explain.
// A holder the node believes in that is alive but has not moved the
// partition here for that long is asked too (at most once a grace): a
// belief can outlive its truth (a record learned from a process that has
// since gone), and nothing else would ever correct it.
func (n *Node) orphanSuspect(v *view, pt *part) bool {
	pt.mu.RLock()
	holder, since, probed := pt.holder, pt.since, pt.probedAt
	pt.mu.RUnlock()
	ref := since
	if v.since.After(ref) {
		ref = v.since
	}
	if time.Since(ref) <= n.orphanGrace() {
		return false
	}
	// A holder that came back as a new process since we learned of it holds
	// nothing: that counts as gone.
	if holder != "" && n.alive(holder) && !n.restartedSince(holder, int64(since.Sub(n.started))) {
		return probed == 0 || n.mono()-probed > int64(n.orphanGrace())
	}
	return true
}

// orphanGrace is how long a target waits, after it last saw a holder or a
// membership change, before it asks whether the partition has a holder.
func (n *Node) orphanGrace() time.Duration { return 2*n.cfg.LeaseDuration + 2*time.Second }

// claimOrphan restarts partition pid empty at a new epoch when no live
// member holds it, moves it or keeps a copy: its holder and backup have
// both failed (the two-fault case), and the state is lost.
func (n *Node) claimOrphan(ctx context.Context, pid int) {
	if !n.quorum() {
		return
	}
	pt := &n.pt.parts[pid]
	pt.mu.Lock()
	pt.probedAt = n.mono()
	pt.mu.Unlock()
	newest, ok := n.probe(ctx, pid)
	if ok && !newest.held && newest.myCopy != "" {
		// Nobody holds the partition, but a member keeps a complete copy
		// of our own holding: a record that made us let go was wrong, and
		// the copy's keeper waits for us, alive, to act. Promote it, as at
		// the end of a transfer; it moves the partition on to its target.
		n.promoteCopy(ctx, pid, newest.myCopy, newest.myCopyEpoch)
		return
	}
	if !ok || newest.active {
		if ok && newest.holder != "" {
			n.learn(pid, newest.holder, newest.epoch)
		}
		return
	}
	pt.mu.Lock()
	if pt.role == roleHolder || pt.role == roleFenced || pt.rep.complete {
		pt.mu.Unlock()
		return
	}
	epoch := max(pt.epoch, newest.epoch) + 1
	pt.store = n.newPartStore()
	pt.backup = ""
	pt.setRoleLocked(roleHolder, n.name, epoch, n.clock())
	pt.mu.Unlock()
	n.metrics.Handoff("lost", "orphaned", 1)
	n.log.Error("partition state lost: holder and backup both failed; restarted empty", "partition", pid, "epoch", epoch)
}

// probeResult is the newest knowledge of a partition among live members.
type probeResult struct {
	holder string
	epoch  uint64
	// active is set when some live member holds the partition, is moving
	// it, or keeps a complete copy (it will take it over).
	active bool
	// held is set when some live member holds the partition or is moving
	// it.
	held bool
	// myCopy is the member keeping the newest complete copy of this
	// node's own holding (at myCopyEpoch), "" if none.
	myCopy      string
	myCopyEpoch uint64
	// other is the member with the newest holding of the partition, or
	// the newest complete copy of one, that is not this node's (at
	// otherEpoch), "" if none.
	other      string
	otherEpoch uint64
	// heldBy is the member holding (or moving) the partition at the
	// newest epoch (heldEpoch) among those that answered, "" if none.
	heldBy    string
	heldEpoch uint64
	// topCopy is the first, in copyClaim order, of the complete copies the
	// members that answered keep (keeper "" if none).
	topCopy copyClaim
}

// copyClaim is a complete copy of a partition that keeper keeps: of
// holder's holding, made at epoch while holder held it at holderEpoch (0:
// not known, from a member of an older version).
type copyClaim struct {
	keeper, holder     string
	epoch, holderEpoch uint64
}

// above reports whether copy c comes before copy o: the newer epoch; at
// one epoch, the newer holding it was made from (an unknown one first, so
// that a member that cannot order copies never makes its own copy win
// over another's it cannot see into: an older member would take its copy
// over whatever this one does), then the larger holder's name, then the
// larger keeper's name. It is a strict total order on copies of distinct
// keepers, so of two members that probe each other and see each other's
// copy, exactly one finds its own first.
func (c copyClaim) above(o copyClaim) bool {
	if c.epoch != o.epoch {
		return c.epoch > o.epoch
	}
	ch, oh := c.holderEpoch, o.holderEpoch
	if ch == 0 {
		ch = math.MaxUint64
	}
	if oh == 0 {
		oh = math.MaxUint64
	}
	if ch != oh {
		return ch > oh
	}
	if c.holder != o.holder {
		return c.holder > o.holder
	}
	return c.keeper > o.keeper
}

// probe asks every other live member about partition pid. ok is false if
// any of them did not answer: the caller must not act on partial news.
func (n *Node) probe(ctx context.Context, pid int) (probeResult, bool) {
	return n.probeQuiet(ctx, pid, nil)
}

// probeQuiet is probe where the members quiet reports true for are asked
// too, but their silence does not make ok false. A member marked
// unreachable is asked all the same: the mark may be old, and it may be
// the very member whose news matters (a backup that took the partition
// over while its holder stalled, and has told nobody else yet). One that
// does not answer is asked again through every member that did (a relayed
// probe, with this node as its sender): its port may be unreachable from
// this node only, while it decides. Its silence is borne only when no
// relay reaches it either (a crashed backup gossip still lists, a wedged
// port).
func (n *Node) probeQuiet(ctx context.Context, pid int, quiet func(string) bool) (probeResult, bool) {
	v := n.view.Load()
	var mu sync.Mutex
	var res probeResult
	ok := true
	var silent, answered []string
	// merge adds member m's answer to res; called with mu held.
	merge := func(m string, in *peerpb.PartitionInfo) {
		if in.Epoch > res.epoch && in.Holder != "" {
			res.holder, res.epoch = in.Holder, in.Epoch
		}
		if in.ReplicaEpoch > res.epoch {
			res.holder, res.epoch = in.ReplicaHolder, in.ReplicaEpoch
		}
		if in.Epoch > res.otherEpoch && in.Holder != "" && in.Holder != n.name {
			res.other, res.otherEpoch = in.Holder, in.Epoch
		}
		if in.ReplicaEpoch > res.otherEpoch && in.ReplicaHolder != n.name {
			res.other, res.otherEpoch = in.ReplicaHolder, in.ReplicaEpoch
		}
		switch role(in.Role) {
		case roleHolder, roleFenced:
			res.active, res.held = true, true
			if in.Epoch > res.heldEpoch {
				res.heldBy, res.heldEpoch = m, in.Epoch
			}
		}
		if in.ReplicaEpoch > 0 {
			res.active = true
			claim := copyClaim{keeper: m, holder: in.ReplicaHolder, epoch: in.ReplicaEpoch, holderEpoch: in.ReplicaHolderEpoch}
			if res.topCopy.keeper == "" || claim.above(res.topCopy) {
				res.topCopy = claim
			}
			if in.ReplicaHolder == n.name && in.ReplicaEpoch > res.myCopyEpoch {
				res.myCopy, res.myCopyEpoch = m, in.ReplicaEpoch
			}
		}
	}
	// ask sends the probe of pid to via (for m: via itself, or a relay)
	// and returns m's answer, nil if none.
	ask := func(via, m string) *peerpb.PartitionInfo {
		c, err := n.peerClient(via)
		if err != nil {
			return nil
		}
		req := &peerpb.ProbeRequest{Sender: n.name, Partitions: []uint32{uint32(pid)}}
		timeout := n.cfg.ForwardTimeout
		if via != m {
			req.Relay = m
			timeout *= 2 // two hops
		}
		cctx, cancel := context.WithTimeout(ctx, timeout)
		resp, err := c.stub.Probe(cctx, req)
		cancel()
		if err != nil || len(resp.Partitions) != 1 || via != m && resp.AnsweredBy != m {
			return nil
		}
		return resp.Partitions[0]
	}
	var wg sync.WaitGroup
	for m := range v.alive {
		if m == n.name {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := ask(m, m)
			mu.Lock()
			defer mu.Unlock()
			if in == nil {
				if quiet == nil || !quiet(m) {
					ok = false
				} else {
					silent = append(silent, m)
				}
				return
			}
			answered = append(answered, m)
			merge(m, in)
		}()
	}
	wg.Wait()
	if !ok {
		return res, false
	}
	for _, m := range silent {
		for _, via := range answered {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if in := ask(via, m); in != nil {
					mu.Lock()
					merge(m, in)
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	return res, ok
}

// promoteRequest asks a copy's keeper to hold partition pid from our
// holding at epoch on, telling it our lease length (server.promote takes
// the shorter of it and its own).
func (n *Node) promoteRequest(pid int, epoch uint64) *peerpb.PromoteRequest {
	return &peerpb.PromoteRequest{Sender: n.name, Partition: uint32(pid), Epoch: epoch, LeaseNs: int64(n.cfg.LeaseDuration)}
}

// promoteCopy asks member to, which keeps a complete copy of this node's
// holding of partition pid at epoch, to hold the partition at epoch + 1.
// This node does not hold the partition (nobody does): it only hands its
// old holding over to the copy, as a transfer's last step would.
func (n *Node) promoteCopy(ctx context.Context, pid int, to string, epoch uint64) {
	c, err := n.peerClient(to)
	if err != nil {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, n.rpcTimeout())
	resp, err := c.stub.Promote(rctx, n.promoteRequest(pid, epoch))
	cancel()
	switch {
	case err != nil:
		n.warnThrottled("partition restore: promote failed", "partition", pid, "peer", to, "err", err)
	case resp.Ok:
		n.learn(pid, to, resp.Epoch)
		n.log.Warn("partition had no holder: its backup copy was promoted", "partition", pid, "peer", to, "epoch", resp.Epoch)
	case resp.Epoch > epoch+1 && resp.Holder != "":
		n.learn(pid, resp.Holder, resp.Epoch)
	default:
		n.warnThrottled("partition restore refused", "partition", pid, "peer", to, "err", resp.Error)
	}
}

// learn records a newer holder of pid.
func (n *Node) learn(pid int, holder string, epoch uint64) {
	if pid < 0 || pid >= len(n.pt.parts) || holder == "" {
		return
	}
	pt := &n.pt.parts[pid]
	pt.mu.Lock()
	pt.learnLocked(holder, epoch, n.clock())
	pt.mu.Unlock()
}

// newPartStore returns an empty store for one partition's keys. MaxKeys is
// shared out: each partition may hold twice its even share.
func (n *Node) newPartStore() *shard.Store {
	cfg := n.cfg.Store
	cfg.Stripes = partStripes
	if cfg.MaxKeys > 0 {
		cfg.MaxKeys = max(64, 2*cfg.MaxKeys/len(n.pt.parts))
	}
	st, err := shard.NewStore(cfg)
	if err != nil {
		// cfg was validated in New; NewStore only fails on bad values.
		panic(fmt.Sprintf("peer: partition store: %v", err))
	}
	return st
}

// partStripes is the lock stripes of one partition's store.
const partStripes = 16

// found makes this node the holder of every partition at epoch 1: it
// starts a new cluster.
func (n *Node) found() {
	now := n.clock()
	for i := range n.pt.parts {
		pt := &n.pt.parts[i]
		pt.mu.Lock()
		pt.store = n.newPartStore()
		pt.setRoleLocked(roleHolder, n.name, 1, now)
		pt.mu.Unlock()
	}
}

// drain transfers every partition this node holds before it leaves: the
// node is already draining (not a target anywhere). It retries until ctx
// ends and reports the partitions (and keys) it could not move.
func (n *Node) drain(ctx context.Context) error {
	// Takeovers go on while the node drains: a holder that fails now,
	// before it has copied its partition to another member, leaves this
	// node the only copy, which is taken over and handed on with the
	// rest. Once the drain ends the node takes nothing new over.
	defer func() {
		n.own.mu.Lock()
		n.own.stopped = true
		n.own.mu.Unlock()
	}()
	pause := time.NewTicker(50 * time.Millisecond)
	defer pause.Stop()
	start := time.Now()
	held0, keys0 := n.heldPartitions()
	var emptySince time.Time
	for {
		n.reconcile()
		held, keys := n.heldPartitions()
		if held == 0 && emptySince.IsZero() {
			emptySince = time.Now()
		}
		// Nothing held, and every holder that used us as its backup has a
		// copy elsewhere (we refuse leases while closing) — or two leases
		// have passed since we held nothing and each holder still listing
		// us answers that it has moved on (its release to us was lost).
		// Not on time alone: a holder gossip still lists may have crashed
		// before it copied elsewhere, and failure detection can take
		// longer than two leases (the LAN profile's 5.8 s against the
		// default lease's 4 s); our copy is then its partition's only
		// state. A copy of a holder that has gone is waited for
		// (reconcile takes it over once the lease we granted has ended,
		// and the next rounds hand it on) while this node sees a
		// majority, without which nobody takes anything over.
		if held == 0 && (n.replicasHeld() == 0 || time.Since(emptySince) > 2*n.cfg.LeaseDuration && n.holdersMovedOn(ctx)) &&
			(n.copiesOfGoneHolders() == 0 || !n.quorum()) {
			n.log.Info("handoff on leave", "partitions", held0, "keys", keys0, "duration", time.Since(start), "copies_left", n.replicasHeld())
			return nil
		}
		if v := n.view.Load(); v.snap.Has(n.name) || v.stopping {
			// Our ring still names us (excludeSelf found no other member
			// that is not leaving), or every live member is leaving:
			// the whole cluster is stopping, and nobody would take the
			// partitions over.
			n.log.Info("last member leaving: partitions end with the cluster", "partitions", held, "keys", keys)
			return nil
		}
		if held == 0 {
			n.logReplicasHeld()
		}
		select {
		case <-ctx.Done():
			if held == 0 {
				n.log.Warn("leaving while holders still keep their copies here", "partitions", n.replicasHeld())
				return nil
			}
			n.metrics.Handoff("sent", "failed", keys)
			err := fmt.Errorf("peer: %d partitions (%d keys) not handed off: %w", held, keys, ctx.Err())
			n.log.Error("partitions not handed off", "partitions", held, "keys", keys, "err", ctx.Err())
			return err
		case <-pause.C:
		}
	}
}

// heldPartitions counts the partitions this node holds or is moving, and
// their keys.
func (n *Node) heldPartitions() (parts, keys int) {
	for i := range n.pt.parts {
		pt := &n.pt.parts[i]
		pt.mu.RLock()
		if pt.role == roleHolder || pt.role == roleFenced {
			parts++
			if pt.store != nil {
				keys += pt.store.Len()
			}
		}
		pt.mu.RUnlock()
	}
	return parts, keys
}

var errNoPeer = errors.New("peer: member not in view")

// excludeSelf rebuilds the node's ring without itself (it is draining, so
// it is nobody's target) and waits, briefly, for the new view. When every
// member is leaving (this one the last), the rebuild keeps the ring and
// marks the view stopping: that view ends the wait too.
func (n *Node) excludeSelf(ctx context.Context) {
	ch := n.viewChanged()
	n.nudge()
	t := time.NewTimer(200 * time.Millisecond)
	defer t.Stop()
	for v := n.view.Load(); v.snap.Has(n.name) && !v.stopping; v = n.view.Load() {
		select {
		case <-ch:
			ch = n.viewChanged()
		case <-t.C:
			return // no other member: the ring keeps only us
		case <-ctx.Done():
			return
		}
	}
}

// Settled reports whether ownership on this node matches its ring: it
// holds, not fenced, every partition its ring names it the target of, each
// with its backup copy in place when the ring has another member, and
// holds none that belong to another member. A cluster whose members are
// all settled (and agree on the members) has finished moving partitions.
func (n *Node) Settled() bool {
	v := n.view.Load()
	if n.lo != nil {
		return n.lo.settled(v)
	}
	for i := range n.pt.parts {
		pt := &n.pt.parts[i]
		pt.mu.RLock()
		r, backup, needSync := pt.role, pt.backup, pt.needSync
		pt.mu.RUnlock()
		mine := r == roleHolder || r == roleFenced
		if r == roleFenced {
			return false
		}
		if target := v.snap.PartitionOwner(i); (target == n.name) != mine && !(mine && n.keepsAsTarget(v, i)) {
			return false
		}
		if mine && (needSync || backup != n.desiredBackup(v, i)) {
			return false
		}
	}
	return true
}

// replicasHeld counts the partitions this node keeps a complete copy of
// for a live holder (copiesOfGoneHolders counts the others).
func (n *Node) replicasHeld() int {
	c := 0
	n.eachCopy(func(_ int, rep replica, _ role) {
		if n.alive(rep.holder) {
			c++
		}
	})
	return c
}

// eachCopy calls fn for every partition this node keeps a complete copy
// of, with the copy and the partition's role, read under the partition's
// lock; fn runs without it.
func (n *Node) eachCopy(fn func(pid int, rep replica, r role)) {
	for i := range n.pt.parts {
		pt := &n.pt.parts[i]
		pt.mu.RLock()
		rep, r := pt.rep, pt.role
		pt.mu.RUnlock()
		if rep.complete {
			fn(i, rep, r)
		}
	}
}

// holdersMovedOn reports whether every live holder this node, leaving,
// keeps a complete copy for has moved on from it: asked (Probe), the
// holder holds the partition at a newer epoch than the copy (a copy
// elsewhere replaced it), or knows of a holding at a newer epoch (it
// handed the partition on). A holder that does not
// answer may have crashed before gossip says so, with the copy here the
// only state of its partition: it has not moved on, and the copy waits
// for its failure to be seen (and taken over) or for the drain's
// deadline. A holder whose ring has no other member to copy to cannot
// move on; its answer is enough (alone, it decides without a backup).
func (n *Node) holdersMovedOn(ctx context.Context) bool {
	v := n.view.Load()
	pids := map[string][]uint32{}
	epochs := map[uint32]uint64{}
	n.eachCopy(func(pid int, rep replica, _ role) {
		if n.alive(rep.holder) {
			pids[rep.holder] = append(pids[rep.holder], uint32(pid))
			epochs[uint32(pid)] = rep.epoch
		}
	})
	for holder, ps := range pids {
		c, err := n.peerClient(holder)
		if err != nil {
			return false
		}
		cctx, cancel := context.WithTimeout(ctx, n.cfg.ForwardTimeout)
		resp, err := c.stub.Probe(cctx, &peerpb.ProbeRequest{Sender: n.name, Partitions: ps})
		cancel()
		if err != nil || len(resp.Partitions) != len(ps) {
			return false
		}
		others := false
		for _, m := range v.snap.Members() {
			others = others || m != holder
		}
		for _, in := range resp.Partitions {
			// Moved on only to a newer epoch: a holder that copied
			// elsewhere holds at one, one that handed the partition on
			// forwards to one. An answer that knows nothing newer than
			// our copy — no holding at all included — is not enough: it
			// may come from a new process under the holder's name (a
			// crash and a restart our gossip has not told us of), which
			// knows nothing of the partition whose only state is here.
			if others && in.Epoch <= epochs[in.Partition] {
				return false
			}
		}
	}
	return true
}

// copiesOfGoneHolders counts the partitions this node keeps a complete
// copy of for a holder that has gone (failed, or come back as a new
// process): reconcile takes them over once the lease granted has ended.
func (n *Node) copiesOfGoneHolders() int {
	c := 0
	n.eachCopy(func(_ int, rep replica, r role) {
		if r != roleHolder && r != roleFenced && (!n.alive(rep.holder) || n.restartedSince(rep.holder, rep.made)) {
			c++
		}
	})
	return c
}

// dropBackup releases partition pid's backup when no member can keep a
// copy: the holder decides alone from now on (with quorum).
func (n *Node) dropBackup(pid int, epoch uint64, backup string) {
	// The caller decided on a view that may be old by now: a rebuild that
	// brings the others back publishes its view, then stops counting them
	// as failed, and an old view without them beside the new count would
	// be a majority of one. So again on the current view: the majority
	// first, then (on a view at least as new) no member for the copy.
	if !n.quorum() || n.desiredBackup(n.view.Load(), pid) != "" {
		return
	}
	pt := &n.pt.parts[pid]
	pt.mu.Lock()
	if pt.role != roleHolder || pt.epoch != epoch || pt.backup != backup {
		pt.mu.Unlock()
		return
	}
	pt.backup = ""
	pt.needSync = false
	pt.mu.Unlock()
	n.release(backup, pid, epoch)
}

// logReplicasHeld logs, at Debug, the copies a draining node still keeps.
func (n *Node) logReplicasHeld() {
	if !n.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	n.eachCopy(func(pid int, rep replica, _ role) {
		n.log.Debug("draining: copy still held", "partition", pid, "owner", rep.holder, "epoch", rep.epoch, "holder_alive", n.alive(rep.holder))
	})
}

// giveWay drops every partition and copy this node holds: its cluster
// (from) met a larger one (to) and joins it. The dropped keys restart empty
// on the other side.
func (n *Node) giveWay(from, to uint64, fromMembers, toMembers int) {
	parts, keys := 0, 0
	for i := range n.pt.parts {
		pt := &n.pt.parts[i]
		pt.mu.Lock()
		if (pt.role == roleHolder || pt.role == roleFenced) && pt.store != nil {
			parts++
			keys += pt.store.Len()
		}
		pt.store = nil
		pt.rep = replica{}
		pt.next = replica{}
		pt.backup = ""
		pt.needSync = false
		pt.leaseUntil.Store(0)
		pt.setRoleLocked(roleNone, "", 0, n.clock())
		pt.epoch = 0
		pt.mu.Unlock()
	}
	n.metrics.Handoff("lost", "merged", keys)
	n.log.Error("joined another cluster founded separately: partition state dropped",
		"cluster", fmt.Sprintf("%016x", from), "members", fromMembers, "joined_cluster", fmt.Sprintf("%016x", to),
		"joined_members", toMembers, "partitions", parts, "keys", keys)
}
