package peer

import (
	"bytes"
	"context"
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

// A partition's move to a joiner (the Promote) under faults: the Promote's
// answer lost as the target is cut off, the Promote held up on the target
// or in the network, and members whose LeaseDuration differs. The old
// holder must not take the partition back while the target may still
// decide under the lease the Promote gave it.

// TestPromoteAnswerLostThenCut: a partition moves to a member that
// joined (n2); n2 applies the Promote, so it holds the partition with a
// lease that counts from the promote, but its answer is lost and its
// gossip link goes silent at that moment. The old holder n0 stays fenced,
// sees n2 fail (long before n2's lease ends), and used to take the
// partition back at once (at the very epoch n2 holds it at) from its fenced
// state, while n2, whose view still lists everybody, went on deciding under
// its lease (async), or under leases granted by n0 itself for a copy n2
// made there while n0 was fenced (sync). Both decided: 8 (async) or 7
// (sync) admissions confirmed in one window of 5.
func TestPromoteAnswerLostThenCut(t *testing.T) {
	t.Parallel() // mostly waiting out leases, as are the other attacks
	for _, mode := range []Replication{ReplicateAsync, ReplicateSync} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			const limit = 5
			pc := startPromoteCut(t, PolicyConfig{Limit: limit, Window: time.Hour, Replication: mode}, "promote-cut", false)
			n0, n1, n2 := pc.n0, pc.n1, pc.n2
			confirmed := 2
			// Ask both sides until well past any lease n2 was given by the
			// promote, or until the limit is exceeded.
			by := map[string]int{n0.Name(): 2}
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for time.Now().Before(pc.end) && confirmed <= limit {
				for _, nd := range []*Node{n2, n0, n1} {
					ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
					d, err := nd.Allow(ctx, Request{Key: pc.key})
					cancel()
					if err == nil && d.Allowed {
						confirmed++
						by[d.Owner]++
					}
				}
				<-tick.C
			}
			if confirmed > limit {
				t.Fatalf("%d admissions confirmed in one window of limit %d (by decider: %v); n0: %s; n2: %s",
					confirmed, limit, by, n0.partForTest(pc.pid), n2.partForTest(pc.pid))
			}
			t.Logf("%d confirmed (by decider: %v); %s; %s", confirmed, by, n0.partForTest(pc.pid), n2.partForTest(pc.pid))
		})
	}
}

// TestPromoteAnswerLostIsolated is TestPromoteAnswerLostThenCut
// with nothing of n2's getting through to n0 but the promote itself (its
// copies are lost too, so n0 never becomes its backup), for a policy that
// replicates nothing: n2 decides only under the lease the promote gave it.
// n0 used to take the partition back as soon as gossip declared n2 failed,
// long before that lease ended, so both decided at once. Now n0 waits the
// lease out: every admission of n2's comes before any of n0's.
func TestPromoteAnswerLostIsolated(t *testing.T) {
	ownByGossip(t)
	t.Parallel()
	pc := startPromoteCut(t, PolicyConfig{Limit: 1 << 20, Window: time.Hour, Replication: ReplicateOff}, "promote-isolated", true)
	n0 := pc.n0
	by, n0First, _ := watchTakeBack(t, pc)
	if n0First.IsZero() {
		t.Fatalf("n0 never took the partition back (admissions by decider: %v); n0: %s", by, n0.partForTest(pc.pid))
	}
	t.Logf("admissions by decider: %v; n0 took over %v after the promote", by, n0First.Sub(pc.promotedAt).Round(time.Millisecond))
}

