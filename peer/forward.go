package peer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/peer/internal/transport"
	"github.com/ringlimit/ringlimit/peer/internal/wire"
	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// peerLink is the connection to one peer incarnation (name and address) and
// the batcher that coalesces concurrent forwards to it. The connection is
// dialed lazily by gRPC and closed when the peer leaves or restarts.
type peerLink struct {
	env   *linkEnv
	name  string
	addr  string
	conn  *grpc.ClientConn
	stub  peerpb.LimiterClient
	queue chan *call
	repl  *replicator   // partition operations to this peer as backup
	sem   chan struct{} // in-flight batch RPCs
	// answered is nudged by every answer to a batch; batchLoop waits on
	// it while it gathers (the batches in flight are the taken slots of
	// sem other than the one it holds).
	answered chan struct{}
	quit     chan struct{}
	once     sync.Once
	// pipe is the forward stream to the peer; batchLoop owns it.
	pipe pipeState[peerpb.CheckRequest, peerpb.CheckResponse]
}

// call is one forwarded request waiting for its batch's answer.
type call struct {
	item  peerpb.CheckItem
	key   peerpb.Key
	done  chan callResult
	timer *time.Timer // ForwardTimeout for the waiting caller; reused with the call
	// abandoned is set by a caller that gave up while the call was
	// queued: a batch not yet sent leaves it out, so a request whose
	// caller was told "unavailable" is not decided (and counted) later.
	// An abandoned call never returns to the pool.
	abandoned atomic.Bool
}

type callResult struct {
	d   wire.Decision
	err error
}

const queueLen = 4096

// peerWindow is the flow-control window of peer connections and of the
// server, per stream and per connection: 1 MiB covers a large batch, and
// partition copies are chunked well below it.
const peerWindow = 1 << 20

// peerLinks is the node's links to its peers, one per member
// incarnation, and what they share: the pools of forwarded calls and of
// replication items, the numbering of replication messages, the gather
// time and the counters tests read. Its links take what they need of the
// node from env (linkenv.go).
type peerLinks struct {
	// env is set once the node's peer authentication is (startRPC),
	// before anything dials.
	env *linkEnv

	mu sync.Mutex
	m  map[string]*peerLink // by member name

	calls     sync.Pool // of *call, reused by forwards
	replItems sync.Pool // of *replItem, reused by replication
	// replSeq numbers replication messages (ReplicateRequest.Seq).
	replSeq atomic.Uint64
	// gather is how long a batch of forwards or of replication waits for
	// the message in flight on its pipe before it takes another slot:
	// pipeGather (tests lengthen it to make the gathering certain).
	gather atomic.Int64
	// pipeBreaks counts streams to peers that broke (tests wait on it);
	// framedOpened the framed pipes opened to peers (tests read it).
	pipeBreaks, framedOpened atomic.Int64
	// copyBarriers counts copies that waited for the replication queued
	// to their receiver before exporting (tests read it).
	copyBarriers atomic.Int64
}

// init readies l for use; env comes later.
func (l *peerLinks) init() {
	l.m = make(map[string]*peerLink)
	l.calls.New = func() any { return &call{done: make(chan callResult, 1)} }
	l.replItems.New = func() any { return &replItem{ch: make(chan error, 1)} }
	l.gather.Store(int64(pipeGather))
}

// dial returns the link to member name at addr, creating it (and its
// batcher goroutines) on first use. A link to an older address of the
// same name is replaced.
func (l *peerLinks) dial(name, addr string) (*peerLink, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.m[name]; c != nil {
		if c.addr == addr {
			return c, nil
		}
		c.stop()
		delete(l.m, name)
	}
	env := l.env
	if env.ctx.Err() != nil {
		return nil, ErrClosed
	}
	creds := insecure.NewCredentials()
	if env.tls != nil {
		creds = credentials.NewTLS(env.tls)
	}
	// Fixed flow-control windows turn off gRPC's bandwidth estimation,
	// which answers data with pings: on a busy pipe of small messages
	// they were a write and a read in every few.
	conn, err := grpc.NewClient(addr, append(env.auth.DialOptions(name, env.tls != nil), grpc.WithTransportCredentials(creds),
		grpc.WithInitialWindowSize(peerWindow), grpc.WithInitialConnWindowSize(peerWindow))...)
	if err != nil {
		return nil, fmt.Errorf("peer: client for %s at %s: %w", name, addr, err)
	}
	c := &peerLink{
		env: env, name: name, addr: addr, conn: conn,
		stub:     peerpb.NewLimiterClient(conn),
		queue:    make(chan *call, queueLen),
		sem:      make(chan struct{}, env.maxInFlight),
		answered: make(chan struct{}, 1),
		quit:     make(chan struct{}),
	}
	c.repl = &replicator{c: c, queue: make(chan *replItem, replQueueLen), sem: make(chan struct{}, env.maxInFlight), answered: make(chan struct{}, 1)}
	l.m[name] = c
	env.wg.Add(2)
	go c.batchLoop()
	go c.replLoop()
	return c, nil
}

