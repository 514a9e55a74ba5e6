package peer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hashicorp/memberlist"
	"github.com/ringlimit/ringlimit/peer/internal/ownlog"
	"github.com/ringlimit/ringlimit/peer/peerpb"
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
		fmt.Fprintf(&b, "%s: leader %v, live %v, p%d published %+v", nd.name, nd.lo.run.Lead() == nd.ops.start, nd.lo.run.LiveUntil() > nd.mono(), pid, nd.lo.run.Part(pid))
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

// awaitDecision asks nd for key, each time within a second, until it
// answers a decision (within 20 s), and returns it.
func awaitDecision(t *testing.T, nd *Node, key Key, what string) Decision {
	t.Helper()
	var d Decision
	waitFor(t, 20*time.Second, what, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var err error
		d, err = nd.Allow(ctx, Request{Key: key})
		return err == nil
	})
	return d
}

// TestLogClusterExactlyLimit: three log-owned nodes admit exactly the
// limit of one key through all of them, decided at one point.
func TestLogClusterExactlyLimit(t *testing.T) {
	t.Parallel()
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
	// Every node's Ownership agrees on the holders, and exactly the
	// holder says it decides, once no copy is under way (a holder moving
	// its backups toward the ring's second choice decides on none of the
	// partition it is copying, for the copy's while).
	var last string
	waitFor(t, 20*time.Second, "every node agreeing on one deciding holder per partition", func() bool {
		last = agreedHolders(c.nodes)
		return last == ""
	})
}

// agreedHolders returns "" when every node's Ownership names the same
// holder for every partition and exactly that holder decides; else what
// differs.
func agreedHolders(nodes []*Node) string {
	infos := make([]OwnershipInfo, len(nodes))
	for i, nd := range nodes {
		infos[i] = nd.Ownership()
		if infos[i].Mode != OwnershipLog || infos[i].Voters != len(nodes) || !infos[i].Live || infos[i].Leader == "" {
			return fmt.Sprintf("%s: Ownership %+v", nd.name, infos[i])
		}
	}
	for p := range infos[0].Partitions {
		deciding := 0
		for i, nd := range nodes {
			pi := infos[i].Partitions[p]
			if pi.Holder != infos[0].Partitions[p].Holder {
				return fmt.Sprintf("partition %d: %s says holder %q, %s says %q", p, nd.name, pi.Holder, nodes[0].name, infos[0].Partitions[p].Holder)
			}
			if pi.Deciding {
				deciding++
				if pi.Holder != nd.name {
					return fmt.Sprintf("partition %d: %s decides, holder %q", p, nd.name, pi.Holder)
				}
			}
		}
		if deciding != 1 {
			return fmt.Sprintf("partition %d: %d nodes decide, want 1", p, deciding)
		}
	}
	return ""
}

// TestLogTakeoverKeepsState kills the holder of a key at its limit: once
// the backup has taken over (after the holder's liveness expired), the
// key is still at its limit, and there was never a second decision point.
func TestLogTakeoverKeepsState(t *testing.T) {
	t.Parallel()
	metrics := newHoMetrics()
	logs := newHoLogs()
	cfg := logConfig(10, time.Minute)
	cfg.Metrics = metrics
	cfg.Logger = slog.New(logs)
	c := startCluster(t, 3, cfg)
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
	// The backup counts the key in its copy (Stats.ReplicaKeys).
	pid := holder.partIDForTest(key)
	backup := holder.backupForTest(pid)
	for _, nd := range c.nodes {
		if nd.name == backup {
			waitFor(t, 5*time.Second, "the backup's stats to count its copy's keys", func() bool { return nd.Stats().ReplicaKeys > 0 })
		}
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
	// Counted as gossip mode counts them: the key's state as taken over,
	// nothing lost.
	if metrics.handoffCount("takeover/ok") < 1 || metrics.handoffCount("lost/orphaned") != 0 {
		t.Fatalf("handoff metrics: takeover/ok %d keys, lost/orphaned %d; want at least the key, 0",
			metrics.handoffCount("takeover/ok"), metrics.handoffCount("lost/orphaned"))
	}
	// And logged as gossip mode logs them: one summary per member that
	// took over, naming the crashed one, once its takeovers are quiet.
	var sums []hoRecord
	waitFor(t, 10*time.Second, "a takeover summary", func() bool {
		sums = sums[:0]
		for _, nd := range rest {
			for _, r := range logs.find(nd.Name(), "partitions taken over from failed holder") {
				// Only the takeovers the kill caused: a loaded machine
				// may have ended a member's liveness while it started.
				if r.at.After(killed) {
					sums = append(sums, r)
				}
			}
		}
		return len(sums) > 0
	})
	parts := int64(0)
	for _, r := range sums {
		if r.attrs["peer"].String() != holder.Name() {
			t.Fatalf("a takeover summary names %s, want the crashed %s", r.attrs["peer"], holder.Name())
		}
		parts += r.attrs["partitions"].Int64()
	}
	if len(sums) > 2 || parts == 0 {
		t.Fatalf("%d takeover summaries over %d partitions, want one per survivor (1 or 2) and some", len(sums), parts)
	}
}

// TestLogLeaveMovesState closes the holder gracefully: its partitions
// move, the key stays at its limit, and the move costs no decision.
func TestLogLeaveMovesState(t *testing.T) {
	t.Parallel()
	metrics := newHoMetrics()
	cfg := logConfig(10, time.Minute)
	cfg.Metrics = metrics
	c := startCluster(t, 3, cfg)
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
	closing := time.Now()
	if err := holder.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	t.Logf("Close took %v", time.Since(closing).Round(time.Millisecond))
	if metrics.handoffCount("sent/ok") < 1 {
		t.Fatalf("the leave's moves counted %d keys sent, want at least the key", metrics.handoffCount("sent/ok"))
	}
	rest := c.live()
	// It moved its holdings and its backups off, then ended its own
	// liveness for good: nobody waits for it to expire.
	waitFor(t, 5*time.Second, "the leaver's liveness to end for good", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		tb, _ := rest[0].lo.run.Table(ctx)
		l := tb.Members[holder.lo.self]
		return l != nil && l.Ended
	})
	for p := range rest[0].pt.parts {
		if st := rest[0].lo.run.Part(p); st.Holder == holder.lo.self || st.Backup == holder.lo.self {
			t.Fatalf("partition %d still names the leaver: %+v", p, st)
		}
	}
	if more, owners := allowN(t, rest, key, 16); more != 0 {
		t.Fatalf("admitted %d more after the leave (owners %v), want 0", more, owners)
	}
}

