package peer

import (
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/peer/internal/membership"
)

// cutTransport is memberlist's NetTransport with a switch: while cut is
// set, every packet and stream to or from this node is dropped, as if its
// network link were down. The forwarding goroutines end on Shutdown.
type cutTransport struct {
	inner   *memberlist.NetTransport
	cut     *atomic.Bool
	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
	wg      sync.WaitGroup
}

var _ memberlist.NodeAwareTransport = (*cutTransport)(nil)

var errCut = errors.New("test: link cut")

// withCutTransport returns a Config.Gossip func that applies fast timings
// and installs a cutTransport switched by cut.
func withCutTransport(t *testing.T, cut *atomic.Bool) func(*memberlist.Config) {
	return func(mc *memberlist.Config) {
		fastGossip(mc)
		// Nothing is gossiped to a member once it is declared dead, so only
		// a reconnect can bring the sides back together.
		mc.GossipToTheDeadTime = 0
		nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{mc.BindAddr}, BindPort: mc.BindPort, Logger: mc.Logger})
		if err != nil {
			t.Fatalf("net transport: %v", err)
		}
		ct := &cutTransport{inner: nt, cut: cut, packets: make(chan *memberlist.Packet), streams: make(chan net.Conn), done: make(chan struct{})}
		ct.wg.Add(2)
		go ct.forwardPackets()
		go ct.forwardStreams()
		mc.Transport = ct
	}
}

func (c *cutTransport) forwardPackets() {
	defer c.wg.Done()
	for {
		select {
		case p := <-c.inner.PacketCh():
			if c.cut.Load() {
				continue
			}
			select {
			case c.packets <- p:
			case <-c.done:
				return
			}
		case <-c.done:
			return
		}
	}
}

func (c *cutTransport) forwardStreams() {
	defer c.wg.Done()
	for {
		select {
		case s := <-c.inner.StreamCh():
			if c.cut.Load() {
				_ = s.Close()
				continue
			}
			select {
			case c.streams <- s:
			case <-c.done:
				_ = s.Close()
				return
			}
		case <-c.done:
			return
		}
	}
}

func (c *cutTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return c.inner.FinalAdvertiseAddr(ip, port)
}

func (c *cutTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if c.cut.Load() {
		return time.Now(), nil // sent into the void
	}
	return c.inner.WriteTo(b, addr)
}

func (c *cutTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return c.WriteTo(b, a.Addr)
}

func (c *cutTransport) PacketCh() <-chan *memberlist.Packet { return c.packets }

func (c *cutTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if c.cut.Load() {
		return nil, errCut
	}
	return c.inner.DialTimeout(addr, timeout)
}

func (c *cutTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return c.DialTimeout(a.Addr, timeout)
}

func (c *cutTransport) StreamCh() <-chan net.Conn { return c.streams }

// Shutdown shuts the inner transport down first, while the forwarders
// still drain it: its listeners hand every packet and stream over on
// unbuffered channels, and Shutdown waits for them. Stopping the
// forwarders first left a listener that had just read a packet blocked
// on its send, and the node's Close hung for good (two attack tests at
// once, 6 minutes into their cleanup). memberlist reads our channels
// until its transport has shut down.
func (c *cutTransport) Shutdown() error {
	err := c.inner.Shutdown()
	close(c.done)
	c.wg.Wait()
	return err
}

// cutLog makes cut, while set, also drop the ownership log's messages
// between c's node idx and the rest, both ways: a network split cuts the
// log as well as gossip, and a member gossip declares dead stays on the
// ring while the log still sees it extend its liveness.
func cutLog(c *cluster, idx int, cut *atomic.Bool) {
	lone := c.nodes[idx].ops.start
	for i, nd := range c.nodes {
		drop := func(to uint64) bool { return cut.Load() && (i == idx) != (to == lone) }
		nd.lo.raftDrop.Store(&drop)
	}
}

// TestReconnectAfterPartition cuts n0 off from n1 and n2 (gossip and
// log) until each side
// has declared the other failed and shrunk its ring, then restores the
// link: the reconnect loop must merge the rings again. n0 was given no
// seeds and n1 and n2 are not alone, so only the failed-member reconnect
// can heal it.
func TestReconnectAfterPartition(t *testing.T) {
	t.Parallel()
	var cut atomic.Bool
	c := startClusterWith(t, 3, Config{}, func(i int, cfg *Config) {
		cfg.GossipProfile = GossipFast // ReconnectInterval 1 s
		if i == 0 {
			cfg.Gossip = withCutTransport(t, &cut)
		} else {
			cfg.Gossip = func(mc *memberlist.Config) { fastGossip(mc); mc.GossipToTheDeadTime = 0 }
		}
	})
	n0, n1, n2 := c.nodes[0], c.nodes[1], c.nodes[2]
	cutLog(c, 0, &cut)
	cut.Store(true)
	for _, w := range []struct {
		nd   *Node
		want []string
	}{{n0, []string{"n0"}}, {n1, []string{"n1", "n2"}}, {n2, []string{"n1", "n2"}}} {
		waitView(t, w.nd, 15*time.Second, w.nd.Name()+" to shrink its ring to "+w.want[0]+"...", func() bool { return slices.Equal(w.nd.Members(), w.want) })
	}
	healed := time.Now()
	cut.Store(false)
	for _, nd := range c.nodes {
		waitView(t, nd, 15*time.Second, nd.Name()+" to see 3 members after the partition healed", func() bool { return len(nd.Members()) == 3 })
	}
	t.Logf("rings merged %v after the link came back (ReconnectInterval %v)", time.Since(healed), n0.cfg.ReconnectInterval)
}

