package peer

// Streams: forwards (CheckStream) and replication (ReplicateStream) to a
// peer travel on one long-lived bidirectional stream per peer and kind, a
// pipe, instead of one unary RPC per batch. A pipe is a framed pipe
// (framed.go) when the peer takes one, else a gRPC stream; both carry the
// same messages to the same handlers. A unary RPC costs a
// stream set-up, headers both ways and a handler goroutine on the
// receiver; on a pipe a batch is one message each way.
//
// The rules:
//   - The client's loop goroutine (batchLoop, replLoop) owns the pipe: it
//     alone opens it and sends on it. A pipe's receiver goroutine, owned by
//     the Node, reads answers and matches them to requests by id.
//   - Every request sent on a pipe is answered exactly once: by its
//     answer, or with the error that broke the pipe. A pipe that breaks
//     (send or receive error, no answer within twice ForwardTimeout, the
//     client stopping) fails every request still waiting on it, the way a
//     failed unary RPC fails its batch; the next batch opens a new pipe.
//   - A pipe is opened only on a connection that is ready, so opening
//     never blocks the loop; until then, and for a pause after a pipe
//     could not be opened, batches go as unary RPCs. A receiver without
//     the stream methods (an older node) answers Unimplemented before it
//     reads anything: the batch is resent as a unary RPC and the client
//     keeps to unary RPCs for a long pause.
//   - What the receiver does not do differs by kind: CheckStream decides
//     batches concurrently (answers may come in any order), each within
//     the request's timeout_ns from its receipt (Check's deadline);
//     ReplicateStream applies requests in arrival order, so operations of
//     a partition keep the order the holder sent them in, as the one
//     unary Replicate in flight did.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/internal/transport"
	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// errPipeUnimplemented breaks a pipe to a receiver without stream methods.
var errPipeUnimplemented = errors.New("peer: receiver has no stream methods")

// errPipeRetired ends a gRPC stream pipe replaced by a framed pipe once
// its last request is answered.
var errPipeRetired = errors.New("peer: stream replaced by a framed pipe")

const (
	// pipeRetryPause is how long a client sends unary RPCs after a pipe
	// could not be opened.
	pipeRetryPause = time.Second
	// pipeUnimplementedPause is the same after the receiver lacked the
	// stream methods: it will not gain them before it restarts.
	pipeUnimplementedPause = time.Minute
)

// pipe is one long-lived stream to a peer. Safe for one sending goroutine
// and the pipe's own receiver.
type pipe[Req, Resp any] struct {
	n      *Node
	st     grpc.BidiStreamingClient[Req, Resp]
	cancel context.CancelFunc
	idOf   func(*Resp) uint64
	framed bool // a framed pipe (framed.go), not a gRPC stream

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]pipeWait[Req, Resp]
	err     error // why the pipe broke; nil while it works
	// retired: nothing more is sent; the pipe ends once the requests it
	// carries are answered.
	retired bool
	// watchdog breaks the pipe when a request has waited longer than
	// twice ForwardTimeout (receivers answer within ForwardTimeout). One
	// timer per pipe, not one per message: it looks every
	// ForwardTimeout/2, so a lost answer is noticed within 2.5×.
	watchdog *time.Timer
}

// pipeReq is a request sent on a pipe: the message to send, given the id
// the pipe chose for it, and what to do with its answer. (An interface
// holding the sender's own pointer: sending allocates no closure.)
type pipeReq[Req, Resp any] interface {
	msg(id uint64) *Req
	done(*Resp, error)
}

// pipeWait is one request waiting for its answer.
type pipeWait[Req, Resp any] struct {
	r    pipeReq[Req, Resp]
	sent time.Time
}

// openPipe opens a stream with open on a context of its own and starts
// its receiver.
func openPipe[Req, Resp any](n *Node, open func(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[Req, Resp], error), idOf func(*Resp) uint64) (*pipe[Req, Resp], error) {
	ctx, cancel := context.WithCancel(n.ctx)
	st, err := open(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	p := &pipe[Req, Resp]{n: n, st: st, cancel: cancel, idOf: idOf, pending: map[uint64]pipeWait[Req, Resp]{}}
	p.mu.Lock()
	p.watchdog = time.AfterFunc(p.watchEvery(), p.watch)
	p.mu.Unlock()
	n.wg.Add(1)
	go p.receive()
	return p, nil
}

// watchEvery is the watchdog's period.
func (p *pipe[Req, Resp]) watchEvery() time.Duration {
	return max(time.Millisecond, p.n.cfg.ForwardTimeout/2)
}

// watch is the watchdog's tick: it breaks the pipe if a request has
// waited more than twice ForwardTimeout, else looks again later.
func (p *pipe[Req, Resp]) watch() {
	limit := 2 * p.n.cfg.ForwardTimeout
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		return
	}
	now := time.Now()
	late := false
	for _, w := range p.pending {
		if now.Sub(w.sent) > limit {
			late = true
			break
		}
	}
	if !late {
		p.watchdog.Reset(p.watchEvery())
	}
	p.mu.Unlock()
	if late {
		p.fail(fmt.Errorf("peer: no answer on the stream within %v: %w", limit, context.DeadlineExceeded))
	}
}

