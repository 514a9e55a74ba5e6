package peer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/internal/grantee"
	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/peer/internal/transport"
	"github.com/ringlimit/ringlimit/peer/internal/wire"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// limiterService answers peers: it decides, as owner, the requests they forward.
type limiterService struct {
	peerpb.UnimplementedLimiterServer
	n *Node
}

// Check decides each item independently. A receiver that is not the owner in
// its own ring view never decides: it answers STATUS_NOT_OWNER with the
// member it believes holds the key, so the sender retries there or after
// refreshing its ring.
func (s *limiterService) Check(ctx context.Context, req *peerpb.CheckRequest) (*peerpb.CheckResponse, error) {
	return s.check(ctx, req, nil)
}

// checkScratch is a CheckStream worker's memory for the batches it
// decides: the answer check returns lives in it, and it is reused once
// that answer is sent.
type checkScratch struct {
	items []wire.Item
	slots []checkSlot
	slab  []byte
	out   []byte
	resp  peerpb.CheckResponse
}

// reset drops what the last batch's items and decisions point to (its
// request's memory), unless the scratch grew large, when it lets it all go.
func (sc *checkScratch) reset() {
	if cap(sc.items) > wire.MaxBatch/4 || cap(sc.out) > transport.KeepBuf {
		*sc = checkScratch{}
		return
	}
	clear(sc.items[:cap(sc.items)])
	clear(sc.slots[:cap(sc.slots)])
	sc.resp.Reset()
}

// check is Check, in sc's memory when sc is not nil.
func (s *limiterService) check(ctx context.Context, req *peerpb.CheckRequest, sc *checkScratch) (*peerpb.CheckResponse, error) {
	n := s.n
	if len(req.GetItems()) > wire.MaxBatch {
		return nil, status.Errorf(codes.InvalidArgument, "peer: batch of %d requests exceeds %d", len(req.GetItems()), wire.MaxBatch)
	}
	if n.ctx.Err() != nil {
		return nil, status.Error(codes.Unavailable, ErrClosed.Error())
	}
	if h := n.hooks.check.Load(); h != nil {
		(*h)(ctx)
	}
	if err := ctx.Err(); err != nil {
		// The sender gave up: deciding now would record admissions nobody
		// is told of.
		return nil, status.FromContextError(err).Err()
	}
	v := n.view.Load()
	if v == nil {
		// Peers can see a joining node before its first ring is built.
		return nil, status.Error(codes.Unavailable, "peer: node starting")
	}
	if sc == nil {
		sc = new(checkScratch)
	}
	var items []wire.Item
	packed := len(req.GetItemsPacked()) > 0
	if packed {
		var err error
		if items, err = wire.DecodeItems(sc.items[:0], req.GetItemsPacked()); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		sc.items = items
	} else {
		items = make([]wire.Item, len(req.GetItems()))
		for i, it := range req.GetItems() {
			pk := it.GetKey()
			items[i] = wire.Item{Key: Key{Tenant: pk.GetTenant(), Subject: pk.GetSubject(), Policy: pk.GetPolicy()},
				Hits: it.GetHits(), Op: it.GetOp(), Policies: it.GetPolicies()}
		}
	}
	// The batch's decisions, requests and waits share one allocation, and
	// its keys' encodings a second: a key encodes to its parts plus a
	// length byte each.
	slots := slices.Grow(sc.slots[:0], len(items))[:len(items)]
	clear(slots)
	sc.slots = slots
	size := 0
	for i := range items {
		k := &items[i].Key
		size += 3 + len(k.Tenant) + len(k.Subject) + len(k.Policy)
	}
	slab := slices.Grow(sc.slab[:0], size)
	sc.slab = slab
	// Every item is decided first and the synchronous backups are waited
	// for afterwards, so the batch's admissions travel to each backup
	// together. An item is answered only once its backup has it. Items
	// that wait for a moving partition share one deadline, the batch's:
	// each waiting its own half forward timeout in turn made a batch of
	// a few such items answer after the sender had given up (issue 53
	// item 14).
	until := n.waitUntil(ctx)
	for i := range items {
		sl := &slots[i]
		var r *opReq
		sl.out, r, slab = n.decideWire(ctx, v, &items[i], &sl.req, slab, until)
		if r != nil && (r.Wait != nil || r.DurIdx != 0) {
			sl.wait = r
		}
	}
	for i := range slots {
		r := slots[i].wait
		if r == nil {
			continue
		}
		// The backup first, then this node's disk (dataDir.await).
		var err error
		if r.Wait != nil {
			select {
			case err = <-r.Wait.Done():
				r.Wait.Release()
			case <-ctx.Done():
				err = fmt.Errorf("%w: waiting for the backup: %w", ErrUnavailable, ctx.Err())
			}
		}
		if derr := n.dd.await(r); err == nil {
			err = derr
		}
		if err != nil {
			slots[i].out = wireError(n, v, peerpb.Status_STATUS_UNAVAILABLE, err)
			continue
		}
		n.metrics.Decision(r.P.Name, Reason(slots[i].out.Reason), PathRemote)
	}
	resp := &sc.resp
	if packed {
		// About 40 bytes per plain decision.
		b := binary.AppendUvarint(slices.Grow(sc.out[:0], 8+48*len(slots)), uint64(len(slots)))
		for i := range slots {
			b = wire.AppendDecision(b, &slots[i].out)
		}
		resp.DecisionsPacked, sc.out = b, b
		return resp, nil
	}
	resp.Decisions = make([]*peerpb.Decision, len(slots))
	for i := range slots {
		resp.Decisions[i] = slots[i].out.ToPB()
	}
	return resp, nil
}