// to returns the link to a live member by name.
func (l *peerLinks) to(name string) (*peerLink, error) {
	addr, ok := l.env.view.Load().alive[name]
	if !ok {
		return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, name, errNoPeer)
	}
	return l.dial(name, addr)
}

// drop stops the links to members that left or changed address.
func (l *peerLinks) drop(addrs map[string]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, c := range l.m {
		if addrs[name] != c.addr {
			c.stop()
			delete(l.m, name)
		}
	}
}

// dropMember stops the link to member name, if there is one.
func (l *peerLinks) dropMember(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.m[name]; c != nil {
		c.stop()
		delete(l.m, name)
	}
}

// stopAll stops every link (their batchers exit; the node's wg waits for
// them).
func (l *peerLinks) stopAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, c := range l.m {
		c.stop()
		delete(l.m, name)
	}
}

func (c *peerLink) stop() { c.once.Do(func() { close(c.quit) }) }

// pipeGather is how long a batch waits for the batch in flight before it
// uses another in-flight slot.
const pipeGather = 5 * time.Millisecond

// batchLoop takes an in-flight slot, then everything queued (up to
// MaxBatch), and sends it as one RPC. No fixed delay is added: while RPCs are
// in flight, requests queue up and leave together in the next batch.
//
// While a batch is in flight, the next one gathers: it leaves when the
// answer comes (which wakes callers that mostly ask again at once, into
// this batch), or after pipeGather. Fewer, larger messages cost far less
// per request (a write and a read each way, and on the owner a
// replication message and its answer), and the answer takes no longer
// to come; the further slots are for a batch that is slow to answer
// (a partition on the move), which should not hold the others up for
// long.
func (c *peerLink) batchLoop() {
	gather := time.NewTimer(pipeGather)
	gather.Stop()
	defer c.env.wg.Done()
	defer func() {
		// Break the pipe, which fails the batches waiting on it; wait for
		// in-flight batches, then fail whatever is still queued.
		c.pipe.close(fmt.Errorf("%w: connection to %s closed", ErrUnavailable, c.name))
		for range cap(c.sem) {
			c.sem <- struct{}{}
		}
		for {
			select {
			case k := <-c.queue:
				k.done <- callResult{err: fmt.Errorf("%w: connection to %s closed", ErrUnavailable, c.name)}
			default:
				_ = c.conn.Close()
				return
			}
		}
	}()
	for {
		select {
		case c.sem <- struct{}{}:
		case <-c.quit:
			return
		}
		var first *call
		select {
		case first = <-c.queue:
		case <-c.quit:
			<-c.sem
			return
		}
		if len(c.sem) > 1 && len(c.queue) < c.env.maxBatch-1 {
			gather.Reset(time.Duration(c.env.gather.Load()))
		wait:
			for len(c.sem) > 1 {
				select {
				case <-c.answered:
				case <-gather.C:
					break wait
				case <-c.quit:
					break wait // the batch fails with the others below
				}
			}
			gather.Stop()
		}
		if len(c.queue) < c.env.maxBatch {
			// Let callers that are ready to run enqueue first: on a busy
			// node the batch grows by what they add, and fewer, larger
			// messages cost far less than the yield.
			runtime.Gosched()
		}
		// The batch, its packing and its answer use a pooled fwdSend.
		f := getFwdSend(c)
		batch := f.batch[:0]
		if !first.abandoned.Load() {
			batch = append(batch, first)
		}
	drain:
		for len(batch) < c.env.maxBatch {
			select {
			case k := <-c.queue:
				if !k.abandoned.Load() {
					batch = append(batch, k)
				}
			default:
				break drain
			}
		}
		f.batch = batch
		if len(batch) == 0 {
			f.release()
			c.done() // every caller gave up: nothing to decide
			continue
		}
		if p := c.pipe.get(c, transport.KindCheck, c.stub.CheckStream, checkID); p != nil && c.sendPipe(p, f) {
			continue
		}
		f.batch = nil // the unary call's now
		f.release()
		c.env.wg.Add(1)
		go c.send(batch)
	}
}

