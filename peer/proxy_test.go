package peer

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testProxy is a TCP proxy on 127.0.0.1 in front of one node's port, for
// the attacks that break a link in one place only. Connections wait in
// the listener's queue until the first setTarget (a node may advertise
// the proxy before it has an address of its own); each then goes to the
// latest target. forward copies the client's bytes to the server and
// reports whether the connection ended by itself (the server's side is
// then closed too); nil copies them as they come. cut closes every
// connection through it, and from then on every new one at once.
type testProxy struct {
	lis     net.Listener
	forward func(sc, cc net.Conn) bool
	target  atomic.Pointer[string]
	ready   chan struct{}
	once    sync.Once
	done    chan struct{}
	conns   connSet
	wg      sync.WaitGroup
}

func newTestProxy(t *testing.T, forward func(sc, cc net.Conn) bool) *testProxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &testProxy{lis: lis, forward: forward, ready: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() {
		close(p.done)
		_ = lis.Close()
		p.cut()
		p.wg.Wait()
	})
	p.wg.Add(1)
	go p.accept()
	return p
}

func (p *testProxy) addr() string { return p.lis.Addr().String() }

// setTarget sets the address behind the proxy.
func (p *testProxy) setTarget(addr string) {
	p.target.Store(&addr)
	p.once.Do(func() { close(p.ready) })
}

// via is setTarget that returns the proxy's address (rpcAddrRewrite's
// rewrite).
func (p *testProxy) via(target string) string {
	p.setTarget(target)
	return p.addr()
}

// cut closes every connection through the proxy, and from now on every
// new one.
func (p *testProxy) cut() { p.conns.closeAll() }

func (p *testProxy) accept() {
	defer p.wg.Done()
	select {
	case <-p.ready:
	case <-p.done:
		return
	}
	for {
		cc, err := p.lis.Accept()
		if err != nil {
			return
		}
		if !p.conns.track(cc) {
			continue
		}
		sc, err := net.DialTimeout("tcp", *p.target.Load(), time.Second)
		if err != nil {
			_ = cc.Close()
			continue
		}
		if !p.conns.track(sc) {
			_ = cc.Close()
			continue
		}
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(cc, sc)
			_ = cc.Close()
		}()
		go func() {
			defer p.wg.Done()
			ended := true
			if p.forward != nil {
				ended = p.forward(sc, cc)
			} else {
				_, _ = io.Copy(sc, cc)
			}
			if ended {
				_ = sc.Close()
			}
		}()
	}
}

// connSet is the connections a test proxy made, to close them all at once;
// once closed, it closes every connection it is given.
type connSet struct {
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
}

// track records c, or closes it and reports false once the set is closed.
func (s *connSet) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = c.Close()
		return false
	}
	s.conns = append(s.conns, c)
	return true
}

// closeAll closes every connection recorded, and every later one.
func (s *connSet) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.conns = nil
}
