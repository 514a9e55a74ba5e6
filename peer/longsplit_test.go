package peer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// gossipSplit is a network split of the test's gossip: while small is set,
// a member whose gossip address is in it and one whose address is not
// cannot reach each other; members on one side still gossip with each
// other.
type gossipSplit struct {
	small atomic.Pointer[map[string]bool]
}

// cuts reports whether the split separates gossip addresses a and b now.
func (s *gossipSplit) cuts(a, b string) bool {
	m := s.small.Load()
	return m != nil && (*m)[a] != (*m)[b]
}

// gossip returns a Config.Gossip func that applies hoGossip's patient
// failure detector (on a loaded machine fast timings flap both sides'
// views, and the partitions' targets never settle) and installs a
// splitTransport behind s. Each node calls it once, for its
// own transport.
func (s *gossipSplit) gossip(t *testing.T) func(*memberlist.Config) {
	return func(mc *memberlist.Config) {
		hoGossip(mc)
		nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{mc.BindAddr}, BindPort: mc.BindPort, Logger: mc.Logger})
		if err != nil {
			t.Fatalf("net transport: %v", err)
		}
		mc.Transport = &splitTransport{NetTransport: nt, split: s}
	}
}

// splitTransport is memberlist's NetTransport that sends no packet to,
// and dials no stream to, a member across the split. Every node of the
// test runs one, so nothing crosses either way; what it receives needs no
// filter (a stream's remote port would not name its sender anyway).
type splitTransport struct {
	*memberlist.NetTransport
	split *gossipSplit
	self  atomic.Pointer[string] // the advertised gossip address
}

var _ memberlist.NodeAwareTransport = (*splitTransport)(nil)

func (s *splitTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	a, p, err := s.NetTransport.FinalAdvertiseAddr(ip, port)
	if err == nil {
		self := net.JoinHostPort(a.String(), fmt.Sprint(p))
		s.self.Store(&self)
	}
	return a, p, err
}

func (s *splitTransport) cut(addr string) bool {
	self := s.self.Load()
	return self != nil && s.split.cuts(*self, addr)
}

func (s *splitTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	if s.cut(addr) {
		return time.Now(), nil // sent into the void
	}
	return s.NetTransport.WriteTo(b, addr)
}

// WriteToAddress and DialAddressTimeout are overridden too: the embedded
// NetTransport's would reach its own WriteTo and DialTimeout, past the cut.
func (s *splitTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return s.WriteTo(b, a.Addr)
}

func (s *splitTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	if s.cut(addr) {
		return nil, errCut
	}
	return s.NetTransport.DialTimeout(addr, timeout)
}

func (s *splitTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return s.DialTimeout(a.Addr, timeout)
}