// watchTakeBack asks n2 and n0 for pc.key every 20 ms until pc.end. It
// fails the test if n2 admits after n0 has (two decision points at once),
// and returns the admissions by decider, when n0 first admitted and when
// n2 last did.
func watchTakeBack(t *testing.T, pc *promoteCut) (by map[string]int, n0First, n2Last time.Time) {
	t.Helper()
	n0, n2 := pc.n0, pc.n2
	by = map[string]int{}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(pc.end) {
		for _, nd := range []*Node{n2, n0} {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			d, err := nd.Allow(ctx, Request{Key: pc.key})
			cancel()
			if err != nil || !d.Allowed {
				continue
			}
			by[d.Owner]++
			switch {
			case d.Owner == n0.Name() && n0First.IsZero():
				n0First = time.Now()
			case d.Owner == n2.Name() && !n0First.IsZero():
				t.Fatalf("n2 admitted %v after the promote, %v after n0 took the partition back: two decision points at once (admissions by decider: %v); n0: %s; n2: %s",
					time.Since(pc.promotedAt).Round(time.Millisecond), time.Since(n0First).Round(time.Millisecond), by, n0.partForTest(pc.pid), n2.partForTest(pc.pid))
			case d.Owner == n2.Name():
				n2Last = time.Now()
			}
		}
		<-tick.C
	}
	return by, n0First, n2Last
}

// promoteCut is the scene of the promote attacks: n0 held a key (two
// admissions made) whose partition moved to the joiner n2; n2 applied the
// Promote, but its answer was lost and its gossip went silent at that
// moment.
type promoteCut struct {
	n0, n1, n2 *Node
	key        Key
	pid        int
	promotedAt time.Time
	end        time.Time // well past any lease the promote gave n2, and its timeout
}

// startPromoteCut sets the scene for policy "p" (subjects from prefix).
// isolated also loses every copy n2 sends after the cut, so n0 never
// becomes its backup.
func startPromoteCut(t *testing.T, pol PolicyConfig, prefix string, isolated bool) *promoteCut {
	t.Helper()
	return startPromoteCutLease(t, pol, prefix, isolated, 0)
}

// startPromoteCutLease is startPromoteCut with n2's LeaseDuration set to
// n2Lease (0: attackLease, the others').
func startPromoteCutLease(t *testing.T, pol PolicyConfig, prefix string, isolated bool, n2Lease time.Duration) *promoteCut {
	t.Helper()
	var cut atomic.Bool
	c := startClusterWith(t, 2, Config{LeaseDuration: attackLease, Policies: map[string]PolicyConfig{"p": pol}},
		func(_ int, cfg *Config) { cfg.Gossip = attackGossip })
	pc := &promoteCut{n0: c.nodes[0], n1: c.nodes[1], pid: -1}
	n0 := pc.n0
	ring3 := n0.ringWithForTest("n2")
	for _, k := range hoKeys(prefix, 4000, "p") {
		p := n0.partIDForTest(k)
		if o, _ := n0.Owner(k); o == n0.Name() && ring3.PartitionOwner(p) == "n2" && ring3.PartitionBackup(p) == n0.Name() {
			pc.key, pc.pid = k, p
			break
		}
	}
	if pc.pid < 0 {
		t.Fatal("no key held by n0 that moves to n2 (with n0 as its backup) when n2 joins")
	}
	admitN(t, n0, pc.key, 2)
	// The move waits until n2's hooks are in place.
	var ready atomic.Bool
	n0.setCopyFaultForTest(func(p int, to string, _ bool) copyFault {
		if p == pc.pid && to == "n2" && !ready.Load() {
			return copyUnsent
		}
		return copySend
	})
	pc.n2 = c.addWith("n2", func(cfg *Config) {
		if n2Lease > 0 {
			cfg.LeaseDuration = n2Lease
		}
		cutGossip := withCutTransport(t, &cut)
		cfg.Gossip = func(mc *memberlist.Config) { cutGossip(mc); mc.SuspicionMaxTimeoutMult = 50 }
	})
	var promotedAt atomic.Int64
	pc.n2.setPromoteLostForTest(func(p int) bool {
		if p != pc.pid {
			return false
		}
		// n2's link fails as it answers: the answer, and every later
		// one, is lost; its gossip goes silent.
		promotedAt.CompareAndSwap(0, time.Now().UnixNano())
		cut.Store(true)
		return true
	})
	if isolated {
		pc.n2.setCopyFaultForTest(func(p int, _ string, _ bool) copyFault {
			if p == pc.pid && cut.Load() {
				return copyUnsent
			}
			return copySend
		})
	}
	ready.Store(true)
	n0.kickOwnership()
	waitFor(t, 20*time.Second, "n2 to hold the partition", func() bool {
		r, _, _ := pc.n2.roleForTest(pc.pid)
		return r == roleHolder
	})
	pc.promotedAt = time.Unix(0, promotedAt.Load())
	pc.end = pc.promotedAt.Add(max(pc.n0.rpcTimeout()+2*attackLease, n2Lease) + 2*time.Second)
	return pc
}