// checkStreamWorkers is how many batches of one CheckStream are decided at
// once: a batch may wait (sync replication, a partition on the move), and
// the others should not wait behind it. Senders keep MaxInFlight batches
// in flight (4 by default); more wait for a worker.
const checkStreamWorkers = 8

// checkTask is a received batch and when its sender gives up on it.
type checkTask struct {
	req      *peerpb.CheckRequest
	deadline time.Time // zero: none
}

// CheckStream is the receiver's side of a sender's forward pipe: one loop
// receives, a fixed set of workers decide (through Check, so every rule of
// Check holds) and answer. The workers end with the stream.
func (s *limiterService) CheckStream(st peerpb.Limiter_CheckStreamServer) error {
	ctx := st.Context()
	tasks := make(chan checkTask, checkStreamWorkers)
	var sendMu sync.Mutex // a stream takes one Send at a time
	var wg sync.WaitGroup
	for range checkStreamWorkers {
		wg.Go(func() {
			// The worker's batches share its memory: an answer is
			// encoded by Send before the next batch is decided.
			var sc checkScratch
			bc := newBatchCtx(ctx)
			defer bc.close()
			for t := range tasks {
				resp := s.checkStreamOne(ctx, t, &sc, bc)
				sendMu.Lock()
				err := st.Send(resp)
				sendMu.Unlock()
				sc.reset()
				if err != nil {
					// The stream is gone; Recv fails too and ends the loop.
					continue
				}
			}
		})
	}
	defer func() {
		close(tasks)
		wg.Wait()
	}()
	for {
		req, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if drop := s.n.hooks.streamDrop.Load(); drop != nil && (*drop)(req) {
			continue
		}
		t := checkTask{req: req}
		if ns := req.GetTimeoutNs(); ns > 0 {
			t.deadline = time.Now().Add(time.Duration(ns))
		}
		select {
		case tasks <- t:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// checkStreamOne decides one batch of a CheckStream.
func (s *limiterService) checkStreamOne(ctx context.Context, t checkTask, sc *checkScratch, bc *batchCtx) *peerpb.CheckResponse {
	if !t.deadline.IsZero() {
		bc.begin(t.deadline)
		defer bc.finish()
		ctx = bc
	}
	resp, err := s.check(ctx, t.req, sc)
	if err != nil {
		st := status.Convert(err)
		return &peerpb.CheckResponse{Id: t.req.GetId(), Code: int32(st.Code()), Error: st.Message()}
	}
	resp.Id = t.req.GetId()
	return resp
}

// checkSlot is one item of a Check batch: its decision, its request, and
// the request again while the decision waits for a synchronous backup.
type checkSlot struct {
	out  wire.Decision
	req  opReq
	wait *opReq
}

// wireError is the wire answer for an item that was not decided.
func wireError(n *Node, v *view, st peerpb.Status, err error) wire.Decision {
	return wire.Decision{Status: st, Err: err.Error(), Owner: n.name, RingVersion: v.snap.Version(), MembersHash: v.snap.MembersHash()}
}

// decideWire decides one item as holder. When the decision still waits for
// a synchronous backup, the returned request's wait is set and the caller
// must wait for it before answering (and then records the decision's
// metric); the request is nil when the item was not parsed.
func (n *Node) decideWire(ctx context.Context, v *view, it *wire.Item, r *opReq, slab []byte, until time.Time) (wire.Decision, *opReq, []byte) {
	bad := func(st peerpb.Status, err error) wire.Decision { return wireError(n, v, st, err) }
	op := opFromWire(it.Op)
	if op.Spec().OwnRPC {
		// Its id would have nowhere to go: Limiter.Lease carries it.
		return bad(peerpb.Status_STATUS_INVALID_ARGUMENT, fmt.Errorf("%w: %v travels on Limiter.Lease, one per call", ErrInvalidKey, it.Op)), nil, slab
	}
	if op == partition.OpReset {
		if err := n.ops.auth.CheckResetProof(ctx, resetProofInput(it.Key)); err != nil {
			n.warns.warn("peer reset refused: no proof of authorization", "err", err)
			return bad(peerpb.Status_STATUS_INVALID_ARGUMENT, fmt.Errorf("%w: %s", ErrInvalidKey, status.Convert(err).Message())), nil, slab
		}
	}
	ek, err := n.parseReqInto(r, op, it.Key, it.Policies, it.Hits, slab[len(slab):len(slab)])
	switch {
	case errors.Is(err, ErrUnknownPolicy):
		return bad(peerpb.Status_STATUS_UNKNOWN_POLICY, err), nil, slab
	case err != nil:
		return bad(peerpb.Status_STATUS_INVALID_ARGUMENT, err), nil, slab
	}
	if len(it.Policies) == 0 && len(ek) <= cap(slab)-len(slab) {
		slab = slab[:len(slab)+len(ek)] // ek was appended in place
	}
	r.EK = ek
	r.DeferWait = true
	d, r := n.decideWireReq(ctx, v, r, until)
	return d, r, slab
}

// waitUntil is how long a receiver waits for a partition it holds or is
// about to hold (a move in progress): within the sender's deadline and at
// most half a forward timeout, so the sender can still act on the answer.
func (n *Node) waitUntil(ctx context.Context) time.Time {
	until := time.Now().Add(n.cfg.ForwardTimeout / 2)
	if dl, ok := ctx.Deadline(); ok && dl.Before(until) {
		until = dl
	}
	return until
}

// decideWireReq decides the parsed request r (see decideWire), waiting
// for a moving partition until until.
func (n *Node) decideWireReq(ctx context.Context, v *view, r *opReq, until time.Time) (wire.Decision, *opReq) {
	bad := func(st peerpb.Status, err error) wire.Decision { return wireError(n, v, st, err) }
	pk := shard.Place(r.EK)
	pid := v.snap.PartitionOfHash(pk.Hash())
	pt := &n.pt.parts[pid]
	for {
		var d Decision
		st, ch, err := n.decideHere(ctx, v, pt, r, pk, &d)
		switch st {
		case partition.Decided:
			if err != nil {
				if errors.Is(err, ErrInvalidHits) || errors.Is(err, ErrWrongAlgorithm) {
					return bad(peerpb.Status_STATUS_INVALID_ARGUMENT, err), nil
				}
				return bad(peerpb.Status_STATUS_UNAVAILABLE, err), nil
			}
			if r.Wait == nil && r.DurIdx == 0 {
				n.metrics.Decision(r.P.Name, d.Reason, PathRemote)
			}
			out := wire.Decision{
				Status: peerpb.Status_STATUS_OK, Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining,
				RetryAfterNs: int64(d.RetryAfter), ResetAfterNs: int64(d.ResetAfter),
				Owner: n.name, RingVersion: d.RingVersion, MembersHash: v.snap.MembersHash(), Reason: peerpb.Reason(d.Reason),
				DecidedAtNs: d.DecidedAt.UnixNano(), RefusedBy: d.RefusedBy, Limits: limitsToWire(d.Limits),
			}
			return out, r
		case partition.Wait:
			if err := n.waitPart(ctx, ch, until); err != nil {
				return bad(peerpb.Status_STATUS_UNAVAILABLE, fmt.Errorf("%w: partition %d is moving", ErrUnavailable, pid)), nil
			}
			v = n.view.Load()
			continue
		}
		pt.Mu.RLock()
		r, holder, epoch := pt.Role, pt.Holder, pt.Epoch
		pt.Mu.RUnlock()
		if r == partition.RoleHint && holder != n.name {
			return wire.Decision{Status: peerpb.Status_STATUS_NOT_OWNER, Owner: holder, HolderEpoch: epoch, RingVersion: v.snap.Version(), MembersHash: v.snap.MembersHash()}, nil
		}
		if t := v.snap.PartitionOwner(pid); t != n.name {
			return wire.Decision{Status: peerpb.Status_STATUS_NOT_OWNER, Owner: t, RingVersion: v.snap.Version(), MembersHash: v.snap.MembersHash()}, nil
		}
		// We are the target and hold nothing yet: wait for the transfer.
		if err := n.waitPart(ctx, ch, until); err != nil {
			return bad(peerpb.Status_STATUS_UNAVAILABLE, fmt.Errorf("%w: partition %d has no holder here yet", ErrUnavailable, pid)), nil
		}
		v = n.view.Load()
	}
}

// publicService is the RateLimiter service for clients: any node accepts any
// key and routes it like Node.Allow.
type publicService struct {
	peerpb.UnimplementedRateLimiterServer
	n *Node
}

func (s *publicService) Allow(ctx context.Context, req *peerpb.AllowRequest) (*peerpb.AllowResponse, error) {
	return s.do(ctx, partition.OpCheck, req)
}

// Peek answers what Allow would decide, consuming nothing.
func (s *publicService) Peek(ctx context.Context, req *peerpb.AllowRequest) (*peerpb.AllowResponse, error) {
	return s.do(ctx, partition.OpPeek, req)
}

// Refund gives back units of the key's admissions, once
// Config.AuthorizeRefund (if set) allows the call.
func (s *publicService) Refund(ctx context.Context, req *peerpb.AllowRequest) (*peerpb.AllowResponse, error) {
	if err := authorize(ctx, s.n.cfg.AuthorizeRefund); err != nil {
		return nil, err
	}
	return s.do(ctx, partition.OpRefund, req)
}

// Reset clears a key, once Config.AuthorizeReset (if set) allows the call.
// Without it the public port is the guard: serve it with mutual TLS
// wherever clients must not reset quotas.
func (s *publicService) Reset(ctx context.Context, req *peerpb.AllowRequest) (*peerpb.AllowResponse, error) {
	if err := authorize(ctx, s.n.cfg.AuthorizeReset); err != nil {
		return nil, err
	}
	return s.do(ctx, partition.OpReset, req)
}

// authorize asks check (nil: anyone may) whether the call may run; its
// refusal is the call's answer, a gRPC status (PermissionDenied when check
// returned another error).
func authorize(ctx context.Context, check func(context.Context) error) error {
	if check == nil {
		return nil
	}
	err := check(ctx)
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); !ok {
		err = status.Error(codes.PermissionDenied, err.Error())
	}
	return err
}

// Acquire takes a lease of a concurrency policy.
func (s *publicService) Acquire(ctx context.Context, req *peerpb.AllowRequest) (*peerpb.AllowResponse, error) {
	pk := req.GetKey()
	l, err := s.n.Acquire(ctx, Request{Key: Key{Tenant: pk.GetTenant(), Subject: pk.GetSubject(), Policy: pk.GetPolicy()}, Hits: req.GetHits(), Policies: req.GetPolicies()})
	if err != nil {
		return nil, s.status(err)
	}
	out := DecisionToWire(l.Decision)
	out.LeaseId, out.LeaseTtlNs = l.ID, int64(l.TTL)
	return out, nil
}

// Release ends a lease of a concurrency policy.
func (s *publicService) Release(ctx context.Context, req *peerpb.AllowRequest) (*peerpb.AllowResponse, error) {
	pk := req.GetKey()
	d, err := s.n.Release(ctx, Key{Tenant: pk.GetTenant(), Subject: pk.GetSubject(), Policy: pk.GetPolicy()}, req.GetLeaseId())
	if err != nil {
		return nil, s.status(err)
	}
	return DecisionToWire(d), nil
}

// Reserve admits an estimate of a sliding_log policy, pending under a
// reservation id.
func (s *publicService) Reserve(ctx context.Context, req *peerpb.AllowRequest) (*peerpb.AllowResponse, error) {
	pk := req.GetKey()
	r, err := s.n.Reserve(ctx, Request{Key: Key{Tenant: pk.GetTenant(), Subject: pk.GetSubject(), Policy: pk.GetPolicy()}, Hits: req.GetHits(), Policies: req.GetPolicies()})
	if err != nil {
		return nil, s.status(err)
	}
	out := DecisionToWire(r.Decision)
	out.LeaseId, out.LeaseTtlNs = r.ID, int64(r.TTL)
	return out, nil
}

// Settle replaces a reservation's estimate with its actual cost.
func (s *publicService) Settle(ctx context.Context, req *peerpb.AllowRequest) (*peerpb.AllowResponse, error) {
	pk := req.GetKey()
	st, err := s.n.Settle(ctx, Key{Tenant: pk.GetTenant(), Subject: pk.GetSubject(), Policy: pk.GetPolicy()}, req.GetLeaseId(), req.GetActual())
	if err != nil {
		return nil, s.status(err)
	}
	out := DecisionToWire(st.Decision)
	out.Estimate, out.Overage = st.Estimate, st.Overage
	return out, nil
}

// batchParallel bounds the requests of one AllowBatch decided at once.
const batchParallel = 64

// AllowBatch decides independent requests; one bad item fails alone.
func (s *publicService) AllowBatch(ctx context.Context, req *peerpb.AllowBatchRequest) (*peerpb.AllowBatchResponse, error) {
	if n := len(req.GetRequests()); n > MaxBatch {
		return nil, status.Errorf(codes.InvalidArgument, "peer: batch of %d requests exceeds %d", n, MaxBatch)
	}
	out := &peerpb.AllowBatchResponse{Results: make([]*peerpb.AllowBatchResult, len(req.GetRequests()))}
	var wg sync.WaitGroup
	sem := make(chan struct{}, batchParallel)
	for i, r := range req.GetRequests() {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			resp, err := s.do(ctx, partition.OpCheck, r)
			if err != nil {
				st := status.Convert(err)
				out.Results[i] = &peerpb.AllowBatchResult{Code: int32(st.Code()), Error: st.Message()}
				return
			}
			out.Results[i] = &peerpb.AllowBatchResult{Response: resp}
		})
	}
	wg.Wait()
	return out, nil
}

