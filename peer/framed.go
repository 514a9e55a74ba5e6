package peer

// Framed pipes (internal/transport) carry the peer streams (forwards and
// replication, see stream.go) on a plain TCP connection of their own
// beside the gRPC server, on the same port. This file is the node's side
// of them:
//
//   - Admission by the same rules as peer RPCs (auth.go): a verified
//     peer's certificate under mutual TLS, else the answer to the hello's
//     challenge, else open.
//   - An admitted pipe is served by the gRPC streams' own handlers
//     (CheckStream, ReplicateStream), so every rule of stream.go holds
//     unchanged on it.
//   - A client dials on a goroutine of its own and sends unary RPCs
//     meanwhile, so dialling never blocks its loop. A server that does not
//     speak framed pipes (an older node, or a proxy that passes only
//     HTTP/2) closes the connection: the client then uses a gRPC stream,
//     and tries a framed pipe again only after a pause (stream.go).
//   - The node's RPC server stops framed pipes with its gRPC server: at
//     once (their connections closed) or gracefully (no more requests
//     read; answers to those read are still sent).

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/internal/transport"
	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// pipeHandler is the node's transport.Handler.
type pipeHandler struct {
	n   *Node
	srv *limiterService
}

func newFramedServer(n *Node) *transport.Server {
	return transport.NewServer(n.cfg.ServerTLS, n.ops.auth, pipeHandler{n: n, srv: &limiterService{n: n}}, n.log)
}

// Admit takes a pipe whose hello the node's Auth admitted, unless the
// node refuses framed pipes for now (tests).
func (h pipeHandler) Admit() error {
	if h.n.hooks.refuseFramed.Load() {
		return status.Error(codes.Unavailable, "framed pipes refused for now")
	}
	return nil
}

// ServePipe runs the stream handler of kind on fc.
func (h pipeHandler) ServePipe(ctx context.Context, cancel context.CancelFunc, kind byte, fc *transport.Conn) error {
	h.n.framedServed[kind].Add(1)
	fc.SetWriteTimeout(h.n.framedWriteTimeout())
	switch kind {
	case transport.KindCheck:
		return h.srv.CheckStream(transport.NewStream[peerpb.CheckRequest, peerpb.CheckResponse](fc, ctx, false, cancel))
	case transport.KindReplicate:
		// ReplicateStream applies each request before it reads the next
		// and keeps none: its requests can share one message.
		return h.srv.ReplicateStream(transport.NewStream[peerpb.ReplicateRequest, peerpb.ReplicateResponse](fc, ctx, true, cancel))
	}
	return nil
}

// framedWriteTimeout bounds each write on a framed pipe: 10 s, or four
// forward timeouts if that is longer. A write blocks only while the peer
// reads nothing (its buffers are full); by then its callers have long
// given up, and the connection is closed rather than left to TCP's
// retransmission timeout (minutes).
func (n *Node) framedWriteTimeout() time.Duration {
	if d := n.cfg.framedWriteTimeout; d > 0 {
		return d
	}
	return max(10*time.Second, 4*n.cfg.ForwardTimeout)
}