// TestLogSplitHolderAndBackupCutOff cuts the log's traffic between a
// key's holder and backup and the other three of five members, while
// gossip and forwarding still work: the holder cannot extend its
// liveness, so it stops deciding by its own clock; the others end it but
// cannot hand the partition on (its state is only on the small side), so
// the key is unavailable, never empty; after the heal the state is whole.
// Clients on every node keep asking throughout, and no more than the
// limit is ever admitted.
func TestLogSplitHolderAndBackupCutOff(t *testing.T) {
	t.Parallel()
	// A limit the cut cannot reach, so that the state after the heal
	// tells whether any admission was lost or made twice.
	const limit = 160
	cfg := logConfig(limit, 10*time.Minute)
	// The cut is the log's alone and gossip must stay whole: lan timings,
	// whose probes a loaded machine under -race does not time out (with
	// the fast profile's 200 ms the ring flapped and never settled).
	cfg.Gossip = func(mc *memberlist.Config) { GossipLAN.Apply(mc) }
	c := startCluster(t, 5, cfg)
	key := Key{Tenant: "acme", Subject: "split", Policy: "api"}
	const pre = 32
	if admitted, _ := allowN(t, c.nodes[:1], key, pre); admitted != pre {
		t.Fatalf("admitted %d of %d before the cut, want all", admitted, pre)
	}
	pid := c.nodes[0].partIDForTest(key)
	byName := map[string]*Node{}
	for _, nd := range c.nodes {
		byName[nd.name] = nd
	}
	st := c.nodes[0].lo.run.Part(pid)
	holder, backup := byName[memberName(st.Holder)], byName[memberName(st.Backup)]
	if holder == nil || backup == nil {
		t.Fatalf("partition %d: holder %q backup %q", pid, st.Holder, st.Backup)
	}
	small := map[uint64]bool{holder.ops.start: true, backup.ops.start: true}
	for _, nd := range c.nodes {
		mine := small[nd.ops.start]
		drop := func(to uint64) bool { return small[to] != mine }
		nd.lo.raftDrop.Store(&drop)
	}
	t.Logf("cut: holder %s and backup %s from the other three", holder.name, backup.name)
	cut := time.Now()

	var mu sync.Mutex
	admitted, unavailable := pre, 0
	var lastSmall time.Time
	ask := func(nd *Node) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		d, err := nd.Allow(ctx, Request{Key: key})
		mu.Lock()
		defer mu.Unlock()
		if errors.Is(err, ErrUnavailable) {
			unavailable++
			return
		}
		if err != nil {
			t.Errorf("Allow on %s: %v", nd.name, err)
			return
		}
		if d.Allowed && d.Reason == ReasonAdmitted {
			admitted++
			if d.Owner == holder.name || d.Owner == backup.name {
				lastSmall = time.Now()
			}
		}
	}
	// During the cut: every node asks every 50 ms for 4 s (4 liveness
	// periods), and never more than one node may decide.
	var wg sync.WaitGroup
	stop := time.Now().Add(4 * time.Second)
	for _, nd := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for i := 0; i < 200 && time.Now().Before(stop); i++ {
				ask(nd)
				<-tick.C
			}
		}()
	}
	waitFor(t, 8*time.Second, "the end of the cut", func() bool {
		if n, who := deciders(c, key); n > 1 {
			t.Fatalf("%d decision points during the cut (last %s)\n%s", n, who, logState(c, key))
		}
		return time.Now().After(stop)
	})
	wg.Wait()
	if holder.lo.run.MayDecide(pid, holder.mono()) {
		t.Fatalf("the cut-off holder still may decide %v after the cut\n%s", time.Since(cut), logState(c, key))
	}
	mu.Lock()
	if admitted >= limit {
		t.Fatalf("admitted %d during the cut, limit %d: the test needs a limit the cut cannot reach", admitted, limit)
	}
	if late := lastSmall.Sub(cut); late > 3*time.Second {
		t.Fatalf("the cut-off side admitted %v after the cut, past its 1 s liveness", late)
	}
	t.Logf("during the cut: %d admitted in all, %d unavailable, the small side's last admission %v after the cut", admitted, unavailable, lastSmall.Sub(cut).Round(time.Millisecond))
	mu.Unlock()

	for _, nd := range c.nodes {
		nd.lo.raftDrop.Store(nil)
	}
	healed := time.Now()
	// After the heal: ask until the key refuses as over its limit. Its
	// state (the first pre and every admission since) is whole, so that
	// happens at the limit: an admission recorded but answered
	// unavailable (its copy to the backup failed as the cut began) makes
	// it happen below, never above.
	overLimit := false
	for i := 0; i < 3*limit && !overLimit; i++ {
		nd := c.nodes[i%len(c.nodes)]
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		d, err := nd.Allow(ctx, Request{Key: key})
		cancel()
		mu.Lock()
		switch {
		case err == nil && d.Allowed:
			admitted++
		case err == nil && d.Reason == ReasonOverLimit:
			overLimit = true
		case err != nil && !errors.Is(err, ErrUnavailable):
			t.Fatalf("Allow on %s: %v", nd.name, err)
		}
		a := admitted
		mu.Unlock()
		if a > limit {
			t.Fatalf("admitted %d after the heal, limit %d", a, limit)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !overLimit {
		t.Fatalf("no refusal after the heal with %d admitted: the key stayed unavailable\n%s", admitted, logState(c, key))
	}
	t.Logf("healed: %d admitted in all (limit %d; %d answered unavailable, their outcome unknown), over the limit %v after the heal",
		admitted, limit, unavailable, time.Since(healed).Round(time.Millisecond))
	if n, _ := deciders(c, key); n != 1 {
		t.Fatalf("%d decision points after the heal, want 1", n)
	}
}

// TestLogIsolatedMemberStopsAndSaysSo cuts one member off from the log
// (gossip still sees it): it stops deciding for its partitions within its
// lease, reports itself not ready because the log has no leader, and the
// other two take its partitions over from the backups; after the heal it
// is ready again.
func TestLogIsolatedMemberStopsAndSaysSo(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 3, logConfig(10, time.Minute))
	lone := c.nodes[2]
	held := -1
	for p := range lone.pt.parts {
		if lone.lo.run.MayDecide(p, lone.mono()) {
			held = p
			break
		}
	}
	if held < 0 {
		t.Fatalf("%s holds no partition", lone.name)
	}
	cut := func(on bool) {
		for _, nd := range c.nodes {
			if !on {
				nd.lo.raftDrop.Store(nil)
				continue
			}
			me := nd == lone
			drop := func(to uint64) bool { return me || to == lone.ops.start }
			nd.lo.raftDrop.Store(&drop)
		}
	}
	cut(true)
	at := time.Now()
	waitFor(t, 5*time.Second, "the cut-off member to stop deciding", func() bool { return !lone.lo.run.MayDecide(held, lone.mono()) })
	stopped := time.Since(at)
	waitFor(t, 10*time.Second, "another member to decide for its partition", func() bool {
		for _, nd := range c.nodes[:2] {
			if nd.lo.run.MayDecide(held, nd.mono()) {
				return true
			}
		}
		return false
	})
	took := time.Since(at)
	if stopped > took {
		t.Fatalf("the cut-off member stopped %v after the cut, after its partition was taken over (%v)", stopped, took)
	}
	var reason string
	waitFor(t, 10*time.Second, "the cut-off member to report the log without a leader", func() bool {
		ok, r := lone.Ready()
		reason = r
		return !ok && strings.Contains(r, "no leader of the ownership log")
	})
	t.Logf("cut off: stopped deciding after %v, taken over after %v; readiness: %s", stopped.Round(time.Millisecond), took.Round(time.Millisecond), reason)
	cut(false)
	waitFor(t, 20*time.Second, "the member to be ready again", func() bool { ok, _ := lone.Ready(); return ok })
}