// TestPromoteDelayed: a partition moves from n0 to the joiner n2,
// whose gossip goes silent as the Promote reaches it, and the Promote is
// held up before n2 applies it. n0's promote times out; it stays fenced,
// sees n2 fail, waits out LeaseDuration from when it sent the promote and
// takes the partition back. Then n2 applies the Promote and decides under
// the lease it counts from then, until its first message to n0 comes back
// stale: both decide.
func TestPromoteDelayed(t *testing.T) {
	ownByGossip(t)
	t.Parallel()
	for _, mode := range []Replication{ReplicateOff, ReplicateAsync} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			const limit = 5
			var cut, ready atomic.Bool
			c, n0, key, pid, confirmed := promoteScene(t, mode, limit, attackLease, "promote-delayed-", &ready)
			n2 := c.addWith("n2", func(cfg *Config) {
				cutGossip := withCutTransport(t, &cut)
				cfg.Gossip = func(mc *memberlist.Config) { cutGossip(mc); mc.SuspicionMaxTimeoutMult = 50 }
			})
			entered, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			free := func() { once.Do(func() { close(release) }) }
			t.Cleanup(free)
			var held atomic.Bool
			n2.setPromoteHookForTest(func(p int) {
				if p == pid && held.CompareAndSwap(false, true) {
					cut.Store(true)
					close(entered)
					<-release
				}
			})
			ready.Store(true)
			n0.kickOwnership()
			awaitTakeBack(t, n0, pid, entered)
			free()
			by := map[string]int{"n0": 2}
			countAdmissions(c, key, attackLease, limit, &confirmed, by) // past the 9/10 lease n2 would count
			if confirmed > limit {
				t.Fatalf("%d admissions confirmed in one window of limit %d (by decider: %v):\n%s\n%s", confirmed, limit, by, n0.partForTest(pid), n2.partForTest(pid))
			}
			t.Logf("confirmed %d (by decider: %v):\n%s\n%s", confirmed, by, n0.partForTest(pid), n2.partForTest(pid))
		})
	}
}

// promoteScene starts the Promote attacks' two members (attack gossip,
// leases of lease, policy "p" of limit under mode) and picks a key n0
// holds whose partition moves to n2 when n2 joins, with n0 as its backup;
// it confirms 2 admissions of it on n0. n0's copies of the partition to n2
// fail unsent until ready is set, so the move waits for the test.
func promoteScene(t *testing.T, mode Replication, limit int64, lease time.Duration, prefix string, ready *atomic.Bool) (c *cluster, n0 *Node, key Key, pid int, confirmed int) {
	t.Helper()
	c = startClusterWith(t, 2, Config{LeaseDuration: lease, Policies: map[string]PolicyConfig{"p": {Limit: limit, Window: time.Hour, Replication: mode}}},
		func(_ int, cfg *Config) { cfg.Gossip = attackGossip })
	n0 = c.nodes[0]
	ring3 := n0.ringWithForTest("n2")
	pid = -1
	for _, k := range hoKeys(prefix+mode.String(), 4000, "p") {
		p := n0.partIDForTest(k)
		if o, _ := n0.Owner(k); o == n0.Name() && ring3.PartitionOwner(p) == "n2" && ring3.PartitionBackup(p) == n0.Name() {
			key, pid = k, p
			break
		}
	}
	if pid < 0 {
		t.Fatal("no key held by n0 that moves to n2 when n2 joins")
	}
	confirmed = admitN(t, n0, key, 2)
	n0.setCopyFaultForTest(func(p int, to string, _ bool) copyFault {
		if p == pid && to == "n2" && !ready.Load() {
			return copyUnsent
		}
		return copySend
	})
	return c, n0, key, pid, confirmed
}