// done ends a batch's flight: it frees the batch's in-flight slot and
// tells a gathering batchLoop.
func (c *peerLink) done() {
	<-c.sem
	select {
	case c.answered <- struct{}{}:
	default:
	}
}

// checkRequest builds the request for batch.
func (c *peerLink) checkRequest(batch []*call) *peerpb.CheckRequest {
	req := &peerpb.CheckRequest{Sender: c.env.self, Items: make([]*peerpb.CheckItem, len(batch))}
	v := c.env.view.Load()
	req.RingVersion, req.MembersHash = v.snap.Version(), v.snap.MembersHash()
	for i, k := range batch {
		req.Items[i] = &k.item
	}
	return req
}

// sendPipe sends f's batch on p; the pipe's receiver hands out the
// decisions and frees the in-flight slot. It reports false, having sent
// nothing, when the pipe is broken; f is then still the caller's.
func (c *peerLink) sendPipe(p *transport.Pipe[peerpb.CheckRequest, peerpb.CheckResponse], f *fwdSend) bool {
	v := c.env.view.Load()
	req := &f.req
	req.Sender, req.RingVersion, req.MembersHash, req.TimeoutNs = c.env.self, v.snap.Version(), v.snap.MembersHash(), int64(c.env.forwardTimeout)
	// About 40 bytes per item with short names.
	b := binary.AppendUvarint(slices.Grow(f.buf[:0], 8+64*len(f.batch)), uint64(len(f.batch)))
	for _, k := range f.batch {
		b = wire.AppendItem(b, &k.item)
	}
	req.ItemsPacked = b
	if cap(b) <= transport.KeepBuf {
		f.buf = b
	}
	f.start = time.Now()
	return sendPooled(p, f)
}

// pooledMsg is a pipe request that is pooled once its users are done with
// it: release drops one, and refs counts them.
type pooledMsg[Req, Resp any] interface {
	transport.Request[Req, Resp]
	refCount() *atomic.Int32
	release()
}

// sendPooled sends m, which its caller alone uses, on p. From the send on
// it has two users: the sender until send returns (it may still be
// encoding the message when the answer, or the pipe's failure, comes), and
// the answer. It reports false when the pipe was broken: nothing was sent,
// and m is still the caller's alone.
func sendPooled[Req, Resp any](p *transport.Pipe[Req, Resp], m pooledMsg[Req, Resp]) bool {
	m.refCount().Store(2)
	if p.Send(m) != nil {
		m.refCount().Store(1) // done will not be called
		return false
	}
	m.release()
	return true
}

// fwdSend is a batch of forwards sent on a pipe, in one allocation, with
// the memory its packing and its answer use. It is pooled (fwdSendPool)
// once its sender and its answer are both done with it.
type fwdSend struct {
	c     *peerLink
	req   peerpb.CheckRequest
	batch []*call
	buf   []byte
	out   []wire.Decision
	start time.Time
	// refs counts the fwdSend's users while it is on a pipe.
	refs atomic.Int32
}

var fwdSendPool = sync.Pool{New: func() any { return new(fwdSend) }}

// getFwdSend returns a pooled fwdSend for c's batcher (one user).
func getFwdSend(c *peerLink) *fwdSend {
	f := fwdSendPool.Get().(*fwdSend)
	f.c = c
	f.refs.Store(1)
	return f
}

func (f *fwdSend) refCount() *atomic.Int32 { return &f.refs }

// release drops a user; the last one pools f, without what it points to,
// unless it grew large.
func (f *fwdSend) release() {
	if f.refs.Add(-1) != 0 {
		return
	}
	if cap(f.batch) > wire.MaxBatch/4 || cap(f.out) > wire.MaxBatch/4 {
		return
	}
	clear(f.batch[:cap(f.batch)])
	clear(f.out[:cap(f.out)])
	f.batch, f.out = f.batch[:0], f.out[:0]
	f.c = nil
	f.req.Reset()
	fwdSendPool.Put(f)
}

func (f *fwdSend) Msg(id uint64) *peerpb.CheckRequest {
	f.req.Id = id
	return &f.req
}

