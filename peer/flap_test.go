package peer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/ring"
)

// flapNet cuts members' gossip on command: a cut member's memberlist sends
// nothing (UDP packets dropped, TCP dials refused) and every other member's
// sends to it are dropped the same way, so it neither hears nor is heard.
// Only gossip: its gRPC (the ownership log, forwards, replication) is
// untouched, as when a starved or flapping gossip layer loses probes while
// the data plane still works. Real memberlist, real sockets on 127.0.0.1.
type flapNet struct {
	mu  sync.Mutex
	cut map[string]bool // gossip address -> cut
}

var errFlapCut = errors.New("flap: gossip cut")

func (f *flapNet) blocked(from, to string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cut[from] || f.cut[to]
}

func (f *flapNet) set(addr string, cut bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut == nil {
		f.cut = map[string]bool{}
	}
	f.cut[addr] = cut
}

func (f *flapNet) healAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.cut)
}

// gossip is a Config.Gossip hook that keeps the profile's timings and puts
// memberlist on a NetTransport wrapped by f.
func (f *flapNet) gossip(t testing.TB) func(*memberlist.Config) {
	return func(mc *memberlist.Config) {
		nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
			BindAddrs: []string{mc.BindAddr}, BindPort: mc.BindPort, Logger: mc.Logger})
		if err != nil {
			t.Errorf("flap transport on %s:%d: %v", mc.BindAddr, mc.BindPort, err)
			return // memberlist makes its own; the test fails
		}
		mc.Transport = &flapTransport{NetTransport: nt, net: f,
			self: net.JoinHostPort(mc.BindAddr, strconv.Itoa(nt.GetAutoBindPort()))}
	}
}

// flapTransport is memberlist's NetTransport with sends and dials through
// its flapNet.
type flapTransport struct {
	*memberlist.NetTransport
	net  *flapNet
	self string
}

func (t *flapTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if t.net.blocked(t.self, addr) {
		return time.Now(), nil // lost on the way, as UDP is
	}
	return t.NetTransport.WriteTo(b, addr)
}

func (t *flapTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return t.WriteTo(b, a.Addr)
}

func (t *flapTransport) DialTimeout(addr string, d time.Duration) (net.Conn, error) {
	if t.net.blocked(t.self, addr) {
		return nil, errFlapCut
	}
	return t.NetTransport.DialTimeout(addr, d)
}

func (t *flapTransport) DialAddressTimeout(a memberlist.Address, d time.Duration) (net.Conn, error) {
	return t.DialTimeout(a.Addr, d)
}

// flapRun is one flapping scenario.
type flapRun struct {
	members int
	flapFor time.Duration // how long gossip flaps
	// cutShare of the members (at least one) are cut at any moment
	// during the flap, each for a random time in [minCut, maxCut].
	cutShare       float64
	minCut, maxCut time.Duration
	// settleLeases bounds, in LeaseDurations, the time from the end of
	// the flap until every member's gossip sees every other alive and
	// every member is settled (Node.Settled): the claim under test.
	settleLeases int
	// startIn bounds the start: gossip whole and every member settled.
	startIn time.Duration
	seed    uint64
	// unscaled runs the fast profile as it is (no ExpectedMembers), with
	// the same partition count, for comparison.
	unscaled bool
	// suite uses the suite's test gossip (testGossip: a probe timeout and
	// suspicion a starved member can answer in) instead of the profile,
	// for a run inside the loaded race-detector suite.
	suite bool
}

