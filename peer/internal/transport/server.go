package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Handler is what a Server needs from the node it serves for.
type Handler interface {
	// Admit decides a pipe whose hello the Server's Auth admitted: nil
	// takes it; an error refuses it with the error's gRPC status.
	Admit() error
	// ServePipe runs an admitted pipe of kind (KindCheck or
	// KindReplicate) on fc until it ends. ctx is the pipe's and cancel
	// ends it: a Stream made with cancel calls it when the connection
	// breaks (as a Stop at once breaks it), so work for a sender that is
	// gone stops.
	ServePipe(ctx context.Context, cancel context.CancelFunc, kind byte, fc *Conn) error
}

// Server serves the framed pipes that a Listener hands it.
type Server struct {
	tls  *tls.Config
	auth Auth
	h    Handler
	log  *slog.Logger

	mu      sync.Mutex
	stopped bool
	conns   map[net.Conn]struct{} // sniffing or serving
	active  sync.WaitGroup        // serving goroutines, for a graceful stop
}

// NewServer serves pipes for h, over TLS when tlsCfg is set, admitting
// hellos by auth; log gets the pipes that fail to set up or end in error,
// at debug level.
func NewServer(tlsCfg *tls.Config, auth Auth, h Handler, log *slog.Logger) *Server {
	return &Server{tls: tlsCfg, auth: auth, h: h, log: log, conns: map[net.Conn]struct{}{}}
}

// Conns counts the connections the server is sniffing or serving.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// track registers c (false: the server has stopped; c is closed).
func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		c.Close()
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

// begin counts c as served, for a graceful stop (false: the server has
// stopped; c is closed).
func (s *Server) begin(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		delete(s.conns, c)
		c.Close()
		return false
	}
	s.active.Add(1)
	return true
}

// untrack forgets c and reports whether the server is still running.
func (s *Server) untrack(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
	return !s.stopped
}

// Stop ends every framed pipe: at once (connections closed), or, when
// graceful, by reading no more requests and waiting for the answers to
// those read. The caller of a graceful stop may follow it with a hard one.
func (s *Server) Stop(graceful bool) {
	s.mu.Lock()
	s.stopped = true
	for c := range s.conns {
		if cr, ok := netConnOf(c).(interface{ CloseRead() error }); graceful && ok {
			_ = cr.CloseRead()
		} else {
			_ = c.Close()
		}
	}
	s.mu.Unlock()
	if graceful {
		s.active.Wait()
	}
}

// serve sets up the framed pipe on c, whose magic has been read, and runs
// its handler until the pipe ends. It closes c.
func (s *Server) serve(c net.Conn) {
	defer s.active.Done()
	defer func() {
		s.untrack(c)
		c.Close()
	}()
	_ = c.SetDeadline(time.Now().Add(SetupTimeout))
	conn := c
	var cs *tls.ConnectionState
	if s.tls != nil {
		tc := tls.Server(c, s.tls)
		if err := tc.Handshake(); err != nil {
			s.log.Debug("framed pipe: TLS handshake failed", "remote", c.RemoteAddr().String(), "err", err)
			return
		}
		state := tc.ConnectionState()
		cs = &state
		conn = tc
	}
	fc := NewConn(conn)
	// Before the hello is accepted the sender is a stranger: it gets no
	// buffer larger than a hello needs.
	hello, err := fc.ReadFrame(MaxHello)
	if err != nil || len(hello) < 1 {
		s.log.Debug("framed pipe: no hello", "remote", c.RemoteAddr().String(), "err", err)
		return
	}
	kind := hello[0]
	err = s.auth.serverHello(fc, cs, hello)
	if errors.Is(err, errNoProof) {
		s.log.Debug("framed pipe: no answer to the challenge", "remote", c.RemoteAddr().String())
		return
	}
	if err == nil {
		err = s.h.Admit()
	}
	if err != nil {
		st := status.Convert(err)
		_ = fc.WriteRaw(append([]byte{byte(st.Code())}, st.Message()...))
		return
	}
	if kind != KindCheck && kind != KindReplicate {
		_ = fc.WriteRaw(append([]byte{byte(codes.Unimplemented)}, fmt.Sprintf("unknown framed pipe kind %d", kind)...))
		return
	}
	if err := fc.WriteRaw([]byte{0}); err != nil {
		return
	}
	_ = c.SetDeadline(time.Time{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err = s.h.ServePipe(ctx, cancel, kind, fc)
	if err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, context.Canceled) {
		s.log.Debug("framed pipe ended", "remote", c.RemoteAddr().String(), "err", err)
	}
}

// Listener is the listener a gRPC server serves: it passes on the
// connections that are not framed pipes and gives those that are to its
// Server.
type Listener struct {
	net.Listener
	wg    *sync.WaitGroup
	s     *Server
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once

	errMu sync.Mutex
	err   error // the underlying Accept's error, once it fails
}

// NewListener starts accepting on lis for s; the goroutines it starts are
// counted in wg (their owner's) and end when the listener is closed and
// s stopped.
func NewListener(lis net.Listener, s *Server, wg *sync.WaitGroup) *Listener {
	l := &Listener{Listener: lis, wg: wg, s: s, conns: make(chan net.Conn), done: make(chan struct{})}
	wg.Add(1)
	go l.acceptLoop()
	return l
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
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
		if !l.s.track(c) {
			return
		}
		l.wg.Add(1)
		go l.sniff(c)
	}
}

// sniff reads the first bytes of c and hands it on.
func (l *Listener) sniff(c net.Conn) {
	defer l.wg.Done()
	var head [len(Magic)]byte
	_ = c.SetReadDeadline(time.Now().Add(SetupTimeout))
	k, _ := io.ReadFull(c, head[:])
	if k == len(head) && string(head[:]) == Magic {
		if l.s.begin(c) {
			l.s.serve(c)
		}
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	if !l.s.untrack(c) {
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
func (l *Listener) Accept() (net.Conn, error) {
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

// Close stops accepting. Framed pipes end with the Server.
func (l *Listener) Close() error {
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