// TestLogFounderServesAtOnce: a node that founds a log-owned cluster
// returns from New ready, holding every partition.
func TestLogFounderServesAtOnce(t *testing.T) {
	cfg := logConfig(5, time.Minute)
	cfg.Name = "founder"
	cfg.Logger = testLogger(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	nd, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nd.Close(context.Background()) })
	took := time.Since(start)
	if ok, why := nd.Ready(); !ok {
		t.Fatalf("not ready when New returned (%v): %s", took, why)
	}
	d, err := nd.Allow(ctx, Request{Key: Key{Tenant: "t", Subject: "s", Policy: "api"}})
	if err != nil || !d.Allowed || d.Owner != "founder" {
		t.Fatalf("first Allow = %+v, %v", d, err)
	}
	t.Logf("New returned ready after %v", took.Round(time.Millisecond))
}

// TestLogRestartedHolder kills a key's holder and starts a new process
// under the same name at once: the new process is a new incarnation, the
// old one is ended for good, the backup continues from its copy, and the
// key stays at its limit throughout.
func TestLogRestartedHolder(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 3, logConfig(10, time.Minute))
	key := Key{Tenant: "acme", Subject: "restart", Policy: "api"}
	if admitted, _ := allowN(t, c.nodes, key, 48); admitted != 10 {
		t.Fatalf("admitted %d of 48, want 10", admitted)
	}
	st := c.nodes[0].lo.run.Part(c.nodes[0].partIDForTest(key))
	var holder *Node
	for _, nd := range c.nodes {
		if nd.lo.self == st.Holder {
			holder = nd
		}
	}
	if holder == nil {
		t.Fatalf("no node is the holder %q", st.Holder)
	}
	gossipAddr, rpcAddr := holder.GossipAddr(), holder.RPCAddr()
	holder.KillForTest()
	// On the same addresses, as a supervisor restarts a process: a new
	// process there replaces the old member at once.
	again := c.addWith(holder.name, func(cfg *Config) { cfg.GossipAddr, cfg.RPCAddr = gossipAddr, rpcAddr })
	if again.lo.self == holder.lo.self {
		t.Fatalf("the restarted process has the old incarnation's ID %s", again.lo.self)
	}
	c.waitMembers(3)
	if more, owners := allowN(t, c.live(), key, 24); more != 0 {
		t.Fatalf("admitted %d more after the restart (owners %v), want 0\n%s", more, owners, logState(c, key))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	tb, _ := again.lo.run.Table(ctx)
	if l := tb.Members[holder.lo.self]; l == nil || !l.Ended {
		t.Fatalf("the old incarnation's record is %+v, want ended for good", l)
	}
}

