package peer

// The backup's side of ownership: what a member does with the copies and
// the replication a partition's holder sends it (receiveOp, the one
// entry), until a complete copy becomes the partition's store
// (internal/partition.Part's Rep and Next) and each later admission is
// added to it (applyReplica). The Replicate RPC's handler is here too:
// it decodes a message's operations (replicaApply) and hands each to
// receiveOp.

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/internal/transport"
	"github.com/ringlimit/ringlimit/peer/internal/wire"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// receiveOp is the receiver's side of a copy and of replication.
func (n *Node) receiveOp(sender string, h opHead, keys []packedAdmit, closing bool) opResult {
	lo := n.lo
	refused := opResult{status: peerpb.OpStatus_OP_STATUS_REFUSED}
	needSync := opResult{status: peerpb.OpStatus_OP_STATUS_NEED_SYNC}
	pid := int(h.part)
	from := lo.incarnation(sender)
	if pid >= len(n.pt.parts) || sender == "" || sender == n.name || from == "" {
		return refused
	}
	pt := &n.pt.parts[pid]
	now := n.clock()
	switch h.kind {
	case peerpb.PartitionOp_KIND_SYNC_BEGIN:
		if closing || h.epoch == 0 {
			// Epoch 0 names no holding: every grant makes the epoch at
			// least 1.
			return refused
		}
		pt.Mu.Lock()
		pt.Next = replica{Holder: sender, Epoch: h.epoch, CopySeq: h.holderEpoch, Store: n.pt.newStore()}
		pt.Mu.Unlock()
		return opResult{status: peerpb.OpStatus_OP_STATUS_OK}
	case peerpb.PartitionOp_KIND_SYNC_CHUNK:
		pt.Mu.Lock()
		defer pt.Mu.Unlock()
		if pt.Next.Holder != sender || pt.Next.Epoch != h.epoch || pt.Next.CopySeq != h.holderEpoch || pt.Next.Store == nil {
			return needSync // not the copy under way: an older one, late
		}
		if len(keys) < h.carried {
			pt.Next = replica{} // keys this node cannot record: not a complete copy
			return needSync
		}
		accepted := 0
		for _, k := range keys {
			if err := pt.Next.Store.Import(k.st, k.sp, now); err != nil {
				pt.Next = replica{}
				return opResult{status: peerpb.OpStatus_OP_STATUS_NEED_SYNC, accepted: uint32(accepted)}
			}
			accepted++
		}
		n.metrics.Backup("received", "ok", accepted)
		return opResult{status: peerpb.OpStatus_OP_STATUS_OK, accepted: uint32(accepted)}
	case peerpb.PartitionOp_KIND_SYNC_END:
		if closing {
			// Refused before the machine is asked, so a leaving node never
			// keeps a copy it answered it did not take.
			return refused
		}
		pt.Mu.Lock()
		nx := pt.Next
		dup := pt.Rep.Complete && pt.Rep.Holder == sender && pt.Rep.Epoch == h.epoch && pt.Rep.CopySeq == h.holderEpoch
		pt.Mu.Unlock()
		if nx.Holder != sender || nx.Epoch != h.epoch || nx.CopySeq != h.holderEpoch || nx.Store == nil {
			if dup {
				return opResult{status: peerpb.OpStatus_OP_STATUS_OK}
			}
			return needSync
		}
		// The machine is asked without the partition's lock: the runner
		// takes it to publish.
		ctx, cancel := context.WithTimeout(n.ctx, n.cfg.ForwardTimeout)
		ok := lo.run.OfferCopy(ctx, pid, from, nx.Epoch, nx.CopySeq)
		cancel()
		pt.Mu.Lock()
		defer pt.Mu.Unlock()
		if pt.Next.Store != nx.Store {
			return needSync // another copy began meanwhile
		}
		pt.Next = replica{}
		if !ok {
			return refused
		}
		pt.Store = nx.Store
		pt.Rep = replica{Holder: sender, Epoch: nx.Epoch, CopySeq: nx.CopySeq, Complete: true}
		if n.dd != nil {
			// The copy is this backup's state: on disk before it is
			// acknowledged (partlog.go).
			if err := n.dd.parts.copied(pid, nx.Epoch, nx.Store); err != nil {
				return refused
			}
		}
		return opResult{status: peerpb.OpStatus_OP_STATUS_OK}
	case peerpb.PartitionOp_KIND_ADMIT, peerpb.PartitionOp_KIND_REPLACE:
		if !n.awaitReplica(pt, pid, from, h.epoch) {
			return needSync
		}
		res, idx := n.applyReplica(pt, pid, h, keys, now)
		pt.Mu.Unlock()
		if idx != 0 && h.durIdx != nil {
			*h.durIdx = max(*h.durIdx, idx) // the message's answer waits
		} else if idx != 0 && n.dd.sync(idx) != nil {
			return opResult{status: peerpb.OpStatus_OP_STATUS_NEED_SYNC}
		}
		return res
	case peerpb.PartitionOp_KIND_HEARTBEAT, peerpb.PartitionOp_KIND_RELEASE:
		// Sent by members of older releases (their leases and copy
		// releases): nothing to do here.
		return opResult{status: peerpb.OpStatus_OP_STATUS_OK}
	default:
		return refused
	}
}

