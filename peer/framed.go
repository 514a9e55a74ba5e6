package peer

// Framed pipes: the peer streams (forwards and replication, see stream.go)
// on a plain TCP connection of their own, framed by a length prefix,
// instead of on a gRPC stream. A gRPC stream message costs about four
// times a bare loopback message and a few dozen allocations (HTTP/2
// framing, flow control, and a writer and a reader goroutine on each side
// that every message passes); on a framed pipe the sender writes the
// frame itself and the receiver reads it itself.
//
// The rules:
//   - A framed pipe shares the gRPC port. The server's listener looks at
//     the first 24 bytes of every connection: framedMagic (which neither an
//     HTTP/2 preface, "PRI ...", nor a TLS record, 0x16 ..., begins with)
//     makes it a framed pipe; anything else goes to the gRPC server with
//     the bytes put back.
//   - After the magic come TLS, when the node has ServerTLS (the client
//     uses ClientTLS, as for gRPC), then a hello frame: the pipe's kind
//     (forwards or replication) and the peer token. The server answers
//     with one frame, accepted or refused (the gRPC status code and
//     message), by the same rules as peer RPCs (auth.go): a verified
//     client certificate under mutual TLS, else the token, else open.
//   - Then each frame is a 4-byte big-endian length and a protobuf
//     message: the same requests and answers as the gRPC streams, served
//     by the same handlers (CheckStream, ReplicateStream), so every rule
//     of stream.go holds unchanged.
//   - A client dials on a goroutine of its own and sends unary RPCs
//     meanwhile, so dialling never blocks its loop. A server that does not
//     speak framed pipes (an older node, or a proxy that passes only
//     HTTP/2) closes the connection: the client then uses a gRPC stream,
//     and tries a framed pipe again only after a pause.
//   - The node's RPC server stops framed pipes with its gRPC server:
//     at once (their connections closed) or gracefully (no more requests
//     read; answers to those read are still sent).

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// framedMagic opens a framed pipe's connection. It is as long as the
// HTTP/2 client preface, so a gRPC server without framed pipes reads it
// whole, finds it wrong and closes the connection at once.
const framedMagic = "RLPIPE/1 ringlimit pipe\n"

// Kinds of framed pipe, named in the hello frame.
const (
	framedCheck     byte = 1 // forwards: CheckStream
	framedReplicate byte = 2 // replication: ReplicateStream
)

const (
	// framedMaxFrame bounds a frame (a gRPC server's default is 4 MiB per
	// message; batches and copy chunks stay well below both).
	framedMaxFrame = 16 << 20
	// framedSetupTimeout bounds sniffing, TLS and the hello, each side.
	framedSetupTimeout = 5 * time.Second
	// framedKeepBuf is the largest frame buffer kept between frames.
	framedKeepBuf = 256 << 10
	// framedMaxHello bounds the hello and its answer: a kind and a token,
	// or a status and its message.
	framedMaxHello = 4 << 10
)

// errFramedRefused means the server did not take the framed pipe: it
// does not speak framed pipes, or refused the hello.
var errFramedRefused = errors.New("peer: framed pipe refused")

// framedConn is one framed connection: one reader, writers serialised.
type framedConn struct {
	c    net.Conn
	r    *bufio.Reader
	hdr  [4]byte
	rbuf []byte

	// wtimeout bounds each write (zero: none): a peer that stops reading
	// (paused, or cut off without a reset) does not hold the writer, and
	// the writers queued behind it, for ever; the connection is closed
	// instead, which ends both sides' readers.
	wtimeout time.Duration

	wmu  sync.Mutex
	wbuf []byte
}

func newFramedConn(c net.Conn) *framedConn {
	return &framedConn{c: c, r: bufio.NewReaderSize(c, 32<<10)}
}