// done hands out the decisions and frees the in-flight slot.
func (f *fwdSend) Done(resp *peerpb.CheckResponse, err error) {
	c := f.c
	if errors.Is(err, transport.ErrUnimplemented) {
		// The receiver decided nothing: resend as a unary RPC, which
		// keeps the in-flight slot (and takes the batch).
		batch := f.batch
		f.batch = nil
		f.release()
		c.env.wg.Add(1)
		go c.send(batch)
		return
	}
	if err == nil {
		err = streamErr(resp.GetCode(), resp.GetError())
	}
	f.out = c.finish(c.env.ctx, f.batch, resp, err, f.start, f.out)
	f.release()
	c.done()
}

// send makes one batch RPC and hands each call its decision.
func (c *peerLink) send(batch []*call) {
	defer c.env.wg.Done()
	defer c.done()
	req := c.checkRequest(batch)
	ctx, cancel := context.WithTimeout(c.env.ctx, c.env.forwardTimeout)
	defer cancel()
	start := time.Now()
	resp, err := c.stub.Check(ctx, req)
	c.finish(ctx, batch, resp, err, start, nil)
}

// finish hands each call of batch its decision from resp, or err. The
// decisions are decoded into out's memory, which it returns for reuse.
func (c *peerLink) finish(ctx context.Context, batch []*call, resp *peerpb.CheckResponse, err error, start time.Time, out []wire.Decision) []wire.Decision {
	out = slices.Grow(out[:0], len(batch))[:len(batch)]
	switch {
	case err != nil:
	case len(resp.GetDecisionsPacked()) > 0:
		err = wire.DecodeDecisions(resp.GetDecisionsPacked(), len(batch), c.name, out)
	case len(resp.GetDecisions()) != len(batch):
		err = fmt.Errorf("peer: %s answered %d decisions for %d requests", c.name, len(resp.GetDecisions()), len(batch))
	default:
		for i, d := range resp.GetDecisions() {
			out[i] = wire.DecisionFromPB(d)
		}
	}
	c.env.metrics.Batch(c.name, len(batch))
	if err != nil {
		c.env.metrics.Forward(c.name, "error", time.Since(start))
		c.env.warn("forward failed", "peer", c.name, "batch", len(batch), "err", err)
		err = fmt.Errorf("%w: forward to %s: %w", ErrUnavailable, c.name, withCtxErr(ctx, err))
		for _, k := range batch {
			k.done <- callResult{err: err}
		}
		return out
	}
	c.env.metrics.Forward(c.name, "ok", time.Since(start))
	for i, k := range batch {
		k.done <- callResult{d: out[i]}
	}
	return out
}

// forward asks owner to decide. It returns the owner's decision, a
// *notOwnerError, or an error wrapping ErrUnavailable.
func (l *peerLinks) forward(ctx context.Context, v *view, owner string, r *opReq) (Decision, error) {
	if r.Op.Spec().OwnRPC {
		return l.forwardLease(ctx, owner, r)
	}
	key, hits := r.Key, r.Hits
	env := l.env
	c, err := l.to(owner)
	if err != nil {
		return Decision{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	var res callResult
	if r.Op == partition.OpReset {
		// A reset travels alone, as a unary call carrying its proof: this
		// node authorized it (Config.AuthorizeReset at the public API, or
		// an in-process Node.Reset), and the holder refuses a peer reset
		// without the proof (resetProofOK), so that the peer token alone,
		// captured on a plaintext network, resets nothing (issue 53 item
		// 6). Streams and framed pipes have no per-request metadata.
		ctx, cancel := context.WithTimeout(ctx, env.forwardTimeout)
		defer cancel()
		if proof := env.auth.ResetProof(resetProofInput(key)); proof != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, transport.ResetProofKey, proof)
		}
		res = c.direct(ctx, r)
	} else if env.noBatching {
		ctx, cancel := context.WithTimeout(ctx, env.forwardTimeout)
		defer cancel()
		res = c.direct(ctx, r)
	} else {
		// ForwardTimeout is enforced with the call's pooled timer rather
		// than a derived context: this path runs per request, and a
		// context.WithTimeout costs several allocations each time.
		k := l.calls.Get().(*call)
		if k.timer == nil {
			k.timer = time.NewTimer(env.forwardTimeout)
		} else {
			k.timer.Reset(env.forwardTimeout)
		}
		k.key = peerpb.Key{Tenant: key.Tenant, Subject: key.Subject, Policy: key.Policy}
		k.item = peerpb.CheckItem{Key: &k.key, Hits: hits, Op: peerpb.Op(r.Op), Policies: r.Names}
		select {
		case c.queue <- k:
		case <-ctx.Done():
			k.timer.Stop()
			l.calls.Put(k)
			return Decision{}, fmt.Errorf("%w: queue to %s: %w", ErrUnavailable, owner, ctx.Err())
		case <-k.timer.C:
			l.calls.Put(k)
			return Decision{}, fmt.Errorf("%w: queue to %s: %w", ErrUnavailable, owner, context.DeadlineExceeded)
		case <-c.quit:
			k.timer.Stop()
			l.calls.Put(k)
			return Decision{}, fmt.Errorf("%w: connection to %s closed", ErrUnavailable, owner)
		}
		select {
		case res = <-k.done:
			k.timer.Stop()
			l.calls.Put(k)
		case <-ctx.Done():
			// The batch still holds k and will answer into its buffered
			// channel; k is left to the garbage collector, not the pool.
			k.abandoned.Store(true)
			k.timer.Stop()
			return Decision{}, fmt.Errorf("%w: forward to %s: %w", ErrUnavailable, owner, ctx.Err())
		case <-k.timer.C:
			k.abandoned.Store(true)
			return Decision{}, fmt.Errorf("%w: forward to %s: no answer within %v: %w", ErrUnavailable, owner, env.forwardTimeout, context.DeadlineExceeded)
		}
	}
	if res.err != nil {
		return Decision{}, res.err
	}
	return fromWire(&res.d, owner)
}