// awaitReplica locks pt when this member may apply a replica of pid from
// holder from at epoch, and reports whether it may. A holder replicates at
// a new epoch (after the SetBackup naming this member) as soon as it has
// applied the command, which may be a moment before this member has: a
// replica from a newer epoch than the one applied here waits for the log
// to catch up, within half a ForwardTimeout, rather than fail the
// holder's decision. On false pt is not locked.
func (n *Node) awaitReplica(pt *part, pid int, from string, epoch uint64) bool {
	lo := n.lo
	var timeout <-chan time.Time
	for {
		pt.Mu.Lock()
		if lo.run.AcceptReplica(pid, from, epoch) && pt.Store != nil {
			return true
		}
		ch := pt.Changed
		behind := lo.run.Part(pid).Epoch < epoch
		pt.Mu.Unlock()
		if !behind {
			return false
		}
		if timeout == nil {
			t := time.NewTimer(n.cfg.ForwardTimeout / 2)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-ch:
		case <-timeout:
			return false
		case <-n.ctx.Done():
			return false
		}
	}
}

// applyReplica applies replicated admissions to the backup's store (pt
// locked by awaitReplica) and, with a data directory, logs the keys of
// policies kept on disk: idx is the record to Sync before answering (0:
// none to wait for).
func (n *Node) applyReplica(pt *part, pid int, h opHead, keys []packedAdmit, now time.Time) (opResult, uint64) {
	if h.seq != 0 {
		if h.seq < pt.Rep.Seq {
			return opResult{status: peerpb.OpStatus_OP_STATUS_NEED_SYNC}, 0 // delivered late: applying it could undo later ones
		}
		pt.Rep.Seq = h.seq
	}
	accepted := 0
	for _, k := range keys {
		if h.kind == peerpb.PartitionOp_KIND_REPLACE {
			pt.Store.Delete(k.st.Key)
			if len(k.st.Runs) == 0 && len(k.st.Reservations) == 0 && len(k.st.Grants) == 0 {
				accepted++
				continue
			}
		}
		if err := pt.Store.Import(k.st, k.sp, now); err != nil {
			return opResult{status: peerpb.OpStatus_OP_STATUS_NEED_SYNC, accepted: uint32(accepted)}, 0
		}
		accepted++
	}
	idx, err := n.dd.replica(pid, h.epoch, pt.Store, keys, now)
	if err != nil {
		return opResult{status: peerpb.OpStatus_OP_STATUS_NEED_SYNC}, 0
	}
	n.metrics.Backup("received", "ok", accepted)
	return opResult{status: peerpb.OpStatus_OP_STATUS_OK, accepted: uint32(accepted)}, idx
}