// send sends r's message with a fresh id and calls r.done exactly once
// with the answer or the error that broke the pipe. It returns an error,
// without calling done, only when the pipe was already broken.
func (p *pipe[Req, Resp]) send(r pipeReq[Req, Resp]) error {
	sent := time.Now()
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		return p.err
	}
	p.nextID++
	id := p.nextID
	req := r.msg(id)
	// The watchdog frees the waiting batch (and its in-flight slot) if the
	// receiver never answers.
	p.pending[id] = pipeWait[Req, Resp]{r: r, sent: sent}
	p.mu.Unlock()
	if err := p.st.Send(req); err != nil {
		if errors.Is(err, io.EOF) {
			// The stream ended. Only the receiver goroutine may call Recv
			// (a stream allows one receiver at a time), so say that much;
			// the receiver's own error follows in its log if it differs.
			err = errors.New("peer: stream closed by the receiver")
		}
		p.fail(err)
	}
	return nil
}

// fail breaks the pipe with err and fails every waiting request.
func (p *pipe[Req, Resp]) fail(err error) {
	if status.Code(err) == codes.Unimplemented {
		err = fmt.Errorf("%w: %w", errPipeUnimplemented, err)
	}
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		return
	}
	p.err = err
	p.n.pipeBreaks.Add(1)
	waiting := p.pending
	p.pending = nil
	p.watchdog.Stop()
	p.mu.Unlock()
	p.cancel()
	for _, w := range waiting {
		w.r.done(nil, err)
	}
}

// receive matches answers to waiting requests until the stream ends.
func (p *pipe[Req, Resp]) receive() {
	defer p.n.wg.Done()
	for {
		resp, err := p.st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("peer: stream closed by the receiver")
			}
			p.fail(err)
			return
		}
		id := p.idOf(resp)
		p.mu.Lock()
		w, ok := p.pending[id]
		delete(p.pending, id)
		p.mu.Unlock()
		if !ok {
			continue // failed by the watchdog meanwhile; the pipe is broken
		}
		w.r.done(resp, nil)
		p.endIfRetired()
	}
}

// retire stops the pipe's use: it ends once every request sent on it is
// answered (at once if none waits). Its sender sends nothing more on it.
func (p *pipe[Req, Resp]) retire() {
	p.mu.Lock()
	p.retired = true
	p.mu.Unlock()
	p.endIfRetired()
}

// endIfRetired ends a retired pipe that has no request waiting.
func (p *pipe[Req, Resp]) endIfRetired() {
	p.mu.Lock()
	if !p.retired || p.err != nil || len(p.pending) > 0 {
		p.mu.Unlock()
		return
	}
	p.err = errPipeRetired
	p.watchdog.Stop()
	p.mu.Unlock()
	p.cancel()
}

// pipeState is a client loop's pipe of one kind and when it may next try
// to open one.
type pipeState[Req, Resp any] struct {
	p     *pipe[Req, Resp]
	retry time.Time
	// A framed pipe (framed.go) is dialled on a goroutine of its own: dial
	// gets its outcome while it runs, dialCancel cuts it short.
	dial        chan framedResult
	dialCancel  context.CancelFunc
	framedRetry time.Time // no framed pipe before then
	// kind mirrors p for other goroutines (tests): 0 none, 1 a gRPC
	// stream, 2 a framed pipe.
	kind atomic.Int32
}

// set makes p the pipe in use (nil: none).
func (s *pipeState[Req, Resp]) set(p *pipe[Req, Resp]) {
	s.p = p
	switch {
	case p == nil:
		s.kind.Store(0)
	case p.framed:
		s.kind.Store(2)
	default:
		s.kind.Store(1)
	}
}

// get returns a working pipe, opening one if the connection is ready, or
// nil: then the caller sends a unary RPC. It prefers a framed pipe of
// kind, and uses a gRPC stream when the peer does not take one.
func (s *pipeState[Req, Resp]) get(c *client, kind byte, open func(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[Req, Resp], error), idOf func(*Resp) uint64) *pipe[Req, Resp] {
	if s.p != nil {
		s.p.mu.Lock()
		err := s.p.err
		s.p.mu.Unlock()
		if err == nil {
			if !s.p.framed && kind == transport.KindCheck {
				// A gRPC stream is in use because a framed pipe could not
				// be had: try one again after the pause, and move to it
				// when it opens (the stream ends once its requests are
				// answered). Forwards only: batches are independent, while
				// replication must reach the backup in the order it was
				// sent, which two live pipes would not keep; its stream
				// stays until it breaks.
				if p := s.framedPipe(c, kind, idOf); p != nil {
					s.p.retire()
					s.set(p)
				}
			}
			return s.p
		}
		s.set(nil)
		if errors.Is(err, errPipeUnimplemented) {
			s.retry = time.Now().Add(pipeUnimplementedPause)
		}
	}
	if c.n.cfg.DisableStreams || time.Now().Before(s.retry) {
		return nil
	}
	if st := c.conn.GetState(); st != connectivity.Ready {
		c.conn.Connect()
		return nil
	}
	// framedPipe checks whether framed pipes may be tried now; while they
	// may not, no dial is under way and a gRPC stream opens.
	if p := s.framedPipe(c, kind, idOf); p != nil {
		s.set(p)
		return p
	}
	if s.dial != nil {
		return nil // still dialling: unary RPCs meanwhile
	}
	p, err := openPipe(c.n, open, idOf)
	if err != nil {
		s.retry = time.Now().Add(pipeRetryPause)
		return nil
	}
	s.set(p)
	return p
}

