package connlimit

import (
	"net"
	"net/netip"
	"sync"
)

// Refusal says which bound refused a connection.
type Refusal uint8

const (
	// RefusedTotal: the listener held its most connections.
	RefusedTotal Refusal = iota + 1
	// RefusedPerAddr: the listener held its most connections from the
	// client's address.
	RefusedPerAddr
)

// String returns "total" or "per_addr".
func (r Refusal) String() string {
	if r == RefusedPerAddr {
		return "per_addr"
	}
	return "total"
}

// Listener is a net.Listener whose Accept returns only connections within
// its bounds. It is safe for concurrent use.
type Listener struct {
	net.Listener
	max, perAddr int
	refused      func(remote net.Addr, why Refusal)

	mu     sync.Mutex
	total  int
	byAddr map[netip.Addr]int
}

// New wraps lis. maxConns bounds the connections held at once and
// perAddr those from one address; zero or less means no bound. refused,
// if not nil, is called on the accepting goroutine for each connection
// refused, after it is closed; it must not block.
func New(lis net.Listener, maxConns, perAddr int, refused func(remote net.Addr, why Refusal)) *Listener {
	return &Listener{Listener: lis, max: maxConns, perAddr: perAddr, refused: refused, byAddr: make(map[netip.Addr]int)}
}

// Accept waits for the next connection within the bounds; connections
// past them are closed in the meantime. Its errors are the wrapped
// listener's.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := addrKey(c.RemoteAddr())
		why := l.take(addr)
		if why == 0 {
			return &conn{Conn: c, l: l, addr: addr}, nil
		}
		if tc, ok := c.(*net.TCPConn); ok {
			// A reset, not a FIN: a flood of refused connections leaves
			// no TIME_WAIT state behind here.
			_ = tc.SetLinger(0)
		}
		c.Close()
		if l.refused != nil {
			l.refused(c.RemoteAddr(), why)
		}
	}
}

// Open returns how many accepted connections are not closed yet, in all
// and from remote's address.
func (l *Listener) Open(remote net.Addr) (total, fromAddr int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total, l.byAddr[addrKey(remote)]
}

// take counts a new connection from addr, or says which bound refuses it.
func (l *Listener) take(addr netip.Addr) Refusal {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.max > 0 && l.total >= l.max {
		return RefusedTotal
	}
	if l.perAddr > 0 && l.byAddr[addr] >= l.perAddr {
		return RefusedPerAddr
	}
	l.total++
	l.byAddr[addr]++
	return 0
}

// release uncounts a closed connection from addr.
func (l *Listener) release(addr netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.byAddr[addr] <= 1 {
		// Deleted, not left at zero: a scan of many addresses must not
		// grow the map for good.
		delete(l.byAddr, addr)
		return
	}
	l.byAddr[addr]--
}

// addrKey is the address a connection counts against: its IP (an
// IPv4-mapped IPv6 address is IPv4). IPv6 addresses are not grouped by
// prefix: inside a cluster a /64 is often a whole machine's pods, which
// one bound would then cover together. A remote address that is not IP
// (a Unix socket, a test pipe) counts as the zero address.
func addrKey(a net.Addr) netip.Addr {
	var ip netip.Addr
	switch a := a.(type) {
	case *net.TCPAddr:
		ip, _ = netip.AddrFromSlice(a.IP)
	default:
		if a == nil {
			return netip.Addr{}
		}
		ap, err := netip.ParseAddrPort(a.String())
		if err != nil {
			return netip.Addr{}
		}
		ip = ap.Addr()
	}
	return ip.Unmap()
}

// conn is an accepted connection that frees its slot on its first Close.
type conn struct {
	net.Conn
	l    *Listener
	addr netip.Addr
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.addr) })
	return err
}