// replicaApply is the backup's side of one replication message from the
// holder sender: it decodes the message's operations against this node's
// policy table and hands each to the ownership log's driver, which keeps
// the copies (receiveOp).
type replicaApply struct {
	n       *Node // its receiveOp keeps the copies
	table   *policyTable
	parts   int // the ring's partitions: a larger number is refused
	sender  string
	seq     uint64      // the message's ReplicateRequest.Seq
	sw      senderTable // what the sender tells of its policy table
	closing bool        // this node is closing
	durIdx  *uint64     // see opHead.durIdx
}

// op applies one operation to this node's copy.
func (a *replicaApply) op(op *peerpb.PartitionOp) *peerpb.OpResult {
	var keys []packedAdmit
	for _, w := range op.GetKeys() {
		st, p, err := a.table.decodeState(w)
		if err != nil || p == nil {
			continue // malformed, or a policy this node does not have
		}
		keys = append(keys, packedAdmit{st: st, sp: importPolicy(p, a.sw)})
	}
	h := opHead{kind: op.GetKind(), part: op.GetPartition(), epoch: op.GetEpoch(), holderEpoch: op.GetHolderEpoch(), carried: len(op.GetKeys()), seq: a.seq, durIdx: a.durIdx}
	r := a.n.receiveOp(a.sender, h, keys, a.closing)
	return &peerpb.OpResult{Status: r.status, Holder: r.holder, Epoch: r.epoch, Accepted: r.accepted}
}

// admitScratch is replicaApply.packed's scratch.
type admitScratch struct {
	runs []shard.Run
	ents []packedAdmit
}

var admitScratchPool = sync.Pool{New: func() any { return new(admitScratch) }}

// put drops the keys and policies sc points to and pools it, unless it
// grew large.
func (sc *admitScratch) put() {
	if cap(sc.ents) > maxReplBatch || cap(sc.runs) > maxReplBatch {
		return
	}
	clear(sc.ents[:cap(sc.ents)])
	admitScratchPool.Put(sc)
}

// packed applies a packed admissions request and returns the packed
// answer, in out's memory. a.durIdx, if not nil, gathers the data
// directory record the answer must wait for (see opHead.durIdx).
func (a *replicaApply) packed(out []byte, b []byte) ([]byte, error) {
	r := wire.NewReader(b) // its strings alias b (see wire.NewReader)
	tab := a.table.Load()  // once per request
	nops := r.Count(wire.MaxBatch, 3)
	out = binary.AppendUvarint(slices.Grow(out[:0], 8+16*nops), uint64(nops))
	// Scratch shared by the operations, and reused by later requests:
	// receiveOp keeps neither (Import copies the runs it merges).
	sc := admitScratchPool.Get().(*admitScratch)
	defer sc.put()
	runs, ents := sc.runs[:0], sc.ents[:0]
	defer func() { sc.runs, sc.ents = runs, ents }()
	for range nops {
		part, epoch := r.Uvarint(), r.Uvarint()
		ne := r.Count(r.Size(), 6)
		// Import copies the runs it merges: one slice serves every
		// operation.
		if cap(runs) < ne {
			runs = make([]shard.Run, 0, ne)
		}
		if cap(ents) < ne {
			ents = make([]packedAdmit, 0, ne)
		}
		runs = runs[:0]
		ents = ents[:0]
		for range ne {
			k := Key{Tenant: r.Str(), Subject: r.Str(), Policy: r.Str()}
			alg := r.Uvarint()
			runs = append(runs, shard.Run{Age: time.Duration(r.Varint()), Count: r.Varint()})
			st := shard.KeyState{Key: k, Algorithm: shard.Algorithm(alg), Runs: runs[len(runs)-1 : len(runs) : len(runs)]}
			if alg > 255 || st.Validate() != nil {
				continue // malformed: skipped, as replicaApply.op skips it
			}
			if p := tab.Lookup(k.Policy); p != nil && p.Shard.Algorithm == st.Algorithm {
				ents = append(ents, packedAdmit{st: st, sp: importPolicy(p, a.sw)})
			}
		}
		if r.Err() != nil {
			break
		}
		if part > uint64(^uint32(0)) {
			part = uint64(a.parts) // refused below
		}
		res := a.n.receiveOp(a.sender, opHead{kind: peerpb.PartitionOp_KIND_ADMIT, part: uint32(part), epoch: epoch, carried: ne, seq: a.seq, durIdx: a.durIdx}, ents, a.closing)
		out = binary.AppendUvarint(out, uint64(res.status))
		out = wire.AppendString(out, res.holder)
		out = binary.AppendUvarint(out, res.epoch)
		out = binary.AppendUvarint(out, uint64(res.accepted))
	}
	if err := r.End(); err != nil {
		return nil, fmt.Errorf("%w at byte %d", err, r.Offset())
	}
	return out, nil
}

