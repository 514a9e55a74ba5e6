package peer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// h2Client is a hand-driven HTTP/2 client of a node's gRPC port: it can
// do what grpc-go's client never does, such as open more streams than
// the server allows or leave pings unanswered.
type h2Client struct {
	t  *testing.T
	c  net.Conn
	fr *http2.Framer
}

// dialH2 connects from local (nil: any address) to addr, sends the
// HTTP/2 preface and waits for the server's SETTINGS: the node has
// accepted the connection and handed it to gRPC.
func dialH2(t *testing.T, local net.Addr, addr string) *h2Client {
	t.Helper()
	h, err := tryH2(local, addr)
	if err != nil {
		t.Fatalf("connection from %v to %s: %v", local, addr, err)
	}
	t.Cleanup(func() { h.c.Close() })
	h.t = t
	return h
}

// tryH2 is dialH2, returning an error when the server refuses.
func tryH2(local net.Addr, addr string) (*h2Client, error) {
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: local}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	h := &h2Client{c: c, fr: http2.NewFramer(c, c)}
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		c.Close()
		return nil, err
	}
	if err := h.fr.WriteSettings(); err != nil {
		c.Close()
		return nil, err
	}
	f, err := h.fr.ReadFrame()
	if err != nil {
		c.Close()
		return nil, err
	}
	if _, ok := f.(*http2.SettingsFrame); !ok {
		c.Close()
		return nil, fmt.Errorf("first frame %v, want SETTINGS", f.Header())
	}
	return h, nil
}

// openAllowStream sends the headers of an AllowStream call on stream id
// (odd, increasing) and no message: an idle stream.
func (h *h2Client) openAllowStream(id uint32) {
	h.t.Helper()
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/ringlimit.v1.RateLimiter/AllowStream"},
		{":authority", "ringlimit"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := h.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: b.Bytes(), EndHeaders: true}); err != nil {
		h.t.Fatalf("headers of stream %d: %v", id, err)
	}
}

// readUntil reads frames, acknowledging SETTINGS and answering pings when
// answer is set, until done returns true for a frame or the connection
// ends (its error is returned; nil when done).
func (h *h2Client) readUntil(answer bool, done func(http2.Frame) bool) error {
	for {
		f, err := h.fr.ReadFrame()
		if err != nil {
			return err
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = h.fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if answer && !f.IsAck() {
				_ = h.fr.WritePing(true, f.Data)
			}
		}
		if done(f) {
			return nil
		}
	}
}

// allowStreamGoroutines counts the goroutines of AllowStream calls being
// served (each has one receiving its messages) in this process.
func allowStreamGoroutines(t *testing.T) int {
	t.Helper()
	var b strings.Builder
	if err := pprof.Lookup("goroutine").WriteTo(&b, 2); err != nil {
		t.Fatal(err)
	}
	return strings.Count(b.String(), "(*allowStream).receive(")
}

// waitGoroutines waits until the process has at most limit goroutines and
// no AllowStream is served, failing after a deadline with what it saw.
func waitGoroutines(t *testing.T, limit int, what string) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		g, s := runtime.NumGoroutine(), allowStreamGoroutines(t)
		if g <= limit && s == 0 {
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("%s: %d goroutines (%d serving AllowStream) after 10 s, want at most %d and none", what, g, s, limit)
		}
	}
}

// goroutineSlack is how far above its count before a test's clients the
// process may stay once they are gone: the node's own goroutines come and
// go (a sweep, a probe).
const goroutineSlack = 8

// checkServed checks that a fresh gRPC client still gets decisions.
func checkServed(t *testing.T, n *Node, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := peerpb.NewRateLimiterClient(dialTest(t, n.RPCAddr())).Allow(ctx, &peerpb.AllowRequest{Key: &peerpb.Key{Tenant: "t", Subject: "other", Policy: "p"}})
	if err != nil || !r.GetAllowed() {
		t.Fatalf("%s: Allow from another client = %v, %v; want admitted", what, r, err)
	}
}

// TestRPCStreamsBounded opens three times MaxStreams idle AllowStream
// calls on one connection, ignoring the server's SETTINGS as the issue's
// flood did: the node refuses every stream past the bound (REFUSED_STREAM)
// and serves exactly MaxStreams, others are still answered, and once the
// connection closes every goroutine it cost is gone.
func TestRPCStreamsBounded(t *testing.T) {
	const maxStreams = 16
	c := startCluster(t, 1, Config{Policies: map[string]PolicyConfig{"p": {Limit: 5, Window: time.Minute}},
		RPCLimits: RPCLimits{MaxStreams: maxStreams}})
	n := c.nodes[0]
	checkServed(t, n, "before the flood") // the client's connection is part of the baseline
	base := runtime.NumGoroutine()

	h := dialH2(t, nil, n.RPCAddr())
	const opened = 3 * maxStreams
	for i := range opened {
		h.openAllowStream(uint32(2*i + 1))
	}
	refused := map[uint32]bool{}
	err := h.readUntil(true, func(f http2.Frame) bool {
		if rst, ok := f.(*http2.RSTStreamFrame); ok {
			if rst.ErrCode != http2.ErrCodeRefusedStream {
				t.Fatalf("stream %d reset with %v, want REFUSED_STREAM", rst.StreamID, rst.ErrCode)
			}
			refused[rst.StreamID] = true
		}
		return len(refused) == opened-maxStreams
	})
	if err != nil {
		t.Fatalf("reading the answers to %d streams: %v (%d refused)", opened, err, len(refused))
	}
	for i := range opened {
		if id := uint32(2*i + 1); refused[id] != (i >= maxStreams) {
			t.Fatalf("stream %d (the %d-th opened) refused: %v; want the first %d served, the rest refused", id, i+1, refused[id], maxStreams)
		}
	}
	// The served streams' handlers start on their own goroutines: wait
	// (with a deadline) until all of them run, and never more.
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := allowStreamGoroutines(t)
		if s > maxStreams {
			t.Fatalf("%d AllowStream calls served, want at most %d (MaxStreams)", s, maxStreams)
		}
		if s == maxStreams {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d AllowStream calls served after 10 s, want %d (MaxStreams)", s, maxStreams)
		}
		pause := time.NewTimer(10 * time.Millisecond)
		<-pause.C
	}
	checkServed(t, n, "during the flood")
	t.Logf("%d streams opened: %d served, %d refused; %d goroutines above the baseline", opened, maxStreams, len(refused), runtime.NumGoroutine()-base)

	h.c.Close()
	waitGoroutines(t, base+goroutineSlack, "after the flooding client closed")
}