// TestLogLocalPathAllocs: with log ownership the holder's decision asks
// the runner's published snapshot, and still allocates nothing.
func TestLogLocalPathAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	c := startCluster(t, 1, Config{Ownership: OwnershipLog, Policies: map[string]PolicyConfig{"p": {Limit: 1 << 40, Window: time.Second}}})
	nd := c.nodes[0]
	ctx := context.Background()
	req := Request{Key: Key{Tenant: "t", Subject: "s", Policy: "p"}}
	if d, err := nd.Allow(ctx, req); err != nil || d.Owner != nd.name {
		t.Fatalf("Allow = %+v, %v", d, err)
	}
	if a := testing.AllocsPerRun(1000, func() {
		if _, err := nd.Allow(ctx, req); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Fatalf("Node.Allow on the local path allocates %.1f times per call, want 0", a)
	}
}

// TestLogWithPeerAuth: the log's messages go through the same peer
// authentication as every peer RPC, so a cluster with a peer secret
// settles and decides.
func TestLogWithPeerAuth(t *testing.T) {
	t.Parallel()
	cfg := logConfig(10, time.Minute)
	cfg.PeerSecret = []byte("0123456789abcdef0123456789abcdef")
	c := startCluster(t, 3, cfg)
	key := Key{Tenant: "acme", Subject: "auth", Policy: "api"}
	if admitted, owners := allowN(t, c.nodes, key, 24); admitted != 10 || len(owners) != 1 {
		t.Fatalf("admitted %d of 24 (owners %v), want 10 from one owner", admitted, owners)
	}
}

// TestLogRaftNeedsPeerAuth: with a peer secret, a client without the
// token cannot feed the node's log a message.
func TestLogRaftNeedsPeerAuth(t *testing.T) {
	cfg := logConfig(10, time.Minute)
	cfg.PeerSecret = []byte("0123456789abcdef0123456789abcdef")
	c := startCluster(t, 1, cfg)
	conn, err := grpc.NewClient(c.nodes[0].RPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, "/"+ownlog.ServiceName+"/Stream")
	if err == nil {
		_ = st.SendMsg(&wrapperspb.BytesValue{Value: []byte("not a raft message")})
		_ = st.CloseSend()
		err = st.RecvMsg(&emptypb.Empty{})
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("raft stream without the peer token: %v, want Unauthenticated", err)
	}
}

