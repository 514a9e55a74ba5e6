package peer

// AllowStream: the public streaming form of Allow. A client keeps one
// stream per node and sends each request with an id of its choosing; the
// node answers each id once, in any order.
//
// The rules:
//   - Every item is decided as Allow decides it: the same validation, the
//     same routing (a node that does not hold the key's partition forwards
//     it once, or waits for a transfer), the same failure policy. Speed
//     never buys a second decision point: the stream only changes how
//     requests reach the node and how answers leave it.
//   - The stream's receiver decides the items its node holds at once, on
//     its own goroutine, with no hand-off. Admissions that wait for a
//     synchronous backup are answered together once the backup has them
//     (the batch's admissions travel to the backup in one message); an
//     item that must be forwarded or must wait for its partition gets a
//     goroutine of its own, so it holds up nothing else.
//   - One goroutine per stream sends: it gathers the answers ready
//     (admissions once their backup has them) into one message. The
//     handler waits for it, so nothing is sent after the handler returns.
//   - The stream ends when the client closes its side, the client goes
//     away, or the node stops (Unavailable): the handler then waits for its
//     goroutines, which end with the stream's context or the node's.

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// allowStream is one AllowStream call on the server.
type allowStream struct {
	n   *Node
	st  peerpb.RateLimiter_AllowStreamServer
	ctx context.Context
	// jobs carries answers to the stream's sender (answer); quit, closed
	// by the handler, tells everyone the stream is over.
	jobs chan streamJob
	quit chan struct{}

	mu   sync.Mutex // guards done and wg.Add
	done bool       // the handler is returning: no more goroutines
	wg   sync.WaitGroup
	// routing holds a slot per item being routed on a goroutine of its
	// own: at most maxStreamRouted at once, then the receiver waits (and
	// flow control holds the client back).
	routing chan struct{}
}

// maxStreamRouted bounds the items of one stream routed at once (each on
// a goroutine until its holder answers or ForwardTimeout passes): a client
// that sends faster than holders answer is held back instead of growing
// the node's goroutines without bound.
const maxStreamRouted = 2 * MaxBatch

// streamJob is answers for the sender: ready ones, and admissions to
// answer once their synchronous backup has them.
type streamJob struct {
	ready, waiting []*streamReq
}

// streamJobs bounds the jobs waiting for the sender; a full queue holds
// the receiver back, and so the client.
const streamJobs = 64

// AllowStream decides a stream of single requests (see the rules above).
func (s *publicService) AllowStream(st peerpb.RateLimiter_AllowStreamServer) error {
	n := s.n
	if n.stopped.Load() {
		return status.Error(codes.Unavailable, ErrClosed.Error())
	}
	if n.view.Load() == nil {
		// Clients can reach a joining node before its first ring is built.
		return status.Error(codes.Unavailable, "peer: node starting")
	}
	as := &allowStream{n: n, st: st, ctx: st.Context(), jobs: make(chan streamJob, streamJobs), quit: make(chan struct{}),
		routing: make(chan struct{}, maxStreamRouted)}
	recvDone := make(chan error, 1)
	// The receiver runs beside the handler so that a stopping node ends
	// the stream while Recv blocks; it ends once the handler returns (the
	// stream's context is cancelled then). Close waits for it through
	// n.wg, after the gRPC server has stopped and so after this Add.
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		recvDone <- as.receive()
	}()
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		as.answer()
	}()
	var err error
	select {
	case err = <-recvDone:
	case <-n.ctx.Done():
		err = status.Error(codes.Unavailable, ErrClosed.Error())
	}
	as.mu.Lock()
	as.done = true
	as.mu.Unlock()
	// Routed requests end with the stream's context or the node's; their
	// answers reach the sender before quit (after a clean end of the
	// client's side) or are dropped.
	as.wg.Wait()
	close(as.quit)
	<-answered
	return err
}

// receive reads messages and decides their items until the stream ends.
func (as *allowStream) receive() error {
	for {
		req, err := as.st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if n := len(req.GetItems()); n > MaxBatch {
			return status.Errorf(codes.InvalidArgument, "peer: AllowStream message of %d items exceeds %d", n, MaxBatch)
		}
		as.decide(req.GetItems())
	}
}

// streamReq is one item being decided: its request and its result.
type streamReq struct {
	r    opReq
	res  peerpb.AllowStreamResult
	resp peerpb.AllowResponse // res.Response when decided: one allocation less
	d    Decision
}

