package transport

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
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// Magic opens a framed pipe's connection. It is as long as the HTTP/2
// client preface, so a gRPC server without framed pipes reads it whole,
// finds it wrong and closes the connection at once.
const Magic = "RLPIPE/1 ringlimit pipe\n"

// Kinds of framed pipe, named in the hello frame.
const (
	KindCheck     byte = 1 // forwards: CheckStream
	KindReplicate byte = 2 // replication: ReplicateStream
)

const (
	// MaxFrame bounds a frame (a gRPC server's default is 4 MiB per
	// message; batches and copy chunks stay well below both).
	MaxFrame = 16 << 20
	// SetupTimeout bounds sniffing, TLS and the hello, each side.
	SetupTimeout = 5 * time.Second
	// KeepBuf is the largest frame buffer kept between frames (callers
	// that keep encoding buffers of their own use the same bound).
	KeepBuf = 256 << 10
	// MaxHello bounds the hello and its answer: a kind and a token, or a
	// status and its message.
	MaxHello = 4 << 10
)

// ErrRefused means the server did not take the framed pipe: it does not
// speak framed pipes, or refused the hello (the error then also carries
// the refusal's gRPC status).
var ErrRefused = errors.New("peer: framed pipe refused")

// Conn is one framed connection: one reader, writers serialised.
type Conn struct {
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

// NewConn frames c.
func NewConn(c net.Conn) *Conn {
	return &Conn{c: c, r: bufio.NewReaderSize(c, 32<<10)}
}

// SetWriteTimeout bounds each later write (zero: none). Call it before
// the connection is shared.
func (f *Conn) SetWriteTimeout(d time.Duration) { f.wtimeout = d }

// NetConn is the connection the frames travel on (a *tls.Conn under
// TLS).
func (f *Conn) NetConn() net.Conn { return f.c }

// Close closes the connection.
func (f *Conn) Close() error { return f.c.Close() }

// WriteMsg writes m as one frame with one write.
func (f *Conn) WriteMsg(m proto.Message) error {
	f.wmu.Lock()
	defer f.wmu.Unlock()
	b := append(f.wbuf[:0], 0, 0, 0, 0)
	b, err := proto.MarshalOptions{}.MarshalAppend(b, m)
	if err != nil {
		return fmt.Errorf("peer: encode frame: %w", err)
	}
	if len(b)-4 > MaxFrame {
		return fmt.Errorf("peer: frame of %d bytes exceeds %d", len(b)-4, MaxFrame)
	}
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	if f.wtimeout > 0 {
		_ = f.c.SetWriteDeadline(time.Now().Add(f.wtimeout))
	}
	_, err = f.c.Write(b)
	if cap(b) <= KeepBuf {
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

// WriteRaw writes payload as one frame (setup frames).
func (f *Conn) WriteRaw(payload []byte) error {
	f.wmu.Lock()
	defer f.wmu.Unlock()
	b := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(payload)), uint32(len(payload)))
	_, err := f.c.Write(append(b, payload...))
	return err
}

// ReadFrame reads one frame of at most limit bytes; the bytes are valid
// until the next read. A connection that ends between frames returns
// io.EOF.
func (f *Conn) ReadFrame(limit uint32) ([]byte, error) {
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
	if cap(f.rbuf) > KeepBuf {
		f.rbuf = nil // b stays valid; the next frame gets a fresh buffer
	}
	return b, nil
}

// ReadMsg reads one frame into m (which copies what it keeps).
func (f *Conn) ReadMsg(m proto.Message) error {
	b, err := f.ReadFrame(MaxFrame)
	if err != nil {
		return err
	}
	if err := proto.Unmarshal(b, m); err != nil {
		return fmt.Errorf("peer: decode frame: %w", err)
	}
	return nil
}

// Stream carries a stream handler's or a pipe's messages on a framed
// connection: it is the grpc.BidiStreamingServer the handler reads and
// answers on (In: requests, Out: answers), and, with the types swapped,
// the grpc.BidiStreamingClient a pipe sends on.
type Stream[In, Out any] struct {
	fc  *Conn
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

// NewStream is a stream on fc whose Context is ctx. reuse: Recv decodes
// into one message (see Stream). cancel, if set, is called when a read
// fails other than at a clean end.
func NewStream[In, Out any](fc *Conn, ctx context.Context, reuse bool, cancel context.CancelFunc) *Stream[In, Out] {
	return &Stream[In, Out]{fc: fc, ctx: ctx, reuse: reuse, cancel: cancel}
}

// Recv reads the next message.
func (s *Stream[In, Out]) Recv() (*In, error) {
	m := s.last
	if m == nil || !s.reuse {
		m = new(In)
		s.last = m
	} else {
		proto.Reset(any(m).(proto.Message))
	}
	if err := s.fc.ReadMsg(any(m).(proto.Message)); err != nil {
		if s.cancel != nil && !errors.Is(err, io.EOF) {
			s.cancel()
		}
		return nil, err
	}
	return m, nil
}

// Send writes m as one frame.
func (s *Stream[In, Out]) Send(m *Out) error {
	return s.fc.WriteMsg(any(m).(proto.Message))
}

// Context is the stream's context.
func (s *Stream[In, Out]) Context() context.Context { return s.ctx }

// SendMsg writes m, which must be a protobuf message.
func (s *Stream[In, Out]) SendMsg(m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("peer: framed pipe cannot send %T", m)
	}
	return s.fc.WriteMsg(pm)
}

// RecvMsg reads into m, which must be a protobuf message.
func (s *Stream[In, Out]) RecvMsg(m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("peer: framed pipe cannot receive into %T", m)
	}
	return s.fc.ReadMsg(pm)
}