// TestRPCConnsBounded fills the connection bounds, from one address and
// in all: a connection past either is reset without a byte, connections
// from another address are served until the total is reached, a closed
// connection makes room again, and once all close their goroutines are
// gone. The test uses 127.0.0.2 as the other address (Linux routes all of
// 127.0.0.0/8 to loopback).
func TestRPCConnsBounded(t *testing.T) {
	const perIP, total = 4, 6
	c := startCluster(t, 1, Config{Policies: map[string]PolicyConfig{"p": {Limit: 5, Window: time.Minute}},
		RPCLimits: RPCLimits{MaxConns: total, MaxConnsPerIP: perIP}})
	n := c.nodes[0]
	base := runtime.NumGoroutine()
	one, other := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}
	if l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: other.IP}); err != nil {
		t.Skipf("127.0.0.2 is not a local address here: %v", err)
	} else {
		l.Close()
	}

	refusedFrom := func(local net.Addr, why string) {
		t.Helper()
		if h, err := tryH2(local, n.RPCAddr()); err == nil {
			h.c.Close()
			t.Fatalf("a connection from %v past the %s bound was served", local, why)
		}
	}
	var held []*h2Client
	for range perIP {
		held = append(held, dialH2(t, one, n.RPCAddr()))
	}
	refusedFrom(one, "per-address")
	for range total - perIP {
		held = append(held, dialH2(t, other, n.RPCAddr()))
	}
	refusedFrom(other, "total")
	refusedFrom(one, "total")

	// One closes: one more may connect, from either address.
	held[0].c.Close()
	waitOpen(t, n, total-1)
	held[0] = dialH2(t, other, n.RPCAddr())
	refusedFrom(other, "total")

	for _, h := range held {
		h.c.Close()
	}
	waitOpen(t, n, 0)
	checkServed(t, n, "after the connections closed")
	waitGoroutines(t, base+goroutineSlack+4, "after every connection closed") // + the last client's connection
}

// waitOpen waits until the node's gRPC port holds want connections (the
// server notices a client's close on its next read).
func waitOpen(t *testing.T, n *Node, want int) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		got, _ := n.rpcConns.Open(nil)
		if got == want {
			return
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("the gRPC port holds %d connections after 10 s, want %d", got, want)
		}
	}
}

// TestRPCKeepalive checks that connections that go quiet are closed: one
// with no call in progress after IdleTimeout (GOAWAY, then close, though
// it answers pings), and one whose client stopped answering pings, with
// its calls, KeepaliveTimeout after the node's ping.
func TestRPCKeepalive(t *testing.T) {
	c := startCluster(t, 1, Config{Policies: map[string]PolicyConfig{"p": {Limit: 5, Window: time.Minute}},
		RPCLimits: RPCLimits{IdleTimeout: 300 * time.Millisecond, KeepaliveTime: time.Second, KeepaliveTimeout: 200 * time.Millisecond}})
	n := c.nodes[0]
	base := runtime.NumGoroutine()
	for _, tc := range []struct {
		name    string
		streams int  // idle AllowStream calls held open
		answer  bool // whether the client answers the node's pings
	}{
		{"idle connection", 0, true},
		{"silent client with calls", 4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			h := dialH2(t, nil, n.RPCAddr())
			for i := range tc.streams {
				h.openAllowStream(uint32(2*i + 1))
			}
			goAway := false
			err := h.readUntil(tc.answer, func(f http2.Frame) bool {
				if _, ok := f.(*http2.GoAwayFrame); ok {
					goAway = true
				}
				return false
			})
			if err == nil || errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
				t.Fatalf("connection not closed by the node within 10 s: %v", err)
			}
			if tc.streams == 0 && !goAway {
				t.Fatalf("idle connection closed (%v) without a GOAWAY", err)
			}
			t.Logf("closed after %v (%v, GOAWAY %v)", time.Since(start).Round(time.Millisecond), err, goAway)
			waitGoroutines(t, base+goroutineSlack, "after the node closed the connection")
		})
	}
}

// isTimeout reports whether err is a network timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