// TestReconnectSet checks the failed-member bookkeeping: failures are
// remembered, graceful leaves and rejoins forget, the set is bounded and
// entries older than ReconnectTimeout are dropped.
func TestReconnectSet(t *testing.T) {
	g := newGossiper(&gossiperEnv{name: "self", cfg: &Config{ReconnectTimeout: time.Hour}})
	g.noteReconnect(membership.Event{Kind: "failed", Name: "a", Addr: "127.0.0.1:1"})
	g.noteReconnect(membership.Event{Kind: "failed", Name: "b", Addr: "127.0.0.1:2"})
	g.noteReconnect(membership.Event{Kind: "left", Name: "b"})
	g.noteReconnect(membership.Event{Kind: "failed", Name: "self", Addr: "127.0.0.1:3"})
	if got := len(g.retry.failed); got != 1 || g.retry.failed["a"].addr != "127.0.0.1:1" {
		t.Fatalf("failed set = %v, want only a", g.retry.failed)
	}
	g.noteReconnect(membership.Event{Kind: "joined", Name: "a"})
	for i := range maxReconnect + 10 {
		g.noteReconnect(membership.Event{Kind: "failed", Name: string(rune('A' + i)), Addr: "127.0.0.1:9"})
	}
	if got := len(g.retry.failed); got != maxReconnect {
		t.Fatalf("failed set holds %d members, want the bound %d", got, maxReconnect)
	}
}

// TestReconnectAloneNotReady cuts off n1, which joined through the seed
// n0: alone although it was given seeds, n1 is not ready; once the link is
// back it rejoins and is ready again.
func TestReconnectAloneNotReady(t *testing.T) {
	t.Parallel()
	var cut atomic.Bool
	c := startClusterWith(t, 2, Config{}, func(i int, cfg *Config) {
		cfg.GossipProfile = GossipFast
		if i == 1 {
			cfg.Gossip = withCutTransport(t, &cut)
		} else {
			cfg.Gossip = func(mc *memberlist.Config) { fastGossip(mc); mc.GossipToTheDeadTime = 0 }
		}
	})
	n1 := c.nodes[1]
	if ok, reason := n1.Ready(); !ok {
		t.Fatalf("n1 joined: Ready = false, %q", reason)
	}
	cutLog(c, 1, &cut)
	cut.Store(true)
	waitView(t, n1, 15*time.Second, "n1 to be alone", func() bool { return len(n1.Members()) == 1 })
	if ok, reason := n1.Ready(); ok || !strings.Contains(reason, "alone") {
		t.Fatalf("n1 cut off: Ready = %v, %q; want not ready, alone", ok, reason)
	}
	cut.Store(false)
	for _, nd := range c.nodes {
		waitView(t, nd, 15*time.Second, nd.Name()+" to see 2 members after the link came back", func() bool { return len(nd.Members()) == 2 })
	}
	// Ready once its partitions are back (they move as on any join).
	deadline := time.Now().Add(15 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if ok, _ := n1.Ready(); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("n1 not ready 15 s after the rejoin: %s; %s", c.nodes[0].unsettledForTest(), n1.unsettledForTest())
		}
		<-tick.C
	}
}

// TestCutTransportShutdownUnderTraffic shuts a cutTransport down while
// packets keep arriving and its channel is read as memberlist reads it
// (until the transport has shut down): Shutdown must return. Stopping the
// forwarders before the inner transport left its listener blocked on a
// packet nobody would take, and a node's Close hung (2 of 3 runs of this
// test with the old order).
func TestCutTransportShutdownUnderTraffic(t *testing.T) {
	mc := memberlist.DefaultLANConfig()
	mc.BindAddr, mc.BindPort = "127.0.0.1", 0
	withCutTransport(t, new(atomic.Bool))(mc)
	ct := mc.Transport.(*cutTransport)
	to := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: ct.inner.GetAutoBindPort()}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // memberlist's packetListen
		defer wg.Done()
		for {
			select {
			case <-ct.PacketCh():
			case <-stop:
				return
			}
		}
	}()
	var sent atomic.Int64
	go func() { // a busy cluster's gossip, bounded in count and time
		defer wg.Done()
		conn, err := net.DialUDP("udp", nil, to)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		end := time.Now().Add(10 * time.Second)
		for i := 0; i < 2_000_000 && time.Now().Before(end); i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := conn.Write([]byte("ping")); err == nil {
				sent.Add(1)
			}
		}
	}()
	waitFor(t, 5*time.Second, "packets to flow", func() bool { return sent.Load() > 1000 })
	done := make(chan error, 1)
	go func() { done <- ct.Shutdown() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("Shutdown did not return within 5 s under traffic (%d packets sent)", sent.Load())
	}
	close(stop)
	wg.Wait()
}
