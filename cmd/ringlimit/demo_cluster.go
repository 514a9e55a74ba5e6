package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/shard"
)

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
		firstUnavail, converged, resumed        time.Duration
		unavailable, unknown, overDuring, other int
		resumedDec                              peer.Decision
		resumedVia                              string
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
			if errors.Is(err, context.DeadlineExceeded) {
				// No answer in time: the request may have reached the
				// new holder, which then counts it if it admitted it.
				unknown++
			}
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
	// A request answered unavailable because no answer came in time may
	// still have been admitted: it then counts against the quota (the
	// limit holds), so up to that many fewer fit after the takeover.
	lowest, maybe := max(0, limit-before-unknown), ""
	if unknown > 0 {
		maybe = fmt.Sprintf("; %d of the unavailable ones timed out and may have been admitted, so at least %d", unknown, lowest)
	}
	fmt.Fprintf(d.out, "  after the takeover: %d admitted (want %d = %d - %d before the crash%s), then %s\n", admittedAfter, limit-before, limit, before, maybe, refused.Reason)
	d.promise(firstUnavail > 0, "requests for the dead holder's key fail closed as unavailable (first after %v)", firstUnavail.Round(time.Millisecond))
	d.promise(overDuring == 0 && other == 0, "no request during the outage was reported as over limit (%d) or another error (%d)", overDuring, other)
	d.promise(resumed > 0 && resumedDec.Owner != "n4", "decisions resume on the backup after failure detection and the lease (after %v)", resumed.Round(time.Millisecond))
	want := fmt.Sprint(limit - before)
	if unknown > 0 {
		want = fmt.Sprintf("%d, at least %d with %d outcome unknown", limit-before, lowest, unknown)
	}
	d.promise(admittedAfter <= limit-before && admittedAfter >= lowest && refused.Reason == peer.ReasonOverLimit, "the crash lost nothing: %d admitted after it (want %s), then over limit", admittedAfter, want)
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
	d.heading("8. A concurrency cap: at most %d jobs in progress per subject, leases with a %v TTL", limit, demoLeaseTTL)
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
