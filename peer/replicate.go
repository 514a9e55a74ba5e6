package peer

import (
	"context"
	"encoding/binary"
	"fmt"
	"iter"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/transport"
	"github.com/ringlimit/ringlimit/peer/internal/wire"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// Replication: the holder's side sends partition operations to each
// partition's backup through one batcher per backup member (the same
// pattern as forwarding: an in-flight slot, then everything queued, as one
// Replicate RPC). An admission of a ReplicateSync policy waits for its
// operation's answer; a ReplicateAsync one does not. A backup applies an
// admission only where the log's table names it backup of that holder at
// that epoch; any other answer than OK leaves the admission unconfirmed:
// the caller of a synchronous one is told unavailable, and for an
// asynchronous one (or one never queued, or whose batch failed) the holder
// copies the partition to the backup again (replFinish, recopy.go).
// Holders' leases come from the log's liveness records, never from these
// answers.
//
// The backup's side (server.Replicate) keeps one copy per partition in its
// own store. A copy is replaced only by a complete copy at a newer epoch;
// admissions are added to it (merging adds admissions up, so a duplicated
// message only refuses more, never admits more). So a holder exports a
// copy only once the replication it queued to the receiver before the
// fence is answered (replBarrier): an admission landing after a copy that
// already holds it would count twice.

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
	// barrier: not an operation; done yields once every item queued
	// before it has been answered (replBarrier).
	barrier bool
	// pool is the pool a pooled item goes back to (Release); nil for an
	// item the garbage collector takes.
	pool *sync.Pool
}

// Done yields the backup's answer (partition.Copy).
func (it *replItem) Done() <-chan error { return it.done }

// Release hands a pooled item back once Done has yielded.
func (it *replItem) Release() {
	if it.pool != nil {
		putReplItem(it.pool, it)
	}
}

// getReplItem returns a cleared item from the links' pool.
func (l *peerLinks) getReplItem() *replItem {
	it := l.replItems.Get().(*replItem)
	if it.ch == nil {
		it.ch = make(chan error, 1)
	}
	it.pool = &l.replItems
	return it
}

// putReplItem returns it to pool, emptied. Only the item's last user may:
// the waiter once done has yielded (never one that gave up waiting), or
// the batcher for an item nobody waits for.
func putReplItem(pool *sync.Pool, it *replItem) {
	*it = replItem{ch: it.ch}
	pool.Put(it)
}

// putReplItem returns it to the links' pool, emptied.
func (e *linkEnv) putReplItem(it *replItem) { putReplItem(e.replItems, it) }