// writeMsg writes m as one frame with one write.
func (f *framedConn) writeMsg(m proto.Message) error {
	f.wmu.Lock()
	defer f.wmu.Unlock()
	b := append(f.wbuf[:0], 0, 0, 0, 0)
	b, err := proto.MarshalOptions{}.MarshalAppend(b, m)
	if err != nil {
		return fmt.Errorf("peer: encode frame: %w", err)
	}
	if len(b)-4 > framedMaxFrame {
		return fmt.Errorf("peer: frame of %d bytes exceeds %d", len(b)-4, framedMaxFrame)
	}
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	if f.wtimeout > 0 {
		_ = f.c.SetWriteDeadline(time.Now().Add(f.wtimeout))
	}
	_, err = f.c.Write(b)
	if cap(b) <= framedKeepBuf {
		f.wbuf = b
	} else {
		f.wbuf = nil
	}
	if err != nil {
		// A frame may be half written: nothing more can follow it.
		_ = f.c.Close()
	}
	return err
}

// writeRaw writes payload as one frame (setup frames).
func (f *framedConn) writeRaw(payload []byte) error {
	f.wmu.Lock()
	defer f.wmu.Unlock()
	b := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(payload)), uint32(len(payload)))
	_, err := f.c.Write(append(b, payload...))
	return err
}

// readFrame reads one frame of at most limit bytes; the bytes are valid
// until the next read. A connection that ends between frames returns
// io.EOF.
func (f *framedConn) readFrame(limit uint32) ([]byte, error) {
	if _, err := io.ReadFull(f.r, f.hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(f.hdr[:])
	if n > limit {
		return nil, fmt.Errorf("peer: frame of %d bytes exceeds %d", n, limit)
	}
	if int(n) > cap(f.rbuf) {
		f.rbuf = make([]byte, n)
	}
	b := f.rbuf[:n]
	if _, err := io.ReadFull(f.r, b); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	if cap(f.rbuf) > framedKeepBuf {
		f.rbuf = nil // b stays valid; the next frame gets a fresh buffer
	}
	return b, nil
}

// readMsg reads one frame into m (which copies what it keeps).
func (f *framedConn) readMsg(m proto.Message) error {
	b, err := f.readFrame(framedMaxFrame)
	if err != nil {
		return err
	}
	if err := proto.Unmarshal(b, m); err != nil {
		return fmt.Errorf("peer: decode frame: %w", err)
	}
	return nil
}

// framedStream carries a stream handler's or a pipe's messages on a
// framed connection: it is the grpc.BidiStreamingServer the handler
// reads and answers on (Req in, Resp out), and, with the types swapped,
// the grpc.BidiStreamingClient a pipe sends on.
type framedStream[In, Out any] struct {
	fc  *framedConn
	ctx context.Context
	// reuse makes Recv decode every message into one: for a reader done
	// with a message before it reads the next (a pipe's receiver, the
	// replication handler). Decoding never writes into what an earlier
	// message's fields (strings, byte slices, sub-messages) still point
	// to; only the message itself is reused. CheckStream's requests go to
	// workers, so it gets fresh ones.
	reuse bool
	last  *In
	// cancel, on a handler's side, ends ctx when the connection breaks
	// (as gRPC ends a stream's context): work for a sender that is gone
	// stops. A clean end (the sender closing its side, a graceful stop)
	// leaves ctx alone, so what was read is still answered.
	cancel context.CancelFunc
}

func (s *framedStream[In, Out]) Recv() (*In, error) {
	m := s.last
	if m == nil || !s.reuse {
		m = new(In)
		s.last = m
	} else {
		proto.Reset(any(m).(proto.Message))
	}
	if err := s.fc.readMsg(any(m).(proto.Message)); err != nil {
		if s.cancel != nil && !errors.Is(err, io.EOF) {
			s.cancel()
		}
		return nil, err
	}
	return m, nil
}

func (s *framedStream[In, Out]) Send(m *Out) error {
	return s.fc.writeMsg(any(m).(proto.Message))
}

func (s *framedStream[In, Out]) Context() context.Context { return s.ctx }

func (s *framedStream[In, Out]) SendMsg(m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("peer: framed pipe cannot send %T", m)
	}
	return s.fc.writeMsg(pm)
}

