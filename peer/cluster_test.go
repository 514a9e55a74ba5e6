package peer

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// fastGossip is the GossipFast preset, as a Config.Gossip func that test
// variants (hoGossip, slowDetectGossip) start from.
func fastGossip(mc *memberlist.Config) { GossipFast.Apply(mc) }

// testGossip is the gossip of test nodes that set none: fastGossip with a
// probe timeout and a suspicion that a starved member (a loaded 2-core
// machine running the race detector and other tests' clusters at once)
// can answer and refute in. With fastGossip's 100 ms and 3 probes, a
// fresh-clone CI under two busy loops saw five live members declare each
// other dead and come back every second for a minute, so their rings, and
// the partitions' targets, never settled. Failure detection stays under
// about a second (3 members: 0.5-1 s), which the tests that kill members
// wait for; takeovers follow liveness leases, not gossip.
func testGossip(mc *memberlist.Config) {
	fastGossip(mc)
	mc.ProbeTimeout = 250 * time.Millisecond
	mc.SuspicionMult = 5
}

// testLogger returns a logger for a test's nodes. With RINGLIMIT_TEST_LOG
// set it writes every line (debug level) to stderr. Otherwise it keeps the
// test's last recorderLines lines (info level and up, from every node of
// the test) in memory and writes them to the test log only if the test
// fails, so a failure seen once in CI comes with its history.
func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("RINGLIMIT_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	r, loaded := recorders.LoadOrStore(t, &recorder{})
	rec := r.(*recorder)
	if !loaded {
		t.Cleanup(func() {
			recorders.Delete(t)
			if t.Failed() {
				rec.mu.Lock()
				t.Logf("last %d log lines of the test's nodes:\n%s", len(rec.lines), strings.Join(rec.lines, ""))
				rec.mu.Unlock()
			}
		})
	}
	return slog.New(slog.NewTextHandler(rec, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// recorderLines bounds what a recorder keeps.
const recorderLines = 400

var recorders sync.Map // testing.TB -> *recorder

// recorder keeps the last recorderLines lines written to it.
type recorder struct {
	mu    sync.Mutex
	lines []string
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.lines) == recorderLines {
		r.lines = append(r.lines[:0], r.lines[1:]...)
	}
	r.lines = append(r.lines, string(p))
	return len(p), nil
}

type cluster struct {
	t     testing.TB
	nodes []*Node
	base  Config
	// started is every node started for the cluster (nodes may be
	// reordered or trimmed by a test), closed together at cleanup.
	started []*Node
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

// testForwardTimeout is the ForwardTimeout of the test nodes that set
// none. The default, half a second, is what a client of a healthy
// cluster should wait; on a loaded 2-core machine running the race
// detector a live holder sometimes takes longer, and a test that checks
// exactness must not fail because a forward took long. Tests of
// timeouts set their own, or give the call a deadline.
const testForwardTimeout = 3 * time.Second

// testPartitions is the partition count of the test nodes that set
// neither one nor ExpectedMembers. Every partition of a forming cluster
// costs a move and a backup copy through the ownership log before the
// cluster settles: with the default 271, a three-node start under the
// race detector is most of a cluster test's time, and on a loaded
// machine it did not settle within a minute. 31 still gives each of
// five members several partitions; tests of the default set it.
const testPartitions = 31

// withTestPartitions gives cfg testPartitions unless it chose its
// partition count (directly or through ExpectedMembers): a node a test
// starts outside the cluster helper to join a cluster calls it too, so
// that its placement fingerprint matches the members'.
func withTestPartitions(cfg *Config) {
	if cfg.Ring.PartitionCount == 0 && cfg.ExpectedMembers == 0 {
		cfg.Ring.PartitionCount = testPartitions
	}
}

// cleanupCloseTimeout bounds each node's Close in a test's cleanup. A
// healthy node closes in well under a second; one whose handoffs cannot
// complete (cut off, stalled, its log without a majority) waited the whole
// deadline, 5 s each, which cost tens of seconds per fault test. Nothing
// checks these closes: a test that checks Close calls it itself.
const cleanupCloseTimeout = time.Second

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
		cfg.Gossip = testGossip
	}
	if cfg.ForwardTimeout == 0 {
		cfg.ForwardTimeout = testForwardTimeout
	}
	withTestPartitions(&cfg)
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
	c.closeAtCleanup(nd)
	c.nodes = append(c.nodes, nd)
	return nd
}

// closeAtCleanup has the test's cleanup close nd, with the cluster's other
// nodes. The first node registers the cleanup, so it runs after every
// cleanup the test registers once its cluster is up (releasing stalls and
// hooks); it closes every started node at once, as a whole cluster is
// stopped, rather than one after another: in turn, each close waited out
// its leave's gossip, and a survivor's drain to the members still up,
// which cost about a second per node of every test.
func (c *cluster) closeAtCleanup(nd *Node) {
	if len(c.started) == 0 {
		c.t.Cleanup(func() {
			var wg sync.WaitGroup
			for _, nd := range c.started {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), cleanupCloseTimeout)
					defer cancel()
					_ = nd.Close(ctx)
				})
			}
			wg.Wait()
		})
	}
	c.started = append(c.started, nd)
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
			seen := map[int]bool{}
			for _, nd := range c.live() {
				why = append(why, nd.unsettledForTest())
				for _, pid := range nd.unsettledPids() {
					if !seen[pid] && len(seen) < 4 {
						seen[pid] = true
						for _, o := range c.live() {
							why = append(why, "  "+o.partForTest(pid))
						}
					}
				}
			}
			if dir := os.Getenv("RINGLIMIT_TEST_STACKS"); dir != "" {
				// Triage of a stalled start-up: every goroutine's stack.
				f, err := os.CreateTemp(dir, "settle-*.txt")
				if err == nil {
					_ = pprof.Lookup("goroutine").WriteTo(f, 2)
					_ = f.Close()
					why = append(why, "goroutines: "+f.Name())
				}
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
	waitForWhy(t, d, what, cond, nil)
}

// waitForWhy is waitFor whose failure adds what why says (when not nil)
// about the state that kept cond from holding.
func waitForWhy(t testing.TB, d time.Duration, what string, cond func() bool, why func() string) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			if why != nil {
				t.Fatalf("timed out after %v waiting for %s: %s", d, what, why())
			}
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		<-tick.C
	}
}

func TestClusterExactlyLimit(t *testing.T) {
	// Two cases at a time, whatever -parallel: three at once (a 5-node
	// cluster among them) beside CI's other packages and two busy loops
	// flapped gossip, and a forward cut short failed the case.
	two := make(chan struct{}, 2)
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
			// Each case's cluster waits on its forwards far more than it
			// computes (about a quarter of a core alone): two run at once.
			// Exactness has no deadline to miss (forwards get 5 s).
			t.Parallel()
			two <- struct{}{}
			defer func() { <-two }()
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
