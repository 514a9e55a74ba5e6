package peer

import (
	"context"
	"fmt"
	"iter"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// Replication: the holder's side sends partition operations to each
// partition's backup through one batcher per backup member (the same
// pattern as forwarding: an in-flight slot, then everything queued, as one
// Replicate RPC). An admission of a ReplicateSync policy waits for its
// operation's answer; a ReplicateAsync one does not. Every OK answer
// renews the lease of the operation's partition from when the batch was
// sent; STALE turns the partition into a forwarding record; NEED_SYNC
// marks it for a new complete copy.
//
// The backup's side (server.Replicate) keeps one copy per partition in its
// own store. A copy is replaced only by a complete copy at a newer epoch;
// admissions are added to it (merging adds admissions up, so a duplicated
// message only refuses more, never admits more).

// replItem is one operation waiting for a batch.
type replItem struct {
	kind  peerpb.PartitionOp_Kind
	part  uint32
	epoch uint64
	at    time.Time // node clock when the admission was decided (ADMIT)
	run   shard.Run // the admission, age relative to at (ADMIT)
	// state is a key's whole state, ages relative to at (REPLACE).
	state *shard.KeyState
	key   Key
	alg   shard.Algorithm
	done  chan error // nil when nobody waits
	// ch is the pooled item's channel, kept across reuse: done is ch when
	// somebody waits.
	ch chan error
}

// getReplItem returns a cleared item from the node's pool.
func (n *Node) getReplItem() *replItem {
	it := n.replItems.Get().(*replItem)
	if it.ch == nil {
		it.ch = make(chan error, 1)
	}
	return it
}

// putReplItem returns it to the pool. Only the item's last user may: the
// waiter once done has yielded (never one that gave up waiting), or the
// batcher for an item nobody waits for.
func (n *Node) putReplItem(it *replItem) {
	*it = replItem{ch: it.ch}
	n.replItems.Put(it)
}

// replicator is the batcher of operations to one backup member.
type replicator struct {
	c     *client
	queue chan *replItem
	// answered is nudged by every answer on the pipe; replLoop waits on
	// it while it gathers, as batchLoop does.
	answered chan struct{}
	// pipe is the replication stream to the backup; replLoop owns it.
	pipe pipeState[peerpb.ReplicateRequest, peerpb.ReplicateResponse]
	// sem bounds the requests in flight on the pipe (MaxInFlight); the
	// stream keeps their order.
	sem chan struct{}
}

const replQueueLen = 8192

// sendOps queues ops to member to without waiting for them; results are
// applied to the partitions when they arrive.
func (n *Node) sendOps(to string, ops []*peerpb.PartitionOp) {
	c, err := n.peerClient(to)
	if err != nil {
		return
	}
	for _, op := range ops {
		it := &replItem{kind: op.Kind, part: op.Partition, epoch: op.Epoch}
		select {
		case c.repl.queue <- it:
		default:
			// A full queue: the lease renewal is retried next tick.
			return
		}
	}
}

// release tells member to, our former backup of partition pid at epoch,
// to drop its copy (best effort: a lost release leaves a copy that a probe
// finds stale before any takeover).
func (n *Node) release(to string, pid int, epoch uint64) {
	if h := n.releaseLost.Load(); h != nil && (*h)(pid, to) {
		return
	}
	n.sendOps(to, []*peerpb.PartitionOp{{Kind: peerpb.PartitionOp_KIND_RELEASE, Partition: uint32(pid), Epoch: epoch}})
}

// replicateAdmission queues one admission of key in partition pid at epoch
// for backup to. It returns a channel that yields the outcome when wait is
// set, else nil.
func (n *Node) replicateAdmission(to string, pid int, epoch uint64, key Key, alg shard.Algorithm, run shard.Run, at time.Time, wait bool) (chan error, error) {
	it, err := n.replicateAdmissionItem(to, pid, epoch, key, alg, run, at, wait)
	if it == nil {
		return nil, err
	}
	return it.done, nil // the item goes to the garbage collector, not the pool
}

// replicateAdmissionItem is replicateAdmission with a pooled item: when
// wait is set it returns the item, whose done yields the outcome; the
// waiter returns it with putReplItem after done yields.
func (n *Node) replicateAdmissionItem(to string, pid int, epoch uint64, key Key, alg shard.Algorithm, run shard.Run, at time.Time, wait bool) (*replItem, error) {
	c, err := n.peerClient(to)
	if err != nil {
		return nil, err
	}
	it := n.getReplItem()
	it.kind, it.part, it.epoch, it.at, it.run, it.key, it.alg = peerpb.PartitionOp_KIND_ADMIT, uint32(pid), epoch, at, run, key, alg
	if wait {
		it.done = it.ch
	}
	select {
	case c.repl.queue <- it:
	default:
		n.putReplItem(it)
		return nil, fmt.Errorf("%w: replication queue to %s is full", ErrUnavailable, to)
	}
	if !wait {
		return nil, nil
	}
	return it, nil
}

// replicateState queues key state st (ages relative to at) for backup to
// as a replacement of the copy's state of that key.
func (n *Node) replicateState(to string, pid int, epoch uint64, st shard.KeyState, at time.Time, wait bool) (chan error, error) {
	c, err := n.peerClient(to)
	if err != nil {
		return nil, err
	}
	var done chan error
	if wait {
		done = make(chan error, 1)
	}
	it := &replItem{kind: peerpb.PartitionOp_KIND_REPLACE, part: uint32(pid), epoch: epoch, at: at, state: &st, done: done}
	select {
	case c.repl.queue <- it:
		// Queued, the item is the batcher's: one nobody waits for goes
		// to the pool once sent, so it is not read here again.
	default:
		return nil, fmt.Errorf("%w: replication queue to %s is full", ErrUnavailable, to)
	}
	return done, nil
}

// admissionRun is the admission just decided at now, as a run to add to the
// backup's copy: exact for the sliding log, fixed window and calendar, an
// upper bound on the bucket's debt for the token bucket (the copy refills
// no earlier).
func admissionRun(p *policy.Entry, sd shard.Decision, hits int64, now time.Time) shard.Run {
	switch p.Shard.Algorithm {
	case shard.TokenBucket:
		// debt = ceil(hits × W / L), the bucket's fill for hits units.
		hi, lo := bits.Mul64(uint64(hits), uint64(p.Shard.Window))
		q, r := bits.Div64(hi%uint64(p.Shard.Limit), lo, uint64(p.Shard.Limit))
		if r > 0 {
			q++
		}
		return shard.Run{Age: -time.Duration(q)}
	case shard.FixedWindow:
		// The window started W − ResetAfter before the decision.
		return shard.Run{Age: p.Shard.Window - sd.ResetAfter, Count: hits}
	case shard.Calendar:
		// Not an age: the start instant of the decided period (see
		// shard.Calendar). That period ends at now + ResetAfter (now may
		// trail the key's clamped time, which only moves this instant
		// earlier inside the period), so its last nanosecond names it.
		start, _ := p.Shard.Period.Bounds(now.Add(sd.ResetAfter-1), p.Shard.Zone)
		return shard.Run{Age: time.Duration(start.UnixNano()), Count: hits}
	default:
		return shard.Run{Age: 0, Count: hits}
	}
}

// replLoop batches c's replication queue into Replicate RPCs.
func (c *client) replLoop() {
	defer c.n.wg.Done()
	r := c.repl
	defer func() {
		r.pipe.close(fmt.Errorf("%w: connection to %s closed", ErrUnavailable, c.name))
		for {
			select {
			case it := <-r.queue:
				if it.done != nil {
					it.done <- fmt.Errorf("%w: connection to %s closed", ErrUnavailable, c.name)
				}
			default:
				return
			}
		}
	}()
	gather := time.NewTimer(pipeGather)
	gather.Stop()
	for {
		// An in-flight slot first, so that what queues meanwhile leaves in
		// one batch.
		select {
		case r.sem <- struct{}{}:
		case <-c.quit:
			return
		}
		var first *replItem
		select {
		case first = <-r.queue:
		case <-c.quit:
			<-r.sem
			return
		}
		if len(r.sem) > 1 && len(r.queue) < maxReplBatch-1 {
			// As in batchLoop: while a message is out, what queues waits
			// for its answer (or pipeGather) and leaves with it in one
			// message, instead of one small message each.
			gather.Reset(time.Duration(c.n.gather.Load()))
		wait:
			for len(r.sem) > 1 {
				select {
				case <-r.answered:
				case <-gather.C:
					break wait
				case <-c.quit:
					break wait
				}
			}
			gather.Stop()
		}
		if len(r.queue) < maxReplBatch {
			// As in batchLoop: deciders ready to run add to this batch.
			runtime.Gosched()
		}
		// The batch, its packing and its answer use a pooled replSend.
		rs := getReplSend(c)
		batch := append(rs.batch[:0], first)
	drain:
		for len(batch) < maxReplBatch {
			select {
			case it := <-r.queue:
				batch = append(batch, it)
			default:
				break drain
			}
		}
		rs.batch = batch
		if p := r.pipe.get(c, framedReplicate, c.stub.ReplicateStream, replicateID); p != nil && c.sendReplPipe(p, rs) {
			continue
		}
		c.sendRepl(batch)
		rs.release()
		<-r.sem
	}
}

// sendReplPipe sends rs's batch on p without waiting; the pipe's receiver
// applies the answer and frees the slot. It reports false, having sent
// nothing, when the pipe is broken; rs is then still the caller's.
func (c *client) sendReplPipe(p *pipe[peerpb.ReplicateRequest, peerpb.ReplicateResponse], rs *replSend) bool {
	batch := rs.batch
	if allAdmits(batch) {
		// The common case: admissions only, packed.
		var b []byte
		b, rs.ops, rs.opOf = packAdmits(&rs.pack, batch, c.n.clock())
		rs.packed.Sender, rs.packed.AdmitsPacked = c.n.name, b
		rs.req = &rs.packed
	} else {
		rs.req, rs.opOf = c.replRequest(batch)
		rs.ops = opsOf(rs.req)
	}
	c.stamp(rs.req, batch)
	rs.sent = c.n.mono()
	rs.start = time.Now()
	return sendPooled(p, rs)
}

// replSend is a replication message sent on a pipe, in one allocation
// (with the packed request inside it), and the scratch its batch, packing
// and answer use. It is pooled (replSendPool) once its sender and its
// answer are both done with it: a batch of admissions allocates nothing
// of its own.
type replSend struct {
	c      *client
	req    *peerpb.ReplicateRequest // &packed, or built by replRequest
	packed peerpb.ReplicateRequest
	batch  []*replItem
	ops    []replOp
	opOf   []int
	sent   int64
	start  time.Time
	pack   packScratch
	res    resultScratch
	// refs counts the replSend's users while it is on a pipe.
	refs atomic.Int32
}

var replSendPool = sync.Pool{New: func() any { return new(replSend) }}

// getReplSend returns a pooled replSend for c's batcher (one user).
func getReplSend(c *client) *replSend {
	rs := replSendPool.Get().(*replSend)
	rs.c = c
	rs.refs.Store(1)
	return rs
}

func (rs *replSend) refCount() *atomic.Int32 { return &rs.refs }

// release drops a user; the last one pools rs, without what it points
// to, unless it grew large.
func (rs *replSend) release() {
	if rs.refs.Add(-1) != 0 {
		return
	}
	if cap(rs.batch) > maxReplBatch/4 {
		return
	}
	clear(rs.batch[:cap(rs.batch)])
	rs.batch = rs.batch[:0]
	rs.res.clear()
	rs.c, rs.req, rs.ops, rs.opOf = nil, nil, nil, nil
	rs.packed.Reset()
	replSendPool.Put(rs)
}

func (rs *replSend) msg(id uint64) *peerpb.ReplicateRequest {
	rs.req.Id = id
	return rs.req
}

// done applies the answer and frees the in-flight slot.
func (rs *replSend) done(resp *peerpb.ReplicateResponse, err error) {
	c := rs.c
	var results []*peerpb.OpResult
	if err == nil {
		err = streamErr(resp.GetCode(), resp.GetError())
	}
	if err == nil {
		results, err = c.replResults(resp, len(rs.ops), &rs.res)
	}
	c.replFinish(c.n.ctx, rs.batch, rs.ops, rs.opOf, results, err, rs.sent, rs.start)
	rs.release()
	<-c.repl.sem
	select {
	case c.repl.answered <- struct{}{}:
	default:
	}
}

// stamp readies req, the replication message of batch, for sending: its
// number, given here, in the loop that sends them one after another (the
// backup applies none older than one it has applied), and this node's
// policy version and, while the backup's policy table may differ, windows.
func (c *client) stamp(req *peerpb.ReplicateRequest, batch []*replItem) {
	req.Seq = c.n.replSeq.Add(1)
	c.n.stampPolicies(req, c.name, batchPolicies(batch))
}

// stampPolicies sets req's policy version and windows (see windowsFor)
// from one reading of the table.
func (n *Node) stampPolicies(req *peerpb.ReplicateRequest, member string, names iter.Seq[string]) {
	tab := n.table.Load()
	req.PolicyVersion = tab.Version()
	req.WindowsPacked = n.windowsFor(tab, member, names)
}

// windowsFor returns the windows_packed field of a replication message to
// member naming the policies names yields: this node's windows (table tab)
// for them while member's policy table may differ from this node's (it
// gossips another version, or none yet), else nil.
func (n *Node) windowsFor(tab *policy.Table, member string, names iter.Seq[string]) []byte {
	if m := n.memberPolicies.Load(); m != nil {
		if v, ok := (*m)[member]; ok && v == tab.Version() {
			return nil
		}
	}
	return packWindows(tab, names)
}

// batchPolicies yields the policy of each key batch carries.
func batchPolicies(batch []*replItem) iter.Seq[string] {
	return func(yield func(string) bool) {
		for _, it := range batch {
			name := it.key.Policy
			if it.state != nil {
				name = it.state.Key.Policy
			}
			if name != "" && !yield(name) {
				return
			}
		}
	}
}

// opsPolicies yields the policy of each key ops carry.
func opsPolicies(ops []*peerpb.PartitionOp) iter.Seq[string] {
	return func(yield func(string) bool) {
		for _, op := range ops {
			for _, k := range op.GetKeys() {
				if !yield(k.GetKey().GetPolicy()) {
					return
				}
			}
		}
	}
}

// allAdmits reports whether every item of batch is an admission.
func allAdmits(batch []*replItem) bool {
	for _, it := range batch {
		if it.kind != peerpb.PartitionOp_KIND_ADMIT {
			return false
		}
	}
	return true
}

// opsOf lists the partitions and epochs of req's operations.
func opsOf(req *peerpb.ReplicateRequest) []replOp {
	ops := make([]replOp, len(req.Ops))
	for j, op := range req.Ops {
		ops[j] = replOp{part: op.Partition, epoch: op.Epoch, keys: uint32(len(op.Keys))}
	}
	return ops
}

// replResults returns the want results of a replication answer, packed or
// not. A packed answer is decoded into sc when it is not nil (the results
// are then valid until sc is reused).
func (c *client) replResults(resp *peerpb.ReplicateResponse, want int, sc *resultScratch) ([]*peerpb.OpResult, error) {
	if b := resp.GetResultsPacked(); len(b) > 0 {
		if sc == nil {
			sc = new(resultScratch)
		}
		rs, err := decodeOpResults(sc.rs[:0], b, want, c.name)
		if err != nil {
			return nil, err
		}
		out := sc.ptrs[:0]
		for i := range rs {
			out = append(out, &rs[i])
		}
		sc.rs, sc.ptrs = rs, out
		return out, nil
	}
	if len(resp.GetResults()) != want {
		return nil, fmt.Errorf("peer: %s answered %d results for %d operations", c.name, len(resp.GetResults()), want)
	}
	return resp.GetResults(), nil
}

// resultScratch holds a packed replication answer's decoded results.
type resultScratch struct {
	rs   []peerpb.OpResult
	ptrs []*peerpb.OpResult
}

// clear drops what the results point to.
func (sc *resultScratch) clear() {
	clear(sc.ptrs[:cap(sc.ptrs)])
	for i := range sc.rs {
		sc.rs[i].Holder = ""
	}
	sc.rs, sc.ptrs = sc.rs[:0], sc.ptrs[:0]
}

const maxReplBatch = 1024

// sendRepl sends one batch. Consecutive admissions for one partition and
// epoch, with no operation but admissions between them, share one operation.
func (c *client) sendRepl(batch []*replItem) {
	req, opOf := c.replRequest(batch)
	c.stamp(req, batch)
	ctx, cancel := context.WithTimeout(c.n.ctx, c.n.cfg.ForwardTimeout)
	defer cancel()
	sent := c.n.mono()
	start := time.Now()
	resp, err := c.stub.Replicate(ctx, req)
	ops := opsOf(req)
	var results []*peerpb.OpResult
	if err == nil {
		results, err = c.replResults(resp, len(ops), nil)
	}
	c.replFinish(ctx, batch, ops, opOf, results, err, sent, start)
}

// replRequest builds the request for batch; opOf maps each item to its
// operation's index.
func (c *client) replRequest(batch []*replItem) (req *peerpb.ReplicateRequest, opOf []int) {
	n := c.n
	now := n.clock()
	req = &peerpb.ReplicateRequest{Sender: n.name}
	opOf = make([]int, len(batch))
	admitOp := map[[2]uint64]int{}
	for i, it := range batch {
		if it.kind == peerpb.PartitionOp_KIND_ADMIT {
			k := [2]uint64{uint64(it.part), it.epoch}
			j, ok := admitOp[k]
			if !ok {
				j = len(req.Ops)
				admitOp[k] = j
				req.Ops = append(req.Ops, &peerpb.PartitionOp{Kind: it.kind, Partition: it.part, Epoch: it.epoch})
			}
			run := it.run
			if it.alg != shard.TokenBucket {
				// Ages are relative to now, when the message is built.
				run.Age += now.Sub(it.at)
			}
			req.Ops[j].Keys = append(req.Ops[j].Keys, stateToWire(shard.KeyState{Key: it.key, Algorithm: it.alg, Runs: []shard.Run{run}}))
			opOf[i] = j
			continue
		}
		// Admissions queued after this operation must be applied after
		// it: a REPLACE (a refund, a reset, a lease) sets the key's whole
		// state as it was when queued, and would erase an admission of
		// the key decided later but grouped into an earlier operation.
		clear(admitOp)
		opOf[i] = len(req.Ops)
		op := &peerpb.PartitionOp{Kind: it.kind, Partition: it.part, Epoch: it.epoch}
		if it.state != nil {
			st := *it.state
			st.Runs = append([]shard.Run(nil), st.Runs...)
			for j := range st.Runs {
				// An exported age is absolute in time: it grows by the
				// time the message waited.
				st.Runs[j].Age += now.Sub(it.at)
			}
			op.Keys = []*peerpb.KeyState{stateToWire(st)}
		}
		req.Ops = append(req.Ops, op)
	}
	return req, opOf
}

// replFinish applies the results of a batch's operations ops (sent at
// node monotonic time sent) and tells the waiting items; opOf maps each
// item to its operation.
func (c *client) replFinish(ctx context.Context, batch []*replItem, ops []replOp, opOf []int, results []*peerpb.OpResult, err error, sent int64, start time.Time) {
	n := c.n
	if err != nil {
		n.metrics.Forward(c.name, "replicate_error", time.Since(start))
		n.warnThrottled("replication failed", "peer", c.name, "ops", len(ops), "err", err)
		err = fmt.Errorf("%w: replicate to %s: %w", ErrUnavailable, c.name, withCtxErr(ctx, err))
		for _, it := range batch {
			if it.done != nil {
				it.done <- err
			} else {
				n.putReplItem(it)
			}
		}
		return
	}
	n.metrics.Forward(c.name, "replicate_ok", time.Since(start))
	for j, r := range results {
		n.applyOpResult(int(ops[j].part), ops[j].epoch, c.name, r, sent)
	}
	for i, it := range batch {
		if it.done == nil {
			n.putReplItem(it)
			continue
		}
		j := opOf[i]
		r := results[j]
		switch {
		case r.Status != peerpb.OpStatus_OP_STATUS_OK:
			it.done <- fmt.Errorf("%w: backup %s answered %v for partition %d", ErrUnavailable, c.name, r.Status, it.part)
		case r.Accepted < ops[j].keys:
			// The backup skipped some of the operation's keys: a policy
			// its table does not have, or has with another algorithm (a
			// policy change rolling out). Which ones is not said, so none
			// of the operation's admissions is confirmed: each stays
			// counted here, where it can only refuse more, and its caller
			// is told unavailable, not admitted without a copy.
			it.done <- fmt.Errorf("%w: backup %s recorded %d of %d keys of partition %d (a policy it does not have, or has with another algorithm)",
				ErrUnavailable, c.name, r.Accepted, ops[j].keys, it.part)
		default:
			it.done <- nil
		}
	}
}

// applyOpResult applies a backup's answer to an operation of partition
// pid sent at epoch (node monotonic time sent).
func (n *Node) applyOpResult(pid int, epoch uint64, from string, r *peerpb.OpResult, sent int64) {
	if pid < 0 || pid >= len(n.pt.parts) {
		return
	}
	pt := &n.pt.parts[pid]
	switch r.Status {
	case peerpb.OpStatus_OP_STATUS_OK:
		if r.LeaseNs <= 0 {
			return
		}
		pt.mu.RLock()
		// No lease from a backup whose copy must be made again (it lost
		// ours, or a copy's outcome is unknown): an answer still in flight
		// from before must not extend it.
		if pt.epoch == epoch && pt.backup == from && !pt.needSync {
			until := sent + min(r.LeaseNs, int64(n.cfg.LeaseDuration))/10*9
			for {
				cur := pt.leaseUntil.Load()
				if cur >= until || pt.leaseUntil.CompareAndSwap(cur, until) {
					break
				}
			}
		}
		pt.mu.RUnlock()
	case peerpb.OpStatus_OP_STATUS_STALE:
		pt.mu.Lock()
		if r.Holder == n.name {
			// The backup keeps a copy of our own holding at a newer
			// epoch: a copy whose answer we lost. Nobody else holds the
			// partition; a new copy, at a newer epoch still, settles it.
			if pt.epoch == epoch && pt.backup == from {
				pt.needSync = true
				pt.leaseUntil.Store(0)
			}
			pt.mu.Unlock()
			n.kickOwnership()
			return
		}
		if pt.epoch <= epoch && r.Epoch > epoch {
			pt.learnLocked(r.Holder, r.Epoch, n.clock())
			n.log.Warn("partition lost to a newer holder", "partition", pid, "owner", r.Holder, "epoch", r.Epoch)
		}
		pt.mu.Unlock()
	case peerpb.OpStatus_OP_STATUS_NEED_SYNC, peerpb.OpStatus_OP_STATUS_REFUSED:
		pt.mu.Lock()
		if pt.epoch == epoch && pt.backup == from {
			pt.needSync = true
		}
		pt.mu.Unlock()
		n.kickOwnership()
	}
}

// Replicate is the backup's side of replication.
func (s *server) Replicate(_ context.Context, req *peerpb.ReplicateRequest) (*peerpb.ReplicateResponse, error) {
	return s.replicate(req, nil)
}

// replScratch is a ReplicateStream's memory for its answers: the answer
// replicate returns lives in it, and it is reused once that is sent.
type replScratch struct {
	out  []byte
	resp peerpb.ReplicateResponse
}

// replicate is Replicate, answering in sc's memory when sc is not nil.
func (s *server) replicate(req *peerpb.ReplicateRequest, sc *replScratch) (*peerpb.ReplicateResponse, error) {
	n := s.n
	if len(req.GetOps()) > maxWireBatch {
		return nil, status.Errorf(codes.InvalidArgument, "peer: %d operations exceed %d", len(req.GetOps()), maxWireBatch)
	}
	closing := n.closing.Load()
	quorum := n.quorum()
	ws, err := decodeWindows(req.GetWindowsPacked())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	sw := senderTable{windows: ws}
	if v := req.GetPolicyVersion(); len(ws) == 0 && v != 0 && v != n.PolicyVersion() {
		sw.unknown = true
	}
	if len(req.GetAdmitsPacked()) > 0 {
		if sc == nil {
			sc = new(replScratch)
		}
		b, err := n.applyPackedAdmits(sc.out[:0], req.GetSender(), req.GetSeq(), sw, req.GetAdmitsPacked(), closing, quorum)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		if cap(b) <= framedKeepBuf {
			sc.out = b
		}
		sc.resp.Reset()
		sc.resp.ResultsPacked = b
		return &sc.resp, nil
	}
	resp := &peerpb.ReplicateResponse{Results: make([]*peerpb.OpResult, len(req.GetOps()))}
	for i, op := range req.GetOps() {
		resp.Results[i] = n.applyOp(req.GetSender(), req.GetSeq(), sw, op, closing, quorum)
	}
	return resp, nil
}

// applyOp applies one operation from holder sender to this node's copy;
// sw is what the sender tells of its policy table.
func (n *Node) applyOp(sender string, seq uint64, sw senderTable, op *peerpb.PartitionOp, closing, quorum bool) *peerpb.OpResult {
	var keys []packedAdmit
	for _, w := range op.GetKeys() {
		st, p, err := n.decodeState(w)
		if err != nil || p == nil {
			continue // malformed, or a policy this node does not have
		}
		keys = append(keys, packedAdmit{st: st, sp: importPolicy(p, sw)})
	}
	h := opHead{kind: op.GetKind(), part: op.GetPartition(), epoch: op.GetEpoch(), holderEpoch: op.GetHolderEpoch(), carried: len(op.GetKeys()), seq: seq}
	r := n.applyOpKeys(sender, h, keys, closing, quorum)
	return &peerpb.OpResult{Status: r.status, LeaseNs: r.leaseNs, Holder: r.holder, Epoch: r.epoch, Accepted: r.accepted}
}

// opResult is the backup's answer to one operation (peerpb.OpResult).
type opResult struct {
	status   peerpb.OpStatus
	leaseNs  int64
	holder   string
	epoch    uint64
	accepted uint32
}

// opHead is an operation from a holder without its keys.
type opHead struct {
	kind        peerpb.PartitionOp_Kind
	part        uint32
	epoch       uint64
	holderEpoch uint64 // SYNC_BEGIN's HolderEpoch; 0: unknown
	carried     int    // key states the operation carried, valid or not
	seq         uint64 // its message's ReplicateRequest.Seq; 0: not numbered
}

// applyOpKeys applies operation h from holder sender; keys are the key
// states it carries that are valid here, each with its local policy (a
// key of a policy this node does not have, or has with another algorithm,
// is not among them).
func (n *Node) applyOpKeys(sender string, h opHead, keys []packedAdmit, closing, quorum bool) opResult {
	if n.lo != nil {
		return n.lo.applyOp(sender, h, keys, closing)
	}
	kind, part, epoch, holderEpoch := h.kind, h.part, h.epoch, h.holderEpoch
	if holderEpoch == 0 || holderEpoch >= epoch {
		// A copy's sender holds the partition at holderEpoch, below the
		// copy's epoch; an older sender does not say (epoch - 1).
		holderEpoch = epoch - 1
	}
	pid := int(part)
	if pid >= len(n.pt.parts) || sender == "" || sender == n.name || kind == peerpb.PartitionOp_KIND_SYNC_BEGIN && epoch == 0 {
		// (A copy's epoch is above its holder's, so never 0: one at 0 is
		// malformed, and its holder epoch would wrap.)
		return opResult{status: peerpb.OpStatus_OP_STATUS_REFUSED}
	}
	pt := &n.pt.parts[pid]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	// A newer holder we know of (ourselves included) makes the sender stale.
	if pt.epoch > epoch && pt.holder != "" && pt.role != roleNone {
		return opResult{status: peerpb.OpStatus_OP_STATUS_STALE, holder: pt.holder, epoch: pt.epoch}
	}
	if kind == peerpb.PartitionOp_KIND_SYNC_BEGIN && pt.holder != "" && pt.holder != sender && pt.role != roleNone {
		// Another holder we know of at a newer epoch than the sender's
		// holding, or this node holding at that epoch or newer, means the
		// sender no longer holds the partition (it was taken over while
		// it paused, say): its copy must not make this node its backup,
		// whose lease would let it decide again.
		holding := pt.role == roleHolder || pt.role == roleFenced
		if pt.epoch > holderEpoch || holding && pt.epoch == holderEpoch {
			return opResult{status: peerpb.OpStatus_OP_STATUS_STALE, holder: pt.holder, epoch: pt.epoch}
		}
	}
	if pt.rep.epoch > epoch {
		return opResult{status: peerpb.OpStatus_OP_STATUS_STALE, holder: pt.rep.holder, epoch: pt.rep.epoch}
	}
	now := n.clock()
	grant := func() opResult {
		if closing || !quorum {
			// No lease: a closing node will not be there to honour it, and
			// a node without a majority must not let a holder decide.
			return opResult{status: peerpb.OpStatus_OP_STATUS_REFUSED}
		}
		pt.rep.leaseEnd = max(pt.rep.leaseEnd, n.mono()+int64(n.cfg.LeaseDuration))
		return opResult{status: peerpb.OpStatus_OP_STATUS_OK, leaseNs: int64(n.cfg.LeaseDuration)}
	}
	switch kind {
	case peerpb.PartitionOp_KIND_SYNC_BEGIN:
		if closing {
			return opResult{status: peerpb.OpStatus_OP_STATUS_REFUSED}
		}
		// The sender holds the partition at holderEpoch; record it. Never
		// more: a copy's epoch can be several above its holder's, and a
		// record of a holding newer than the real one would make a backup
		// with a good copy think it stale.
		if pt.role != roleHolder && pt.role != roleFenced {
			pt.learnLocked(sender, holderEpoch, now)
		}
		// The new copy is built beside the complete one we may have; it
		// replaces it only at SYNC_END.
		pt.next = replica{holder: sender, epoch: epoch, holderEpoch: holderEpoch, store: n.newPartStore(), made: n.mono()}
		return opResult{status: peerpb.OpStatus_OP_STATUS_OK}
	case peerpb.PartitionOp_KIND_SYNC_CHUNK:
		if pt.next.holder != sender || pt.next.epoch != epoch || pt.next.store == nil {
			return opResult{status: peerpb.OpStatus_OP_STATUS_NEED_SYNC}
		}
		if len(keys) < h.carried {
			// Keys this node cannot record (a policy change rolling out):
			// a copy without them is not complete, and as backup, or as
			// the next holder, it would start them empty. Give it up; the
			// holder copies again.
			pt.next = replica{}
			return opResult{status: peerpb.OpStatus_OP_STATUS_NEED_SYNC}
		}
		accepted := 0
		for _, k := range keys {
			if err := pt.next.store.Import(k.st, k.sp, now); err != nil {
				// This node cannot hold the copy (capacity): give it up;
				// the complete copy we had, if any, stays.
				pt.next = replica{}
				return opResult{status: peerpb.OpStatus_OP_STATUS_NEED_SYNC, accepted: uint32(accepted)}
			}
			accepted++
		}
		n.metrics.Backup("received", "ok", accepted)
		return opResult{status: peerpb.OpStatus_OP_STATUS_OK, accepted: uint32(accepted)}
	case peerpb.PartitionOp_KIND_ADMIT, peerpb.PartitionOp_KIND_REPLACE:
		if pt.rep.holder != sender || pt.rep.epoch != epoch || pt.rep.store == nil || !pt.rep.complete {
			return opResult{status: peerpb.OpStatus_OP_STATUS_NEED_SYNC}
		}
		if h.seq != 0 {
			if h.seq < pt.rep.seq {
				// A message older than one already applied, delivered
				// late (its sender gave up on it, and was told nothing it
				// carried is recorded here): applying it now could undo
				// later operations (a REPLACE removing later admissions).
				// Nobody waits for this answer.
				return opResult{status: peerpb.OpStatus_OP_STATUS_NEED_SYNC}
			}
			pt.rep.seq = h.seq
		}
		accepted := 0
		for _, k := range keys {
			st, sp := k.st, k.sp
			if kind == peerpb.PartitionOp_KIND_REPLACE {
				pt.rep.store.Delete(st.Key)
				if len(st.Runs) == 0 {
					accepted++ // a reset: the key is empty
					continue
				}
			}
			if err := pt.rep.store.Import(st, sp, now); err != nil {
				// The copy cannot hold the key (capacity). The operation
				// fails, so the holder does not acknowledge what it
				// carried; the copy still holds every admission that was
				// acknowledged, so it stays complete for a takeover.
				return opResult{status: peerpb.OpStatus_OP_STATUS_NEED_SYNC, accepted: uint32(accepted)}
			}
			accepted++
		}
		n.metrics.Backup("received", "ok", accepted)
		r := grant()
		r.accepted = uint32(accepted)
		return r
	case peerpb.PartitionOp_KIND_SYNC_END:
		if pt.next.holder != sender || pt.next.epoch != epoch || pt.next.store == nil {
			return opResult{status: peerpb.OpStatus_OP_STATUS_NEED_SYNC}
		}
		lease := pt.rep.leaseEnd // a lease granted stays granted
		completed := n.mono()
		if pt.rep.complete && pt.rep.holder == sender && pt.rep.epoch == epoch {
			// The same copy again (a duplicate): a promote of it is no
			// younger than the first completion (promote).
			completed = pt.rep.completed
		}
		pt.rep = pt.next
		pt.rep.complete = true
		pt.rep.leaseEnd = lease
		pt.rep.completed = completed
		pt.next = replica{}
		return grant()
	case peerpb.PartitionOp_KIND_HEARTBEAT:
		if pt.rep.holder != sender || pt.rep.epoch != epoch || !pt.rep.complete {
			return opResult{status: peerpb.OpStatus_OP_STATUS_NEED_SYNC}
		}
		return grant()
	case peerpb.PartitionOp_KIND_RELEASE:
		if pt.next.holder == sender && pt.next.epoch <= epoch {
			pt.next = replica{}
		}
		if pt.rep.holder == sender && pt.rep.epoch <= epoch {
			pt.rep = replica{}
			pt.next = replica{}
		} else if pt.rep.holder == "" {
			pt.releasedBy, pt.releasedEpoch = sender, epoch
		}
		return opResult{status: peerpb.OpStatus_OP_STATUS_OK}
	default:
		return opResult{status: peerpb.OpStatus_OP_STATUS_REFUSED}
	}
}

// Promote makes this node, the backup with a complete copy at the sender's
// epoch, the partition's holder at epoch + 1. The old holder becomes this
// node's backup at once when it still has the very same state and is the
// ring's choice; otherwise reconcile makes a new copy before the
// partition decides for synchronous policies.
func (s *server) Promote(ctx context.Context, req *peerpb.PromoteRequest) (*peerpb.PromoteResponse, error) {
	if h := s.n.promoteHook.Load(); h != nil {
		(*h)(int(req.GetPartition()))
	}
	resp, err := s.promote(ctx, req)
	if h := s.n.promoteLost.Load(); h != nil && err == nil && (*h)(int(req.GetPartition())) {
		// Tests: the promote took effect, its answer is lost.
		return nil, status.Error(codes.Unavailable, "peer: answer lost (test)")
	}
	return resp, err
}

// promote is Promote's decision.
func (s *server) promote(ctx context.Context, req *peerpb.PromoteRequest) (*peerpb.PromoteResponse, error) {
	n := s.n
	pid := int(req.GetPartition())
	if pid >= len(n.pt.parts) {
		return nil, status.Errorf(codes.InvalidArgument, "peer: partition %d out of range", pid)
	}
	pt := &n.pt.parts[pid]
	pt.mu.Lock()
	defer pt.mu.Unlock()
	epoch := req.GetEpoch()
	if (pt.role == roleHolder || pt.role == roleFenced) && pt.epoch == epoch+1 {
		return &peerpb.PromoteResponse{Ok: true, Holder: n.name, Epoch: pt.epoch}, nil // a repeat
	}
	if n.closing.Load() {
		return &peerpb.PromoteResponse{Holder: pt.holder, Epoch: pt.epoch, Error: "closing"}, nil
	}
	if pt.epoch > epoch+1 || pt.rep.epoch > epoch {
		h, e := pt.holder, pt.epoch
		if pt.rep.epoch > e {
			h, e = pt.rep.holder, pt.rep.epoch
		}
		return &peerpb.PromoteResponse{Holder: h, Epoch: e, Error: "newer epoch known"}, nil
	}
	if !pt.rep.complete || pt.rep.holder != req.GetSender() || pt.rep.epoch != epoch {
		return &peerpb.PromoteResponse{Holder: pt.holder, Epoch: pt.epoch, Error: "no complete copy at this epoch"}, nil
	}
	if err := ctx.Err(); err != nil {
		// The sender has given up on this promote (its deadline passed,
		// or it went away): it may take the partition back once
		// the promote's timeout and a lease have passed since it sent it
		// (settleFenced), and a lease counted from now could outlast that.
		return nil, status.FromContextError(err).Err()
	}
	// The sender keeps the very same state (it fenced the partition before
	// the copy) and turns it into its copy of ours when it reads this
	// answer: it is our backup from the start, so a crash of this node
	// right after the move loses nothing. Our lease counts from now, before
	// the sender's record of it begins (when it receives the answer).
	//
	// Unless the promote may be late. Its deadline does not tell: gRPC
	// sends it as a timeout that our server counts from when it reads the
	// request, so a promote held in the network (or in the socket of a
	// paused process) arrives with its whole timeout ahead of it, perhaps
	// after the sender gave up, waited out that timeout and a lease, and
	// took the partition back (settleFenced); a lease from now would let
	// both decide. Our own clock bounds its age instead: the sender sent
	// it after our answer to the copy's last request, which completed the
	// copy here, so it is no older than the copy. A promote that arrives
	// within 9/10 of its timeout of the copy's completion, on our clock,
	// is on time: our lease then ends within 9/10 of the timeout plus the
	// lease from the copy's completion, before the sender's wait ends
	// (counted in full on its clock from later), while the clocks' rates
	// differ by less than 10 % (offsets do not matter). A later one still
	// makes us the holder (the sender may be waiting for its answer yet,
	// or be a member handing a copy of its old holding over, which waits
	// for nothing: promoteCopy), but without a lease: we decide only once
	// our backup, the sender, grants one (or a new backup does, after the
	// checks of a holder whose lease has ended). A sender that took the
	// partition back answers stale and we learn its holding.
	lease := int64(0)
	budget := n.rpcTimeout()
	if dl, ok := ctx.Deadline(); ok {
		budget = min(budget, time.Until(dl))
	}
	if now := n.mono(); pt.rep.completed != 0 && now-pt.rep.completed <= holderLease(budget) {
		lease = now + holderLease(promoteLease(n.cfg.LeaseDuration, req.GetLeaseNs()))
	}
	pt.store = pt.rep.store
	pt.rep = replica{}
	pt.next = replica{}
	pt.backup = req.GetSender()
	pt.needSync = false
	pt.leaseUntil.Store(lease)
	pt.setRoleLocked(roleHolder, n.name, epoch+1, n.clock())
	n.metrics.Handoff("received", "ok", pt.store.Len())
	n.kickOwnership()
	return &peerpb.PromoteResponse{Ok: true, Holder: n.name, Epoch: epoch + 1}, nil
}

// promoteLease is the lease a promoted holder counts on: its own
// LeaseDuration, or the sender's (senderNs) when shorter. The sender, our
// backup from its answer on, records a lease of its own length from when
// it reads the answer (which it may take back once that ends and we seem
// gone); a longer lease of ours would outlast its record, and both would
// decide. An older sender sends no length (0): ours, as before.
func promoteLease(own time.Duration, senderNs int64) time.Duration {
	if senderNs > 0 && senderNs < int64(own) {
		return time.Duration(senderNs)
	}
	return own
}

// Probe tells what this node knows of the partitions asked about, or,
// asked to relay it, what the member named in the request knows: it passes
// the probe on with the same sender (so the member counts a probe of its
// copy's holder, as if asked directly) and returns that member's answer
// (probeQuiet).
func (s *server) Probe(ctx context.Context, req *peerpb.ProbeRequest) (*peerpb.ProbeResponse, error) {
	n := s.n
	if len(req.GetPartitions()) > len(n.pt.parts) {
		return nil, status.Errorf(codes.InvalidArgument, "peer: %d partitions asked, ring has %d", len(req.GetPartitions()), len(n.pt.parts))
	}
	if to := req.GetRelay(); to != "" && to != n.name {
		c, err := n.peerClient(to)
		if err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		// Bounded by the sender's deadline, which gRPC carries here.
		resp, err := c.stub.Probe(ctx, &peerpb.ProbeRequest{Sender: req.GetSender(), Partitions: req.GetPartitions()})
		if err != nil {
			return nil, status.Errorf(codes.Unavailable, "peer: relay probe to %s: %v", to, err)
		}
		if resp.GetAnsweredBy() != to {
			return nil, status.Errorf(codes.Unavailable, "peer: relay probe to %s answered by %q", to, resp.GetAnsweredBy())
		}
		return resp, nil
	}
	resp := &peerpb.ProbeResponse{Partitions: make([]*peerpb.PartitionInfo, len(req.GetPartitions())), AnsweredBy: n.name}
	for i, pid := range req.GetPartitions() {
		if int(pid) >= len(n.pt.parts) {
			return nil, status.Errorf(codes.InvalidArgument, "peer: partition %d out of range", pid)
		}
		pt := &n.pt.parts[pid]
		pt.mu.RLock()
		info := &peerpb.PartitionInfo{Partition: pid, Role: uint32(pt.role), Holder: pt.holder, Epoch: pt.epoch}
		if pt.rep.complete {
			info.ReplicaEpoch, info.ReplicaHolder, info.ReplicaHolderEpoch = pt.rep.epoch, pt.rep.holder, pt.rep.holderEpoch
			if req.GetSender() == pt.rep.holder {
				// The copy's holder acts on this answer: a takeover under
				// way must not commit after it (takeOver).
				pt.holderProbes.Add(1)
			}
		}
		pt.mu.RUnlock()
		resp.Partitions[i] = info
	}
	return resp, nil
}
