package peer

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// An eighth round of attacks on the ownership protocol: a message held in
// the network, before the receiver's server reads it.

// TestAttack8PromoteDelayedInNetwork: a partition moves from n0 to the
// joiner n2, and the Promote is held in the network on its way to n2 (a
// proxy in front of n2's gRPC port keeps its bytes; the stream's reset,
// sent when n0 gives up, never arrives), while n2's gossip goes silent.
// n0's promote times out; it stays fenced, sees n2 fail, waits out the
// promote's timeout and a lease from when it sent it, and takes the
// partition back above every epoch n2 may hold it at. Then the Promote
// reaches n2's server. gRPC carries a deadline as a timeout that the
// server counts from when it reads the request, so the Promote arrives
// with its whole timeout ahead of it: n2 used to apply it and decide
// under the lease it counts from then (async: until its first
// replication answer came back stale; off: until its first heartbeat's),
// beside n0. Synchronous policies were safe: n0, n2's backup, refuses
// n2's copies as stale, so nothing n2 decides is confirmed.
func TestAttack8PromoteDelayedInNetwork(t *testing.T) {
	inEveryMode(t, func(t *testing.T, mode Replication) {
		const limit = 5
		const lease = time.Second
		var cut, ready atomic.Bool
		c, n0, key, pid, confirmed := promoteScene(t, mode, limit, lease, "promote-in-network-", &ready)
		// n2's gossip goes silent as its Promote is held.
		px := newPromoteHold(t, pid, func() { cut.Store(true) })
		n2 := c.addWith("n2", func(cfg *Config) {
			cfg.RPCAdvertiseAddr = px.addr()
			cutGossip := withCutTransport(t, &cut)
			cfg.Gossip = func(mc *memberlist.Config) { cutGossip(mc); mc.SuspicionMaxTimeoutMult = 50 }
		})
		// A cut-off member's graceful leave waits out its drain: crash it.
		t.Cleanup(n2.KillForTest)
		px.setTarget(n2.RPCAddr())
		ready.Store(true)
		n0.kickOwnership()
		fenced := awaitTakeBack(t, n0, pid, px.held)
		px.free()
		select {
		case <-px.delivered:
		case <-time.After(5 * time.Second):
			t.Fatal("the held Promote was never delivered to n2's server")
		}
		by := map[string]int{"n0": 2}
		countAdmissions(c, key, lease*3/2, limit, &confirmed, by) // past the 9/10 lease n2 would count
		if confirmed > limit {
			t.Fatalf("%d admissions confirmed in one window of limit %d (by decider: %v):\n%s\n%s", confirmed, limit, by, n0.partForTest(pid), n2.partForTest(pid))
		}
		// The scene happened: n2 applied the late Promote (only a
		// holder becomes a forwarding record) and learned of n0's
		// newer holding.
		waitFor(t, 5*time.Second, "n2 to apply the late Promote and learn n0's holding", func() bool {
			r, h, e := n2.roleForTest(pid)
			return r == roleMoved && h == "n0" && e > fenced+1
		})
		t.Logf("confirmed %d (by decider: %v):\n%s\n%s", confirmed, by, n0.partForTest(pid), n2.partForTest(pid))
	})
}

// promoteHold is a TCP proxy in front of a node's gRPC port that holds, in
// the network, the first Promote of partition pid: its bytes go no
// further until free, and then nothing more from that connection does
// (the stream's reset, sent when the caller gives up, is lost with
// everything after it; the connection stays open on the server's side).
// Framed pipes and every other request pass unchanged.
type promoteHold struct {
	*testProxy
	t       *testing.T
	pid     int
	onHold  func()
	held    chan struct{} // closed when the Promote is held
	release chan struct{} // closed by free
	// delivered is closed once the held bytes are written to the server.
	delivered chan struct{}
	taken     atomic.Bool
	freeOnce  sync.Once
}

// newPromoteHold starts the proxy on 127.0.0.1; onHold runs as the Promote
// is held. Its target is set by setTarget (the node starts after the
// proxy, which it advertises).
func newPromoteHold(t *testing.T, pid int, onHold func()) *promoteHold {
	t.Helper()
	p := &promoteHold{t: t, pid: pid, onHold: onHold,
		held: make(chan struct{}), release: make(chan struct{}), delivered: make(chan struct{})}
	p.testProxy = newTestProxy(t, p.forward)
	return p
}

func (p *promoteHold) free() { p.freeOnce.Do(func() { close(p.release) }) }

// forward copies the client's bytes from cc to sc, holding the Promote of
// pid. It reports whether the connection ended by itself (false: the
// Promote was held, and the server's side stays open and silent).
func (p *promoteHold) forward(sc, cc net.Conn) bool {
	head := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(cc, head); err != nil {
		return true
	}
	if _, err := sc.Write(head); err != nil {
		return true
	}
	if string(head) != http2.ClientPreface {
		_, _ = io.Copy(sc, cc) // a framed pipe
		return true
	}
	var path string
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if f.Name == ":path" {
			path = f.Value
		}
	})
	var (
		holding bool
		stream  uint32
		buf     bytes.Buffer // frames from the Promote's HEADERS on
		msg     []byte       // the Promote's message, as it arrives
	)
	for {
		var fh [9]byte
		if _, err := io.ReadFull(cc, fh[:]); err != nil {
			return true
		}
		n := int(fh[0])<<16 | int(fh[1])<<8 | int(fh[2])
		typ, flags := http2.FrameType(fh[3]), http2.Flags(fh[4])
		sid := binary.BigEndian.Uint32(fh[5:]) & (1<<31 - 1)
		payload := make([]byte, n)
		if _, err := io.ReadFull(cc, payload); err != nil {
			return true
		}
		switch typ {
		case http2.FrameHeaders, http2.FrameContinuation:
			frag := payload
			if typ == http2.FrameHeaders {
				if flags.Has(http2.FlagHeadersPadded) && len(frag) > 0 {
					pad := int(frag[0])
					frag = frag[1 : len(frag)-pad]
				}
				if flags.Has(http2.FlagHeadersPriority) {
					frag = frag[5:]
				}
				path = ""
			}
			if _, err := dec.Write(frag); err != nil {
				p.t.Errorf("proxy: header block: %v", err)
				return true
			}
			if flags.Has(http2.FlagHeadersEndHeaders) {
				_ = dec.Close()
				if !holding && !p.taken.Load() && path == peerpb.Limiter_Promote_FullMethodName {
					holding, stream, msg = true, sid, msg[:0]
				}
			}
		}
		if !holding {
			if _, err := sc.Write(append(fh[:], payload...)); err != nil {
				return true
			}
			continue
		}
		buf.Write(fh[:])
		buf.Write(payload)
		if typ != http2.FrameData || sid != stream {
			continue
		}
		data := payload
		if flags.Has(http2.FlagDataPadded) && len(data) > 0 {
			data = data[1 : len(data)-int(data[0])]
		}
		msg = append(msg, data...)
		if !flags.Has(http2.FlagDataEndStream) {
			continue
		}
		var req peerpb.PromoteRequest
		if len(msg) < 5 || proto.Unmarshal(msg[5:], &req) != nil || int(req.GetPartition()) != p.pid || !p.taken.CompareAndSwap(false, true) {
			// Another Promote: it goes on at once.
			holding = false
			if _, err := sc.Write(buf.Bytes()); err != nil {
				return true
			}
			buf.Reset()
			continue
		}
		p.onHold()
		close(p.held)
		select {
		case <-p.release:
		case <-p.done:
			return false
		}
		_, _ = sc.Write(buf.Bytes())
		close(p.delivered)
		return false
	}
}
