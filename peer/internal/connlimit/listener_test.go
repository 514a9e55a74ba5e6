package connlimit

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"
)

// accepted is one Accept's result.
type accepted struct {
	c   net.Conn
	err error
}

// serve accepts on l until it is closed, passing every connection on.
func serve(t *testing.T, l *Listener) <-chan accepted {
	t.Helper()
	ch := make(chan accepted, 16)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			ch <- accepted{c, err}
			if err != nil {
				return
			}
		}
	})
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
	})
	return ch
}

// next returns the next accepted connection, failing after a deadline.
func next(t *testing.T, ch <-chan accepted, what string) net.Conn {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatalf("%s: Accept = %v", what, a.err)
		}
		return a.c
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: no connection accepted within 5 s", what)
	}
	return nil
}

// dial connects to l.
func dial(t *testing.T, l net.Listener) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// dialRefused connects to l and reports whether the server closed the
// connection without a byte: the reset may even fail the dial.
func dialRefused(l net.Listener) bool {
	c, err := net.DialTimeout("tcp", l.Addr().String(), 5*time.Second)
	if err != nil {
		return true
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [1]byte
	_, err = c.Read(b[:])
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return err != nil
}

// TestListenerBounds checks each bound: connections past it are closed
// without reaching Accept's caller, the refusal is reported with its
// bound, and closing a held connection makes room for one more.
func TestListenerBounds(t *testing.T) {
	for _, tc := range []struct {
		name         string
		max, perAddr int
		want         Refusal
		hold         int // connections held before one is refused
	}{
		{"total", 3, 0, RefusedTotal, 3},
		{"per_addr", 0, 2, RefusedPerAddr, 2},
		{"both/per_addr_first", 5, 2, RefusedPerAddr, 2},
		{"both/total_first", 2, 5, RefusedTotal, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			refusals := make(chan Refusal, 16)
			l := New(raw, tc.max, tc.perAddr, func(_ net.Addr, why Refusal) { refusals <- why })
			ch := serve(t, l)
			var held []net.Conn
			for range tc.hold {
				dial(t, l)
				held = append(held, next(t, ch, "a connection within the bounds"))
			}
			if total, from := l.Open(held[0].RemoteAddr()); total != tc.hold || from != tc.hold {
				t.Fatalf("Open = %d in all, %d from the address; want %d and %d", total, from, tc.hold, tc.hold)
			}
			refused := make(chan bool, 1)
			go func() { refused <- dialRefused(l) }()
			select {
			case why := <-refusals:
				if why != tc.want {
					t.Fatalf("refused by %v, want %v", why, tc.want)
				}
			case a := <-ch:
				t.Fatalf("Accept returned a connection past the bounds (err %v)", a.err)
			case <-time.After(5 * time.Second):
				t.Fatal("no refusal within 5 s")
			}
			if !<-refused {
				t.Fatal("the refused connection is still open")
			}
			// Closing one held connection (twice: the slot is freed once)
			// makes room for exactly one more.
			held[0].Close()
			held[0].Close()
			if total, _ := l.Open(held[1].RemoteAddr()); total != tc.hold-1 {
				t.Fatalf("after a Close: Open = %d, want %d", total, tc.hold-1)
			}
			dial(t, l)
			next(t, ch, "a connection after one closed")
			go func() { refused <- dialRefused(l) }()
			select {
			case why := <-refusals:
				if why != tc.want {
					t.Fatalf("refused by %v, want %v", why, tc.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("no refusal within 5 s once full again")
			}
			if !<-refused {
				t.Fatal("the connection refused once full again is still open")
			}
		})
	}
}

// TestListenerAcceptError checks that the wrapped listener's error comes
// back from Accept.
func TestListenerAcceptError(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := New(raw, 1, 1, nil)
	l.Close()
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close = %v, want net.ErrClosed", err)
	}
}

// TestAddrKey checks which remote addresses count together: those with
// one IP, IPv4-mapped IPv6 as IPv4.
func TestAddrKey(t *testing.T) {
	tcp := func(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	for _, tc := range []struct {
		name string
		a, b net.Addr
		same bool
	}{
		{"ipv4 ports", tcp("10.0.0.1:1000"), tcp("10.0.0.1:2000"), true},
		{"ipv4 addresses", tcp("10.0.0.1:1000"), tcp("10.0.0.2:1000"), false},
		{"ipv6 ports", tcp("[2001:db8:1:2::1]:1"), tcp("[2001:db8:1:2::1]:2"), true},
		{"ipv6 addresses in one /64", tcp("[2001:db8:1:2::1]:1"), tcp("[2001:db8:1:2::2]:1"), false},
		{"ipv4-mapped", tcp("[::ffff:10.0.0.1]:1"), tcp("10.0.0.1:2"), true},
		{"not tcp", &net.UnixAddr{Name: "/a", Net: "unix"}, &net.UnixAddr{Name: "/b", Net: "unix"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := addrKey(tc.a) == addrKey(tc.b); got != tc.same {
				t.Fatalf("addrKey(%v) == addrKey(%v): %v, want %v (%v, %v)", tc.a, tc.b, got, tc.same, addrKey(tc.a), addrKey(tc.b))
			}
		})
	}
}