// run starts the cluster (the fast gossip profile, scaled to the member
// count by ExpectedMembers), flaps its gossip, heals it, and measures the
// recovery.
func (r flapRun) run(t *testing.T) {
	var fn flapNet
	base := Config{GossipProfile: GossipFast, ExpectedMembers: r.members}
	scaled := "scaled for"
	if r.unscaled {
		p, err := ring.PartitionsFor(r.members)
		if err != nil {
			t.Fatal(err)
		}
		base.ExpectedMembers, base.Ring.PartitionCount, scaled = 0, p, "unscaled, at"
	}
	// Started by hand rather than by startCluster, whose deadlines are
	// for small clusters: gossip first, then the ownership log.
	c := &cluster{t: t, base: base}
	for i := range r.members {
		c.addWith(fmt.Sprintf("n%d", i), func(cfg *Config) {
			cut := fn.gossip(t)
			cfg.Gossip = cut
			if r.suite {
				cfg.Gossip = func(mc *memberlist.Config) { testGossip(mc); cut(mc) }
			}
		})
	}
	nodes := c.nodes
	lease := nodes[0].cfg.LeaseDuration
	settleIn := time.Duration(r.settleLeases) * lease
	s0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), r.startIn)
	defer cancel()
	if !gossipWhole(ctx, nodes) {
		t.Fatalf("gossip views not whole %v after the last start: %s", r.startIn, flapState(nodes))
	}
	// A cluster that never settled cannot show that it settles again; its
	// gossip recovery is still measured (and the test fails).
	startSettled := WaitSettled(ctx, nodes, 0) == nil
	if !startSettled {
		t.Errorf("not settled %v after the last start, before any fault: %s", r.startIn, flapState(nodes))
	}
	t.Logf("%d members started; gossip whole and settled (%v) %v after the last start; fast gossip %s %d members, %d partitions, LeaseDuration %v",
		r.members, startSettled, time.Since(s0).Round(time.Millisecond), scaled, r.members, nodes[0].cfg.Ring.PartitionCount, lease)

	// The flap: every 100 ms, members whose cut is over are healed and
	// others are cut until cutShare of them are.
	rng := rand.New(rand.NewPCG(r.seed, uint64(r.members)))
	want := max(1, int(float64(r.members)*r.cutShare))
	until := make([]time.Time, r.members)
	cuts, fewest := 0, r.members
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	f0 := time.Now()
	for now := f0; now.Sub(f0) < r.flapFor; now = <-tick.C {
		cut := 0
		for i, u := range until {
			switch {
			case u.IsZero():
			case now.After(u):
				until[i] = time.Time{}
				fn.set(nodes[i].GossipAddr(), false)
			default:
				cut++
			}
		}
		for tries := 0; cut < want && tries < 4*r.members; tries++ {
			i := rng.IntN(r.members)
			if !until[i].IsZero() {
				continue
			}
			until[i] = now.Add(r.minCut + time.Duration(rng.Int64N(int64(r.maxCut-r.minCut)+1)))
			fn.set(nodes[i].GossipAddr(), true)
			cut++
			cuts++
		}
		for _, nd := range nodes {
			fewest = min(fewest, nd.gossiper.ml.NumMembers())
		}
	}
	fn.healAll()
	h0 := time.Now()
	t.Logf("flapped for %v: %d cuts of %v to %v, %d members cut at a time; the fewest members a gossip view held: %d of %d",
		r.flapFor, cuts, r.minCut, r.maxCut, want, fewest, r.members)
	if fewest == r.members {
		t.Fatalf("no member's gossip view lost a member during the flap: the fault did not bite")
	}

	// Recovery: gossip first (every view holds every member alive), then
	// the ownership layer (every member settled, rings agreed).
	ctx, cancel = context.WithTimeout(context.Background(), settleIn)
	defer cancel()
	if !gossipWhole(ctx, nodes) {
		t.Fatalf("gossip views not whole %v after the flap ended (bound %v = %d leases): %s",
			time.Since(h0).Round(time.Millisecond), settleIn, r.settleLeases, flapState(nodes))
	}
	gossipAt := time.Since(h0)
	if !startSettled {
		t.Fatalf("every gossip view whole %v after the flap ended; the cluster had not settled before it", gossipAt.Round(time.Millisecond))
	}
	if err := WaitSettled(ctx, nodes, 0); err != nil {
		t.Fatalf("not settled %v after the flap ended (gossip whole after %v; bound %v = %d leases): %v; %s",
			time.Since(h0).Round(time.Millisecond), gossipAt.Round(time.Millisecond), settleIn, r.settleLeases, err, flapState(nodes))
	}
	settled := time.Since(h0)
	t.Logf("after the flap: every gossip view whole in %v, every member settled in %v (%.1f leases; bound %v)",
		gossipAt.Round(time.Millisecond), settled.Round(time.Millisecond), float64(settled)/float64(lease), settleIn)
}