// decide decides the items of one message: the ones this node can decide
// now here, the others on goroutines of their own.
func (as *allowStream) decide(items []*peerpb.AllowStreamItem) {
	n := as.n
	if len(items) == 0 {
		return
	}
	// One allocation for the message's requests and results, one for the
	// keys' encodings (a key encodes to its parts plus a length byte each).
	reqs := make([]streamReq, len(items))
	size := 0
	for _, it := range items {
		k := it.GetRequest().GetKey()
		size += 3 + len(k.GetTenant()) + len(k.GetSubject()) + len(k.GetPolicy())
	}
	slab := make([]byte, 0, size)
	var job streamJob
	for i, it := range items {
		sr := &reqs[i]
		sr.res.Id = it.GetId()
		req := it.GetRequest()
		pk := req.GetKey()
		key := Key{Tenant: pk.GetTenant(), Subject: pk.GetSubject(), Policy: pk.GetPolicy()}
		if n.stopped.Load() {
			sr.set(ErrClosed)
			job.ready = append(job.ready, sr)
			continue
		}
		ek, err := n.parseReqInto(&sr.r, partition.OpCheck, key, req.GetPolicies(), req.GetHits(), slab[len(slab):len(slab)])
		if err != nil {
			sr.set(err)
			job.ready = append(job.ready, sr)
			continue
		}
		if len(req.GetPolicies()) == 0 && len(ek) <= cap(slab)-len(slab) {
			slab = slab[:len(slab)+len(ek)] // ek was appended in place
		}
		sr.r.EK = ek
		if sr.r.Multi != nil || !as.tryHere(sr) {
			as.goRoute(sr)
			continue
		}
		if sr.r.Wait != nil || sr.r.DurIdx != 0 {
			job.waiting = append(job.waiting, sr)
		} else {
			job.ready = append(job.ready, sr)
		}
	}
	as.push(job)
}

// push hands job to the sender; dropped once the stream is over.
func (as *allowStream) push(job streamJob) {
	if len(job.ready) == 0 && len(job.waiting) == 0 {
		return
	}
	select {
	case as.jobs <- job:
	case <-as.quit:
	}
}

// tryHere decides sr on this node if it holds the key's partition and may
// decide at once; a synchronous backup's answer is left in sr.r.Wait. It
// reports false when the request must be routed (forwarded, or wait for
// its partition).
func (as *allowStream) tryHere(sr *streamReq) bool {
	n := as.n
	v := n.view.Load()
	pk := shard.Place(sr.r.EK)
	pid := v.snap.PartitionOfHash(pk.Hash())
	sr.r.DeferWait = true
	var d Decision
	st, _, err := n.decideHere(as.ctx, v, &n.pt.parts[pid], &sr.r, pk, &d)
	sr.r.DeferWait = false
	if st != partition.Decided {
		return false
	}
	if err != nil {
		sr.d, err = n.failure.unavailable(&sr.r, err)
		sr.set(err)
		return true
	}
	sr.d = d
	if sr.r.Wait == nil && sr.r.DurIdx == 0 {
		n.metrics.Decision(sr.r.P.Name, d.Reason, PathLocal)
		sr.set(nil)
	}
	return true
}

// pending reports whether a request of srs waits for a data directory
// record not yet on disk (never, without a data directory).
func (dd *dataDir) pending(srs []*streamReq) bool {
	if dd == nil {
		return false
	}
	for _, sr := range srs {
		if sr.r.DurIdx != 0 && !dd.parts.parts.Synced(sr.r.DurIdx) {
			return true
		}
	}
	return false
}

// answer is the stream's one sender: it takes the jobs waiting, waits for
// their admissions' backups (in order: one backup's answers come in the
// order it was sent), and sends all their answers in one message, until
// quit. The jobs still queued at quit are sent too (nothing answers them
// otherwise, and the handler has not returned yet).
func (as *allowStream) answer() {
	var srs []*streamReq
	for {
		srs = srs[:0]
		select {
		case job := <-as.jobs:
			srs = as.collect(srs, job)
		case <-as.quit:
			for {
				select {
				case job := <-as.jobs:
					srs = as.collect(srs, job)
				default:
					as.send(srs)
					return
				}
			}
		}
	gather:
		for len(srs) < MaxBatch {
			select {
			case job := <-as.jobs:
				if len(srs) > 0 && as.n.dd.pending(job.waiting) {
					// The answers gathered do not wait for this job's
					// fsync: each would wait one more.
					as.send(srs)
					srs = srs[:0]
				}
				srs = as.collect(srs, job)
			default:
				break gather
			}
		}
		as.send(srs)
	}
}

// collect appends job's answers to srs, once its admissions' backup has
// them.
func (as *allowStream) collect(srs []*streamReq, job streamJob) []*streamReq {
	n := as.n
	srs = append(srs, job.ready...)
	for _, sr := range job.waiting {
		// The backup first, then this node's disk (dataDir.await).
		var err error
		if sr.r.Wait != nil {
			select {
			case err = <-sr.r.Wait.Done():
				sr.r.Wait.Release()
			case <-as.ctx.Done():
				err = errors.Join(ErrUnavailable, as.ctx.Err())
			case <-n.ctx.Done():
				err = ErrClosed
			}
			sr.r.Wait = nil
		}
		if derr := n.dd.await(&sr.r); err == nil {
			err = derr
		}
		if err != nil {
			// Recorded here but not confirmed by the backup: the failure
			// policy answers, as it does for Allow.
			sr.d, err = n.failure.unavailable(&sr.r, err)
		} else {
			n.metrics.Decision(sr.r.P.Name, sr.d.Reason, PathLocal)
		}
		sr.set(err)
	}
	return append(srs, job.waiting...)
}

