package peer

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// fastGossip is the GossipFast preset, as a Config.Gossip func that test
// variants (slowDetect, hoGossip, hoCrashGossip) start from.
func fastGossip(mc *memberlist.Config) { GossipFast.Apply(mc) }

// testLogger returns a logger writing to the test log when RINGLIMIT_TEST_LOG
// is set, and a discarding one otherwise.
func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("RINGLIMIT_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type cluster struct {
	t     testing.TB
	nodes []*Node
	base  Config
}

// startCluster starts n nodes on 127.0.0.1 with OS-chosen ports, joined
// through the first, and waits until every node sees n members.
func startCluster(t testing.TB, n int, base Config) *cluster {
	t.Helper()
	c := &cluster{t: t, base: base}
	for i := range n {
		c.add(fmt.Sprintf("n%d", i))
	}
	c.waitMembers(n)
	return c
}

// startClusterWith is startCluster with a per-node adjustment of the base
// config (edit may be nil): edit(i, &cfg) runs for node i before it starts,
// for example to give each node its own clock.
func startClusterWith(t testing.TB, n int, base Config, edit func(i int, cfg *Config)) *cluster {
	t.Helper()
	c := &cluster{t: t, base: base}
	for i := range n {
		c.addWith(fmt.Sprintf("n%d", i), func(cfg *Config) {
			if edit != nil {
				edit(i, cfg)
			}
		})
	}
	c.waitMembers(n)
	return c
}

func (c *cluster) add(name string) *Node {
	c.t.Helper()
	return c.addWith(name, nil)
}

// addWith starts one more node named name, joined through a live node,
// with edit (if not nil) applied to its copy of the base config. It does not
// wait for membership to converge.
func (c *cluster) addWith(name string, edit func(cfg *Config)) *Node {
	c.t.Helper()
	cfg := c.base
	cfg.Name = name
	if edit != nil {
		edit(&cfg)
	}
	if cfg.Gossip == nil {
		cfg.Gossip = fastGossip
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(c.t)
	}
	if len(c.nodes) > 0 {
		for _, o := range c.nodes {
			if !o.closing.Load() {
				cfg.Join = []string{o.GossipAddr()}
				break
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nd, err := New(ctx, cfg)
	if err != nil {
		c.t.Fatalf("start %s: %v", name, err)
	}
	c.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = nd.Close(ctx)
	})
	c.nodes = append(c.nodes, nd)
	return nd
}

// live returns the nodes not closed.
func (c *cluster) live() []*Node {
	var out []*Node
	for _, nd := range c.nodes {
		if !nd.closing.Load() {
			out = append(out, nd)
		}
	}
	return out
}

// waitMembers waits until every live node's ring has exactly want members
// and every partition has moved to its target (Node.Settled).
func (c *cluster) waitMembers(want int) {
	c.t.Helper()
	waitFor(c.t, 15*time.Second, fmt.Sprintf("every node to see %d members", want), func() bool {
		for _, nd := range c.live() {
			if len(nd.Members()) != want {
				return false
			}
		}
		return true
	})
	deadline := time.Now().Add(60 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		settled := true
		for _, nd := range c.live() {
			settled = settled && nd.Settled()
		}
		if settled {
			return
		}
		if time.Now().After(deadline) {
			var why []string
			for _, nd := range c.live() {
				why = append(why, nd.unsettledForTest())
			}
			c.t.Fatalf("timed out after 60s waiting for every partition to settle on its target:\n%s", strings.Join(why, "\n"))
		}
		<-tick.C
	}
}

// waitFor polls cond until it holds or the deadline passes, then fails
// naming what did not happen. Polling waits on a timer channel between
// checks; it never sleeps a fixed time before asserting.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		<-tick.C
	}
}

func TestClusterExactlyLimit(t *testing.T) {
	for _, tc := range []struct {
		nodes, requests int
		batching        bool
		unary           bool // DisableStreams: batches as unary RPCs
	}{
		{3, 300, true, false},
		{3, 300, true, true},
		{3, 300, false, false},
		{5, 1000, true, false},
	} {
		t.Run(fmt.Sprintf("nodes=%d/requests=%d/batching=%v/streams=%v", tc.nodes, tc.requests, tc.batching, !tc.unary), func(t *testing.T) {
			base := Config{
				Policies:        map[string]PolicyConfig{"api": {Limit: 100, Window: time.Minute}},
				DisableBatching: !tc.batching,
				DisableStreams:  tc.unary,
				// This test is about exactness, not deadlines: a loaded
				// machine must not turn a slow forward into an error.
				ForwardTimeout: 5 * time.Second,
			}
			c := startCluster(t, tc.nodes, base)
			key := Key{Tenant: "acme", Subject: "user-1", Policy: "api"}
			owner, _ := c.nodes[0].Owner(key)
			var mu sync.Mutex
			admitted := 0
			owners := map[string]int{}
			var wg sync.WaitGroup
			errs := make(chan error, tc.requests)
			per := tc.requests / tc.nodes
			for _, nd := range c.nodes {
				for g := range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range per / 4 {
							d, err := nd.Allow(context.Background(), Request{Key: key})
							if err != nil {
								errs <- err
								return
							}
							mu.Lock()
							owners[d.Owner]++
							if d.Allowed {
								admitted++
							}
							mu.Unlock()
						}
						_ = g
					}()
				}
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatalf("Allow: %v", err)
			}
			if admitted != 100 {
				t.Fatalf("admitted %d of %d requests across %d nodes, want exactly 100", admitted, tc.requests, tc.nodes)
			}
			if len(owners) != 1 || owners[owner] == 0 {
				t.Fatalf("decisions came from %v, want only the owner %s", owners, owner)
			}
		})
	}
}
