package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/shard"
)

const demoUsage = `Usage: ringlimit demo [-v] [--log-level L]

Starts a 3-node ringlimit cluster on 127.0.0.1 inside this process, plus one
node as a child process (this same binary running "serve"), and walks through
what ringlimit promises, with real decisions:

  1. boundary burst: a fixed window admits 200 around its edge, the sliding log 100
  2. exact expiry: an admission expires exactly one window later, not 1 ms sooner
  3. one decision point: 3 local limiters admit 300, the cluster exactly 100
  4. graceful leave: a key's quota moves with it
  5. crash: the owner is SIGKILLed; requests are "unavailable", never "over limit",
     until the ring converges and decisions resume
  6. hot keys: each owner reports its heaviest keys
  7. concurrency cap: leases never exceed the cap; a lease never released
     comes back after its TTL

Tables go to stdout, the nodes' logs to stderr: by default only their
warnings and errors (a crash's forward failures and takeover summaries), so
the walkthrough reads cleanly on a terminal. Exits 1 if any promise it shows
does not hold. Takes a few seconds; needs no network beyond loopback.

Flags:
  -v                  also log the nodes' lifecycle (gossip membership,
                      readiness, handoffs): --log-level info
  --log-level L       debug, info, warn or error (default warn)
`

// demoPolicies is the demo's policy table. The child node loads the same
// table from a file, so that every holder decides alike.
func demoPolicies() map[string]peer.PolicyConfig {
	return map[string]peer.PolicyConfig{
		"api":   {Limit: 100, Window: time.Minute},
		"login": {Limit: 5, Window: time.Minute},
		"feed":  {Limit: 1_000_000, Window: time.Minute, Algorithm: peer.TokenBucket},
		// At most 3 jobs in progress per subject; a lease not released
		// expires after demoLeaseTTL.
		"jobs": {Limit: 3, Window: demoLeaseTTL, Algorithm: peer.Concurrency},
	}
}

// demo holds the walkthrough's output and the promises checked so far.
type demo struct {
	out    io.Writer
	log    *slog.Logger
	level  slog.Level // of log, and of the child's lines passed on
	stderr io.Writer
	// gossipKey encrypts the cluster's gossip and authenticates its peer
	// RPCs (the child reads it from gossip.key beside the policy file).
	gossipKey []byte
	held      []string
	failed    []string
}

// promise records and prints one checked promise.
func (d *demo) promise(ok bool, format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	if ok {
		d.held = append(d.held, msg)
		fmt.Fprintf(d.out, "  ✓ %s\n", msg)
		return
	}
	d.failed = append(d.failed, msg)
	fmt.Fprintf(d.out, "  ✗ FAILED: %s\n", msg)
}

func (d *demo) heading(format string, a ...any) {
	fmt.Fprintf(d.out, "\n== %s ==\n", fmt.Sprintf(format, a...))
}

// table returns a tabwriter for one aligned table; call Flush when done.
func (d *demo) table() *tabwriter.Writer {
	return tabwriter.NewWriter(d.out, 0, 0, 2, ' ', 0)
}

// runDemo runs the walkthrough. It returns an error (exit 1) if the cluster
// cannot be set up or any promise fails.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, demoUsage) }
	verbose := fs.Bool("v", false, "")
	levelName := fs.String("log-level", "warn", "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError("demo: " + err.Error())
	}
	if fs.NArg() > 0 {
		return usageError(fmt.Sprintf("demo: unexpected argument %q", fs.Arg(0)))
	}
	level, err := parseLevel(*levelName)
	if err != nil {
		return usageError("demo: " + err.Error())
	}
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "log-level" })
	if *verbose && !given {
		level = slog.LevelInfo
	}
	log, err := newLogger(stderr, "text", level, true)
	if err != nil {
		return err
	}
	start := time.Now()
	d := &demo{out: stdout, log: log, level: level, stderr: stderr}
	fmt.Fprintln(stdout, "ringlimit demo: at most L admissions in any rolling window (t − W, t], cluster-wide")

	d.boundaryBurst()
	d.expiryEdge()
	if err := d.cluster(ctx); err != nil {
		return fmt.Errorf("demo: %w", err)
	}

	fmt.Fprintln(stdout)
	if len(d.failed) > 0 {
		fmt.Fprintf(stdout, "%d of %d promises FAILED (%.1fs):\n", len(d.failed), len(d.held)+len(d.failed), time.Since(start).Seconds())
		for _, f := range d.failed {
			fmt.Fprintf(stdout, "  - %s\n", f)
		}
		return &exitError{code: exitFailure, err: fmt.Errorf("demo: %d promises failed", len(d.failed))}
	}
	fmt.Fprintf(stdout, "all %d promises held (%.1fs)\n", len(d.held), time.Since(start).Seconds())
	return nil
}

