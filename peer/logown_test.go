package peer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// These tests run real nodes (memberlist, gRPC on 127.0.0.1) with
// ownership through the replicated log.

func logConfig(limit int64, window time.Duration) Config {
	return Config{
		Ownership:      OwnershipLog,
		Policies:       map[string]PolicyConfig{"api": {Limit: limit, Window: window}},
		ForwardTimeout: 5 * time.Second,
		LeaseDuration:  time.Second,
	}
}

// deciders counts the nodes that may decide for key's partition now.
func deciders(c *cluster, key Key) (n int, who string) {
	for _, nd := range c.live() {
		if nd.lo == nil {
			continue
		}
		pid := nd.partIDForTest(key)
		if nd.lo.run.MayDecide(pid, nd.mono()) {
			n++
			who = nd.name
		}
	}
	return n, who
}

// logState describes key's partition on every live node, for failures.
func logState(c *cluster, key Key) string {
	var b strings.Builder
	for _, nd := range c.live() {
		if nd.lo == nil {
			continue
		}
		pid := nd.partIDForTest(key)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		tb, _ := nd.lo.run.Table(ctx)
		cancel()
		ctx, cancel = context.WithTimeout(context.Background(), time.Second)
		fmt.Fprintf(&b, "%s: %s\n  ", nd.name, nd.lo.run.Describe(ctx))
		cancel()
		fmt.Fprintf(&b, "%s: leader %v, live %v, p%d published %+v", nd.name, nd.lo.member.Leader(), nd.lo.run.LiveUntil() > nd.mono(), pid, nd.lo.run.Part(pid))
		if tb != nil {
			fmt.Fprintf(&b, ", table %+v, members", tb.Parts[pid])
			for id, l := range tb.Members {
				fmt.Fprintf(&b, " %s=%+v", id, *l)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// allowN sends n requests for key through nodes, round robin, from 4
// goroutines each, and returns the admitted count and the owners seen.
func allowN(t *testing.T, nodes []*Node, key Key, n int) (admitted int, owners map[string]int) {
	t.Helper()
	var mu sync.Mutex
	owners = map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	per := n / len(nodes) / 4
	for _, nd := range nodes {
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range per {
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
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Allow: %v", err)
	}
	return admitted, owners
}

func TestLogClusterExactlyLimit(t *testing.T) {
	c := startCluster(t, 3, logConfig(100, time.Minute))
	key := Key{Tenant: "acme", Subject: "user-1", Policy: "api"}
	admitted, owners := allowN(t, c.nodes, key, 300)
	if admitted != 100 {
		t.Fatalf("admitted %d of 300 across 3 nodes, want exactly 100", admitted)
	}
	if len(owners) != 1 {
		t.Fatalf("decisions came from %v, want one decision point", owners)
	}
	if n, _ := deciders(c, key); n != 1 {
		t.Fatalf("%d nodes may decide for the key, want 1", n)
	}
}

// TestLogTakeoverKeepsState kills the holder of a key at its limit: once
// the backup has taken over (after the holder's liveness expired), the
// key is still at its limit, and there was never a second decision point.
func TestLogTakeoverKeepsState(t *testing.T) {
	c := startCluster(t, 3, logConfig(10, time.Minute))
	key := Key{Tenant: "acme", Subject: "user-2", Policy: "api"}
	admitted, owners := allowN(t, c.nodes, key, 48)
	if admitted != 10 {
		t.Fatalf("admitted %d of 48, want 10", admitted)
	}
	var holder *Node
	for _, nd := range c.nodes {
		if owners[nd.name] > 0 {
			holder = nd
		}
	}
	if holder == nil {
		t.Fatalf("no holder among %v", owners)
	}
	killed := time.Now()
	holder.KillForTest()
	var rest []*Node
	for _, nd := range c.nodes {
		if nd != holder {
			rest = append(rest, nd)
		}
	}
	var d Decision
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("state:\n%s", logState(c, key))
		}
	})
	waitFor(t, 20*time.Second, "a decision after the takeover", func() bool {
		if n, who := deciders(c, key); n > 1 {
			t.Fatalf("%d decision points (last %s)", n, who)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var err error
		d, err = rest[0].Allow(ctx, Request{Key: key})
		return err == nil && d.Reason != ReasonUnavailable
	})
	t.Logf("decided again %v after the kill, by %s", time.Since(killed).Round(time.Millisecond), d.Owner)
	if d.Allowed {
		t.Fatalf("the key at its limit was admitted after the takeover (%+v): the copy was lost", d)
	}
	if more, _ := allowN(t, rest, key, 16); more != 0 {
		t.Fatalf("admitted %d more after the takeover, want 0", more)
	}
}

// TestLogLeaveMovesState closes the holder gracefully: its partitions
// move, the key stays at its limit, and the move costs no decision.
func TestLogLeaveMovesState(t *testing.T) {
	c := startCluster(t, 3, logConfig(10, time.Minute))
	key := Key{Tenant: "acme", Subject: "user-3", Policy: "api"}
	if admitted, _ := allowN(t, c.nodes, key, 48); admitted != 10 {
		t.Fatalf("admitted %d of 48, want 10", admitted)
	}
	owner, _ := c.nodes[0].Owner(key)
	var holder *Node
	for _, nd := range c.nodes {
		if nd.name == owner {
			holder = nd
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := holder.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	rest := c.live()
	if more, owners := allowN(t, rest, key, 16); more != 0 {
		t.Fatalf("admitted %d more after the leave (owners %v), want 0", more, owners)
	}
}