func (s *framedStream[In, Out]) RecvMsg(m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("peer: framed pipe cannot receive into %T", m)
	}
	return s.fc.readMsg(pm)
}

// Headers and trailers do not exist on a framed pipe.
func (s *framedStream[In, Out]) SetHeader(metadata.MD) error  { return nil }
func (s *framedStream[In, Out]) SendHeader(metadata.MD) error { return nil }
func (s *framedStream[In, Out]) SetTrailer(metadata.MD)       {}
func (s *framedStream[In, Out]) Header() (metadata.MD, error) { return nil, nil }
func (s *framedStream[In, Out]) Trailer() metadata.MD         { return nil }

// CloseSend ends the client's half: the server's handler reads io.EOF.
func (s *framedStream[In, Out]) CloseSend() error {
	if cw, ok := netConnOf(s.fc.c).(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return s.fc.c.Close()
}

// netConnOf is the TCP connection under c.
func netConnOf(c net.Conn) net.Conn {
	if tc, ok := c.(*tls.Conn); ok {
		return tc.NetConn()
	}
	return c
}

// framedServer serves the framed pipes of a node's RPC server.
type framedServer struct {
	n   *Node
	srv *server

	mu      sync.Mutex
	stopped bool
	conns   map[net.Conn]struct{} // sniffing or serving
	active  sync.WaitGroup        // serving goroutines, for a graceful stop
}

func newFramedServer(n *Node) *framedServer {
	return &framedServer{n: n, srv: &server{n: n}, conns: map[net.Conn]struct{}{}}
}

// track registers c (false: the server has stopped; c is closed).
func (fs *framedServer) track(c net.Conn) bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.stopped {
		c.Close()
		return false
	}
	fs.conns[c] = struct{}{}
	return true
}

// begin counts c as served, for a graceful stop (false: the server has
// stopped; c is closed).
func (fs *framedServer) begin(c net.Conn) bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.stopped {
		delete(fs.conns, c)
		c.Close()
		return false
	}
	fs.active.Add(1)
	return true
}

// untrack forgets c and reports whether the server is still running.
func (fs *framedServer) untrack(c net.Conn) bool {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	delete(fs.conns, c)
	return !fs.stopped
}

// stop ends every framed pipe: at once (connections closed), or, when
// graceful, by reading no more requests and waiting for the answers to
// those read. The caller of a graceful stop may follow it with a hard one.
func (fs *framedServer) stop(graceful bool) {
	fs.mu.Lock()
	fs.stopped = true
	for c := range fs.conns {
		if cr, ok := netConnOf(c).(interface{ CloseRead() error }); graceful && ok {
			_ = cr.CloseRead()
		} else {
			_ = c.Close()
		}
	}
	fs.mu.Unlock()
	if graceful {
		fs.active.Wait()
	}
}

