package peer

// Streams: forwards (CheckStream) and replication (ReplicateStream) to a
// peer travel on one long-lived bidirectional stream per peer and kind, a
// pipe (transport.Pipe), instead of one unary RPC per batch. A pipe is a
// framed pipe (internal/transport, framed.go) when the peer takes one,
// else a gRPC stream; both carry the same messages to the same handlers. A unary RPC costs a
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
//     failed unary RPC fails its batch (transport.Pipe keeps this rule);
//     the next batch opens a new pipe.
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
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/internal/transport"
	"github.com/ringlimit/ringlimit/peer/peerpb"
)

const (
	// pipeRetryPause is how long a client sends unary RPCs after a pipe
	// could not be opened.
	pipeRetryPause = time.Second
	// pipeUnimplementedPause is the same after the receiver lacked the
	// stream methods: it will not gain them before it restarts.
	pipeUnimplementedPause = time.Minute
)

// framedResult is the outcome of a framed pipe's dial.
type framedResult struct {
	fc  *transport.Conn
	err error
}

// pipeState is a client loop's pipe of one kind and when it may next try
// to open one.
type pipeState[Req, Resp any] struct {
	p     *transport.Pipe[Req, Resp]
	retry time.Time
	// A framed pipe is dialled on a goroutine of its own: dial
	// gets its outcome while it runs, dialCancel cuts it short.
	dial        chan framedResult
	dialCancel  context.CancelFunc
	framedRetry time.Time // no framed pipe before then
	// kind mirrors p for other goroutines (tests): 0 none, 1 a gRPC
	// stream, 2 a framed pipe.
	kind atomic.Int32
}

// set makes p the pipe in use (nil: none).
func (s *pipeState[Req, Resp]) set(p *transport.Pipe[Req, Resp]) {
	s.p = p
	switch {
	case p == nil:
		s.kind.Store(0)
	case p.Framed():
		s.kind.Store(2)
	default:
		s.kind.Store(1)
	}
}

// get returns a working pipe, opening one if the connection is ready, or
// nil: then the caller sends a unary RPC. It prefers a framed pipe of
// kind, and uses a gRPC stream when the peer does not take one.
func (s *pipeState[Req, Resp]) get(c *peerLink, kind byte, open func(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[Req, Resp], error), idOf func(*Resp) uint64) *transport.Pipe[Req, Resp] {
	if s.p != nil {
		err := s.p.Err()
		if err == nil {
			if !s.p.Framed() && kind == transport.KindCheck {
				// A gRPC stream is in use because a framed pipe could not
				// be had: try one again after the pause, and move to it
				// when it opens (the stream ends once its requests are
				// answered). Forwards only: batches are independent, while
				// replication must reach the backup in the order it was
				// sent, which two live pipes would not keep; its stream
				// stays until it breaks.
				if p := s.framedPipe(c, kind, idOf); p != nil {
					s.p.Retire()
					s.set(p)
				}
			}
			return s.p
		}
		s.set(nil)
		if errors.Is(err, transport.ErrUnimplemented) {
			s.retry = time.Now().Add(pipeUnimplementedPause)
		}
	}
	if c.env.noStreams || time.Now().Before(s.retry) {
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
	p, err := transport.OpenPipe(c.env.ctx, c.env.pipeConfig(false), open, idOf)
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
func (s *pipeState[Req, Resp]) framedPipe(c *peerLink, kind byte, idOf func(*Resp) uint64) *transport.Pipe[Req, Resp] {
	if c.env.noFramed || time.Now().Before(s.framedRetry) || c.conn.GetState() != connectivity.Ready {
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
		p, err := transport.OpenPipe(c.env.ctx, c.env.pipeConfig(true), transport.Open[Req, Resp](res.fc), idOf)
		if err == nil {
			c.env.framedOpened.Add(1)
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
		c.env.log.Info("peer takes no framed pipe; using a gRPC stream", "peer", c.name, "err", res.err)
	}
	s.framedRetry = time.Now().Add(pause)
	return nil
}

// startDial dials a framed pipe of kind to c's peer on a goroutine the
// node owns.
func (s *pipeState[Req, Resp]) startDial(c *peerLink, kind byte) {
	ctx, cancel := context.WithCancel(c.env.ctx)
	ch := make(chan framedResult, 1)
	s.dial, s.dialCancel = ch, cancel
	c.env.wg.Add(1)
	go func() {
		defer c.env.wg.Done()
		fc, err := transport.Dial(ctx, c.addr, kind, c.env.auth.PipeCredential(c.name), c.env.tls)
		if fc != nil {
			fc.SetWriteTimeout(c.env.framedWriteTimeout)
		}
		ch <- framedResult{fc: fc, err: err}
	}()
}

// close breaks the pipe, if any, failing what waits on it, and ends a
// dial in progress.
func (s *pipeState[Req, Resp]) close(err error) {
	if s.p != nil {
		s.p.Fail(err)
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

// streamErr turns a whole-batch failure carried in a stream answer into
// the error the unary RPC would have returned.
func streamErr(code int32, msg string) error {
	if code == 0 {
		return nil
	}
	return status.Error(codes.Code(code), msg)
}
