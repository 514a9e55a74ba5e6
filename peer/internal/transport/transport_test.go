package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// echo admits the token "good" (and any verified client) and answers
// every message of a pipe with itself, its kind prefixed.
type echo struct{}

func (echo) Admit(verified bool, token string) error {
	switch {
	case verified || token == "good":
		return nil
	case token == "":
		return status.Error(codes.Unauthenticated, "no token")
	}
	return status.Error(codes.PermissionDenied, "wrong token")
}

func (echo) ServePipe(ctx context.Context, cancel context.CancelFunc, kind byte, fc *Conn) error {
	st := NewStream[wrapperspb.StringValue, wrapperspb.StringValue](fc, ctx, true, cancel)
	for {
		m, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := st.Send(wrapperspb.String(string('0'+kind) + m.GetValue())); err != nil {
			return err
		}
	}
}

// serveEcho serves echo pipes and gRPC-bound connections on one loopback
// port; everything it started has ended when the test's cleanup returns.
func serveEcho(t *testing.T) (*Listener, *Server) {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	s := NewServer(nil, echo{}, slog.New(slog.DiscardHandler))
	l := NewListener(raw, s, &wg)
	t.Cleanup(func() {
		l.Close()
		s.Stop(false)
		wg.Wait()
	})
	return l, s
}

// TestDialHello: a hello with the wrong token, none, or an unknown kind is
// refused with its status and nothing served; an admitted pipe carries
// messages both ways, and its client's CloseSend ends the handler cleanly.
func TestDialHello(t *testing.T) {
	l, s := serveEcho(t)
	addr := l.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name  string
		kind  byte
		token string
		want  codes.Code
	}{
		{"no token", KindCheck, "", codes.Unauthenticated},
		{"wrong token", KindReplicate, "bad", codes.PermissionDenied},
		{"unknown kind", 9, "good", codes.Unimplemented},
	} {
		fc, err := Dial(ctx, addr, tc.kind, tc.token, nil)
		if err == nil {
			fc.Close()
			t.Fatalf("%s: pipe opened, want refused", tc.name)
		}
		if !errors.Is(err, ErrRefused) || status.Code(err) != tc.want {
			t.Fatalf("%s: %v (code %v), want ErrRefused with %v", tc.name, err, status.Code(err), tc.want)
		}
	}
	fc, err := Dial(ctx, addr, KindReplicate, "good", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fc.Close()
	open := Open[wrapperspb.StringValue, wrapperspb.StringValue](fc)
	st, err := open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"a", "", "longer message"} {
		if err := st.Send(wrapperspb.String(v)); err != nil {
			t.Fatal(err)
		}
		got, err := st.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if want := "2" + v; got.GetValue() != want {
			t.Fatalf("echo of %q = %q, want %q", v, got.GetValue(), want)
		}
	}
	if got := s.Conns(); got != 1 {
		t.Fatalf("Conns() = %d while one pipe is open, want 1", got)
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv after CloseSend: %v, want io.EOF (the handler ended cleanly)", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.Conns() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("Conns() = %d 5 s after the pipe ended, want 0", s.Conns())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestNotFramedGoesToAccept: a connection that does not open with Magic
// (an HTTP/2 preface, or fewer bytes than Magic before the client waits)
// comes out of Accept with every byte it sent put back.
func TestNotFramedGoesToAccept(t *testing.T) {
	l, _ := serveEcho(t)
	for _, head := range []string{"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\nmore bytes", Magic[:len(Magic)-1] + "X"} {
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte(head)); err != nil {
			t.Fatal(err)
		}
		got, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		_ = got.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, len(head))
		if _, err := io.ReadFull(got, b); err != nil || string(b) != head {
			t.Fatalf("Accept's connection read %q, %v; want %q", b, err, head)
		}
		got.Close()
		c.Close()
	}
}

// TestReadFrameLimit: a frame longer than the reader's limit is an error
// before anything of its length is allocated or read, and a connection
// that ends inside a frame is io.ErrUnexpectedEOF, between frames io.EOF.
func TestReadFrameLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    []byte
		limit uint32
		want  func(error) bool
	}{
		{"over the limit", binary.BigEndian.AppendUint32(nil, MaxHello+1), MaxHello, func(err error) bool { return err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) }},
		{"over the largest frame", binary.BigEndian.AppendUint32(nil, 1<<31), MaxFrame, func(err error) bool { return err != nil && !errors.Is(err, io.ErrUnexpectedEOF) }},
		{"cut inside", append(binary.BigEndian.AppendUint32(nil, 10), "abc"...), MaxFrame, func(err error) bool { return errors.Is(err, io.ErrUnexpectedEOF) }},
		{"clean end", nil, MaxFrame, func(err error) bool { return errors.Is(err, io.EOF) }},
	} {
		a, b := net.Pipe()
		go func() {
			_, _ = a.Write(tc.in)
			a.Close()
		}()
		fc := NewConn(b)
		got, err := fc.ReadFrame(tc.limit)
		if !tc.want(err) {
			t.Errorf("%s: ReadFrame = %q, %v", tc.name, got, err)
		}
		if cap(fc.rbuf) > 16 {
			t.Errorf("%s: the reader allocated %d bytes for a frame it refused", tc.name, cap(fc.rbuf))
		}
		b.Close()
	}
	// And a frame within the limit reads whole.
	a, b := net.Pipe()
	defer b.Close()
	go func() {
		_, _ = a.Write(append(binary.BigEndian.AppendUint32(nil, 5), "hello"...))
		a.Close()
	}()
	got, err := NewConn(b).ReadFrame(MaxHello)
	if err != nil || !bytes.Equal(got, []byte("hello")) {
		t.Fatalf("ReadFrame = %q, %v; want hello", got, err)
	}
}

// flakyListener fails its first fails Accepts with a temporary error, as
// accept does when the process is out of file descriptors.
type flakyListener struct {
	net.Listener
	mu    sync.Mutex
	fails int
}

type temporaryErr struct{}

func (temporaryErr) Error() string   { return "accept: too many open files" }
func (temporaryErr) Temporary() bool { return true }
func (temporaryErr) Timeout() bool   { return false }

func (l *flakyListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	fail := l.fails > 0
	l.fails--
	l.mu.Unlock()
	if fail {
		return nil, temporaryErr{}
	}
	return l.Listener.Accept()
}

// TestListenerRetriesTemporaryErrors: a temporary accept error (out
// of file descriptors) makes the listener wait and accept again, as gRPC's
// own accept loop does, instead of stopping the server's listener.
func TestListenerRetriesTemporaryErrors(t *testing.T) {
	var wg sync.WaitGroup
	fs := NewServer(nil, echo{}, slog.New(slog.DiscardHandler))
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := NewListener(&flakyListener{Listener: raw, fails: 3}, fs, &wg)
	defer func() {
		l.Close()
		fs.Stop(false)
		wg.Wait()
	}()
	conn, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if c != nil {
			c.Close()
		}
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("Accept after 3 temporary errors: %v, want the connection", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept did not return the connection within 5 s")
	}
}