// Replicate is the backup's side of replication.
func (s *limiterService) Replicate(_ context.Context, req *peerpb.ReplicateRequest) (*peerpb.ReplicateResponse, error) {
	if drop := s.n.hooks.replDrop.Load(); drop != nil && (*drop)(req) {
		return nil, status.Error(codes.Unavailable, "peer: replication request dropped (test)")
	}
	return s.replicate(req, nil, nil)
}

// replScratch is a ReplicateStream's memory for its answers: the answer
// replicate returns lives in it, and it is reused once that is sent.
type replScratch struct {
	out  []byte
	resp peerpb.ReplicateResponse
}

// replicate is Replicate, answering in sc's memory when sc is not nil.
// With deferIdx not nil, the answer is not waited for the data directory:
// *deferIdx is set to the record it must wait for (0: none), and the caller
// syncs it before sending the answer (ReplicateStream's pipelined
// answers).
func (s *limiterService) replicate(req *peerpb.ReplicateRequest, sc *replScratch, deferIdx *uint64) (*peerpb.ReplicateResponse, error) {
	n := s.n
	if hold := n.hooks.replHold.Load(); hold != nil {
		if applied := (*hold)(req); applied != nil {
			defer applied()
		}
	}
	if len(req.GetOps()) > wire.MaxBatch {
		return nil, status.Errorf(codes.InvalidArgument, "peer: %d operations exceed %d", len(req.GetOps()), wire.MaxBatch)
	}
	closing := n.closing.Load()
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
		var durIdx uint64
		a := replicaApply{n: n, table: &n.table, parts: len(n.pt.parts), sender: req.GetSender(), seq: req.GetSeq(), sw: sw, closing: closing, durIdx: &durIdx}
		b, err := a.packed(sc.out[:0], req.GetAdmitsPacked())
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		if durIdx != 0 && deferIdx != nil {
			*deferIdx = durIdx
		} else if durIdx != 0 {
			// Every operation's replica on disk before any is
			// acknowledged: a failed write answers none (the holder
			// copies the partitions again, or fails sync admissions).
			if err := n.dd.sync(durIdx); err != nil {
				return nil, status.Error(codes.Unavailable, err.Error())
			}
		}
		if cap(b) <= transport.KeepBuf {
			sc.out = b
		}
		sc.resp.Reset()
		sc.resp.ResultsPacked = b
		return &sc.resp, nil
	}
	resp := &peerpb.ReplicateResponse{Results: make([]*peerpb.OpResult, len(req.GetOps()))}
	var durIdx uint64
	a := replicaApply{n: n, table: &n.table, parts: len(n.pt.parts), sender: req.GetSender(), seq: req.GetSeq(), sw: sw, closing: closing, durIdx: &durIdx}
	for i, op := range req.GetOps() {
		resp.Results[i] = a.op(op)
	}
	if durIdx != 0 && deferIdx != nil {
		*deferIdx = durIdx
	} else if durIdx != 0 {
		if err := n.dd.sync(durIdx); err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
	}
	return resp, nil
}
