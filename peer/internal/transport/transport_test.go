package transport

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// echo answers every message of a pipe with itself, its kind prefixed.
// Its servers admit hellos by srvAuth: the secret "good", member "srv".
type echo struct{}

func (echo) Admit() error { return nil }

var (
	srvAuth = NewAuth(AuthConfig{Secret: []byte("good"), Self: "srv"})
	// good is a client's credential for srv.
	good = NewAuth(AuthConfig{Secret: []byte("good"), Self: "cli"}).PipeCredential("srv")
)

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
	return serveWith(t, echo{})
}

// serveWith serves h's pipes on a loopback port until the test ends.
func serveWith(t *testing.T, h Handler) (*Listener, *Server) {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	s := NewServer(nil, srvAuth, h, slog.New(slog.DiscardHandler))
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
		name string
		kind byte
		cred Credential
		want codes.Code
	}{
		{"no token", KindCheck, Credential{}, codes.Unauthenticated},
		{"wrong token", KindReplicate, Credential{Token: "bad"}, codes.PermissionDenied},
		{"another secret", KindReplicate, NewAuth(AuthConfig{Secret: []byte("bad"), Self: "cli"}).PipeCredential("srv"), codes.PermissionDenied},
		{"made for another member", KindReplicate, NewAuth(AuthConfig{Secret: []byte("good"), Self: "cli"}).PipeCredential("other"), codes.PermissionDenied},
		{"static token over plaintext", KindCheck, Credential{Token: srvAuth.LegacyToken()}, codes.PermissionDenied},
		{"unknown kind", 9, good, codes.Unimplemented},
	} {
		fc, err := Dial(ctx, addr, tc.kind, tc.cred, nil)
		if err == nil {
			fc.Close()
			t.Fatalf("%s: pipe opened, want refused", tc.name)
		}
		if !errors.Is(err, ErrRefused) || status.Code(err) != tc.want {
			t.Fatalf("%s: %v (code %v), want ErrRefused with %v", tc.name, err, status.Code(err), tc.want)
		}
	}
	fc, err := Dial(ctx, addr, KindReplicate, good, nil)
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
	// The refused connections are forgotten as their serving goroutines
	// end, a moment after their answers.
	waitConns(t, s, 1)
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv after CloseSend: %v, want io.EOF (the handler ended cleanly)", err)
	}
	waitConns(t, s, 0)
}

// waitConns waits up to 5 s for s to sniff or serve want connections.
func waitConns(t *testing.T, s *Server, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for s.Conns() != want {
		if time.Now().After(deadline) {
			t.Fatalf("Conns() = %d after 5 s, want %d", s.Conns(), want)
		}
		<-tick.C
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
		{"over the limit", binary.BigEndian.AppendUint32(nil, MaxHello+1), MaxHello, func(err error) bool {
			return err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF)
		}},
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
	fs := NewServer(nil, srvAuth, echo{}, slog.New(slog.DiscardHandler))
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

// idEcho answers "id:payload" with itself, except a payload "drop",
// which it never answers.
type idEcho struct{ echo }

func (idEcho) ServePipe(ctx context.Context, cancel context.CancelFunc, kind byte, fc *Conn) error {
	st := NewStream[wrapperspb.StringValue, wrapperspb.StringValue](fc, ctx, false, cancel)
	for {
		m, err := st.Recv()
		if err != nil {
			return err
		}
		if strings.HasSuffix(m.GetValue(), ":drop") {
			continue
		}
		if err := st.Send(m); err != nil {
			return err
		}
	}
}

// call is one request of TestPipe and what its Done got.
type call struct {
	payload string
	got     chan string // the answer's value, or "error: ..."
}

func (c *call) Msg(id uint64) *wrapperspb.StringValue {
	return wrapperspb.String(strconv.FormatUint(id, 10) + ":" + c.payload)
}

func (c *call) Done(r *wrapperspb.StringValue, err error) {
	if err != nil {
		c.got <- "error: " + err.Error()
		return
	}
	_, v, _ := strings.Cut(r.GetValue(), ":")
	c.got <- v
}

func answerID(r *wrapperspb.StringValue) uint64 {
	id, _, _ := strings.Cut(r.GetValue(), ":")
	n, _ := strconv.ParseUint(id, 10, 64)
	return n
}

// TestPipe: every request on a pipe is answered once, by its own answer;
// a lost answer breaks the pipe within 2.5 timeouts, failing what waits
// and counting the break, and a broken pipe refuses new requests without
// calling their Done; a retired pipe with nothing waiting ends at once.
func TestPipe(t *testing.T) {
	l, _ := serveWith(t, idEcho{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	var breaks atomic.Int64
	const timeout = 100 * time.Millisecond
	open := func() *Pipe[wrapperspb.StringValue, wrapperspb.StringValue] {
		fc, err := Dial(ctx, l.Addr().String(), KindCheck, good, nil)
		if err != nil {
			t.Fatal(err)
		}
		p, err := OpenPipe(ctx, PipeConfig{WG: &wg, Timeout: timeout, Breaks: &breaks, Framed: true}, Open[wrapperspb.StringValue, wrapperspb.StringValue](fc), answerID)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := open()
	defer p.Fail(errors.New("test over"))
	calls := make([]*call, 200)
	for i := range calls {
		calls[i] = &call{payload: "p" + strconv.Itoa(i), got: make(chan string, 2)}
		if err := p.Send(calls[i]); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range calls {
		if got := <-c.got; got != c.payload {
			t.Fatalf("answer %q to %q", got, c.payload)
		}
	}
	lost := &call{payload: "drop", got: make(chan string, 2)}
	start := time.Now()
	if err := p.Send(lost); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-lost.got:
		if !strings.Contains(got, "no answer on the stream") {
			t.Fatalf("a lost answer's Done got %q, want the watchdog's error", got)
		}
		if d := time.Since(start); d < 2*timeout {
			t.Fatalf("the pipe broke after %v, before twice its timeout", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a lost answer did not break the pipe within 10 s")
	}
	if p.Err() == nil || breaks.Load() != 1 {
		t.Fatalf("after the watchdog: Err() = %v, breaks = %d; want an error and 1", p.Err(), breaks.Load())
	}
	late := &call{payload: "late", got: make(chan string, 2)}
	if err := p.Send(late); err == nil {
		t.Fatal("Send on a broken pipe returned nil")
	}
	for _, c := range append(calls, lost, late) {
		select {
		case got := <-c.got:
			t.Fatalf("request %q answered twice (or after its pipe refused it): %q", c.payload, got)
		default:
		}
	}
	r := open()
	r.Retire()
	if err := r.Err(); !errors.Is(err, ErrRetired) {
		t.Fatalf("a retired pipe with nothing waiting: Err() = %v, want ErrRetired", err)
	}
}