func (s *publicService) do(ctx context.Context, op partition.Op, req *peerpb.AllowRequest) (*peerpb.AllowResponse, error) {
	if s.n.view.Load() == nil {
		// Clients can reach a joining node before its first ring is built.
		return nil, status.Error(codes.Unavailable, "peer: node starting")
	}
	pk := req.GetKey()
	d, err := s.n.do(ctx, op, Request{Key: Key{Tenant: pk.GetTenant(), Subject: pk.GetSubject(), Policy: pk.GetPolicy()}, Hits: req.GetHits(), Policies: req.GetPolicies()})
	if err != nil {
		return nil, s.status(err)
	}
	return DecisionToWire(d), nil
}

// status is ToStatus for the public API. An unknown policy's message
// names the policy asked for and not the node's table: the public API
// answers callers it has not authenticated, and the table's names (other
// tenants' endpoints, plans) are the operator's (issue 53 item 8).
func (s *publicService) status(err error) error {
	if !errors.Is(err, ErrUnknownPolicy) {
		return ToStatus(err)
	}
	return status.Error(codes.NotFound, fmt.Sprintf("%v: not in this node's policy table", err))
}

// DecisionToWire converts a Decision to the public API's response.
func DecisionToWire(d Decision) *peerpb.AllowResponse {
	out := &peerpb.AllowResponse{
		Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining,
		RetryAfterNs: int64(d.RetryAfter), ResetAfterNs: int64(d.ResetAfter),
		Reason: peerpb.Reason(d.Reason), Owner: d.Owner, RingVersion: d.RingVersion,
		RefusedBy: d.RefusedBy,
	}
	if !d.DecidedAt.IsZero() {
		out.DecidedAtUnixNs = d.DecidedAt.UnixNano()
	}
	for _, l := range d.Limits {
		out.Limits = append(out.Limits, &peerpb.PolicyDecision{Policy: l.Policy, Allowed: l.Allowed, Limit: l.Limit, Remaining: l.Remaining,
			RetryAfterNs: int64(l.RetryAfter), ResetAfterNs: int64(l.ResetAfter)})
	}
	return out
}