// awaitTakeBack waits for n0's Promote of partition pid to be held
// (promoted closed), then for n0, fenced, to take the partition back at a
// newer epoch; it returns the epoch n0 was fenced at.
func awaitTakeBack(t *testing.T, n0 *Node, pid int, promoted <-chan struct{}) (fenced uint64) {
	t.Helper()
	select {
	case <-promoted:
	case <-time.After(20 * time.Second):
		t.Fatalf("n0 never sent n2 the Promote: %s", n0.partForTest(pid))
	}
	_, _, fenced = n0.roleForTest(pid)
	waitFor(t, 20*time.Second, "n0 to take the partition back", func() bool {
		r, _, e := n0.roleForTest(pid)
		return r == roleHolder && e > fenced
	})
	return fenced
}

// TestPromoteDelayedInNetwork: a partition moves from n0 to the
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
func TestPromoteDelayedInNetwork(t *testing.T) {
	ownByGossip(t)
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

// TestPromoteTargetLongerLease: the members' LeaseDuration
// differs (a configuration change rolling out): the joiner n2 has four
// times the others'. A partition moves from n0 to n2; n2 applies the
// Promote, but its answer and everything of n2's after it are lost, and
// its gossip goes silent. n0 waits out the Promote's timeout and its own
// lease, then takes the partition back. n2 used to count on a lease of
// its own length from the Promote (9/10 of 12 s) and went on deciding
// for almost 3 s after n0 took the partition back: two decision points.
// Now the Promote carries the sender's lease length and n2 counts on the
// shorter of the two, so every admission of n2's comes before any of
// n0's.
func TestPromoteTargetLongerLease(t *testing.T) {
	ownByGossip(t)
	t.Parallel()
	pc := startPromoteCutLease(t, PolicyConfig{Limit: 1 << 20, Window: time.Hour, Replication: ReplicateOff}, "promote-long-lease", true, 4*attackLease)
	n0, n2 := pc.n0, pc.n2
	by, n0First, n2Last := watchTakeBack(t, pc)
	if n0First.IsZero() || by[n2.Name()] == 0 {
		t.Fatalf("want n2 to decide under the promote's lease, then n0 to take the partition back (admissions by decider: %v); n0: %s", by, n0.partForTest(pc.pid))
	}
	// n2 decided under the sender's lease length (9/10 of it), not its own.
	if d := n2Last.Sub(pc.promotedAt); d > attackLease {
		t.Fatalf("n2 decided until %v after the promote, longer than the sender's lease %v", d.Round(time.Millisecond), attackLease)
	}
	t.Logf("admissions by decider: %v; n2 decided until %v after the promote, n0 took over after %v", by,
		n2Last.Sub(pc.promotedAt).Round(time.Millisecond), n0First.Sub(pc.promotedAt).Round(time.Millisecond))
}

// TestPromoteLease: the promoted holder's lease length is the shorter of
// its own and the sender's; an older sender's (none) leaves its own.
func TestPromoteLease(t *testing.T) {
	for _, c := range []struct {
		own    time.Duration
		sender int64
		want   time.Duration
	}{
		{3 * time.Second, 0, 3 * time.Second},
		{3 * time.Second, int64(time.Second), time.Second},
		{3 * time.Second, int64(12 * time.Second), 3 * time.Second},
		{3 * time.Second, -1, 3 * time.Second},
	} {
		if got := promoteLease(c.own, c.sender); got != c.want {
			t.Errorf("promoteLease(%v, %d) = %v, want %v", c.own, c.sender, got, c.want)
		}
	}
}