// goRoute decides sr by routing it (forward, or wait for its partition) on
// a goroutine of its own.
func (as *allowStream) goRoute(sr *streamReq) {
	select {
	case as.routing <- struct{}{}:
	case <-as.ctx.Done():
		return // the stream is over: no answer can be sent
	case <-as.n.ctx.Done():
		return
	}
	as.mu.Lock()
	defer as.mu.Unlock()
	if as.done {
		<-as.routing
		return // the stream is over: no answer can be sent
	}
	as.wg.Add(1)
	go func() {
		defer as.wg.Done()
		defer func() { <-as.routing }()
		d, err := as.n.route(as.ctx, &sr.r, sr.r.EK)
		sr.d = d
		sr.set(err)
		as.push(streamJob{ready: []*streamReq{sr}})
	}()
}

// set fills sr's result from its decision, or from err.
func (sr *streamReq) set(err error) {
	if err != nil {
		st := status.Convert(ToStatus(err))
		sr.res.Code, sr.res.Error = int32(st.Code()), st.Message()
		return
	}
	if sr.d.Limits != nil {
		sr.res.Response = DecisionToWire(sr.d)
		return
	}
	d, out := &sr.d, &sr.resp
	out.Allowed, out.Limit, out.Remaining = d.Allowed, d.Limit, d.Remaining
	out.RetryAfterNs, out.ResetAfterNs = int64(d.RetryAfter), int64(d.ResetAfter)
	out.Reason, out.Owner, out.RingVersion = peerpb.Reason(d.Reason), d.Owner, d.RingVersion
	if !d.DecidedAt.IsZero() {
		out.DecidedAtUnixNs = d.DecidedAt.UnixNano()
	}
	sr.res.Response = out
}

// send sends the results of srs in one message. A failed Send is not
// reported: the stream is gone, and Recv ends the handler.
func (as *allowStream) send(srs []*streamReq) {
	if len(srs) == 0 {
		return
	}
	resp := &peerpb.AllowStreamResponse{Results: make([]*peerpb.AllowStreamResult, len(srs))}
	for i, sr := range srs {
		resp.Results[i] = &sr.res
	}
	_ = as.st.Send(resp)
}

// Placement returns this node's placement table: the live members, and for
// every partition the member that holds it now: this node if it holds it,
// else the live holder the ownership table names (as this node's applied
// log publishes it: the member its own requests are forwarded to), else the
// ring's target. A client that sends each key to that member saves the
// forward hop; a table out of date costs only the hop (the receiver
// forwards), never a second decision point.
func (s *publicService) Placement(ctx context.Context, _ *peerpb.PlacementRequest) (*peerpb.PlacementResponse, error) {
	n := s.n
	if n.stopped.Load() {
		return nil, status.Error(codes.Unavailable, ErrClosed.Error())
	}
	v := n.view.Load()
	if v == nil {
		return nil, status.Error(codes.Unavailable, "peer: node starting")
	}
	names := make([]string, 0, len(v.alive))
	for name := range v.alive {
		names = append(names, name)
	}
	slices.Sort(names)
	index := make(map[string]uint32, len(names))
	resp := &peerpb.PlacementResponse{
		Node: n.name, RingVersion: v.snap.Version(), MembersHash: v.snap.MembersHash(),
		PartitionCount: uint32(v.snap.PartitionCount()),
		Members:        make([]*peerpb.PlacementMember, len(names)),
		Holders:        make([]uint32, v.snap.PartitionCount()),
	}
	for i, name := range names {
		index[name] = uint32(i)
		resp.Members[i] = &peerpb.PlacementMember{Name: name, Addr: v.alive[name]}
	}
	for pid := range resp.Holders {
		// The ownership table, not the ring: after a holder's crash the
		// ring keeps naming it until gossip declares it dead (seconds),
		// while the table names its backup as soon as the takeover is
		// applied. A table's record lags a move by one commit at most;
		// the member it names then forwards, as the ring's target would.
		pt := &n.pt.parts[pid]
		pt.Mu.RLock()
		r, named := pt.Role, pt.Holder
		pt.Mu.RUnlock()
		holder := v.snap.PartitionOwner(pid)
		switch r {
		case partition.RoleHolder, partition.RoleFenced:
			holder = n.name
		case partition.RoleHint:
			if _, ok := v.alive[named]; ok {
				holder = named
			}
		}
		i, ok := index[holder]
		if !ok {
			return nil, status.Errorf(codes.Unavailable, "peer: partition %d has no live member to go to", pid)
		}
		resp.Holders[pid] = i
	}
	return resp, nil
}