// Lease is the holder's side of forwardLease: one lease operation, decided
// like a Check item.
func (s *limiterService) Lease(ctx context.Context, req *peerpb.LeaseRequest) (*peerpb.LeaseResponse, error) {
	n := s.n
	if n.ctx.Err() != nil {
		return nil, status.Error(codes.Unavailable, ErrClosed.Error())
	}
	v := n.view.Load()
	if v == nil {
		return nil, status.Error(codes.Unavailable, "peer: node starting")
	}
	it := req.GetItem()
	op := opFromWire(it.GetOp())
	if !op.Spec().OwnRPC {
		return nil, statusInvalid(fmt.Sprintf("lease operation %v", op))
	}
	pk := it.GetKey()
	r, err := n.parseReq(op, Key{Tenant: pk.GetTenant(), Subject: pk.GetSubject(), Policy: pk.GetPolicy()}, nil, it.GetHits())
	if err != nil {
		st := peerpb.Status_STATUS_INVALID_ARGUMENT
		if errors.Is(err, ErrUnknownPolicy) {
			st = peerpb.Status_STATUS_UNKNOWN_POLICY
		}
		d := wireError(n, v, st, err)
		return &peerpb.LeaseResponse{Decision: d.ToPB()}, nil
	}
	r.Lease = req.GetLeaseId()
	if op == partition.OpSettle {
		if r.Actual = req.GetActual(); r.Actual < 0 {
			d := wireError(n, v, peerpb.Status_STATUS_INVALID_ARGUMENT, fmt.Errorf("%w: actual cost %d must not be negative", ErrInvalidHits, r.Actual))
			return &peerpb.LeaseResponse{Decision: d.ToPB()}, nil
		}
	}
	if op == partition.OpGrant {
		if len(req.GetReturns()) > shard.MaxGrants {
			d := wireError(n, v, peerpb.Status_STATUS_INVALID_ARGUMENT, fmt.Errorf("%w: %d grants returned, at most %d", ErrInvalidHits, len(req.GetReturns()), shard.MaxGrants))
			return &peerpb.LeaseResponse{Decision: d.ToPB()}, nil
		}
		for _, gr := range req.GetReturns() {
			ret := grantee.Return{ID: gr.GetLeaseId(), Uses: make([]shard.Run, len(gr.GetUses()))}
			for i, u := range gr.GetUses() {
				ret.Uses[i] = shard.Run{Age: time.Duration(max(u.GetAgeNs(), 0)), Count: u.GetCount()}
			}
			r.Returns = append(r.Returns, ret)
		}
	}
	d, _ := n.decideWireReq(ctx, v, r, n.waitUntil(ctx))
	resp := &peerpb.LeaseResponse{Decision: d.ToPB()}
	if op == partition.OpGrant && d.Status == peerpb.Status_STATUS_OK {
		resp.LeaseId, resp.LeaseTtlNs, resp.Granted = r.Lease, int64(r.LeaseTTL), r.Granted
	}
	if (op == partition.OpAcquire || op == partition.OpReserve) && d.Status == peerpb.Status_STATUS_OK && d.Allowed {
		resp.LeaseId, resp.LeaseTtlNs = r.Lease, int64(r.LeaseTTL)
	}
	if op == partition.OpSettle {
		resp.Estimate, resp.Overage = r.Estimate, r.Overage
	}
	return resp, nil
}