// replicator is the batcher of operations to one backup member.
type replicator struct {
	c     *peerLink
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

// replicateAdmissionItem queues one admission of key in partition pid at
// epoch for backup to, in a pooled item: when wait is set it returns the
// item, whose Done yields the outcome; the waiter hands it back with
// Release after Done yields.
func (l *peerLinks) replicateAdmissionItem(to string, pid int, epoch uint64, key Key, alg shard.Algorithm, run shard.Run, at time.Time, wait bool) (*replItem, error) {
	c, err := l.to(to)
	if err != nil {
		l.replUnqueued(pid, epoch, wait)
		return nil, err
	}
	it := l.getReplItem()
	it.kind, it.part, it.epoch, it.at, it.run, it.key, it.alg = peerpb.PartitionOp_KIND_ADMIT, uint32(pid), epoch, at, run, key, alg
	if wait {
		it.done = it.ch
	}
	select {
	case c.repl.queue <- it:
	default:
		putReplItem(&l.replItems, it)
		l.replUnqueued(pid, epoch, wait)
		return nil, fmt.Errorf("%w: replication queue to %s is full", ErrUnavailable, to)
	}
	if !wait {
		return nil, nil
	}
	return it, nil
}

// replicateState queues key state st (ages relative to at) for backup to
// as a replacement of the copy's state of that key.
func (l *peerLinks) replicateState(to string, pid int, epoch uint64, st shard.KeyState, at time.Time, wait bool) (*replItem, error) {
	c, err := l.to(to)
	if err != nil {
		l.replUnqueued(pid, epoch, wait)
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
		l.replUnqueued(pid, epoch, wait)
		return nil, fmt.Errorf("%w: replication queue to %s is full", ErrUnavailable, to)
	}
	if !wait {
		return nil, nil
	}
	return it, nil
}

// replUnqueued handles an item of partition pid at epoch that could not be
// queued for the backup: a waiter is told by the error its caller returns;
// an item nobody waits for stands on the holder all the same (its caller
// goes on), so the backup must get it from a copy of the partition.
func (l *peerLinks) replUnqueued(pid int, epoch uint64, wait bool) {
	if !wait {
		l.env.recopy(pid, epoch)
	}
}

// replLoop batches c's replication queue into Replicate RPCs.
func (c *peerLink) replLoop() {
	defer c.env.wg.Done()
	r := c.repl
	defer func() {
		r.pipe.close(fmt.Errorf("%w: connection to %s closed", ErrUnavailable, c.name))
		for {
			select {
			case it := <-r.queue:
				if it.done != nil {
					it.done <- fmt.Errorf("%w: connection to %s closed", ErrUnavailable, c.name)
				} else {
					// Never sent (see replFinish).
					c.env.recopy(int(it.part), it.epoch)
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
		if first.barrier {
			<-r.sem
			c.awaitReplIdle(first)
			continue
		}
		if len(r.sem) > 1 && len(r.queue) < maxReplBatch-1 && !(first.done != nil && c.env.diskPolicy(first.key.Policy)) {
			// As in batchLoop: while a message is out, what queues waits
			// for its answer (or pipeGather) and leaves with it in one
			// message, instead of one small message each. Not an
			// admission waited for on the backup's disk: the backup
			// applies it while it syncs the message out, and it joins the
			// next fsync (replAnswers) instead of one after that.
			gather.Reset(time.Duration(c.env.gather.Load()))
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
		var bar *replItem // a barrier met while draining: after this batch
	drain:
		for len(batch) < maxReplBatch {
			select {
			case it := <-r.queue:
				if it.barrier {
					bar = it
					break drain
				}
				batch = append(batch, it)
			default:
				break drain
			}
		}
		rs.batch = batch
		if p := r.pipe.get(c, transport.KindReplicate, c.stub.ReplicateStream, replicateID); p == nil || !c.sendReplPipe(p, rs) {
			c.sendRepl(batch)
			rs.release()
			<-r.sem
		}
		if bar != nil {
			c.awaitReplIdle(bar)
		}
	}
}

// awaitReplIdle answers the barrier bar once no replication message to
// c is in flight: every item queued before it has been answered (applied
// or refused by the backup, or failed here). Called by replLoop, holding
// no in-flight slot.
func (c *peerLink) awaitReplIdle(bar *replItem) {
	r := c.repl
	for len(r.sem) > 0 {
		select {
		case <-r.answered:
		case <-c.quit:
			bar.done <- fmt.Errorf("%w: connection to %s closed", ErrUnavailable, c.name)
			return
		}
	}
	bar.done <- nil
}

// replBarrier waits until every replication item queued for member to
// before the call has been answered, or ctx ends.
func (l *peerLinks) replBarrier(ctx context.Context, to string) error {
	c, err := l.to(to)
	if err != nil {
		return err
	}
	l.copyBarriers.Add(1)
	bar := &replItem{barrier: true, done: make(chan error, 1)}
	select {
	case c.repl.queue <- bar:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-bar.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sendReplPipe sends rs's batch on p without waiting; the pipe's receiver
// applies the answer and frees the slot. It reports false, having sent
// nothing, when the pipe is broken; rs is then still the caller's.
func (c *peerLink) sendReplPipe(p *transport.Pipe[peerpb.ReplicateRequest, peerpb.ReplicateResponse], rs *replSend) bool {
	batch := rs.batch
	if allAdmits(batch) {
		// The common case: admissions only, packed.
		var b []byte
		b, rs.ops, rs.opOf = packAdmits(&rs.pack, batch, c.env.clock())
		rs.packed.Sender, rs.packed.AdmitsPacked = c.env.self, b
		rs.req = &rs.packed
	} else {
		rs.req, rs.opOf = c.replRequest(batch)
		rs.ops = opsOf(rs.req)
	}
	c.stamp(rs.req, batch)
	rs.start = time.Now()
	return sendPooled(p, rs)
}

// replSend is a replication message sent on a pipe, in one allocation
// (with the packed request inside it), and the scratch its batch, packing
// and answer use. It is pooled (replSendPool) once its sender and its
// answer are both done with it: a batch of admissions allocates nothing
// of its own.
type replSend struct {
	c      *peerLink
	req    *peerpb.ReplicateRequest // &packed, or built by replRequest
	packed peerpb.ReplicateRequest
	batch  []*replItem
	ops    []replOp
	opOf   []int
	start  time.Time
	pack   packScratch
	res    resultScratch
	// refs counts the replSend's users while it is on a pipe.
	refs atomic.Int32
}

var replSendPool = sync.Pool{New: func() any { return new(replSend) }}

// getReplSend returns a pooled replSend for c's batcher (one user).
func getReplSend(c *peerLink) *replSend {
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

func (rs *replSend) Msg(id uint64) *peerpb.ReplicateRequest {
	rs.req.Id = id
	return rs.req
}

// done applies the answer and frees the in-flight slot.
func (rs *replSend) Done(resp *peerpb.ReplicateResponse, err error) {
	c := rs.c
	var results []*peerpb.OpResult
	if err == nil {
		err = streamErr(resp.GetCode(), resp.GetError())
	}
	if err == nil {
		results, err = c.replResults(resp, len(rs.ops), &rs.res)
	}
	c.replFinish(c.env.ctx, rs.batch, rs.ops, rs.opOf, results, err, rs.start)
	rs.release()
	<-c.repl.sem
	select {
	case c.repl.answered <- struct{}{}:
	default:
	}
}

// packScratch is packAdmits's memory, reused by later batches: what it
// returns is valid until then.
type packScratch struct {
	ints []int
	ops  []replOp
	buf  []byte
}

// packAdmits packs batch, all of it KIND_ADMIT, with ages made relative to
// now, into sc. It returns the operations in packed order and, per item,
// its operation's index.
func packAdmits(sc *packScratch, batch []*replItem, now time.Time) (b []byte, ops []replOp, opOf []int) {
	// One slice for the four index slices: opOf (kept by the caller until
	// the answer), then scratch for the counting sort.
	need := 4*len(batch) + 2
	if cap(sc.ints) < need {
		sc.ints = make([]int, need)
	}
	ints := sc.ints[:need]
	clear(ints)
	opOf, ints = ints[:len(batch):len(batch)], ints[len(batch):]
	ops = sc.ops[:0]
	// A batch spans few partitions as a rule: a linear search finds an
	// operation faster than a map costs to build, up to a few dozen.
	var index map[replOp]int
	if len(batch) > 32 {
		index = make(map[replOp]int, len(batch))
	}
	for i, it := range batch {
		o := replOp{part: it.part, epoch: it.epoch}
		j := -1
		if index != nil {
			if k, ok := index[o]; ok {
				j = k
			}
		} else {
			for k := range ops {
				if ops[k] == o {
					j = k
					break
				}
			}
		}
		if j < 0 {
			j = len(ops)
			if index != nil {
				index[o] = j
			}
			ops = append(ops, o)
		}
		opOf[i] = j
	}
	// Items in operation order, by counting sort: start[j] is where
	// operation j's items begin in order.
	start, ints := ints[:len(ops)+1], ints[len(ops)+1:]
	for _, j := range opOf {
		start[j+1]++
	}
	for j := range ops {
		start[j+1] += start[j]
	}
	order, next := ints[:len(batch)], ints[len(batch):len(batch)+len(ops)]
	copy(next, start[:len(ops)])
	for i, j := range opOf {
		order[next[j]] = i
		next[j]++
	}
	for j := range ops {
		ops[j].keys = uint32(start[j+1] - start[j])
	}
	b = sc.buf[:0]
	if cap(b) < 8+48*len(batch) {
		b = make([]byte, 0, 8+48*len(batch))
	}
	b = binary.AppendUvarint(b, uint64(len(ops)))
	for j, o := range ops {
		b = binary.AppendUvarint(b, uint64(o.part))
		b = binary.AppendUvarint(b, o.epoch)
		b = binary.AppendUvarint(b, uint64(start[j+1]-start[j]))
		for _, i := range order[start[j]:start[j+1]] {
			it := batch[i]
			run := it.run
			if it.alg != shard.TokenBucket {
				// Ages are relative to now, when the message is built.
				run.Age += now.Sub(it.at)
			}
			b = wire.AppendString(b, it.key.Tenant)
			b = wire.AppendString(b, it.key.Subject)
			b = wire.AppendString(b, it.key.Policy)
			b = binary.AppendUvarint(b, uint64(it.alg))
			b = binary.AppendVarint(b, int64(run.Age))
			b = binary.AppendVarint(b, run.Count)
		}
	}
	if cap(b) <= transport.KeepBuf {
		sc.buf = b
	}
	sc.ops = ops
	return b, ops, opOf
}

// stamp readies req, the replication message of batch, for sending: its
// number, given here, in the loop that sends them one after another (the
// backup applies none older than one it has applied), and this node's
// policy version and, while the backup's policy table may differ, windows.
func (c *peerLink) stamp(req *peerpb.ReplicateRequest, batch []*replItem) {
	req.Seq = c.env.replSeq.Add(1)
	c.env.stamp(req, c.name, batchPolicies(batch))
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
func (c *peerLink) replResults(resp *peerpb.ReplicateResponse, want int, sc *resultScratch) ([]*peerpb.OpResult, error) {
	if b := resp.GetResultsPacked(); len(b) > 0 {
		if sc == nil {
			sc = new(resultScratch)
		}
		rs, err := wire.DecodeOpResults(sc.rs[:0], b, want, c.name)
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
func (c *peerLink) sendRepl(batch []*replItem) {
	req, opOf := c.replRequest(batch)
	c.stamp(req, batch)
	ctx, cancel := context.WithTimeout(c.env.ctx, c.env.forwardTimeout)
	defer cancel()
	start := time.Now()
	resp, err := c.stub.Replicate(ctx, req)
	ops := opsOf(req)
	var results []*peerpb.OpResult
	if err == nil {
		results, err = c.replResults(resp, len(ops), nil)
	}
	c.replFinish(ctx, batch, ops, opOf, results, err, start)
}

// replRequest builds the request for batch; opOf maps each item to its
// operation's index.
func (c *peerLink) replRequest(batch []*replItem) (req *peerpb.ReplicateRequest, opOf []int) {
	now := c.env.clock()
	req = &peerpb.ReplicateRequest{Sender: c.env.self}
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
			st.Reservations = append([]shard.Run(nil), st.Reservations...)
			st.Grants = append([]shard.Run(nil), st.Grants...)
			// An exported age is absolute in time: it grows by the time
			// the message waited.
			for j := range st.Runs {
				st.Runs[j].Age += now.Sub(it.at)
			}
			for j := range st.Reservations {
				st.Reservations[j].Age += now.Sub(it.at)
			}
			for j := range st.Grants {
				st.Grants[j].Age += now.Sub(it.at)
			}
			op.Keys = []*peerpb.KeyState{stateToWire(st)}
		}
		req.Ops = append(req.Ops, op)
	}
	return req, opOf
}

// replFinish applies the results of a batch's operations ops and tells
// the waiting items; opOf maps each item to its operation. An item nobody
// waits for (async) that the backup did not record (the batch failed, or
// its operation was refused or only partly accepted) stays counted here
// and is lost to the backup: the holder copies its partition to the
// backup again (recopy.go), so that a crash of the holder loses it only
// until that copy, not for the rest of the window.
func (c *peerLink) replFinish(ctx context.Context, batch []*replItem, ops []replOp, opOf []int, results []*peerpb.OpResult, err error, start time.Time) {
	env := c.env
	if err != nil {
		env.metrics.Forward(c.name, "replicate_error", time.Since(start))
		env.warn("replication failed", "peer", c.name, "ops", len(ops), "err", err)
		err = fmt.Errorf("%w: replicate to %s: %w", ErrUnavailable, c.name, withCtxErr(ctx, err))
		for _, it := range batch {
			if it.done != nil {
				it.done <- err
			} else {
				env.recopy(int(it.part), it.epoch)
				env.putReplItem(it)
			}
		}
		return
	}
	outcome := "replicate_ok"
	for i, it := range batch {
		j := opOf[i]
		r := results[j]
		refused := r.Status != peerpb.OpStatus_OP_STATUS_OK
		// The backup skipped some of the operation's keys: a policy its
		// table does not have, or has with another algorithm (a policy
		// change rolling out). Which ones is not said, so none of the
		// operation's admissions is confirmed: each stays counted here,
		// where it can only refuse more; a waiting caller is told
		// unavailable, not admitted without a copy, and an async one's
		// partition is copied again.
		partly := r.Accepted < ops[j].keys
		if refused || partly {
			outcome = "replicate_refused"
		}
		if it.done == nil {
			if refused || partly {
				env.recopy(int(it.part), it.epoch)
			}
			env.putReplItem(it)
			continue
		}
		switch {
		case refused:
			it.done <- fmt.Errorf("%w: backup %s answered %v for partition %d", ErrUnavailable, c.name, r.Status, it.part)
		case partly:
			it.done <- fmt.Errorf("%w: backup %s recorded %d of %d keys of partition %d (a policy it does not have, or has with another algorithm)",
				ErrUnavailable, c.name, r.Accepted, ops[j].keys, it.part)
		default:
			it.done <- nil
		}
	}
	// replicate_refused: some operation was answered but not recorded.
	env.metrics.Forward(c.name, outcome, time.Since(start))
}

// opResult is the backup's answer to one operation (peerpb.OpResult).
type opResult struct {
	status   peerpb.OpStatus
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
	// durIdx, if not nil, takes the data directory record an admission's
	// replica waits for (the largest), so that the message is answered
	// after one fsync for all its operations (replicate) rather than one
	// each; nil: the operation waits for its own.
	durIdx *uint64
}