// demoEpoch is the demo's fixed clock origin for the single-key limiters, in
// Unix seconds: a whole second, so fixed windows of 1 s start exactly at
// offsets 0, 1 s, ...
const demoEpoch = 1_700_000_000

// burst asks l for n single-unit admissions at offset at and counts them.
func burst(l *shard.Limiter, at time.Duration, n int) (admitted int, last shard.Decision) {
	for range n {
		dec, err := l.Allow(time.Unix(demoEpoch, 0).Add(at), 1)
		if err != nil {
			// Times only move forward here and hits are 1: unreachable.
			return admitted, last
		}
		last = dec
		if dec.Allowed {
			admitted++
		}
	}
	return admitted, last
}

func secs(d time.Duration) string { return fmt.Sprintf("%.3fs", d.Seconds()) }

// boundaryBurst is step 1: L=100 per 1 s, 100 requests 100 ms before a
// window edge and 100 just after it (the boundary facts scaled to W = 1 s).
func (d *demo) boundaryBurst() {
	const limit, w = 100, time.Second
	before, after := w-100*time.Millisecond, w+100*time.Millisecond
	d.heading("1. Boundary burst: limit %d per %v; %d requests at %s and %d at %s", limit, w, limit, secs(before), limit, secs(after))
	tw := d.table()
	fmt.Fprintf(tw, "  algorithm\tat %s\tat %s\tadmitted within 200ms\tcomment\n", secs(before), secs(after))
	got := map[shard.Algorithm]int{}
	for _, a := range []shard.Algorithm{shard.FixedWindow, shard.TokenBucket, shard.SlidingLog} {
		l, err := shard.NewLimiter(shard.Policy{Limit: limit, Window: w, Algorithm: a})
		if err != nil {
			d.promise(false, "build a %v limiter: %v", a, err)
			continue
		}
		n1, _ := burst(l, before, limit)
		n2, _ := burst(l, after, limit)
		got[a] = n1 + n2
		comment := map[shard.Algorithm]string{
			shard.FixedWindow: "the count resets at the edge (1.000s): 2L in 200ms",
			shard.TokenBucket: "smooths a rate (refills 1 per 10ms), does not cap a window",
			shard.SlidingLog:  "counts every admission in (t − 1s, t]",
		}[a]
		fmt.Fprintf(tw, "  %v\t%d/%d\t%d/%d\t%d\t%s\n", a, n1, limit, n2, limit, n1+n2, comment)
	}
	_ = tw.Flush()
	d.promise(got[shard.FixedWindow] == 2*limit, "fixed window admits %d around its edge (want %d: the boundary problem)", got[shard.FixedWindow], 2*limit)
	d.promise(got[shard.SlidingLog] == limit, "sliding log admits %d (want exactly %d)", got[shard.SlidingLog], limit)
	tb := got[shard.TokenBucket]
	d.promise(tb <= limit+limit/5, "token bucket admits %d ≤ L + d·L/W = %d (its own, different promise)", tb, limit+limit/5)
}

// expiryEdge is step 2: admissions expire exactly W after they were made.
func (d *demo) expiryEdge() {
	const w = time.Second
	d.heading("2. Exact expiry edge: the window is (t − W, t]; an admission exactly W old has expired")
	big, _ := shard.NewLimiter(shard.Policy{Limit: 100, Window: w})
	one, _ := shard.NewLimiter(shard.Policy{Limit: 1, Window: w})
	rows := []struct {
		l         *shard.Limiter
		at        time.Duration
		n, want   int           // requests sent, admissions wanted
		wantRetry time.Duration // for a refusal: the exact wait
	}{
		{big, 900 * time.Millisecond, 100, 100, 0},
		{big, 1899 * time.Millisecond, 1, 0, time.Millisecond},
		{big, 1900 * time.Millisecond, 1, 1, 0},
		{one, 0, 1, 1, 0},
		{one, w - time.Millisecond, 1, 0, time.Millisecond},
		{one, w, 1, 1, 0},
	}
	tw := d.table()
	fmt.Fprintf(tw, "  limit\ttime\trequests\tadmitted\tretry_after\twant\n")
	ok := true
	for _, r := range rows {
		admitted, last := burst(r.l, r.at, r.n)
		retry, want := "-", fmt.Sprintf("%d admitted", r.want)
		if last.RetryAfter > 0 {
			retry = last.RetryAfter.String()
		}
		if r.want == 0 {
			want = "refused, retry after " + r.wantRetry.String()
		}
		ok = ok && admitted == r.want && last.RetryAfter == r.wantRetry
		fmt.Fprintf(tw, "  %d\t%s\t%d\t%d\t%s\t%s\n", r.l.Policy().Limit, secs(r.at), r.n, admitted, retry, want)
	}
	_ = tw.Flush()
	d.promise(ok, "refused 1 ms before the admission is W old (retry_after exactly 1ms), admitted exactly at W")
}