// serve sets up the framed pipe on c, whose magic has been read, and runs
// its handler until the pipe ends. It closes c.
func (fs *framedServer) serve(c net.Conn) {
	defer fs.active.Done()
	defer func() {
		fs.untrack(c)
		c.Close()
	}()
	_ = c.SetDeadline(time.Now().Add(framedSetupTimeout))
	conn := c
	var verified bool
	if cfg := fs.n.cfg.ServerTLS; cfg != nil {
		tc := tls.Server(c, cfg)
		if err := tc.Handshake(); err != nil {
			fs.n.log.Debug("framed pipe: TLS handshake failed", "remote", c.RemoteAddr().String(), "err", err)
			return
		}
		verified = len(tc.ConnectionState().VerifiedChains) > 0
		conn = tc
	}
	fc := newFramedConn(conn)
	// Before the hello is accepted the sender is a stranger: it gets no
	// buffer larger than a hello needs.
	hello, err := fc.readFrame(framedMaxHello)
	if err != nil || len(hello) < 1 {
		fs.n.log.Debug("framed pipe: no hello", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	kind, token := hello[0], string(hello[1:])
	if err := fs.n.ops.auth.admit(verified, token); err != nil {
		st := status.Convert(err)
		_ = fc.writeRaw(append([]byte{byte(st.Code())}, st.Message()...))
		return
	}
	if fs.n.refuseFramed.Load() {
		_ = fc.writeRaw(append([]byte{byte(codes.Unavailable)}, "framed pipes refused for now"...))
		return
	}
	if kind != framedCheck && kind != framedReplicate {
		_ = fc.writeRaw(append([]byte{byte(codes.Unimplemented)}, fmt.Sprintf("unknown framed pipe kind %d", kind)...))
		return
	}
	if err := fc.writeRaw([]byte{0}); err != nil {
		return
	}
	fs.n.framedServed[kind].Add(1)
	_ = c.SetDeadline(time.Time{})
	fc.wtimeout = fs.n.framedWriteTimeout()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	switch kind {
	case framedCheck:
		err = fs.srv.CheckStream(&framedStream[peerpb.CheckRequest, peerpb.CheckResponse]{fc: fc, ctx: ctx, cancel: cancel})
	case framedReplicate:
		// ReplicateStream applies each request before it reads the next
		// and keeps none: its requests can share one message.
		err = fs.srv.ReplicateStream(&framedStream[peerpb.ReplicateRequest, peerpb.ReplicateResponse]{fc: fc, ctx: ctx, reuse: true, cancel: cancel})
	}
	if err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, context.Canceled) {
		fs.n.log.Debug("framed pipe ended", "remote", c.RemoteAddr().String(), "err", err)
	}
}

// sniffListener is the listener the gRPC server serves: it passes on the
// connections that are not framed pipes and serves those that are.
type sniffListener struct {
	net.Listener
	n     *Node
	fs    *framedServer
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once

	errMu sync.Mutex
	err   error // the underlying Accept's error, once it fails
}

// newSniffListener starts accepting on lis; the goroutines it starts
// belong to the node and end when the listener is closed.
func newSniffListener(n *Node, lis net.Listener, fs *framedServer) *sniffListener {
	l := &sniffListener{Listener: lis, n: n, fs: fs, conns: make(chan net.Conn), done: make(chan struct{})}
	n.wg.Add(1)
	go l.acceptLoop()
	return l
}

func (l *sniffListener) acceptLoop() {
	defer l.n.wg.Done()
	var pause time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			var tmp interface{ Temporary() bool }
			if errors.As(err, &tmp) && tmp.Temporary() {
				// Out of descriptors (EMFILE) and the like: wait a
				// little and accept again, as net/http and gRPC do; the
				// error is gone once connections close.
				pause = min(max(2*pause, 5*time.Millisecond), time.Second)
				t := time.NewTimer(pause)
				select {
				case <-t.C:
					continue
				case <-l.done:
					t.Stop()
					return
				}
			}
			l.errMu.Lock()
			l.err = err
			l.errMu.Unlock()
			l.Close()
			return
		}
		pause = 0
		if !l.fs.track(c) {
			return
		}
		l.n.wg.Add(1)
		go l.sniff(c)
	}
}

// sniff reads the first bytes of c and hands it on.
func (l *sniffListener) sniff(c net.Conn) {
	defer l.n.wg.Done()
	var head [len(framedMagic)]byte
	_ = c.SetReadDeadline(time.Now().Add(framedSetupTimeout))
	k, _ := io.ReadFull(c, head[:])
	if k == len(head) && string(head[:]) == framedMagic {
		if l.fs.begin(c) {
			l.fs.serve(c)
		}
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	if !l.fs.untrack(c) {
		// The server is stopping, and its stop may be what cut the read
		// short (a graceful stop shuts every tracked connection's
		// reading): handed to gRPC, which may still be accepting, the
		// connection would get gRPC's greeting instead of its end.
		c.Close()
		return
	}
	pc := &prefixConn{Conn: c, head: append([]byte(nil), head[:k]...)}
	select {
	case l.conns <- pc:
	case <-l.done:
		c.Close()
	}
}

// Accept returns the next connection that is not a framed pipe.
func (l *sniffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		l.errMu.Lock()
		defer l.errMu.Unlock()
		if l.err != nil {
			return nil, l.err
		}
		return nil, net.ErrClosed
	}
}

