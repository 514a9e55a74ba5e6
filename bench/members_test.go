package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer"
)

// members starts the in-process clusters of the opt-in scale and
// traffic tests (memberlist and gRPC on 127.0.0.1, the fast gossip
// profile, one unlimited-for-practical-purposes policy "p") and closes
// every member it started, all at once, when the test ends.
type members struct {
	t   *testing.T
	mu  sync.Mutex
	all []*peer.Node
}

func newMembers(t *testing.T) *members {
	m := &members{t: t}
	t.Cleanup(func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		var wg sync.WaitGroup
		for _, nd := range m.all {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_ = nd.Close(ctx)
			})
		}
		wg.Wait()
	})
	return m
}

// start starts member name, joined through join (none: it founds the
// cluster). Safe to call from any goroutine; it reports a failure with
// t.Errorf and returns nil.
func (m *members) start(name string, join []string) *peer.Node {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nd, err := peer.New(ctx, peer.Config{
		Name:          name,
		Join:          join,
		GossipProfile: peer.GossipFast,
		Policies: map[string]peer.PolicyConfig{
			"p": {Limit: 1 << 40, Window: time.Minute},
		},
		ForwardTimeout: 2 * time.Second,
		// 64 members on 127.0.0.1 hold three connections to each other
		// member's port, past the default bound per address.
		RPCLimits: peer.RPCLimits{MaxConnsPerIP: -1},
		// Quiet: 64 members' membership logs would bury the figures.
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		m.t.Errorf("start %s: %v", name, err)
		return nil
	}
	m.mu.Lock()
	m.all = append(m.all, nd)
	m.mu.Unlock()
	return nd
}

// startN starts n members m00, m01, …, each joined through the first,
// one after another, and fails the test if one does not start.
func (m *members) startN(n int) []*peer.Node {
	m.t.Helper()
	var nodes []*peer.Node
	for i := range n {
		var join []string
		if i > 0 {
			join = []string{nodes[0].GossipAddr()}
		}
		nd := m.start(fmt.Sprintf("m%02d", i), join)
		if nd == nil {
			m.t.FailNow()
		}
		nodes = append(nodes, nd)
	}
	return nodes
}