// cluster runs steps 3 to 6 on a live cluster.
func (d *demo) cluster(ctx context.Context) error {
	pols, dir, err := demoPolicyFile()
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if d.gossipKey, err = writeDemoGossipKey(dir); err != nil {
		return err
	}
	base := peer.Config{Policies: pols, GossipProfile: peer.GossipFast, Logger: d.log, ForwardTimeout: 2 * time.Second, GossipKey: d.gossipKey}
	fmt.Fprintln(d.out, "\nstarting a 3-node cluster on 127.0.0.1 (gossip and gRPC on ephemeral ports)...")
	nodes, err := startCluster(ctx, []string{"n1", "n2", "n3"}, base)
	if err != nil {
		return err
	}
	// Close is idempotent: the leaver, already closed, returns at once.
	defer closeAll(nodes, 5*time.Second)

	if err := d.oneDecisionPoint(ctx, nodes); err != nil {
		return err
	}
	leaver, live := nodes[2], nodes[:2]
	if err := d.gracefulLeave(ctx, live, leaver); err != nil {
		return err
	}
	if err := d.crash(ctx, live, filepath.Join(dir, "policies.yaml")); err != nil {
		return err
	}
	if err := d.hotKeys(ctx, live); err != nil {
		return err
	}
	return d.concurrencyCap(ctx, live)
}

// demoPolicyFile writes the demo's table to a temporary policy file and
// returns the table as parsed back from it: the in-process nodes and the
// child node then hold byte-for-byte the same table.
func demoPolicyFile() (map[string]peer.PolicyConfig, string, error) {
	dir, err := os.MkdirTemp("", "ringlimit-demo-")
	if err != nil {
		return nil, "", err
	}
	data, err := formatPolicies(demoPolicies())
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "policies.yaml"), data, 0o600)
	}
	var pols map[string]peer.PolicyConfig
	if err == nil {
		pols, err = loadPolicies(filepath.Join(dir, "policies.yaml"))
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", fmt.Errorf("policy file: %w", err)
	}
	return pols, dir, nil
}

// writeDemoGossipKey writes a random 32-byte gossip key, base64, to
// dir/gossip.key (the child's --gossip-key) and returns it: the demo's
// cluster gossips encrypted and authenticates its peer RPCs, as a real
// one should.
func writeDemoGossipKey(dir string) ([]byte, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "gossip.key"), []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("gossip key: %w", err)
	}
	return key, nil
}