// direct sends one request as its own RPC (batching disabled).
func (c *peerLink) direct(ctx context.Context, r *opReq) callResult {
	key := r.Key
	v := c.env.view.Load()
	req := &peerpb.CheckRequest{
		Sender:      c.env.self,
		RingVersion: v.snap.Version(), MembersHash: v.snap.MembersHash(),
		Items: []*peerpb.CheckItem{{Key: &peerpb.Key{Tenant: key.Tenant, Subject: key.Subject, Policy: key.Policy}, Hits: r.Hits, Op: peerpb.Op(r.Op), Policies: r.Names}},
	}
	start := time.Now()
	resp, err := c.stub.Check(ctx, req)
	if err == nil && len(resp.Decisions) != 1 {
		err = fmt.Errorf("peer: %s answered %d decisions for 1 request", c.name, len(resp.Decisions))
	}
	c.env.metrics.Batch(c.name, 1)
	if err != nil {
		c.env.metrics.Forward(c.name, "error", time.Since(start))
		return callResult{err: fmt.Errorf("%w: forward to %s: %w", ErrUnavailable, c.name, withCtxErr(ctx, err))}
	}
	c.env.metrics.Forward(c.name, "ok", time.Since(start))
	d := wire.DecisionFromPB(resp.Decisions[0])
	return callResult{d: d}
}

// limitsFromWire and limitsToWire convert a multi-policy decision's
// parts to and from the wire's (the same fields; single-policy decisions
// have none, so the allocation is the multi-policy path's only).
func limitsFromWire(ls []wire.Limit) []PolicyDecision {
	out := make([]PolicyDecision, len(ls))
	for i, l := range ls {
		out[i] = PolicyDecision(l)
	}
	return out
}

func limitsToWire(ls []PolicyDecision) []wire.Limit {
	if len(ls) == 0 {
		return nil
	}
	out := make([]wire.Limit, len(ls))
	for i, l := range ls {
		out[i] = wire.Limit(l)
	}
	return out
}