// Close stops accepting. Framed pipes end with the framed server.
func (l *sniffListener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		err = l.Listener.Close()
	})
	return err
}

// prefixConn is a connection with its first bytes put back.
type prefixConn struct {
	net.Conn
	head []byte
}

func (c *prefixConn) Read(b []byte) (int, error) {
	if len(c.head) > 0 {
		k := copy(b, c.head)
		c.head = c.head[k:]
		return k, nil
	}
	return c.Conn.Read(b)
}

// rpcServer is the node's RPC server: gRPC, and framed pipes beside it.
type rpcServer struct {
	grpc   *grpc.Server
	framed *framedServer
}

// Stop ends every RPC and pipe at once.
func (s *rpcServer) Stop() {
	s.framed.stop(false)
	s.grpc.Stop()
}

// GracefulStop stops accepting, lets gRPC calls finish and answers what
// framed pipes have read.
func (s *rpcServer) GracefulStop() {
	done := make(chan struct{})
	go func() { s.framed.stop(true); close(done) }()
	s.grpc.GracefulStop()
	<-done
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

// framedResult is the outcome of a framed pipe's dial.
type framedResult struct {
	fc  *framedConn
	err error
}

// dialFramed opens a framed pipe of kind to addr, over TLS when tlsCfg is
// set, presenting token (may be empty).
func dialFramed(ctx context.Context, addr string, kind byte, token string, tlsCfg *tls.Config) (*framedConn, error) {
	ctx, cancel := context.WithTimeout(ctx, framedSetupTimeout)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	// Cancelling ctx (the client stopping, the timeout) cuts the setup.
	stop := context.AfterFunc(ctx, func() { raw.Close() })
	fail := func(err error) (*framedConn, error) {
		stop()
		raw.Close()
		return nil, err
	}
	if _, err := raw.Write([]byte(framedMagic)); err != nil {
		return fail(err)
	}
	conn := raw
	if tlsCfg != nil {
		cfg := tlsCfg.Clone()
		if cfg.ServerName == "" {
			// As gRPC's TLS credentials do: the target's host.
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				host = addr
			}
			cfg.ServerName = host
		}
		tc := tls.Client(raw, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return fail(fmt.Errorf("%w: TLS: %w", errFramedRefused, err))
		}
		conn = tc
	}
	fc := newFramedConn(conn)
	if err := fc.writeRaw(append([]byte{kind}, token...)); err != nil {
		return fail(err)
	}
	ans, err := fc.readFrame(framedMaxHello)
	switch {
	case err != nil:
		// A server without framed pipes closes the connection.
		return fail(fmt.Errorf("%w: %w", errFramedRefused, err))
	case len(ans) == 0:
		return fail(fmt.Errorf("%w: empty answer", errFramedRefused))
	case ans[0] != 0:
		return fail(fmt.Errorf("%w: %w", errFramedRefused, status.Error(codes.Code(ans[0]), string(ans[1:]))))
	}
	if !stop() {
		return fail(ctx.Err())
	}
	return fc, nil
}

// framedOpen is the open function of a pipe on fc: the pipe's context
// closes the connection when it ends.
func framedOpen[Req, Resp any](fc *framedConn) func(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[Req, Resp], error) {
	return func(ctx context.Context, _ ...grpc.CallOption) (grpc.BidiStreamingClient[Req, Resp], error) {
		context.AfterFunc(ctx, func() { fc.c.Close() })
		return &framedStream[Resp, Req]{fc: fc, ctx: ctx, reuse: true}, nil
	}
}