// TestLogTwoMembersWarn: a cluster that stays at two members says, once,
// that its log needs both.
func TestLogTwoMembersWarn(t *testing.T) {
	t.Parallel()
	base := logConfig(10, time.Minute)
	base.LeaseDuration = 200 * time.Millisecond // the warning comes after 10 leases
	logs := newHoLogs()
	base.Logger = slog.New(logs)
	// Two members, not waited on to settle: leases this short lapse on a
	// loaded machine, and the warning needs only the view of two.
	c := &cluster{t: t, base: base}
	c.add("n0")
	c.add("n1")
	waitFor(t, 10*time.Second, "the two-member warning", func() bool {
		return len(logs.find(c.nodes[0].Name(), "cluster of two members: the ownership log has one voter, so losing that member stops every decision (losing the other, its partitions are taken over); run three or more")) > 0
	})
}

// TestLogTwoMembersLearnerCrash: a log of two members has one voter (the
// founder) and a learner, so a crash of the learner leaves the log its
// majority: the founder takes the learner's partitions over with their
// state. (With two voters the log stopped for good.)
func TestLogTwoMembersLearnerCrash(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 2, logConfig(5, time.Hour))
	n0, n1 := c.nodes[0], c.nodes[1]
	waitFor(t, 20*time.Second, "both nodes settled", func() bool { return n0.Settled() && n1.Settled() })
	if v := n0.Ownership().Voters; v != 1 {
		t.Fatalf("a log of two members has %d voters, want 1", v)
	}
	key := pmKeyOwnedBy(t, n0, "api", n1.Name())
	if admitted, _ := allowN(t, []*Node{n0, n1}, key, 8); admitted != 5 {
		t.Fatalf("admitted %d of 8 before the crash, want the limit 5", admitted)
	}
	n1.KillForTest()
	d := awaitDecision(t, n0, key, "n0 deciding n1's key")
	if d.Allowed || d.Owner != n0.Name() {
		t.Fatalf("after the learner's crash: %+v; want n0 refusing (the key is at its limit)", d)
	}
}

// TestLogTwoMembersVoterLeaves: the founder, the one voter of a log of
// two, leaves gracefully: the learner is made a voter before the founder
// goes, so the log keeps a majority and the member left decides alone.
func TestLogTwoMembersVoterLeaves(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 2, logConfig(5, time.Hour))
	n0, n1 := c.nodes[0], c.nodes[1]
	waitFor(t, 20*time.Second, "both nodes settled", func() bool { return n0.Settled() && n1.Settled() })
	key := pmKeyOwnedBy(t, n0, "api", n0.Name())
	if admitted, _ := allowN(t, []*Node{n0, n1}, key, 8); admitted != 5 {
		t.Fatalf("admitted %d of 8 before the leave, want the limit 5", admitted)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := n0.Close(ctx); err != nil {
		t.Fatalf("the founder's Close: %v", err)
	}
	d := awaitDecision(t, n1, key, "n1 deciding alone")
	if d.Allowed || d.Owner != n1.Name() {
		t.Fatalf("after the founder left: %+v; want n1 refusing (the key is at its limit)", d)
	}
	if info := n1.Ownership(); info.Voters != 1 || info.Leader != n1.Name() {
		t.Fatalf("n1's log after the founder left: %d voters, leader %q; want 1, itself", info.Voters, info.Leader)
	}
}

// TestLogLeaverBackingAtCloseDeadlineEndsItsLiveness: a member closes
// with a deadline shorter than its wait for the holders it backs to copy
// elsewhere (they cannot: their copies to each other fail). It still
// hands on its vote and ends its liveness before the deadline: when the
// drain returned at the deadline with only backups left, it went
// without either, and the log counted a voter that was gone until
// autopilot found it silent, its holders waiting a lease to re-back.
func TestLogLeaverBackingAtCloseDeadlineEndsItsLiveness(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 3, logConfig(1000, time.Minute))
	n0, n1, n2 := c.nodes[0], c.nodes[1], c.nodes[2]
	waitFor(t, 20*time.Second, "all settled", func() bool { return n0.Settled() && n1.Settled() && n2.Settled() })
	n1.setCopyUnsentForTest(func(_ int, to string) bool { return to == n2.Name() })
	n2.setCopyUnsentForTest(func(_ int, to string) bool { return to == n1.Name() })
	// 6 s: shorter than the drain's wait for backups to move (10
	// leases); the leave keeps half of it.
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	start := time.Now()
	err := n0.Close(ctx)
	took := time.Since(start)
	t.Logf("n0's Close: %v after %v", err, took.Round(time.Millisecond))
	if took > 7*time.Second {
		t.Fatalf("Close took %v with a 6 s deadline", took)
	}
	ectx, ecancel := context.WithTimeout(context.Background(), time.Second)
	defer ecancel()
	if ended := n1.lo.run.Ended(ectx, []string{n0.lo.self}); !ended[n0.lo.self] {
		dctx, dcancel := context.WithTimeout(context.Background(), time.Second)
		defer dcancel()
		t.Fatalf("right after n0's Close, n1's table has not ended n0's liveness; log: %s", n1.lo.run.Describe(dctx))
	}
}

