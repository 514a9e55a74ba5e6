package peer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// deafGossip is hoGossip whose failure detector takes at least about 11 s
// to declare a silent member dead (SuspicionMult 80 × log10(3 members) ×
// ProbeInterval 300 ms): long after its liveness has expired in the
// ownership log and its partitions have passed to their backups. A test
// that kills a holder then sees only what follows the ownership table;
// the ring still names the dead member.
func deafGossip(mc *memberlist.Config) {
	hoGossip(mc)
	mc.SuspicionMult = 80
}

// TestClientFollowsTakeover kills a holder abruptly (KillForTest: its port
// refuses connections at once, as after kill -9) while a client and a
// survivor's callers keep asking for two of its keys, one of a policy that
// fails closed and one that fails open, with the default ForwardTimeout
// and the client's default DecisionTimeout. The client must follow the
// takeover as fast as the survivor does (the ownership table, not the
// ring, which keeps the dead member for the whole test), and during the
// outage it must answer the keys of policies that fail open or fall back as
// a node does: admitted with ReasonFailedOpen or ReasonFallback, never
// ErrUnavailable.
func TestClientFollowsTakeover(t *testing.T) {
	const forwardTimeout = defaultForwardTimeout
	c := startCluster(t, 3, Config{
		Gossip:         deafGossip,
		ForwardTimeout: forwardTimeout,
		Policies: map[string]PolicyConfig{
			"closed": {Limit: 1 << 20, Window: time.Minute},
			"open":   {Limit: 1 << 20, Window: time.Minute, OnUnavailable: FailOpen},
			"local":  {Limit: 1 << 20, Window: time.Minute, OnUnavailable: Fallback},
		},
	})
	// The client reads its table from n0 (the first member by name); the
	// key's backup, which takes over, is n1. So the client follows the
	// takeover only if a member's table names the holders the ownership
	// table names, not only the partitions it holds itself.
	victim, via, heir := c.nodes[2], c.nodes[0], c.nodes[1]
	var closedKey Key
	for i := 0; ; i++ {
		if i == 10000 {
			t.Fatalf("no key held by %s with %s as its backup among 10000", victim.Name(), heir.Name())
		}
		k := Key{Tenant: "acme", Subject: fmt.Sprintf("subject-%05d", i), Policy: "closed"}
		if holderForTest(c, k) == victim.Name() && memberName(via.lo.run.Part(via.partIDForTest(k)).Backup) == heir.Name() {
			closedKey = k
			break
		}
	}
	// The same subject: the same partition.
	openKey := Key{Tenant: closedKey.Tenant, Subject: closedKey.Subject, Policy: "open"}
	localKey := Key{Tenant: closedKey.Tenant, Subject: closedKey.Subject, Policy: "local"}
	var addrs []string
	for _, nd := range c.nodes {
		addrs = append(addrs, nd.RPCAddr())
	}
	dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl, err := Dial(dctx, ClientConfig{Addrs: addrs}) // every default, as a user dials
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { cl.Close() })
	ctx := context.Background()
	for _, k := range []Key{closedKey, openKey, localKey} {
		waitFor(t, 10*time.Second, fmt.Sprintf("a decision for %v by %s through the client", k, victim.Name()), func() bool {
			d, err := cl.Allow(ctx, Request{Key: k})
			return err == nil && d.Reason == ReasonAdmitted && d.Owner == victim.Name()
		})
	}
	ring := via.RingVersion()

	victim.KillForTest()
	killed := time.Now()

	// outage calls call until survivors decide (ReasonAdmitted) streak
	// calls in a row, at most for a deadline well inside the time gossip
	// takes to drop the victim, and returns when the streak began and
	// every answer on the way. A streak, not one decision: a call that
	// reaches the new holder once, after waiting out the dead member, is
	// not service restored.
	const streak = 10
	type answer struct {
		d   Decision
		err error
		at  time.Duration
	}
	outage := func(call func() (Decision, error)) (recovered time.Duration, answers []answer) {
		run := 0
		for time.Since(killed) < 10*time.Second {
			start := time.Since(killed)
			d, err := call()
			answers = append(answers, answer{d, err, time.Since(killed)})
			if err != nil || d.Reason != ReasonAdmitted || d.Owner == victim.Name() {
				run = 0
				continue
			}
			if run++; run == 1 {
				recovered = start
			}
			if run == streak {
				return recovered, answers
			}
		}
		return -1, answers
	}
	type result struct {
		recovered time.Duration
		answers   []answer
	}
	run := func(call func() (Decision, error)) <-chan result {
		ch := make(chan result, 1)
		go func() {
			r, a := outage(call)
			ch <- result{r, a}
		}()
		return ch
	}
	clientClosed := run(func() (Decision, error) { return cl.Allow(ctx, Request{Key: closedKey}) })
	clientOpen := run(func() (Decision, error) { return cl.Allow(ctx, Request{Key: openKey}) })
	clientLocal := run(func() (Decision, error) { return cl.Allow(ctx, Request{Key: localKey}) })
	nodeClosed := run(func() (Decision, error) { return via.Allow(ctx, Request{Key: closedKey}) })
	cc, co, cf, nc := <-clientClosed, <-clientOpen, <-clientLocal, <-nodeClosed

	summary := func(r result) string {
		errs, open := 0, 0
		var firstErr error
		for _, a := range r.answers {
			if a.err != nil {
				errs++
				if firstErr == nil {
					firstErr = a.err
				}
			}
			if a.d.Reason == ReasonFailedOpen || a.d.Reason == ReasonFallback {
				open++
			}
		}
		when := "never recovered"
		if r.recovered >= 0 {
			when = fmt.Sprintf("recovered after %v", r.recovered.Round(time.Millisecond))
		}
		return fmt.Sprintf("%s, %d calls, %d errors (first: %v), %d failed open or fallback", when, len(r.answers), errs, firstErr, open)
	}
	t.Logf("after the kill of %s: client, fail closed: %s", victim.Name(), summary(cc))
	t.Logf("after the kill of %s: client, fail open: %s", victim.Name(), summary(co))
	t.Logf("after the kill of %s: client, fallback: %s", victim.Name(), summary(cf))
	t.Logf("after the kill of %s: node %s, fail closed: %s", victim.Name(), via.Name(), summary(nc))
	if v := via.RingVersion(); v != ring {
		t.Fatalf("the ring moved (version %d to %d) before the test ended: gossip dropped the victim sooner than deafGossip should", ring, v)
	}
	if nc.recovered < 0 {
		t.Fatalf("no survivor took over %s's partition within 10 s: %s", victim.Name(), summary(nc))
	}
	if cc.recovered < 0 {
		t.Fatalf("the client never reached the new holder while the ring still named the dead %s (the survivor's callers did after %v): %s",
			victim.Name(), nc.recovered.Round(time.Millisecond), summary(cc))
	}
	// Through the same takeover: the client's first decision comes at most
	// a second after the survivor's callers' (its table's refresh, and a
	// loaded machine).
	if cc.recovered > nc.recovered+time.Second {
		t.Fatalf("the client was unavailable for %v, the survivor's callers for %v: it must follow the takeover as fast", cc.recovered, nc.recovered)
	}
	// The client's table follows the ownership table: it names the heir
	// (read from n0, which does not hold the partition), so the client
	// sends the key there without a forward hop, while the ring still
	// names the victim.
	waitFor(t, 5*time.Second, fmt.Sprintf("the client's table to name %s the holder of %v's partition", heir.Name(), closedKey), func() bool {
		holders, _ := cl.Placement()
		return holders[placementPartition(closedKey, len(holders))] == heir.Name()
	})
	if v := via.RingVersion(); v != ring {
		t.Fatalf("the ring moved (version %d to %d) before the client's table named the heir", ring, v)
	}
	for _, tc := range []struct {
		policy string
		r      result
		want   Reason
	}{{"open", co, ReasonFailedOpen}, {"local", cf, ReasonFallback}} {
		if tc.r.recovered < 0 {
			t.Fatalf("the client never reached the new holder for policy %s: %s", tc.policy, summary(tc.r))
		}
		for i, a := range tc.r.answers {
			if a.err != nil || !a.d.Allowed || (a.d.Reason != tc.want && a.d.Reason != ReasonAdmitted) {
				t.Fatalf("policy %s, call %d at %v after the kill: Allow = %+v, %v; want admitted (%v or decided), never an error (%s)",
					tc.policy, i, a.at.Round(time.Millisecond), a.d, a.err, tc.want, summary(tc.r))
			}
		}
	}
}
