package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer"
)

// TestScale64 starts 64 members in one process (memberlist and gRPC on
// 127.0.0.1, the fast gossip profile) and measures what a membership
// change costs at that size: how long until every member sees the new
// member list and every partition sits on its target (Node.Settled), for
// one join and one graceful leave, while decisions keep flowing through
// several members. Opt-in (RINGLIMIT_SCALE=1): it takes a minute or two on
// two cores.
func TestScale64(t *testing.T) {
	if os.Getenv("RINGLIMIT_SCALE") == "" {
		t.Skip("set RINGLIMIT_SCALE=1 to run the 64-member scale test")
	}
	const members = 64
	m := newMembers(t)
	start := time.Now()
	nodes := m.startN(members)
	converge := func(what string, live []*peer.Node) time.Duration {
		t.Helper()
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if err := peer.WaitSettled(ctx, live, 0); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return time.Since(t0)
	}
	started := time.Since(start)
	settled := converge("start", nodes)
	t.Logf("%d members started in %v and settled %v later (%v in all)", members,
		started.Round(time.Millisecond), settled.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))

	// Decisions keep flowing through a few members while the cluster
	// changes; count what they get.
	var decided, unavailable, other atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		via := nodes[w*7]
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err := via.Allow(ctx, peer.Request{Key: peer.Key{Tenant: "scale", Subject: fmt.Sprintf("s%d-%d", w, i%500), Policy: "p"}})
				cancel()
				switch {
				case err == nil:
					decided.Add(1)
				case errors.Is(err, peer.ErrUnavailable):
					unavailable.Add(1)
				default:
					other.Add(1)
				}
			}
		})
	}
	joiner := m.start("joiner", []string{nodes[0].GossipAddr()})
	if joiner == nil {
		t.FailNow()
	}
	nodes = append(nodes, joiner)
	joinTook := converge("join", nodes)

	leaver := nodes[members/2]
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	err := leaver.Close(ctx)
	cancel()
	if err != nil {
		t.Fatalf("leave: %v", err)
	}
	closeTook := time.Since(t0)
	var rest []*peer.Node
	for _, nd := range nodes {
		if nd != leaver {
			rest = append(rest, nd)
		}
	}
	nodes = rest
	leaveTook := converge("leave", nodes)
	close(stop)
	wg.Wait()
	t.Logf("join: every member saw %d members and settled after %v", members+1, joinTook.Round(time.Millisecond))
	t.Logf("leave: Close took %v; every member saw %d members and settled %v later", closeTook.Round(time.Millisecond), members, leaveTook.Round(time.Millisecond))
	t.Logf("decisions during the changes: %d decided, %d unavailable, %d other errors", decided.Load(), unavailable.Load(), other.Load())
	if other.Load() > 0 {
		t.Fatalf("%d requests failed with something other than unavailability", other.Load())
	}
}