// TestLongSplitNeverRestartsEmpty is issue 52's hole 4. Five nodes, limit
// 5 per 10 minutes, 5 admitted; a 2 | 3 split (gossip and log, both ways)
// puts the key's holder and its backup on the small side and lasts past
// FailedMemberTimeout, until the big side's gossip has given up on them.
// Members gossip gave up on may only be cut off with their partitions'
// state: the big side must keep the key unavailable (the vacancy waits
// for its last holder until EmptyAfter, about 11 minutes here) and
// restart no partition empty. Treating them as gone for good restarted
// the vacancies empty on the big side, which admitted the key again (8 or
// more in one window of 5 in the issue; this test stops at the first
// admission past the limit). After the heal the key is decided again,
// over its limit: the 5 admissions survived.
//
// The split cuts gossip and the log, not the data plane's gRPC (no hook
// reaches it): a forward across it reaches a holder whose lease has
// lapsed, which decides nothing.
func TestLongSplitNeverRestartsEmpty(t *testing.T) {
	t.Parallel()
	const limit = 5
	split := &gossipSplit{}
	cfg := logConfig(limit, 10*time.Minute)
	cfg.GossipProfile = GossipFast // ReconnectInterval 1 s: the sides merge soon after the heal
	cfg.FailedMemberTimeout = 2 * time.Second
	cfg.Gossip = split.gossip(t)
	start := time.Now()
	c := startCluster(t, 5, cfg)
	up := time.Since(start)
	lease := cfg.LeaseDuration
	key := Key{Tenant: "acme", Subject: "long-split", Policy: "api"}
	for i := range limit {
		d := awaitDecision(t, c.nodes[0], key, fmt.Sprintf("admission %d of %d before the split", i+1, limit))
		if !d.Allowed || d.Reason != ReasonAdmitted {
			t.Fatalf("request %d of %d before the split: %+v, want admitted", i+1, limit, d)
		}
	}

	pid := c.nodes[0].partIDForTest(key)
	byID := map[string]*Node{}
	for _, nd := range c.nodes {
		byID[nd.lo.self] = nd
	}
	st := c.nodes[0].lo.run.Part(pid)
	holder, backup := byID[st.Holder], byID[st.Backup]
	if holder == nil || backup == nil || holder == backup {
		t.Fatalf("partition %d: holder %q backup %q, want two members\n%s", pid, st.Holder, st.Backup, splitState(c, key))
	}
	small := []*Node{holder, backup}
	var big []*Node
	for _, nd := range c.nodes {
		if nd != holder && nd != backup {
			big = append(big, nd)
		}
	}
	// tables reads the ownership table as each big-side member applied it.
	tables := func() map[string][]int64 {
		out := map[string][]int64{}
		for _, nd := range big {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			tb, ok := nd.lo.run.Table(ctx)
			cancel()
			if !ok {
				t.Fatalf("%s: no answer for its ownership table", nd.name)
			}
			counts := make([]int64, 2*len(tb.Parts))
			for p, pt := range tb.Parts {
				counts[2*p], counts[2*p+1] = int64(pt.Restarts), int64(pt.Aged)
			}
			out[nd.name] = counts
		}
		return out
	}
	before := tables()

	// The split: gossip and the log, both ways.
	smallRaft := map[uint64]bool{holder.ops.start: true, backup.ops.start: true}
	for _, nd := range c.nodes {
		mine := smallRaft[nd.ops.start]
		drop := func(to uint64) bool { return smallRaft[to] != mine }
		nd.lo.raftDrop.Store(&drop)
	}
	split.small.Store(&map[string]bool{holder.GossipAddr(): true, backup.GossipAddr(): true})
	heal := func() {
		split.small.Store(nil)
		for _, nd := range c.nodes {
			nd.lo.raftDrop.Store(nil)
		}
	}
	t.Cleanup(heal) // before the cluster's cleanup closes the nodes
	cut := time.Now()
	t.Logf("split (the cluster was up in %v): holder %s and backup %s of partition %d from %s, %s and %s",
		up.Round(time.Millisecond), holder.name, backup.name, pid, big[0].name, big[1].name, big[2].name)

	// Every node asks for the key every 100 ms until the split ends.
	var mu sync.Mutex
	admitted, unavailable := limit, 0
	var extra []string // the admissions past the limit: node, owner, when
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, nd := range c.nodes {
		wg.Go(func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				// Half a second: a node that cannot decide answers at its
				// deadline, and the split is asked about often.
				ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				d, err := nd.Allow(ctx, Request{Key: key})
				cancel()
				mu.Lock()
				switch {
				case errors.Is(err, ErrUnavailable):
					unavailable++
				case err != nil:
					t.Errorf("Allow on %s during the split: %v", nd.name, err)
				case d.Allowed:
					admitted++
					extra = append(extra, fmt.Sprintf("%s (owner %s, %v after the split)", nd.name, d.Owner, time.Since(cut).Round(time.Millisecond)))
				}
				mu.Unlock()
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		})
	}
	stopAsking := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopAsking()

	// gaveUp reports whether nd's gossip dropped m from its view and nd's
	// log view gave up on m's incarnation: at a rebuild, m had been out of
	// gossip for longer than FailedMemberTimeout (what setView passes to
	// the ownership machine as View.Failed).
	gaveUp := func(nd, m *Node) bool {
		if nd.view.Load().snap.Has(m.name) {
			return false
		}
		nd.lo.mu.Lock()
		defer nd.lo.mu.Unlock()
		k := nd.lo.known[m.lo.self]
		return k != nil && k.forgotten
	}
	// Rebuilds are driven by gossip events, and after the small side's
	// failure the big side has none: nudge a rebuild on each big-side
	// member every 200 ms, as any gossip event would, so that its log
	// view looks at the failed members again once FailedMemberTimeout has
	// passed (the "next gossip event on the big side").
	var nudged time.Time
	nudge := func() {
		if time.Since(nudged) < 200*time.Millisecond {
			return
		}
		nudged = time.Now()
		for _, nd := range big {
			nd.gossiper.nudge()
		}
	}
	overLimit := func() {
		mu.Lock()
		defer mu.Unlock()
		if admitted > limit {
			t.Fatalf("%d admitted in one window of %d, %v into the split: the big side restarted the key's partition empty. Past the limit: %s\n%s",
				admitted, limit, time.Since(cut).Round(time.Millisecond), strings.Join(extra, "; "), splitState(c, key))
		}
	}
	var givenUp time.Duration
	waitForWhy(t, 20*time.Second, "the big side's gossip to give up on the small side (FailedMemberTimeout)", func() bool {
		overLimit()
		nudge()
		for _, nd := range big {
			for _, m := range small {
				if !gaveUp(nd, m) {
					return false
				}
			}
		}
		if givenUp == 0 {
			givenUp = time.Since(cut)
		}
		return time.Since(cut) > cfg.FailedMemberTimeout+2*lease
	}, func() string {
		var b strings.Builder
		for _, nd := range big {
			fmt.Fprintf(&b, "\n%s: members %v", nd.name, nd.Members())
			for _, m := range small {
				fmt.Fprintf(&b, ", gave up on %s: %v", m.name, gaveUp(nd, m))
			}
		}
		return b.String()
	})
	// The members gossip gave up on are in every big-side member's view of
	// the ownership machine now; give the log's leader a few leases to act
	// on it (to restart what it wrongly takes for lost).
	hold := time.Now()
	waitFor(t, 10*time.Second, "three leases more of the split", func() bool {
		overLimit()
		nudge()
		return time.Since(hold) > 3*lease
	})
	stopAsking()
	overLimit()
	after := tables() // the split is still on: the big side's tables
	for _, nd := range big {
		var restarted []string
		for p := range len(before[nd.name]) / 2 {
			r0, a0 := before[nd.name][2*p], before[nd.name][2*p+1]
			r1, a1 := after[nd.name][2*p], after[nd.name][2*p+1]
			if r1 != r0 || a1 != a0 {
				restarted = append(restarted, fmt.Sprintf("p%d restarts %d→%d aged %d→%d", p, r0, r1, a0, a1))
			}
		}
		if len(restarted) > 0 {
			t.Fatalf("%s's table restarted partitions empty during the split (the small side was only cut off): %s\n%s",
				nd.name, strings.Join(restarted, ", "), splitState(c, key))
		}
	}
	// Which of the small side the big side's log ended for good: only one
	// no partition waits for (it holds, backs and is Last of nothing).
	var ended []string
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	if tb, ok := big[0].lo.run.Table(ctx); ok {
		for _, m := range small {
			if rec := tb.Members[m.lo.self]; rec != nil && rec.Ended {
				ended = append(ended, m.name)
			}
		}
		st := tb.Parts[pid]
		if st.Holder != "" && !slices.Contains([]string{holder.lo.self, backup.lo.self}, st.Holder) {
			t.Fatalf("partition %d held by %s during the split: %+v", pid, st.Holder, st)
		}
		t.Logf("during the split, partition %d in %s's table: %+v; the small side's members ended for good: %v", pid, big[0].name, st, ended)
	}
	cancel()
	mu.Lock()
	if unavailable == 0 {
		t.Fatalf("no request was answered unavailable during a %v split that cut off the key's holder and backup", time.Since(cut).Round(time.Millisecond))
	}
	t.Logf("split for %v (the big side gave up on the small side %v in): nothing admitted past the %d before it, %d asks unavailable, no partition restarted",
		time.Since(cut).Round(time.Millisecond), givenUp.Round(time.Millisecond), limit, unavailable)
	mu.Unlock()

	heal()
	healed := time.Now()
	// decide asks nd for the key once and reports whether nd decided; a
	// decision other than over the limit (the 5 admitted before the split
	// fill the window) is returned as bad.
	decide := func(nd *Node) (decided bool, bad string) {
		// A short deadline: a member that cannot decide answers only at
		// it, and each round below waits for every node, so it is the
		// resolution of the time the key stayed unavailable.
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		d, err := nd.Allow(ctx, Request{Key: key})
		switch {
		case err != nil:
			return false, ""
		case d.Allowed || d.Reason != ReasonOverLimit:
			return true, fmt.Sprintf("%s %v after the heal: %+v, want over the limit (%d admitted in the window before the split): the partition came back without them",
				nd.name, time.Since(healed).Round(time.Millisecond), d, limit)
		}
		return true, ""
	}
	// Every node asks at once, so that the first decision tells how long
	// the key stayed unavailable after the heal.
	var first atomic.Pointer[Node]
	waitForWhy(t, 30*time.Second, "the key to be decided again after the heal", func() bool {
		var wg sync.WaitGroup
		bad := make([]string, len(c.nodes))
		for i, nd := range c.nodes {
			wg.Go(func() {
				var ok bool
				if ok, bad[i] = decide(nd); ok {
					first.CompareAndSwap(nil, nd)
				}
			})
		}
		wg.Wait()
		if b := strings.Join(slices.DeleteFunc(bad, func(s string) bool { return s == "" }), "; "); b != "" {
			t.Fatalf("%s\n%s", b, splitState(c, key))
		}
		return first.Load() != nil
	}, func() string { return "\n" + splitState(c, key) })
	t.Logf("healed: the key decided again, over its limit, on %s %v after the heal (holder now %s)",
		first.Load().name, time.Since(healed).Round(time.Millisecond), memberName(first.Load().lo.run.Part(pid).Holder))
	// Every member in the log decides it so too. An incarnation the log
	// ended for good during the split (gossip had given up on it and no
	// partition waited for it) is out of the log for good: it is only
	// reported.
	ctx, cancel = context.WithTimeout(context.Background(), time.Second)
	tb, ok := big[0].lo.run.Table(ctx)
	cancel()
	if !ok {
		t.Fatalf("%s: no answer for its ownership table after the heal", big[0].name)
	}
	for _, nd := range c.nodes {
		if rec := tb.Members[nd.lo.self]; rec != nil && rec.Ended {
			ready, why := nd.Ready()
			t.Logf("%s: its incarnation was ended for good; after the heal it is out of the log (raft leader %016x, ready %v: %s)",
				nd.name, nd.lo.run.Lead(), ready, why)
			continue
		}
		waitForWhy(t, 20*time.Second, nd.name+" to decide the key after the heal", func() bool {
			ok, bad := decide(nd)
			if bad != "" {
				t.Fatalf("%s\n%s", bad, splitState(c, key))
			}
			return ok
		}, func() string { return "\n" + splitState(c, key) })
	}
	var voters []string
	for _, nd := range c.nodes {
		ready, _ := nd.Ready()
		voters = append(voters, fmt.Sprintf("%s: %d voters, leader %016x, ready %v", nd.name, nd.lo.run.Voters(), nd.lo.run.Lead(), ready))
	}
	t.Logf("every member in the log over the limit %v after the heal; %s", time.Since(healed).Round(time.Millisecond), strings.Join(voters, "; "))
	after = tables()
	for _, nd := range big {
		for p := range len(before[nd.name]) / 2 {
			if after[nd.name][2*p] != before[nd.name][2*p] {
				t.Fatalf("%s's table restarted p%d empty after the heal: restarts %d→%d", nd.name, p, before[nd.name][2*p], after[nd.name][2*p])
			}
		}
	}
}

// splitState is logState without raft's own status, which is read on the
// runner's goroutine only (Describe); logState's Member.Leader raced with
// it under -race when a failure message was built.
func splitState(c *cluster, key Key) string {
	var b strings.Builder
	for _, nd := range c.live() {
		pid := nd.partIDForTest(key)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		tb, _ := nd.lo.run.Table(ctx)
		desc := nd.lo.run.Describe(ctx)
		cancel()
		fmt.Fprintf(&b, "%s: %s\n  lead %016x, live %v, p%d published %+v", nd.name, desc, nd.lo.run.Lead(), nd.lo.run.LiveUntil() > nd.mono(), pid, nd.lo.run.Part(pid))
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