// gossipWhole waits until every node's memberlist counts every node alive,
// and reports whether that happened before ctx ended.
func gossipWhole(ctx context.Context, nodes []*Node) bool {
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for {
		all := true
		for _, nd := range nodes {
			all = all && nd.gossiper.ml.NumMembers() == len(nodes)
		}
		if all {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-poll.C:
		}
	}
}

// flapState summarises nodes for a failure message.
func flapState(nodes []*Node) string {
	views, rings, why := map[int]int{}, map[int]int{}, map[string]int{}
	settled := 0
	for _, nd := range nodes {
		views[nd.gossiper.ml.NumMembers()]++
		rings[len(nd.Members())]++
		if nd.Settled() {
			settled++
		}
		_, reason := nd.Ready()
		why[reason]++
	}
	return fmt.Sprintf("gossip views (members alive: nodes) %v, rings (members: nodes) %v, %d of %d settled, unready reasons %v",
		views, rings, settled, len(nodes), why)
}

// TestGossipFlapRecovers is the CI-sized flap: 6 members whose gossip
// flaps for 4 s (one member at a time cut for 2 to 3 s, longer than the
// suite's suspicion, so it is declared failed and must come back) settle
// within 5 leases of the flap's end. It runs in .ci/run's pass without the
// race detector.
func TestGossipFlapRecovers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 6 members and flaps their gossip for 4 s: skipped with -short")
	}
	if raceEnabled {
		// Under the race detector on a loaded machine the cluster alone
		// took 25-30 s to settle before any fault; .ci/run runs this test
		// again without it, where the whole test takes about 7 s.
		t.Skip("skipped under the race detector (a 6-member start takes half a minute there); .ci/run runs it without")
	}
	flapRun{members: 6, flapFor: 4 * time.Second, cutShare: 0.1, minCut: 2 * time.Second, maxCut: 3 * time.Second,
		settleLeases: 5, startIn: 30 * time.Second, seed: 54, suite: true}.run(t)
}

// flapMembersEnv opts in to TestGossipFlapAtSize.
const flapMembersEnv = "RINGLIMIT_FLAP_MEMBERS"

// TestGossipFlapAtSize is the fleet-sized flap (issue 54 §4): with
// RINGLIMIT_FLAP_MEMBERS=64, 64 in-process members whose gossip flaps for
// a minute (a tenth of them cut at any moment, each for 1 to 3 s) must
// settle within 5 leases of the flap's end. RINGLIMIT_FLAP_SECONDS changes
// the minute; RINGLIMIT_FLAP_UNSCALED=1 runs the fast profile without
// ApplySized's scaling (same partition count), for comparison.
func TestGossipFlapAtSize(t *testing.T) {
	v := os.Getenv(flapMembersEnv)
	if v == "" {
		t.Skipf("set %s=64 to flap the gossip of that many in-process members", flapMembersEnv)
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 3 || n > 128 {
		t.Fatalf("%s=%q: want a member count from 3 to 128", flapMembersEnv, v)
	}
	flapFor := time.Minute
	if s := os.Getenv("RINGLIMIT_FLAP_SECONDS"); s != "" {
		secs, err := strconv.Atoi(s)
		if err != nil || secs < 1 || secs > 600 {
			t.Fatalf("RINGLIMIT_FLAP_SECONDS=%q: want 1 to 600", s)
		}
		flapFor = time.Duration(secs) * time.Second
	}
	flapRun{members: n, flapFor: flapFor, cutShare: 0.1, minCut: time.Second, maxCut: 3 * time.Second,
		settleLeases: 5, startIn: 3 * time.Minute, seed: 54, unscaled: os.Getenv("RINGLIMIT_FLAP_UNSCALED") != ""}.run(t)
}