// TestLogLeaderCrashKeepsHolders kills the log's leader: the election
// that follows ends within the other holders' leases (a new leader makes
// every member extend at once), so a key held and backed up elsewhere
// stays decidable.
func TestLogLeaderCrashKeepsHolders(t *testing.T) {
	t.Parallel()
	cfg := logConfig(1_000_000, time.Minute)
	cfg.LeaseDuration = 2 * time.Second // the default
	c := startCluster(t, 3, cfg)
	var leader *Node
	for _, nd := range c.nodes {
		if nd.Ownership().Leader == nd.name {
			leader = nd
		}
	}
	if leader == nil {
		t.Fatal("no leader")
	}
	var key Key
	var holder *Node
	for i := 0; holder == nil && i < 1000; i++ {
		k := Key{Tenant: "acme", Subject: fmt.Sprintf("lc-%d", i), Policy: "api"}
		st := leader.lo.run.Part(leader.partIDForTest(k))
		if st.Backup == leader.lo.self {
			continue // a key whose backup dies waits for a new backup: another scene
		}
		for _, nd := range c.nodes {
			if nd != leader && nd.lo.self == st.Holder {
				key, holder = k, nd
			}
		}
	}
	if holder == nil {
		t.Fatal("no key held and backed up away from the leader")
	}
	leader.KillForTest()
	killed := time.Now()
	var worst, gap time.Duration
	var since time.Time
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for time.Since(killed) < 4*time.Second {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		d, err := holder.Allow(ctx, Request{Key: key})
		cancel()
		switch {
		case errors.Is(err, ErrUnavailable):
			if since.IsZero() {
				since = time.Now()
			}
		case err != nil:
			t.Fatalf("Allow: %v", err)
		case !d.Allowed || d.Owner != holder.name:
			t.Fatalf("Allow = %+v, want admitted by %s", d, holder.name)
		default:
			if !since.IsZero() {
				gap, since = time.Since(since), time.Time{}
				worst = max(worst, gap)
			}
		}
		<-tick.C
	}
	if !since.IsZero() {
		worst = max(worst, time.Since(since))
	}
	t.Logf("leader %s killed: a key held by %s was unavailable for at most %v", leader.name, holder.name, worst.Round(time.Millisecond))
	if worst > time.Second {
		t.Fatalf("a key held away from the crashed leader was unavailable for %v: the election outlasted the holder's lease", worst)
	}
}

// TestLogRaiseRecopies: a policy's replication raised from off to sync
// makes every holder copy its partitions again before it decides again,
// so that admissions made unreplicated survive the holder's crash once a
// decision has been answered under sync.
func TestLogRaiseRecopies(t *testing.T) {
	t.Parallel()
	off := logConfig(5, time.Minute)
	p := off.Policies["api"]
	p.Replication = ReplicateOff
	off.Policies["api"] = p
	c := startCluster(t, 3, off)
	key := Key{Tenant: "acme", Subject: "raise", Policy: "api"}
	var holder *Node
	for _, nd := range c.nodes {
		if nd.lo.self == nd.lo.run.Part(nd.partIDForTest(key)).Holder {
			holder = nd
		}
	}
	for i := range 5 {
		if d, err := holder.Allow(context.Background(), Request{Key: key}); err != nil || !d.Allowed {
			t.Fatalf("admission %d: %+v, %v", i+1, d, err)
		}
	}
	sync := logConfig(5, time.Minute).Policies // replication sync (the default)
	for _, nd := range c.nodes {
		if err := nd.SetPolicies(sync); err != nil {
			t.Fatal(err)
		}
	}
	// A decision under the new table: answered only once the re-copy is
	// the backup's (unavailable until then: every partition is copied
	// again at once, which a loaded machine takes seconds for).
	waitFor(t, 30*time.Second, "a decision under the new table", func() bool {
		d, err := holder.Allow(context.Background(), Request{Key: key})
		if err != nil && !errors.Is(err, ErrUnavailable) {
			t.Fatalf("the key after the change: %v", err)
		}
		if err == nil && d.Allowed {
			t.Fatalf("the key at its limit admitted after the change: %+v", d)
		}
		return err == nil
	})
	holder.KillForTest()
	var rest []*Node
	for _, nd := range c.nodes {
		if nd != holder {
			rest = append(rest, nd)
		}
	}
	d := awaitDecision(t, rest[0], key, "a decision after the takeover")
	if d.Allowed {
		t.Fatalf("admitted after the takeover (%+v): the backup's copy lacked the admissions made under replication off", d)
	}
}

