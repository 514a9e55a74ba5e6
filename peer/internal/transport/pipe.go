package transport

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
	"google.golang.org/grpc/status"
)

// ErrUnimplemented breaks a pipe to a receiver without stream methods (an
// older node answers Unimplemented before it reads anything).
var ErrUnimplemented = errors.New("peer: receiver has no stream methods")

// ErrRetired ends a pipe that was retired once its last request is
// answered.
var ErrRetired = errors.New("peer: stream replaced by a framed pipe")

// Pipe is one long-lived stream to a peer, a gRPC stream or a framed
// pipe: requests are sent with an id the pipe chooses and matched to
// their answers by it. Safe for one sending goroutine and the pipe's own
// receiver. The rules:
//
//   - Every request sent is answered exactly once, through its Done: by
//     its answer, or with the error that broke the pipe. A pipe that
//     breaks (send or receive error, no answer within twice the timeout,
//     Fail) fails every request still waiting on it; nothing is sent on
//     it again.
//   - The watchdog is one timer per pipe, not one per message: it looks
//     every half timeout, so a lost answer is noticed within 2.5×.
type Pipe[Req, Resp any] struct {
	cfg    PipeConfig
	st     grpc.BidiStreamingClient[Req, Resp]
	cancel context.CancelFunc
	idOf   func(*Resp) uint64

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]pipeWait[Req, Resp]
	err     error // why the pipe broke; nil while it works
	// retired: nothing more is sent; the pipe ends once the requests it
	// carries are answered.
	retired  bool
	watchdog *time.Timer
}

// PipeConfig is what a Pipe needs from its owner.
type PipeConfig struct {
	// WG counts the pipe's receiver goroutine (the owner waits on it).
	WG *sync.WaitGroup
	// Timeout is how long the receiver takes at most to answer; a
	// request unanswered for twice as long breaks the pipe.
	Timeout time.Duration
	// Breaks, if set, counts the pipe breaking.
	Breaks *atomic.Int64
	// Framed says the stream is a framed pipe (Framed reports it).
	Framed bool
}

// Request is a request sent on a pipe: the message to send, given the id
// the pipe chose for it, and what to do with its answer. (An interface
// holding the sender's own pointer: sending allocates no closure.)
type Request[Req, Resp any] interface {
	Msg(id uint64) *Req
	Done(*Resp, error)
}

// pipeWait is one request waiting for its answer.
type pipeWait[Req, Resp any] struct {
	r    Request[Req, Resp]
	sent time.Time
}

// OpenPipe opens a stream with open on a context of its own under ctx
// (ending ctx ends the pipe) and starts its receiver. idOf is the id an
// answer carries.
func OpenPipe[Req, Resp any](ctx context.Context, cfg PipeConfig, open func(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[Req, Resp], error), idOf func(*Resp) uint64) (*Pipe[Req, Resp], error) {
	ctx, cancel := context.WithCancel(ctx)
	st, err := open(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	p := &Pipe[Req, Resp]{cfg: cfg, st: st, cancel: cancel, idOf: idOf, pending: map[uint64]pipeWait[Req, Resp]{}}
	p.mu.Lock()
	p.watchdog = time.AfterFunc(p.watchEvery(), p.watch)
	p.mu.Unlock()
	cfg.WG.Add(1)
	go p.receive()
	return p, nil
}

// Framed reports whether the pipe is a framed pipe.
func (p *Pipe[Req, Resp]) Framed() bool { return p.cfg.Framed }

// Err is why the pipe broke (ErrRetired once a retired pipe ended); nil
// while it works.
func (p *Pipe[Req, Resp]) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// watchEvery is the watchdog's period.
func (p *Pipe[Req, Resp]) watchEvery() time.Duration {
	return max(time.Millisecond, p.cfg.Timeout/2)
}

// watch is the watchdog's tick: it breaks the pipe if a request has
// waited more than twice the timeout, else looks again later.
func (p *Pipe[Req, Resp]) watch() {
	limit := 2 * p.cfg.Timeout
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
		p.Fail(fmt.Errorf("peer: no answer on the stream within %v: %w", limit, context.DeadlineExceeded))
	}
}

// Send sends r's message with a fresh id and calls r.Done exactly once
// with the answer or the error that broke the pipe. It returns an error,
// without calling Done, only when the pipe was already broken.
func (p *Pipe[Req, Resp]) Send(r Request[Req, Resp]) error {
	sent := time.Now()
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		return p.err
	}
	p.nextID++
	id := p.nextID
	req := r.Msg(id)
	// The watchdog frees the waiting request if the receiver never
	// answers.
	p.pending[id] = pipeWait[Req, Resp]{r: r, sent: sent}
	p.mu.Unlock()
	if err := p.st.Send(req); err != nil {
		if errors.Is(err, io.EOF) {
			// The stream ended. Only the receiver goroutine may call Recv
			// (a stream allows one receiver at a time), so say that much;
			// the receiver's own error follows in its log if it differs.
			err = errors.New("peer: stream closed by the receiver")
		}
		p.Fail(err)
	}
	return nil
}

// Fail breaks the pipe with err and fails every waiting request. An
// Unimplemented status becomes ErrUnimplemented (wrapping it).
func (p *Pipe[Req, Resp]) Fail(err error) {
	if status.Code(err) == codes.Unimplemented {
		err = fmt.Errorf("%w: %w", ErrUnimplemented, err)
	}
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		return
	}
	p.err = err
	if p.cfg.Breaks != nil {
		p.cfg.Breaks.Add(1)
	}
	waiting := p.pending
	p.pending = nil
	p.watchdog.Stop()
	p.mu.Unlock()
	p.cancel()
	for _, w := range waiting {
		w.r.Done(nil, err)
	}
}

// receive matches answers to waiting requests until the stream ends.
func (p *Pipe[Req, Resp]) receive() {
	defer p.cfg.WG.Done()
	for {
		resp, err := p.st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("peer: stream closed by the receiver")
			}
			p.Fail(err)
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
		w.r.Done(resp, nil)
		p.endIfRetired()
	}
}

// Retire stops the pipe's use: it ends (ErrRetired) once every request
// sent on it is answered, at once if none waits. Its sender sends nothing
// more on it.
func (p *Pipe[Req, Resp]) Retire() {
	p.mu.Lock()
	p.retired = true
	p.mu.Unlock()
	p.endIfRetired()
}

// endIfRetired ends a retired pipe that has no request waiting.
func (p *Pipe[Req, Resp]) endIfRetired() {
	p.mu.Lock()
	if !p.retired || p.err != nil || len(p.pending) > 0 {
		p.mu.Unlock()
		return
	}
	p.err = ErrRetired
	p.watchdog.Stop()
	p.mu.Unlock()
	p.cancel()
}
