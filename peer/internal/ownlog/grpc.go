package ownlog

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The log's messages travel on the node's existing gRPC port, as one
// client stream per peer of a hand-written service (the payload is a raft
// message already marshalled, so no generated code is needed). The
// node's server-wide interceptors authenticate it like every other peer
// RPC.
const (
	ServiceName = "ringlimit.ownlog.v1.Raft"
	streamName  = "Stream"
	streamPath  = "/" + ServiceName + "/" + streamName
)

var streamDesc = grpc.StreamDesc{StreamName: streamName, ClientStreams: true}

// Register registers the log's service on s: every message received is
// handed to deliver (Runner.Receive), which must not block.
func Register(s grpc.ServiceRegistrar, deliver func(msg []byte), done <-chan struct{}) {
	d := streamDesc
	d.Handler = func(_ any, stream grpc.ServerStream) error {
		// A stream ends when its sender goes away or this member stops
		// (done): a peer that keeps an idle stream open must not hold up
		// the server's graceful stop. Returning cancels the stream, which
		// ends the receiving goroutine.
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			for {
				m := &wrapperspb.BytesValue{}
				if err := stream.RecvMsg(m); err != nil {
					return // the sender went away; it opens a new stream
				}
				deliver(m.GetValue())
			}
		}()
		select {
		case <-ended:
		case <-done:
		}
		return nil
	}
	s.RegisterService(&grpc.ServiceDesc{ServiceName: ServiceName, HandlerType: (*any)(nil), Streams: []grpc.StreamDesc{d}}, struct{}{})
}

// GRPCTransport sends raft messages to peers over gRPC: one goroutine and
// one client stream per peer, fed by a bounded queue. Send never blocks: a
// message that finds its peer's queue full is dropped, and raft sends
// again. Safe for concurrent use; Close stops every goroutine and waits
// for them.
type GRPCTransport struct {
	dial  func(ctx context.Context, to uint64) (grpc.ClientConnInterface, error)
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	mu    sync.Mutex
	peers map[uint64]chan []byte
	// sent, bytes and dropped count for Traffic.
	sent, bytes, dropped atomic.Uint64
}

// peerQueue is how many messages wait for one peer's stream.
const peerQueue = 256

// NewGRPCTransport returns a transport that reaches raft member to through
// the connection dial returns (the node's own, with its credentials).
func NewGRPCTransport(dial func(ctx context.Context, to uint64) (grpc.ClientConnInterface, error)) *GRPCTransport {
	ctx, stop := context.WithCancel(context.Background())
	return &GRPCTransport{dial: dial, ctx: ctx, stop: stop, peers: map[uint64]chan []byte{}}
}

// Send queues msg for member to.
func (t *GRPCTransport) Send(to uint64, msg []byte) {
	t.mu.Lock()
	defer t.mu.Unlock() // a queue is closed only under mu: never send on a closed one
	q, ok := t.peers[to]
	if !ok && t.ctx.Err() == nil {
		q = make(chan []byte, peerQueue)
		t.peers[to] = q
		t.wg.Add(1)
		go t.run(to, q)
	}
	select {
	case q <- msg:
	default:
		t.dropped.Add(1)
	}
}

// Traffic returns the messages sent so far on the peers' streams and
// their bytes (the marshalled raft message, the gRPC framing aside), and
// the messages dropped unsent; the Proposals and Applied fields are zero.
func (t *GRPCTransport) Traffic() Traffic {
	return Traffic{MsgsSent: t.sent.Load(), BytesSent: t.bytes.Load(), MsgsDropped: t.dropped.Load()}
}

// Forget stops sending to a member that left the log.
func (t *GRPCTransport) Forget(to uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if q, ok := t.peers[to]; ok {
		close(q)
		delete(t.peers, to)
	}
}

// Close stops every peer's goroutine and waits for them.
func (t *GRPCTransport) Close() {
	t.stop()
	t.mu.Lock()
	for to, q := range t.peers {
		close(q)
		delete(t.peers, to)
	}
	t.mu.Unlock()
	t.wg.Wait()
}

// run owns one peer's stream: it (re)opens it, with a short backoff after
// a failure, and sends what the queue holds.
func (t *GRPCTransport) run(to uint64, q chan []byte) {
	defer t.wg.Done()
	var s *peerStream
	defer func() { s.close() }()
	for msg := range q {
		if s == nil {
			var err error
			if s, err = t.open(to); err != nil {
				// Drop this message and wait a little before the next try
				// (raft sends again every tick).
				t.dropped.Add(1)
				select {
				case <-time.After(50 * time.Millisecond):
				case <-t.ctx.Done():
					return
				}
				continue
			}
		}
		if err := s.stream.SendMsg(&wrapperspb.BytesValue{Value: msg}); err != nil {
			t.dropped.Add(1)
			s.close()
			s = nil
			continue
		}
		t.sent.Add(1)
		t.bytes.Add(uint64(len(msg)))
	}
}

// peerStream is one open stream and what ends it.
type peerStream struct {
	stream grpc.ClientStream
	cancel context.CancelFunc
}

func (t *GRPCTransport) open(to uint64) (*peerStream, error) {
	conn, err := t.dial(t.ctx, to)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(t.ctx)
	stream, err := conn.NewStream(ctx, &streamDesc, streamPath)
	if err != nil {
		cancel()
		return nil, err
	}
	return &peerStream{stream: stream, cancel: cancel}, nil
}

// close ends the stream: half-close, let the server's handler end, then
// cancel. A nil stream is a no-op.
func (s *peerStream) close() {
	if s == nil {
		return
	}
	_ = s.stream.CloseSend()
	s.cancel()
	_ = s.stream.RecvMsg(&emptypb.Empty{})
}