// oneDecisionPoint is step 3.
func (d *demo) oneDecisionPoint(ctx context.Context, nodes []*peer.Node) error {
	const perServer = 100
	d.heading("3. One decision point per key: limit 100 per 1m, 300 concurrent requests over 3 servers")
	// Three independent copies of a correct limiter.
	localAdmitted := 0
	for s := range 3 {
		l, err := shard.NewLimiter(shard.Policy{Limit: 100, Window: time.Minute})
		if err != nil {
			return err
		}
		n, _ := burst(l, time.Duration(s)*time.Millisecond, perServer)
		localAdmitted += n
	}
	// The cluster: every node routes the key to its single owner.
	key := peer.Key{Tenant: "acme", Subject: "alice", Policy: "api"}
	owner, err := nodes[0].Owner(key)
	if err != nil {
		return err
	}
	type result struct {
		admitted int
		owners   map[string]int
		err      error
	}
	results := make([]result, len(nodes))
	versionsBefore := ringVersions(nodes)
	var wg sync.WaitGroup
	for i, nd := range nodes {
		wg.Go(func() {
			r := result{owners: map[string]int{}}
			for range perServer {
				dec, err := nd.Allow(ctx, peer.Request{Key: key})
				if err != nil {
					r.err = err
					break
				}
				r.owners[dec.Owner]++
				if dec.Allowed {
					r.admitted++
				}
			}
			results[i] = r
		})
	}
	wg.Wait()
	total, owners := 0, map[string]bool{}
	agree := true
	for i, r := range results {
		if r.err != nil {
			return fmt.Errorf("allow on %s: %w", nodes[i].Name(), r.err)
		}
		total += r.admitted
		for o := range r.owners {
			owners[o] = true
		}
		if o, _ := nodes[i].Owner(key); o != owner {
			agree = false
		}
	}
	tw := d.table()
	fmt.Fprintf(tw, "  setup\trequests\tadmitted\tdecided by\n")
	fmt.Fprintf(tw, "  3 independent local limiters\t%d\t%d\teach server for itself\n", 3*perServer, localAdmitted)
	fmt.Fprintf(tw, "  ringlimit cluster, 3 nodes\t%d\t%d\t%s\n", 3*perServer, total, strings.Join(sortedKeys(owners), ","))
	_ = tw.Flush()
	tw = d.table()
	fmt.Fprintf(tw, "  node\tsent\tadmitted\tpath\n")
	for i, nd := range nodes {
		path := "forwarded to " + owner
		if nd.Name() == owner {
			path = "local (owner)"
		}
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%s\n", nd.Name(), perServer, results[i].admitted, path)
	}
	_ = tw.Flush()
	if after := ringVersions(nodes); !slices.Equal(after, versionsBefore) {
		// Not a promise: a diagnostic. The promise is per ring; a member
		// wrongly declared dead (gossip under heavy load) moves its keys.
		fmt.Fprintf(d.out, "  note: membership changed during this step (ring versions %v -> %v)\n", versionsBefore, after)
	}
	d.promise(localAdmitted == 3*perServer, "3 independent local limiters admit %d of %d (3·L: the problem)", localAdmitted, 3*perServer)
	d.promise(total == perServer, "the cluster admits exactly %d of %d (want %d)", total, 3*perServer, perServer)
	d.promise(agree && len(owners) == 1 && owners[owner], "every decision came from the key's single owner %s (owners seen: %v)", owner, sortedKeys(owners))
	return nil
}

// gracefulLeave is step 4: the owner of a key leaves with Close; the key's
// log moves to the new owner and the quota is kept.
func (d *demo) gracefulLeave(ctx context.Context, stay []*peer.Node, leaver *peer.Node) error {
	const used, limit = 60, 100
	key, err := keyOwnedBy(stay[0], leaver.Name(), "acme", "bob", "api")
	if err != nil {
		return err
	}
	d.heading("4. Graceful leave: %s owns %s and leaves; the quota moves with the key", leaver.Name(), key)
	all := append(slices.Clone(stay), leaver)
	var before peer.Decision
	for i := range used {
		dec, err := all[i%len(all)].Allow(ctx, peer.Request{Key: key})
		if err != nil {
			return fmt.Errorf("allow before leave: %w", err)
		}
		before = dec
	}
	t0 := time.Now()
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	closeErr := leaver.Close(closeCtx)
	cancel()
	closeDur := time.Since(t0)
	if err := waitUntil(ctx, 10*time.Second, "the remaining nodes to see 2 members", func() bool {
		return len(stay[0].Members()) == 2 && len(stay[1].Members()) == 2 && stay[0].Settled() && stay[1].Settled()
	}); err != nil {
		return err
	}
	convergeDur := time.Since(t0)
	newOwner, _ := stay[0].Owner(key)
	// Spend what is left, alternating the entry node, until refused.
	admittedAfter, first := 0, peer.Decision{}
	var refused peer.Decision
	for i := 0; i <= limit; i++ {
		dec, err := stay[i%2].Allow(ctx, peer.Request{Key: key})
		if err != nil {
			return fmt.Errorf("allow after leave: %w", err)
		}
		if i == 0 {
			first = dec
		}
		if !dec.Allowed {
			refused = dec
			break
		}
		admittedAfter++
	}
	tw := d.table()
	fmt.Fprintf(tw, "  moment\towner\tremaining\tnote\n")
	fmt.Fprintf(tw, "  after %d admissions\t%s\t%d\t%d of %d used\n", used, before.Owner, before.Remaining, used, limit)
	fmt.Fprintf(tw, "  %s closed\t-\t-\tClose (handoff + leave) took %v; ring at 2 members after %v\n", leaver.Name(), closeDur.Round(time.Millisecond), convergeDur.Round(time.Millisecond))
	fmt.Fprintf(tw, "  first request after\t%s\t%d\t%d left before it\n", first.Owner, first.Remaining, first.Remaining+1)
	fmt.Fprintf(tw, "  spend the rest\t%s\t%d\t%d admitted, then %s (retry after %v)\n", refused.Owner, refused.Remaining, admittedAfter, refused.Reason, refused.RetryAfter.Round(time.Millisecond))
	_ = tw.Flush()
	if closeErr != nil {
		fmt.Fprintf(d.out, "  (Close reported: %v)\n", closeErr)
	}
	d.promise(before.Owner == leaver.Name() && before.Remaining == limit-used, "before the leave %s decided and %d remained", before.Owner, before.Remaining)
	d.promise(newOwner != leaver.Name() && first.Owner == newOwner, "after the leave the key has a new owner (%s)", newOwner)
	d.promise(admittedAfter == limit-used && refused.Reason == peer.ReasonOverLimit, "the quota was kept: %d admitted after the move (want %d), then over limit", admittedAfter, limit-used)
	return nil
}