// TestLogSeparateClustersRefuse: two nodes found a cluster each, then
// meet through gossip. Their logs never merge (each holds every partition
// in its own): each ignores the other's member, says so in its log and
// its readiness, and keeps its own promise; neither forwards to the other.
func TestLogSeparateClustersRefuse(t *testing.T) {
	logs := newHoLogs()
	base := logConfig(3, time.Minute)
	base.Logger = slog.New(logs)
	a := &cluster{t: t, base: base}
	na := a.add("a")
	b := &cluster{t: t, base: base}
	nb := b.add("b")
	k := Key{Tenant: "t", Subject: "s", Policy: "api"}
	if n, err := nb.Join(context.Background(), []string{na.GossipAddr()}); err != nil || n == 0 {
		t.Fatalf("gossip join of the second cluster: %d, %v", n, err)
	}
	for _, nd := range []*Node{na, nb} {
		waitFor(t, 10*time.Second, nd.Name()+" not ready for ignoring the other cluster", func() bool {
			ok, _, code := nd.ops.ready.readiness()
			return !ok && code == ReadyReasonIgnored
		})
		if len(logs.find(nd.Name(), "member ignored: it belongs to another cluster, founded separately")) == 0 {
			t.Fatalf("%s did not log the other cluster's member", nd.Name())
		}
		if m := nd.Members(); len(m) != 1 || m[0] != nd.Name() {
			t.Fatalf("%s's members %v, want itself only", nd.Name(), m)
		}
		if len(logs.find(nd.Name(), "joined another cluster founded separately: partition state dropped")) != 0 {
			t.Fatalf("%s gave way: log ownership never merges two logs", nd.Name())
		}
		// Each cluster is whole on its own: exactly its limit, decided
		// by itself.
		admitted := 0
		for range 5 {
			d, err := nd.Allow(context.Background(), Request{Key: k})
			if err != nil {
				t.Fatalf("via %s: %v", nd.Name(), err)
			}
			if d.Owner != nd.Name() {
				t.Fatalf("via %s: decided by %s", nd.Name(), d.Owner)
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted != 3 {
			t.Fatalf("%s admitted %d of 5, want its limit 3", nd.Name(), admitted)
		}
	}
}

// raftRecorder is a Metrics with the optional RaftTrafficFrom: it keeps
// the read function its node hands it.
type raftRecorder struct {
	nopMetrics
	read atomic.Pointer[func() RaftTraffic]
}

func (r *raftRecorder) RaftTrafficFrom(read func() RaftTraffic) { r.read.Store(&read) }

// TestLogRaftTrafficMetrics: three log-owned nodes count the log's
// messages, bytes, proposals and applied commands in Node.RaftTraffic,
// the message counts keep growing at rest (heartbeats, keep-alives: no
// command is proposed at rest any more), and
// each node hands a Metrics that exports them (RaftTrafficSource, as
// peer/prommetrics's) a function that reads those same counters.
func TestLogRaftTrafficMetrics(t *testing.T) {
	recs := make([]*raftRecorder, 3)
	c := startClusterWith(t, 3, logConfig(100, time.Minute), func(i int, cfg *Config) {
		recs[i] = &raftRecorder{}
		cfg.Metrics = recs[i]
	})
	first := make([]RaftTraffic, len(c.nodes))
	for i, nd := range c.nodes {
		waitFor(t, 20*time.Second, nd.name+" sending raft messages and applying commands", func() bool {
			first[i] = nd.RaftTraffic()
			return first[i].MessagesSent > 0 && first[i].BytesSent > first[i].MessagesSent && first[i].Proposals > 0 && first[i].Applied > 0 &&
				first[i].MessagesReceived > 0 && first[i].BytesReceived > first[i].MessagesReceived
		})
	}
	for i, nd := range c.nodes {
		waitFor(t, 20*time.Second, nd.name+"'s raft counters growing", func() bool {
			now := nd.RaftTraffic()
			return now.MessagesSent > first[i].MessagesSent && now.BytesSent > first[i].BytesSent &&
				now.Proposals >= first[i].Proposals && now.Applied >= first[i].Applied &&
				now.MessagesReceived > first[i].MessagesReceived && now.BytesReceived > first[i].BytesReceived
		})
		// What the Metrics reads is the node's counters then and there:
		// at least what RaftTraffic said a moment before, and no more
		// than it says after.
		read := recs[i].read.Load()
		if read == nil {
			t.Fatalf("%s never handed its Metrics a RaftTraffic source", nd.name)
		}
		before := nd.RaftTraffic()
		got := (*read)()
		after := nd.RaftTraffic()
		for _, w := range []struct {
			name          string
			lo, v, hi     uint64
			wantAboveZero bool
		}{
			{"messages sent", before.MessagesSent, got.MessagesSent, after.MessagesSent, true},
			{"bytes sent", before.BytesSent, got.BytesSent, after.BytesSent, true},
			{"messages received", before.MessagesReceived, got.MessagesReceived, after.MessagesReceived, true},
			{"bytes received", before.BytesReceived, got.BytesReceived, after.BytesReceived, true},
			{"proposals", before.Proposals, got.Proposals, after.Proposals, true},
			{"applied", before.Applied, got.Applied, after.Applied, true},
			{"dropped", before.MessagesDropped, got.MessagesDropped, after.MessagesDropped, false},
			{"shed", before.MessagesShed, got.MessagesShed, after.MessagesShed, false},
			{"conf changes", before.ConfChanges, got.ConfChanges, after.ConfChanges, false},
		} {
			if w.v < w.lo || w.v > w.hi || w.wantAboveZero && w.v == 0 {
				t.Errorf("%s: the Metrics read %s = %d, want in [%d, %d]%s", nd.name, w.name, w.v, w.lo, w.hi, map[bool]string{true: ", above 0"}[w.wantAboveZero])
			}
		}
	}
	// Autopilot added the two joiners: the founder, leading, proposed
	// their configuration changes.
	var conf uint64
	for _, nd := range c.nodes {
		conf += nd.RaftTraffic().ConfChanges
	}
	if conf < 2 {
		t.Errorf("%d configuration changes counted, want at least 2 (two learners added)", conf)
	}
}

// TestLogCopyWaitsForReplication: an admission decided before a holder
// fences a partition to copy it may still be on its way to the copy's
// receiver (async replication, or a sync one not yet answered). A backup
// adds the admissions it receives to its copy, so one that landed after a
// copy that already holds it would count twice: under load this test
// found the backup counting 3 where the holder counted 2, and the join
// and leave tests "owners counted 1 admissions nobody was told of". The
// holder now waits for the replication queued to the receiver to be
// answered before it exports the copy.
func TestLogCopyWaitsForReplication(t *testing.T) {
	t.Parallel()
	cfg := logConfig(1000, time.Minute)
	cfg.ForwardTimeout = 10 * time.Second
	p := cfg.Policies["api"]
	p.Replication = ReplicateAsync
	cfg.Policies["api"] = p
	c := startCluster(t, 3, cfg)
	key := Key{Tenant: "acme", Subject: "in-flight", Policy: "api"}
	var holder, backup *Node
	for _, nd := range c.nodes {
		if nd.lo.self == nd.lo.run.Part(nd.partIDForTest(key)).Holder {
			holder = nd
		}
	}
	for _, nd := range c.nodes {
		if nd.Name() == holder.backupForTest(holder.partIDForTest(key)) {
			backup = nd
		}
	}
	if backup == nil {
		t.Fatalf("the key's holder %s has no backup", holder.Name())
	}
	pid := holder.partIDForTest(key)
	release, applied := make(chan struct{}), make(chan struct{})
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	t.Cleanup(let) // a failure must not leave the backup's handler held
	var held atomic.Bool
	backup.setReplHoldForTest(func(req *peerpb.ReplicateRequest) func() {
		if req.GetSender() != holder.Name() || len(req.GetAdmitsPacked()) == 0 && !hasAdmit(req) || !held.CompareAndSwap(false, true) {
			return nil
		}
		<-release
		return func() { close(applied) }
	})
	ctx := context.Background()
	if d, err := holder.Allow(ctx, Request{Key: key}); err != nil || !d.Allowed {
		t.Fatalf("the first admission: %+v, %v", d, err)
	}
	waitFor(t, 10*time.Second, "the admission's replication to reach the backup", held.Load)
	before := backup.copyForTest(pid, holder.Name())
	// Raising the policy's replication makes every holder copy its
	// partitions again.
	barriers := holder.links.copyBarriers.Load()
	raised := make(chan error, len(c.nodes))
	for _, nd := range c.nodes {
		go func() { raised <- nd.SetPolicies(logConfig(1000, time.Minute).Policies) }()
	}
	// The re-copy to the backup waits for the held admission's answer.
	waitFor(t, 10*time.Second, "a copy to wait for the replication in flight", func() bool {
		return holder.links.copyBarriers.Load() > barriers
	})
	if backup.copyForTest(pid, holder.Name()) != before {
		t.Fatalf("the backup installed a new copy of partition %d while an admission to it was in flight", pid)
	}
	let()
	<-applied
	for range c.nodes {
		if err := <-raised; err != nil {
			t.Fatal(err)
		}
	}
	// A second admission, under sync: answered once the backup applied
	// it (the first was applied before). An attempt that timed out on a
	// loaded machine may have been admitted too, and replicated ahead of
	// the one answered: the holder's count is what the backup must match.
	d := awaitDecision(t, holder, key, "a decision under the raised policy")
	if !d.Allowed || d.Remaining > 998 {
		t.Fatalf("the second admission: %+v; want admitted with at most 998 remaining", d)
	}
	want := 1000 - d.Remaining
	runs, ok := backup.ExportForTest(key)
	var n int64
	for _, r := range runs {
		n += r.Count
	}
	if !ok || n != want {
		t.Fatalf("the backup's copy counts %d admissions of the key (%v); want %d, as the holder", n, runs, want)
	}
}