// fromWire turns an owner's wire decision into a Decision or error.
func fromWire(d *wire.Decision, peer string) (Decision, error) {
	switch d.Status {
	case peerpb.Status_STATUS_OK:
		r := Reason(d.Reason)
		if r < ReasonAdmitted || r > ReasonSpread || r == ReasonUnavailable {
			return Decision{}, fmt.Errorf("%w: %s sent reason %d", ErrUnavailable, peer, d.Reason)
		}
		out := Decision{
			Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining,
			RetryAfter: time.Duration(d.RetryAfterNs), ResetAfter: time.Duration(d.ResetAfterNs),
			Reason: r, Owner: d.Owner, RingVersion: d.RingVersion, RefusedBy: d.RefusedBy,
		}
		if ns := d.DecidedAtNs; ns != 0 {
			out.DecidedAt = time.Unix(0, ns)
		}
		if len(d.Limits) > 0 {
			out.Limits = limitsFromWire(d.Limits)
		}
		return out, nil
	case peerpb.Status_STATUS_NOT_OWNER:
		return Decision{}, &notOwnerError{owner: d.Owner, epoch: d.HolderEpoch}
	case peerpb.Status_STATUS_INVALID_ARGUMENT:
		return Decision{}, fmt.Errorf("%w: %s: %s", ErrInvalidKey, peer, d.Err)
	case peerpb.Status_STATUS_UNKNOWN_POLICY:
		return Decision{}, fmt.Errorf("%w: %s: %s", ErrUnknownPolicy, peer, d.Err)
	case peerpb.Status_STATUS_UNAVAILABLE:
		if strings.HasPrefix(d.Err, ErrCapacity.Error()+":") {
			// The wire has no status of its own for a full holder
			// (TODO(issue 53): STATUS_CAPACITY when the proto is next
			// regenerated); the holder's message starts with the
			// sentinel's text (capacityError), as FromStatus reads
			// InvalidArgument's.
			return Decision{}, &capacityError{cause: fmt.Errorf("%s: %s", peer, d.Err)}
		}
		if strings.HasPrefix(d.Err, ErrUnavailable.Error()+": partition ") && strings.HasSuffix(d.Err, " is moving") {
			// The holder waited for the partition's move and decided
			// nothing (its message, from every version: decideWireReq):
			// the sender asks again (routeInto).
			return Decision{}, fmt.Errorf("%w: %w: %s: %s", ErrUnavailable, errMoving, peer, d.Err)
		}
		return Decision{}, fmt.Errorf("%w: %s: %s", ErrUnavailable, peer, d.Err)
	default:
		return Decision{}, fmt.Errorf("%w: %s: %s", ErrUnavailable, peer, d.Err)
	}
}

// withCtxErr adds ctx's error to a failed RPC's error: gRPC reports an
// expired deadline only as a status, and callers must be able to test
// errors.Is(err, context.DeadlineExceeded).
func withCtxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w: %w", err, cerr)
	}
	if status.Code(err) == codes.DeadlineExceeded && !errors.Is(err, context.DeadlineExceeded) {
		// The deadline passed on the other side first.
		return fmt.Errorf("%w: %w", err, context.DeadlineExceeded)
	}
	return err
}

// forwardLease asks owner to take or end a lease, as its own RPC.
func (l *peerLinks) forwardLease(ctx context.Context, owner string, r *opReq) (Decision, error) {
	c, err := l.to(owner)
	if err != nil {
		return Decision{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	ctx, cancel := context.WithTimeout(ctx, l.env.forwardTimeout)
	defer cancel()
	req := &peerpb.LeaseRequest{
		Sender:  l.env.self,
		Item:    &peerpb.CheckItem{Key: &peerpb.Key{Tenant: r.Key.Tenant, Subject: r.Key.Subject, Policy: r.Key.Policy}, Hits: r.Hits, Op: peerpb.Op(r.Op)},
		LeaseId: r.Lease,
		Actual:  r.Actual,
	}
	for _, g := range r.Returns {
		gr := &peerpb.GrantReturn{LeaseId: g.ID, Uses: make([]*peerpb.Run, len(g.Uses))}
		for i, u := range g.Uses {
			gr.Uses[i] = &peerpb.Run{AgeNs: int64(u.Age), Count: u.Count}
		}
		req.Returns = append(req.Returns, gr)
	}
	start := time.Now()
	resp, err := c.stub.Lease(ctx, req)
	l.env.metrics.Batch(c.name, 1)
	if err != nil {
		l.env.metrics.Forward(c.name, "error", time.Since(start))
		return Decision{}, fmt.Errorf("%w: forward to %s: %w", ErrUnavailable, c.name, withCtxErr(ctx, err))
	}
	l.env.metrics.Forward(c.name, "ok", time.Since(start))
	wd := wire.DecisionFromPB(resp.GetDecision())
	d, err := fromWire(&wd, owner)
	if err != nil {
		return Decision{}, err
	}
	if (r.Op == partition.OpAcquire || r.Op == partition.OpReserve) && d.Allowed {
		r.Lease, r.LeaseTTL = resp.GetLeaseId(), time.Duration(resp.GetLeaseTtlNs())
	}
	if r.Op == partition.OpSettle {
		r.Estimate, r.Overage = resp.GetEstimate(), resp.GetOverage()
	}
	if r.Op == partition.OpGrant {
		r.Lease, r.LeaseTTL, r.Granted = resp.GetLeaseId(), time.Duration(resp.GetLeaseTtlNs()), resp.GetGranted()
	}
	return d, nil
}