// crash is step 5: a node in a child process owns a key and is SIGKILLed.
func (d *demo) crash(ctx context.Context, live []*peer.Node, policyPath string) error {
	d.heading("5. Crash: the owner of a key is killed with SIGKILL (fail closed)")
	child, err := startChild(ctx, d, "n4", live[0].GossipAddr(), policyPath)
	if err != nil {
		return err
	}
	defer child.stop()
	if err := waitUntil(ctx, 20*time.Second, "the nodes and the child n4 to see 3 members and partitions to settle", func() bool {
		return len(live[0].Members()) == 3 && len(live[1].Members()) == 3 && child.members(ctx) == 3 &&
			live[0].Settled() && live[1].Settled()
	}); err != nil {
		return err
	}
	key, err := keyOwnedBy(live[0], "n4", "acme", "carol", "login")
	if err != nil {
		return err
	}
	const limit, before = 5, 3
	var last peer.Decision
	for i := range before {
		dec, err := live[i%2].Allow(ctx, peer.Request{Key: key})
		if err != nil || !dec.Allowed {
			return fmt.Errorf("allow before the kill: %+v, %w", dec, err)
		}
		last = dec
	}
	fmt.Fprintf(d.out, "  child process pid %d serves n4 (grpc %s); key %s (limit %d per 1m) is held by %s\n", child.cmd.Process.Pid, child.grpcAddr, key, limit, last.Owner)
	fmt.Fprintf(d.out, "  before the kill: %d admitted by %s, each answered only after its backup had it (replication: sync)\n", before, last.Owner)

	killed := time.Now()
	if err := child.cmd.Process.Kill(); err != nil { // SIGKILL: no leave, no handoff
		return fmt.Errorf("kill child: %w", err)
	}
	var (
		firstUnavail, converged, resumed time.Duration
		unavailable, overDuring, other   int
		resumedDec                       peer.Decision
		resumedVia                       string
	)
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for i := 0; resumed == 0 && time.Now().Before(deadline); i++ {
		nd := live[i%2]
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		dec, err := nd.Allow(cctx, peer.Request{Key: key})
		cancel()
		since := time.Since(killed)
		switch {
		case errors.Is(err, peer.ErrUnavailable):
			unavailable++
			if firstUnavail == 0 {
				firstUnavail = since
			}
		case err != nil:
			other++
			if ctx.Err() != nil {
				return ctx.Err()
			}
		case !dec.Allowed:
			overDuring++
		default:
			resumed, resumedDec, resumedVia = since, dec, nd.Name()
		}
		if converged == 0 && len(live[0].Members()) == 2 && len(live[1].Members()) == 2 {
			converged = since
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := waitUntil(ctx, 10*time.Second, "the survivors to drop n4 (2 members)", func() bool {
		return len(live[0].Members()) == 2 && len(live[1].Members()) == 2
	}); err != nil {
		d.promise(false, "the ring converged after the crash: %v", err)
		return nil
	}
	if converged == 0 {
		converged = time.Since(killed)
	}
	// The new holder continues from the backup's copy: with `before`
	// admitted before the crash and one just now, exactly limit - before - 1
	// more fit, then over limit.
	admittedAfter := 0
	if resumed > 0 {
		admittedAfter = 1
	}
	var refused peer.Decision
	for i := range limit {
		dec, err := live[i%2].Allow(ctx, peer.Request{Key: key})
		if err != nil {
			other++
			continue
		}
		if dec.Allowed {
			admittedAfter++
		} else {
			refused = dec
		}
	}
	child.reap()

	tw := d.table()
	fmt.Fprintf(tw, "  after kill\tevent\n")
	fmt.Fprintf(tw, "  0s\tSIGKILL to pid %d (n4 cannot leave or hand off)\n", child.cmd.Process.Pid)
	if firstUnavail > 0 {
		fmt.Fprintf(tw, "  %v\tfirst request for the key: unavailable (errors.Is(err, peer.ErrUnavailable)), not over limit\n", firstUnavail.Round(time.Millisecond))
	}
	fmt.Fprintf(tw, "  %v\tgossip marks n4 failed; both survivors' rings have 2 members\n", converged.Round(time.Millisecond))
	if resumed > 0 {
		fmt.Fprintf(tw, "  %v\tthe backup took over after the lease: %s by %s via %s, remaining %d\n", resumed.Round(time.Millisecond), resumedDec.Reason, resumedDec.Owner, resumedVia, resumedDec.Remaining)
	}
	_ = tw.Flush()
	fmt.Fprintf(d.out, "  during the outage: %d requests unavailable, %d reported over limit, %d other errors\n", unavailable, overDuring, other)
	fmt.Fprintf(d.out, "  after the takeover: %d admitted (want %d = %d - %d before the crash), then %s\n", admittedAfter, limit-before, limit, before, refused.Reason)
	d.promise(firstUnavail > 0, "requests for the dead holder's key fail closed as unavailable (first after %v)", firstUnavail.Round(time.Millisecond))
	d.promise(overDuring == 0 && other == 0, "no request during the outage was reported as over limit (%d) or another error (%d)", overDuring, other)
	d.promise(resumed > 0 && resumedDec.Owner != "n4", "decisions resume on the backup after failure detection and the lease (after %v)", resumed.Round(time.Millisecond))
	d.promise(admittedAfter == limit-before && refused.Reason == peer.ReasonOverLimit, "the crash lost nothing: %d admitted after it (want %d), then over limit", admittedAfter, limit-before)
	return nil
}

// hotKeys is step 6: skewed traffic, then each owner's top 3.
func (d *demo) hotKeys(ctx context.Context, live []*peer.Node) error {
	const nKeys, heaviest = 12, 2400
	d.heading("6. Hot keys: skewed traffic (key k gets %d/(k+1) requests); each owner's top 3", heaviest)
	keys := make([]peer.Key, nKeys)
	sent := map[peer.Key]int{}
	var jobs []peer.Key
	for k := range keys {
		keys[k] = peer.Key{Tenant: "shop", Subject: fmt.Sprintf("item-%02d", k), Policy: "feed"}
		n := heaviest / (k + 1)
		sent[keys[k]] = n
		for range n {
			jobs = append(jobs, keys[k])
		}
	}
	const workers = 8
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			for j := w; j < len(jobs); j += workers {
				if _, err := live[j%len(live)].Allow(ctx, peer.Request{Key: jobs[j]}); err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("hot key traffic: %w", err)
	}
	hottest := keys[0]
	hottestOwner, _ := live[0].Owner(hottest)
	tw := d.table()
	fmt.Fprintf(tw, "  owner\trank\tkey\trate (hits/s, decayed)\tsent\n")
	topOK, ownedOK := false, true
	for _, nd := range live {
		top := nd.HotKeys()
		if len(top) > 3 {
			top = top[:3]
		}
		for i, h := range top {
			n := "-" // a key from an earlier step
			if c, ok := sent[h.Key]; ok {
				n = fmt.Sprint(c)
			}
			fmt.Fprintf(tw, "  %s\t#%d\t%s\t%.0f\t%s\n", nd.Name(), i+1, h.Key, h.Rate, n)
			if h.Key.Policy == "feed" {
				if o, _ := nd.Owner(h.Key); o != nd.Name() {
					ownedOK = false
				}
			}
		}
		if nd.Name() == hottestOwner && len(top) > 0 && top[0].Key == hottest {
			topOK = true
		}
	}
	_ = tw.Flush()
	d.promise(topOK, "the hottest key %s is #1 at its owner %s", hottest, hottestOwner)
	d.promise(ownedOK, "each node reports only keys it owns (one key is one decision point)")
	return nil
}

// demoLeaseTTL is the lease TTL of the demo's concurrency policy.
const demoLeaseTTL = 400 * time.Millisecond

// concurrencyCap is step 7: leases of a concurrency policy, taken through
// every node, never exceed the cap; a release frees its unit at once, and
// a lease never released comes back after its TTL.
func (d *demo) concurrencyCap(ctx context.Context, live []*peer.Node) error {
	const limit = 3
	d.heading("7. A concurrency cap: at most %d jobs in progress per subject, leases with a %v TTL", limit, demoLeaseTTL)
	key := peer.Key{Tenant: "acme", Subject: "batch-runner", Policy: "jobs"}
	owner, _ := live[0].Owner(key)
	tw := d.table()
	fmt.Fprintf(tw, "  via\tacquire\tlease\tremaining\tdecided by\n")
	var leases []peer.Lease
	refused := 0
	for i := range limit + 2 {
		via := live[i%len(live)]
		l, err := via.Acquire(ctx, peer.Request{Key: key})
		if err != nil {
			return fmt.Errorf("acquire: %w", err)
		}
		verdict, id := "granted", fmt.Sprintf("%016x", l.ID)
		if !l.Allowed {
			verdict, id = "refused ("+l.Reason.String()+")", "-"
			refused++
		} else {
			leases = append(leases, l)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\n", via.Name(), verdict, id, l.Remaining, l.Owner)
	}
	_ = tw.Flush()
	d.promise(len(leases) == limit && refused == 2, "%d leases granted through %d nodes, the next %d refused: never more than %d held (decided by %s)", len(leases), len(live), refused, limit, owner)
	if len(leases) == 0 {
		return nil
	}
	rel, err := live[1%len(live)].Release(ctx, key, leases[0].ID)
	if err != nil {
		return fmt.Errorf("release: %w", err)
	}
	again, err := live[0].Acquire(ctx, peer.Request{Key: key})
	if err != nil {
		return fmt.Errorf("acquire after release: %w", err)
	}
	d.promise(rel.Allowed && again.Allowed && again.Remaining == 0, "a release frees its unit at once: the next acquire is granted (0 remaining)")
	// Nobody releases the leases now held: their units come back when the
	// TTL has passed on the holder's clock.
	fmt.Fprintf(d.out, "  %d leases are never released; waiting for their TTL (%v)...\n", limit, demoLeaseTTL)
	// Peek (it takes nothing; it answers what an acquire of one unit
	// would leave) until every unit is free again: the leases were taken
	// at different moments, the last one just now.
	var free peer.Decision
	err = waitUntil(ctx, 5*time.Second, "leaked leases to expire", func() bool {
		d, err := live[0].Peek(ctx, peer.Request{Key: key})
		free = d
		return err == nil && d.Allowed && d.Remaining == limit-1
	})
	if err != nil {
		return err
	}
	// Every node runs on this machine's clock: the units cannot be free
	// before the last lease's TTL has passed since the holder granted it.
	after := time.Since(again.DecidedAt)
	d.promise(after >= demoLeaseTTL && free.Remaining == limit-1, "leases never released came back after their TTL (all %d units free again %v after the last was granted)", limit, after.Round(10*time.Millisecond))
	return nil
}

// ringVersions returns each node's ring version.
func ringVersions(nodes []*peer.Node) []uint64 {
	out := make([]uint64, len(nodes))
	for i, nd := range nodes {
		out[i] = nd.RingVersion()
	}
	return out
}

// keyOwnedBy finds a key tenant/subject-N/policy that node's ring places on
// owner.
func keyOwnedBy(node *peer.Node, owner, tenant, subject, policy string) (peer.Key, error) {
	for i := range 10000 {
		k := peer.Key{Tenant: tenant, Subject: fmt.Sprintf("%s-%d", subject, i), Policy: policy}
		if o, err := node.Owner(k); err == nil && o == owner {
			return k, nil
		}
	}
	return peer.Key{}, fmt.Errorf("no key owned by %s in 10000 tries", owner)
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// startCluster starts one node per name on 127.0.0.1 with ephemeral ports,
// the later ones joining the first, and waits until every node sees all of
// them. On error it closes what it started.
func startCluster(ctx context.Context, names []string, base peer.Config) ([]*peer.Node, error) {
	var nodes []*peer.Node
	for _, name := range names {
		cfg := base
		cfg.Name = name
		if len(nodes) > 0 {
			cfg.Join = []string{nodes[0].GossipAddr()}
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		nd, err := peer.New(sctx, cfg)
		cancel()
		if err != nil {
			closeAll(nodes, 2*time.Second)
			return nil, fmt.Errorf("start %s: %w", name, err)
		}
		nodes = append(nodes, nd)
	}
	err := waitUntil(ctx, 30*time.Second, fmt.Sprintf("every node to see %d members and hold its partitions", len(names)), func() bool {
		for _, nd := range nodes {
			if len(nd.Members()) != len(names) || !nd.Settled() {
				return false
			}
		}
		return true
	})
	if err != nil {
		closeAll(nodes, 2*time.Second)
		return nil, err
	}
	return nodes, nil
}

// closeAll closes nodes one after the other (each hands its keys to the
// next), bounded by timeout each.
func closeAll(nodes []*peer.Node, timeout time.Duration) {
	for _, nd := range nodes {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		_ = nd.Close(ctx)
		cancel()
	}
}

// waitUntil polls cond every 10 ms until it holds, ctx ends or timeout
// passes; the error names what did not happen.
func waitUntil(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-deadline.C:
			return fmt.Errorf("timed out after %v waiting for %s", timeout, what)
		case <-tick.C:
		}
	}
	return nil
}

// childNode is a node running as a child process: this binary's serve
// subcommand (or, under go test, the test binary in child mode).
type childNode struct {
	cmd      *exec.Cmd
	stdin    io.Closer
	grpcAddr string
	httpAddr string
	done     chan struct{} // closed when the child's stderr is drained
	reaped   sync.Once
}

// childEnvVar marks a re-executed process as the demo's child. The real
// binary ignores it (its arguments already say "serve"); the test binary's
// TestMain uses it to run main's code instead of the tests.
const childEnvVar = "RINGLIMIT_CHILD"

// startChild starts `<this executable> serve` as node name, joining join,
// with fast gossip and the policy file, and waits for its "serving" line.
// The child stops by itself if its stdin closes, so it never outlives the
// demo, even if the demo is killed.
func startChild(ctx context.Context, d *demo, name, join, policyPath string) (*childNode, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	cmd := exec.Command(exe, "serve", "--name", name,
		"--gossip-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--join", join, "--policies", policyPath, "--log-format", "json",
		"--gossip-key", filepath.Join(filepath.Dir(policyPath), "gossip.key"),
		// Info at least: the demo reads the "serving" line.
		"--log-level", strings.ToLower(min(d.level, slog.LevelInfo).String()),
		"--gossip-profile", "fast", "--exit-on-stdin-eof", "--drain-timeout", "2s")
	cmd.Env = childEnv(os.Environ())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start child %s: %w", name, err)
	}
	c := &childNode{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	serving := make(chan [2]string, 1)
	go c.readLog(stderr, name, d.stderr, d.level, serving)
	t := time.NewTimer(15 * time.Second)
	defer t.Stop()
	select {
	case addrs := <-serving:
		c.grpcAddr, c.httpAddr = addrs[0], addrs[1]
		return c, nil
	case <-c.done:
		c.stop()
		return nil, fmt.Errorf("child %s exited before serving", name)
	case <-t.C:
		c.stop()
		return nil, fmt.Errorf("child %s did not start serving within 15s", name)
	case <-ctx.Done():
		c.stop()
		return nil, ctx.Err()
	}
}

// members asks the child's /readyz how many members its ring has; 0 if it
// cannot tell.
func (c *childNode) members(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.httpAddr+"/readyz", nil)
	if err != nil {
		return 0
	}
	resp, err := (&http.Client{}).Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var body struct {
		Members int `json:"members"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&body) != nil {
		return 0
	}
	return body.Members
}

// readLog reads the child's JSON log: it reports the gRPC address from the
// "serving" line and passes lines at level or above on, prefixed with the
// name.
func (c *childNode) readLog(r io.Reader, name string, w io.Writer, level slog.Level, serving chan<- [2]string) {
	defer close(c.done)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var rec struct {
			Msg      string `json:"msg"`
			Level    string `json:"level"`
			GRPCAddr string `json:"grpc_addr"`
			HTTPAddr string `json:"http_addr"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) != nil {
			fmt.Fprintf(w, "[child %s] %s\n", name, sc.Bytes())
			continue
		}
		if rec.Msg == "serving" {
			select {
			case serving <- [2]string{rec.GRPCAddr, rec.HTTPAddr}:
			default:
			}
		}
		var l slog.Level
		if l.UnmarshalText([]byte(rec.Level)) != nil || l >= level {
			fmt.Fprintf(w, "[child %s] %s\n", name, sc.Bytes())
		}
	}
}

// stop kills the child if it still runs and reaps it.
func (c *childNode) stop() {
	_ = c.stdin.Close()
	_ = c.cmd.Process.Kill() // an error only says it has already exited
	c.reap()
}

// reap waits for the child's log to be drained, then for the process; it
// may be called more than once.
func (c *childNode) reap() {
	c.reaped.Do(func() {
		<-c.done // Wait must not run before the pipe's reads are done
		_ = c.cmd.Wait()
	})
}

// childEnv is the parent's environment without RINGLIMIT_* settings (the
// child gets everything it needs as flags), plus the child marker.
func childEnv(env []string) []string {
	out := make([]string, 0, len(env)+1)
	for _, e := range env {
		if !strings.HasPrefix(e, "RINGLIMIT_") {
			out = append(out, e)
		}
	}
	return append(out, childEnvVar+"=1")
}