// Headers and trailers do not exist on a framed pipe.
func (s *Stream[In, Out]) SetHeader(metadata.MD) error  { return nil }
func (s *Stream[In, Out]) SendHeader(metadata.MD) error { return nil }
func (s *Stream[In, Out]) SetTrailer(metadata.MD)       {}
func (s *Stream[In, Out]) Header() (metadata.MD, error) { return nil, nil }
func (s *Stream[In, Out]) Trailer() metadata.MD         { return nil }

// CloseSend ends the client's half: the server's handler reads io.EOF.
func (s *Stream[In, Out]) CloseSend() error {
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

// Dial opens a framed pipe of kind to addr, over TLS when tlsCfg is set,
// presenting cred. A server that does not take it answers ErrRefused.
func Dial(ctx context.Context, addr string, kind byte, cred Credential, tlsCfg *tls.Config) (*Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, SetupTimeout)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	// Cancelling ctx (the client stopping, the timeout) cuts the setup.
	stop := context.AfterFunc(ctx, func() { raw.Close() })
	fail := func(err error) (*Conn, error) {
		stop()
		raw.Close()
		return nil, err
	}
	if _, err := raw.Write([]byte(Magic)); err != nil {
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
			return fail(fmt.Errorf("%w: TLS: %w", ErrRefused, err))
		}
		conn = tc
	}
	fc := NewConn(conn)
	if err := cred.clientHello(fc, kind); err != nil {
		return fail(err)
	}
	ans, err := fc.ReadFrame(MaxHello)
	if err != nil {
		// A server without framed pipes closes the connection.
		return fail(fmt.Errorf("%w: %w", ErrRefused, err))
	}
	if err := refusal(ans); err != nil {
		return fail(err)
	}
	if !stop() {
		return fail(ctx.Err())
	}
	return fc, nil
}

// Open is the open function of a pipe on fc (the shape of a generated
// gRPC client's stream method): the pipe's context closes the connection
// when it ends.
func Open[Req, Resp any](fc *Conn) func(context.Context, ...grpc.CallOption) (grpc.BidiStreamingClient[Req, Resp], error) {
	return func(ctx context.Context, _ ...grpc.CallOption) (grpc.BidiStreamingClient[Req, Resp], error) {
		context.AfterFunc(ctx, func() { fc.c.Close() })
		return &Stream[Resp, Req]{fc: fc, ctx: ctx, reuse: true}, nil
	}
}