// framedPipe returns a framed pipe of kind when one has just opened: it
// starts a dial if none is under way and framed pipes may be tried, and
// takes a finished dial's outcome (a failed one sets the pause before the
// next try). It never blocks, and returns nil while dialling.
func (s *pipeState[Req, Resp]) framedPipe(c *client, kind byte, idOf func(*Resp) uint64) *pipe[Req, Resp] {
	if c.n.cfg.DisableFramedPipes || time.Now().Before(s.framedRetry) || c.conn.GetState() != connectivity.Ready {
		return nil
	}
	if s.dial == nil {
		s.startDial(c, kind)
		return nil
	}
	var res framedResult
	select {
	case res = <-s.dial:
	default:
		return nil
	}
	s.dial = nil
	s.dialCancel()
	if res.err == nil {
		p, err := openPipe(c.n, transport.Open[Req, Resp](res.fc), idOf)
		if err == nil {
			p.framed = true
			c.n.framedOpened.Add(1)
			return p
		}
		res.fc.Close()
		res.err = err
	}
	pause := pipeRetryPause
	if errors.Is(res.err, transport.ErrRefused) && status.Code(res.err) != codes.Unavailable {
		// An older node, or a proxy that passes only HTTP/2: a gRPC
		// stream works, and will until the peer is replaced.
		pause = pipeUnimplementedPause
		c.n.log.Info("peer takes no framed pipe; using a gRPC stream", "peer", c.name, "err", res.err)
	}
	s.framedRetry = time.Now().Add(pause)
	return nil
}

// startDial dials a framed pipe of kind to c's peer on a goroutine the
// node owns.
func (s *pipeState[Req, Resp]) startDial(c *client, kind byte) {
	ctx, cancel := context.WithCancel(c.n.ctx)
	ch := make(chan framedResult, 1)
	s.dial, s.dialCancel = ch, cancel
	c.n.wg.Add(1)
	go func() {
		defer c.n.wg.Done()
		fc, err := transport.Dial(ctx, c.addr, kind, c.n.ops.auth.token, c.n.cfg.ClientTLS)
		if fc != nil {
			fc.SetWriteTimeout(c.n.framedWriteTimeout())
		}
		ch <- framedResult{fc: fc, err: err}
	}()
}

// close breaks the pipe, if any, failing what waits on it, and ends a
// dial in progress.
func (s *pipeState[Req, Resp]) close(err error) {
	if s.p != nil {
		s.p.fail(err)
		s.set(nil)
	}
	if s.dial != nil {
		s.dialCancel()
		if res := <-s.dial; res.fc != nil {
			res.fc.Close()
		}
		s.dial = nil
	}
}

func checkID(r *peerpb.CheckResponse) uint64         { return r.GetId() }
func replicateID(r *peerpb.ReplicateResponse) uint64 { return r.GetId() }

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
func (s *server) CheckStream(st peerpb.Limiter_CheckStreamServer) error {
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
		if drop := s.n.streamDrop.Load(); drop != nil && (*drop)(req) {
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
func (s *server) checkStreamOne(ctx context.Context, t checkTask, sc *checkScratch, bc *batchCtx) *peerpb.CheckResponse {
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

// ReplicateStream is the backup's side of a holder's replication pipe:
// requests are applied one after another in arrival order, through
// Replicate.
func (s *server) ReplicateStream(st peerpb.Limiter_ReplicateStreamServer) error {
	// Answers share sc's memory: each is encoded by Send before the next
	// request is applied.
	var sc replScratch
	for {
		req, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if drop := s.n.replDrop.Load(); drop != nil && (*drop)(req) {
			continue
		}
		resp, err := s.replicate(req, &sc)
		if err != nil {
			st := status.Convert(err)
			resp = &peerpb.ReplicateResponse{Code: int32(st.Code()), Error: st.Message()}
		}
		resp.Id = req.GetId()
		if err := st.Send(resp); err != nil {
			return err
		}
	}
}

// streamErr turns a whole-batch failure carried in a stream answer into
// the error the unary RPC would have returned.
func streamErr(code int32, msg string) error {
	if code == 0 {
		return nil
	}
	return status.Error(codes.Code(code), msg)
}
