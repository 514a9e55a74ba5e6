package peer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// refusedAddr returns a loopback address nothing listens on: connections to
// it are refused at once.
func refusedAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	_ = lis.Close()
	return addr
}

// TestFailurePolicies asks for keys whose holder is alive in gossip but
// cannot be reached: one refuses connections (its gRPC server stopped), one
// accepts and never answers. Each policy's OnUnavailable applies, reported
// as unavailability and never as over limit, within the caller's deadline.
func TestFailurePolicies(t *testing.T) {
	// Long enough that a 100 ms caller deadline is told apart from it with
	// room for a loaded machine's scheduling.
	const forwardTimeout = time.Second
	// n1 forwards each request as its own RPC, n0 batches.
	c := startClusterWith(t, 5, Config{
		ForwardTimeout: forwardTimeout,
		// The refusing member's gRPC port is closed for each check of a
		// key it holds, the log's traffic to it too: a lease longer than
		// such a check (plus the reconnect) keeps it the keys' holder;
		// with the default lease the leader would end its liveness and
		// its keys' backups would decide them.
		LeaseDuration: 15 * time.Second,
		Policies: map[string]PolicyConfig{
			"closed":   {Limit: 9, Window: time.Minute},
			"open":     {Limit: 9, Window: time.Minute, OnUnavailable: FailOpen},
			"fallback": {Limit: 9, Window: time.Minute, OnUnavailable: Fallback, FallbackLimit: 2},
			// No FallbackLimit: Limit divided by the 5 members of the ring.
			"share": {Limit: 15, Window: time.Minute, OnUnavailable: Fallback},
		},
	}, func(i int, cfg *Config) { cfg.DisableBatching = i == 1 })
	refusing, silent := c.nodes[3], c.nodes[4]
	// refuse closes the refusing member's port until done is called.
	refuse := func(t *testing.T, owner string) (done func()) {
		if owner != "refusing" {
			return func() {}
		}
		refusing.stopRPCForTest()
		return func() {
			// The stopped server's listener may close a moment later.
			waitFor(t, 5*time.Second, "the refusing member's port to reopen", func() bool {
				return refusing.restartRPCForTest() == nil
			})
		}
	}
	silent.setCheckHookForTest(func(ctx context.Context) { <-ctx.Done() })
	names := map[string]string{"refusing": refusing.Name(), "silent": silent.Name()}
	via := c.nodes[0]
	// slack covers scheduling on a loaded machine; any retry loop or a
	// missing deadline would take far longer.
	const slack = time.Second

	t.Run("fail_closed", func(t *testing.T) {
		for _, via := range c.nodes[:2] {
			for _, tc := range []struct {
				owner    string
				deadline time.Duration // of the caller's context; 0 means none
				// wantDeadline: the error also wraps context.DeadlineExceeded.
				wantDeadline bool
				maxElapsed   time.Duration
				minElapsed   time.Duration
			}{
				{owner: "refusing", deadline: 5 * time.Second, maxElapsed: forwardTimeout + slack},
				{owner: "refusing", maxElapsed: forwardTimeout + slack},
				// The caller's deadline comes first.
				{owner: "silent", deadline: 100 * time.Millisecond, wantDeadline: true, minElapsed: 100 * time.Millisecond, maxElapsed: forwardTimeout},
				// No caller deadline: ForwardTimeout bounds the wait.
				{owner: "silent", wantDeadline: true, minElapsed: forwardTimeout, maxElapsed: forwardTimeout + slack},
			} {
				t.Run(fmt.Sprintf("batching=%v/owner=%s/deadline=%v", !via.cfg.DisableBatching, tc.owner, tc.deadline), func(t *testing.T) {
					key := pmKeyOwnedBy(t, via, "closed", names[tc.owner])
					ctx := context.Background()
					if tc.deadline > 0 {
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(ctx, tc.deadline)
						defer cancel()
					}
					reopen := refuse(t, tc.owner)
					start := time.Now()
					d, err := via.Allow(ctx, Request{Key: key})
					elapsed := time.Since(start)
					reopen()
					if !errors.Is(err, ErrUnavailable) || !reflect.DeepEqual(d, Decision{}) {
						t.Fatalf("Allow = %+v, %v; want no decision and an error wrapping ErrUnavailable", d, err)
					}
					if tc.wantDeadline && !errors.Is(err, context.DeadlineExceeded) {
						t.Fatalf("Allow error %v does not wrap context.DeadlineExceeded", err)
					}
					if elapsed < tc.minElapsed || elapsed > tc.maxElapsed {
						t.Fatalf("Allow returned after %v, want between %v and %v", elapsed, tc.minElapsed, tc.maxElapsed)
					}
					if got := ToStatus(err); !errors.Is(FromStatus(got), ErrUnavailable) {
						t.Fatalf("ToStatus(%v) = %v, which does not map back to ErrUnavailable", err, got)
					}
				})
			}
		}
	})

	t.Run("fail_open", func(t *testing.T) {
		for _, owner := range []string{"refusing", "silent"} {
			key := pmKeyOwnedBy(t, via, "open", names[owner])
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			reopen := refuse(t, owner)
			d, err := via.Allow(ctx, Request{Key: key})
			reopen()
			cancel()
			want := Decision{Allowed: true, Limit: 9, Reason: ReasonFailedOpen, Owner: via.Name(), RingVersion: via.RingVersion()}
			if err != nil || !sameDecision(d, want) {
				t.Fatalf("owner %s: Allow = %+v, %v; want %+v", owner, d, err, want)
			}
		}
	})

	t.Run("fallback", func(t *testing.T) {
		for _, tc := range []struct {
			policy string
			limit  int64
		}{
			{"fallback", 2},
			{"share", 15 / 5},
		} {
			key := pmKeyOwnedBy(t, via, tc.policy, names["refusing"])
			reopen := refuse(t, "refusing")
			for i := range tc.limit + 2 {
				d, err := via.Allow(context.Background(), Request{Key: key})
				allowed := i < tc.limit
				if err != nil || d.Reason != ReasonFallback || d.Limit != tc.limit || d.Allowed != allowed || d.Owner != via.Name() {
					t.Fatalf("policy %s, request %d: Allow = %+v, %v; want a fallback decision (allowed %v) with limit %d by %s",
						tc.policy, i, d, err, allowed, tc.limit, via.Name())
				}
				if !allowed && d.RetryAfter <= 0 {
					t.Fatalf("policy %s, request %d: refused fallback decision %+v without RetryAfter", tc.policy, i, d)
				}
			}
			reopen()
		}
	})
}

// slowDetect is fastGossip with failure detection slowed by one probe
// interval, so a test can act on a dead owner before the ring moves on.
func slowDetect(mc *memberlist.Config) {
	fastGossip(mc)
	mc.SuspicionMult = 4
}

// TestFailureOwnerKilled kills a key's owner abruptly (no Leave, no
// handoff). Until memberlist declares it failed, the other nodes apply each
// policy's OnUnavailable to its keys, quickly and never as over limit:
// fail closed is ErrUnavailable, fail open admits without a decision,
// fallback decides on Limit/members locally. Afterwards the ring moves and
// the new owner decides. Without Config.Backup the crash resets the key
// .
func TestFailureOwnerKilled(t *testing.T) {
	const (
		limit          = 5
		forwardTimeout = 400 * time.Millisecond
	)
	c := startCluster(t, 3, Config{
		ForwardTimeout: forwardTimeout,
		Gossip:         slowDetect,
		Policies: map[string]PolicyConfig{
			"closed":   {Limit: limit, Window: time.Minute},
			"open":     {Limit: limit, Window: time.Minute, OnUnavailable: FailOpen},
			"fallback": {Limit: 6, Window: time.Minute, OnUnavailable: Fallback}, // 6/3 members = 2
		},
	})
	victim := c.nodes[2]
	key := pmKeyOwnedBy(t, c.nodes[0], "closed", victim.Name())
	openKey := pmKeyOwnedBy(t, c.nodes[0], "open", victim.Name())
	fallbackKey := pmKeyOwnedBy(t, c.nodes[0], "fallback", victim.Name())
	for i := range 2 {
		d, err := c.nodes[i].Allow(context.Background(), Request{Key: key})
		if err != nil || !d.Allowed || d.Owner != victim.Name() || d.Remaining != int64(limit-1-i) {
			t.Fatalf("before the crash, request %d: Allow = %+v, %v; want admitted by %s with %d remaining", i, d, err, victim.Name(), limit-1-i)
		}
	}
	before := c.nodes[0].RingVersion()

	victim.KillForTest()
	if _, err := victim.Allow(context.Background(), Request{Key: key}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Allow on the killed node = %v, want ErrClosed", err)
	}
	if err := victim.Close(context.Background()); err != nil {
		t.Fatalf("Close after the crash = %v, want nil", err)
	}

	// allow asks via for k with a 5 s deadline and checks the ring has not
	// moved yet and the answer came within ForwardTimeout plus slack.
	allow := func(via *Node, k Key) (Decision, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		d, err := via.Allow(ctx, Request{Key: k})
		if elapsed := time.Since(start); elapsed > forwardTimeout+500*time.Millisecond {
			t.Fatalf("via %s, key %v: answered after %v, want within ForwardTimeout %v plus slack", via.Name(), k, elapsed, forwardTimeout)
		}
		if v := c.nodes[0].RingVersion(); v != before {
			t.Fatalf("the ring moved (version %d to %d) before the checks ended; failure detection was faster than expected", before, v)
		}
		return d, err
	}
	for _, via := range c.nodes[:2] {
		for i := range 3 {
			if d, err := allow(via, key); !errors.Is(err, ErrUnavailable) || !reflect.DeepEqual(d, Decision{}) {
				t.Fatalf("fail closed via %s, request %d: Allow = %+v, %v; want no decision and ErrUnavailable", via.Name(), i, d, err)
			}
			want := Decision{Allowed: true, Limit: limit, Reason: ReasonFailedOpen, Owner: via.Name(), RingVersion: via.RingVersion()}
			if d, err := allow(via, openKey); err != nil || !sameDecision(d, want) {
				t.Fatalf("fail open via %s, request %d: Allow = %+v, %v; want %+v", via.Name(), i, d, err, want)
			}
			// Each node keeps its own fallback log: 2 admitted, then refused.
			d, err := allow(via, fallbackKey)
			if err != nil || d.Reason != ReasonFallback || d.Limit != 2 || d.Allowed != (i < 2) || d.Owner != via.Name() {
				t.Fatalf("fallback via %s, request %d: Allow = %+v, %v; want a fallback decision by %s with limit 2, allowed %v", via.Name(), i, d, err, via.Name(), i < 2)
			}
		}
	}

	c.waitMembers(2)
	// The backup takes over once the victim's lease has expired, and
	// continues from its copy: the synchronous replica lost nothing.
	for _, k := range []Key{key, openKey, fallbackKey} {
		newOwner, _ := c.nodes[0].Owner(k)
		if newOwner == victim.Name() {
			t.Fatalf("%v still owned by the dead %s after the ring moved", k, victim.Name())
		}
		before := int64(0)
		if k == key {
			before = 2
		}
		var d Decision
		waitFor(t, 15*time.Second, fmt.Sprintf("a decision for %v after the takeover", k), func() bool {
			var err error
			d, err = c.nodes[0].Allow(context.Background(), Request{Key: k})
			return err == nil && d.Reason == ReasonAdmitted
		})
		if !d.Allowed || d.Remaining != d.Limit-1-before {
			t.Fatalf("after the takeover, %v: Allow = %+v; want admitted with %d remaining (the crash must lose nothing)", k, d, d.Limit-1-before)
		}
		d2, err := c.nodes[1].Allow(context.Background(), Request{Key: k})
		if err != nil || !d2.Allowed || d2.Owner != d.Owner || d2.Remaining != d.Remaining-1 {
			t.Fatalf("after the takeover, %v via %s: Allow = %+v, %v; want admitted by %s with %d remaining", k, c.nodes[1].Name(), d2, err, d.Owner, d.Remaining-1)
		}
	}
}

// countingMetrics counts forwarded RPCs.
type countingMetrics struct {
	nopMetrics
	forwards atomic.Int64
}

func (m *countingMetrics) Forward(string, string, time.Duration) { m.forwards.Add(1) }

// TestFailureStaleView installs a wrong ring on one of two nodes and sends
// every key through both nodes. Whatever the disagreement, each request ends
// within a bounded number of RPCs and a bounded time, with a decision from
// the key's true owner or ErrUnavailable: no forwarding loop, no decision
// by a node its own ring does not name.
func TestFailureStaleView(t *testing.T) {
	const (
		limit   = 5
		retries = 3
		rounds  = 3 // each key: n0, n1, n0, n1, n0, n1
	)
	m0, m1 := &countingMetrics{}, &countingMetrics{}
	metrics := []*countingMetrics{m0, m1}
	c := startClusterWith(t, 2, Config{
		DisableBatching: true, // one RPC per forward, so RPCs can be counted
		NotOwnerRetries: retries,
		Policies:        map[string]PolicyConfig{"p": {Limit: limit, Window: time.Minute}},
	}, func(i int, cfg *Config) { cfg.Metrics = metrics[i] })
	n0, n1 := c.nodes[0], c.nodes[1]
	phantom := refusedAddr(t)

	for _, tc := range []struct {
		name    string
		members []string
		addrs   map[string]string
	}{
		// n0 believes it is not a member at all.
		{"without_self", []string{"n1"}, map[string]string{"n1": n1.RPCAddr()}},
		// n0 believes in a third member that does not exist.
		{"phantom_member", []string{"n0", "n1", "n9"}, map[string]string{"n0": n0.RPCAddr(), "n1": n1.RPCAddr(), "n9": phantom}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys := pmKeys(40, "p")
			for i := range keys {
				keys[i].Tenant = tc.name
			}
			trueOwner := make([]string, len(keys))
			for i, k := range keys {
				trueOwner[i], _ = n1.Owner(k)
			}
			version, err := n0.SetViewForTest(tc.members, tc.addrs)
			if err != nil {
				t.Fatal(err)
			}
			staleOwner := make([]string, len(keys))
			disagree := 0
			for i, k := range keys {
				staleOwner[i], _ = n0.Owner(k)
				if staleOwner[i] != trueOwner[i] {
					disagree++
				}
			}
			if disagree == 0 {
				t.Fatal("the stale view agrees with the true one on every key; the test checks nothing")
			}
			rpcsBefore := m0.forwards.Load() + m1.forwards.Load()

			type result struct {
				via string
				d   Decision
				err error
			}
			results := make([][]result, len(keys))
			var wg sync.WaitGroup
			for i, k := range keys {
				wg.Go(func() {
					for r := range 2 * rounds {
						via := c.nodes[r%2]
						ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						start := time.Now()
						d, err := via.Allow(ctx, Request{Key: k})
						if time.Since(start) > 5*time.Second {
							err = fmt.Errorf("request took %v: %w", time.Since(start), err)
						}
						cancel()
						results[i] = append(results[i], result{via.Name(), d, err})
					}
				})
			}
			wg.Wait()

			requests := int64(len(keys) * 2 * rounds)
			if rpcs := m0.forwards.Load() + m1.forwards.Load() - rpcsBefore; rpcs > requests*(retries+1) {
				t.Fatalf("%d requests made %d forwarding RPCs, more than %d per request", requests, rpcs, retries+1)
			}
			if v := n0.RingVersion(); v != version {
				t.Fatalf("gossip replaced the stale view during the test (version %d, installed %d)", v, version)
			}
			decided := 0
			for i, rs := range results {
				var deciders []string
				var admitted int64
				for j, r := range rs {
					switch {
					case r.err != nil && !errors.Is(r.err, ErrUnavailable):
						t.Fatalf("key %v request %d via %s: %v, want a decision or ErrUnavailable", keys[i], j, r.via, r.err)
					case r.err != nil:
						continue
					case r.d.Reason != ReasonAdmitted && r.d.Reason != ReasonOverLimit:
						t.Fatalf("key %v request %d via %s: %+v is not an owner's decision", keys[i], j, r.via, r.d)
					}
					decided++
					if r.d.Allowed {
						admitted++
					}
					if len(deciders) == 0 || deciders[len(deciders)-1] != r.d.Owner {
						deciders = append(deciders, r.d.Owner)
					}
				}
				if admitted > limit {
					t.Fatalf("key %v: %d admitted, limit %d; results %+v", keys[i], admitted, limit, rs)
				}
				// Ownership follows the holder, not either ring: a wrong
				// view on n0 may move a partition (n0 transfers what its
				// ring says belongs elsewhere, and the true ring moves it
				// back), so decisions may come from one node and then
				// another, but never alternate (two decision points).
				if len(deciders) > 3 {
					t.Fatalf("key %v (stale owner %s, true owner %s): decisions came from %v, alternating", keys[i], staleOwner[i], trueOwner[i], deciders)
				}

			}
			if decided == 0 {
				t.Fatal("no request was decided")
			}
			t.Logf("%d keys, %d disagreeing; %d of %d requests decided", len(keys), disagree, decided, requests)
		})
	}
}

// TestPipeLostAnswer loses a forwarded batch on its stream (the holder
// receives it and never answers). The caller gets unavailable after
// ForwardTimeout. The batch's in-flight slot, the only one, is freed by
// the pipe's watchdog once it has waited twice ForwardTimeout, which
// breaks the pipe; the next batch opens a new one and is decided. Without
// the watchdog every later forward to that holder would wait forever.
// Requests queued behind the lost batch whose callers gave up are not sent
// when the slot frees: they would be counted with nobody told.
func TestPipeLostAnswer(t *testing.T) {
	const forwardTimeout = 500 * time.Millisecond
	c := startClusterWith(t, 2, Config{
		ForwardTimeout: forwardTimeout,
		MaxInFlight:    1,
		Policies:       map[string]PolicyConfig{"p": {Limit: 1000, Window: time.Minute}},
	}, nil)
	via, holder := c.nodes[0], c.nodes[1]
	key := pmKeyOwnedBy(t, via, "p", holder.Name())
	ctx := context.Background()
	var dropping atomic.Bool
	var dropped atomic.Int64
	holder.setStreamDropForTest(func(*peerpb.CheckRequest) bool {
		if !dropping.Load() {
			return false
		}
		dropped.Add(1)
		return true
	})
	deadline := time.Now().Add(20 * time.Second)
	admitted := 0
	dropping.Store(true)
	breaks := via.pipeBreaksForTest()
	// Until a batch has gone on the stream and been lost (the first may
	// go as a unary RPC while the connection comes up). The lost batch was
	// sent after the last call began.
	var lastStart time.Time
	for dropped.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no batch went on the stream within 20 s")
		}
		lastStart = time.Now()
		d, err := via.Allow(ctx, Request{Key: key})
		switch {
		case err == nil && d.Allowed:
			admitted++ // went as a unary RPC
		case err != nil && !errors.Is(err, ErrUnavailable):
			t.Fatalf("Allow: %v; want a decision or unavailable", err)
		}
	}
	dropping.Store(false)
	// Three callers queue behind the lost batch and give up (their own
	// deadline, well before the watchdog may break the stream).
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, forwardTimeout/10)
			defer cancel()
			if _, err := via.Allow(ctx, Request{Key: key}); !errors.Is(err, ErrUnavailable) {
				t.Errorf("Allow queued behind the lost batch: %v; want unavailable", err)
			}
		})
	}
	wg.Wait()
	waitFor(t, 20*time.Second, "the stream with the lost batch to break (else its slot is held for good)", func() bool {
		return via.pipeBreaksForTest() > breaks
	})
	if waited := time.Since(lastStart); waited < 2*forwardTimeout {
		t.Fatalf("the stream broke %v after the lost batch's call began; it must wait 2×ForwardTimeout (%v)", waited, 2*forwardTimeout)
	}
	d, err := via.Allow(ctx, Request{Key: key})
	if err != nil || !d.Allowed || d.Owner != holder.Name() {
		t.Fatalf("Allow after the stream broke = %+v, %v; want admitted by %s", d, err, holder.Name())
	}
	admitted++
	// Every admission answered is counted at the holder; neither the lost
	// batch nor the abandoned callers' requests were decided. A peek's
	// Remaining is what would remain after its one unit.
	d, err = holder.Peek(ctx, Request{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if used := d.Limit - d.Remaining - 1; used != int64(admitted) {
		t.Fatalf("holder counts %d admissions; %d were answered admitted (nothing else may be counted)", used, admitted)
	}
}

// TestReplicationMessageLost loses a holder's replication message on its
// way to the backup (received, never applied or answered). The admission
// waiting for it is not confirmed (unavailable, once the stream's watchdog
// gives up on it); admissions resume on a new stream; and when the holder
// then crashes, the backup that takes over knows every admission that was
// confirmed: the confirmed ones plus the backup's own never exceed the
// limit.
func TestReplicationMessageLost(t *testing.T) {
	t.Parallel()
	const limit = 10
	const forwardTimeout = crashForwardTimeout
	c := startCrashCluster(t, map[string]PolicyConfig{"p": {Limit: limit, Window: time.Hour}})
	n0, n1 := c.nodes[0], c.nodes[1]
	key, _ := keyHeldWithBackup(t, n0, n1, "repl-lost", "p")
	confirmed := admitN(t, n0, key, 3)
	// Lose the next message that carries admissions (heartbeats carry
	// none and keep flowing).
	var dropping atomic.Bool
	var dropped atomic.Int64
	dropping.Store(true)
	n1.setReplDropForTest(func(req *peerpb.ReplicateRequest) bool {
		if dropping.Load() && (len(req.GetAdmitsPacked()) > 0 || hasAdmit(req)) && dropped.Add(1) == 1 {
			dropping.Store(false)
			return true
		}
		return false
	})
	d, err := n0.Allow(context.Background(), Request{Key: key})
	if err == nil {
		t.Fatalf("the admission whose copy was lost was confirmed: %+v", d)
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("the admission whose copy was lost: %v; want unavailable", err)
	}
	if dropped.Load() != 1 {
		t.Fatalf("%d replication messages lost; want 1", dropped.Load())
	}
	waitFor(t, 20*time.Second, "n0 to confirm admissions again", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*forwardTimeout)
		defer cancel()
		d, err := n0.Allow(ctx, Request{Key: key})
		if err == nil && d.Allowed {
			confirmed++
		}
		return err == nil
	})
	after, _ := admittedAfterCrash(t, n0, []*Node{n1}, key, limit)
	confirmed += after
	if confirmed > limit {
		t.Fatalf("%d admissions confirmed in one window of limit %d across a lost replication message and a crash", confirmed, limit)
	}
}

// TestPolicyUnknownToBackupNotConfirmed adds a policy to the holder's table
// before its backup's (a policy change rolling out). The backup cannot
// record admissions of a policy it does not have, so a synchronous
// admission must not be confirmed until it does: before, the backup
// answered OK having skipped the admission, the holder confirmed it, and a
// crash then left the backup, once it learned the policy, with a full
// quota on top of what had been admitted.
func TestPolicyUnknownToBackupNotConfirmed(t *testing.T) {
	t.Parallel()
	const limit = 5
	base := map[string]PolicyConfig{"p": {Limit: limit, Window: time.Hour}}
	both := map[string]PolicyConfig{"p": base["p"], "q": {Limit: limit, Window: time.Hour}}
	c := startCrashCluster(t, base)
	n0, n1 := c.nodes[0], c.nodes[1]
	kp, _ := keyHeldWithBackup(t, n0, n1, "roll", "p")
	kq := Key{Tenant: kp.Tenant, Subject: kp.Subject, Policy: "q"} // the same partition
	if err := n0.SetPolicies(both); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if d, err := n0.Allow(ctx, Request{Key: kq}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("admission of a policy the backup does not have: %+v, %v; want unavailable (not recorded by the backup)", d, err)
	}
	// Policies the backup has are confirmed meanwhile.
	if d, err := n0.Allow(ctx, Request{Key: kp}); err != nil || !d.Allowed {
		t.Fatalf("admission of a policy both have: %+v, %v", d, err)
	}
	for _, nd := range c.nodes[1:] {
		if err := nd.SetPolicies(both); err != nil {
			t.Fatal(err)
		}
	}
	confirmed := 0
	for range 2 {
		if d, err := n0.Allow(ctx, Request{Key: kq}); err != nil || !d.Allowed {
			t.Fatalf("admission once the backup has the policy: %+v, %v", d, err)
		}
		confirmed++
	}
	after, unknown := admittedAfterCrash(t, n0, []*Node{n1}, kq, limit)
	confirmed += after
	// The first admission of q, answered unavailable, stays counted at
	// the holder (it can only refuse more), and reaches the backup if the
	// holder copies the partition to it again once it has q (a loaded run
	// saw the new holder admit 2, not 3): an outcome unknown to its
	// caller.
	unknown++
	if confirmed > limit || confirmed+unknown < limit {
		t.Fatalf("%d admissions of q confirmed in one window of limit %d across the roll and a crash (%d more of unknown outcome); want exactly %d", confirmed, limit, unknown, limit)
	}
}

// TestLimitRaisedOnHolderFirst rolls out a higher limit that reaches the
// holder before its backup, admits beyond the old limit, crashes the
// holder, and then gives the survivors the new table: the backup kept
// every admission, so the window holds exactly the new limit. Before,
// the backup kept only its old limit's worth and admitted the difference
// again.
func TestLimitRaisedOnHolderFirst(t *testing.T) {
	t.Parallel()
	const oldLimit, newLimit = 4, 8
	oldT := map[string]PolicyConfig{"p": {Limit: oldLimit, Window: time.Hour}}
	newT := map[string]PolicyConfig{"p": {Limit: newLimit, Window: time.Hour}}
	c := startCrashCluster(t, oldT)
	n0, n1, n2 := c.nodes[0], c.nodes[1], c.nodes[2]
	key, _ := keyHeldWithBackup(t, n0, n1, "raise", "p")
	if err := n0.SetPolicies(newT); err != nil {
		t.Fatal(err)
	}
	admitted := admitN(t, n0, key, 6)
	finishRollAndCrash(t, newT, n0, []*Node{n1, n2}, key, newLimit, admitted)
}

// finishRollAndCrash gives survivors the table tab, kills holder, and
// fails the test unless the admissions of key in its window (admitted
// before, and after the takeover) come to exactly limit.
func finishRollAndCrash(t *testing.T, tab map[string]PolicyConfig, holder *Node, survivors []*Node, key Key, limit, admitted int) {
	t.Helper()
	for _, nd := range survivors {
		if err := nd.SetPolicies(tab); err != nil {
			t.Fatal(err)
		}
	}
	after, unknown := admittedAfterCrash(t, holder, survivors, key, limit)
	admitted += after
	if admitted > limit || admitted+unknown < limit {
		t.Fatalf("%d admissions in one window of limit %d across the roll and a crash (%d more of unknown outcome); want exactly %d", admitted, limit, unknown, limit)
	}
}

// TestWindowRaisedOnHolderFirst: a raised window reaches a key's holder
// before its backup. The holder keeps the key's admissions for the new,
// longer window and copies each to the backup, which, on the old table,
// cut the copy to its own shorter window at the next admission it
// received. After a holder crash, with the new table everywhere, the key
// then admitted again what the longer window still counted: 6 admissions
// in a window of limit 4. Replication messages now carry the holder's
// windows while the tables differ, and the backup keeps the longer one.
func TestWindowRaisedOnHolderFirst(t *testing.T) {
	t.Parallel()
	const limit = 4
	oldT := map[string]PolicyConfig{"p": {Limit: limit, Window: time.Minute}}
	newT := map[string]PolicyConfig{"p": {Limit: limit, Window: time.Hour}}
	clk := &hoClock{}
	c := startClockedCrashCluster(t, clk, oldT)
	n0, n1, n2 := c.nodes[0], c.nodes[1], c.nodes[2]
	key, _ := keyHeldWithBackup(t, n0, n1, "wraise", "p")
	if err := n0.SetPolicies(newT); err != nil {
		t.Fatal(err)
	}
	admitted := admitN(t, n0, key, 2)
	// Past the old window, inside the new one: the next admission's copy
	// is merged into the backup's log, which used to drop the first two.
	clk.Advance(2 * time.Minute)
	admitted += admitN(t, n0, key, 1)
	finishRollAndCrash(t, newT, n0, []*Node{n1, n2}, key, limit, admitted)
}

// TestWindowRolledBackOnBackupFirst: a key's backup rolls its policy
// table back to a shorter window while its holder's gossiped view of it
// is still the newer table, so the holder's next replication message
// carries no windows. The backup used to cut its copy to its own,
// shorter window: after a roll forward again and a holder crash, the key
// would have admitted again what the longer window still counted.
// Messages now carry the sender's policy version, and a backup whose
// version differs, told no windows, keeps every copied admission.
func TestWindowRolledBackOnBackupFirst(t *testing.T) {
	oldT := map[string]PolicyConfig{"p": {Limit: 4, Window: time.Minute}}
	newT := map[string]PolicyConfig{"p": {Limit: 4, Window: time.Hour}}
	clk := &hoClock{}
	c := startClockedCrashCluster(t, clk, newT)
	n0, n1 := c.nodes[0], c.nodes[1]
	key, pid := keyHeldWithBackup(t, n0, n1, "wback", "p")
	// The holder stamps its messages with its policy version.
	stamped := make(chan uint64, 64)
	n1.setReplDropForTest(func(req *peerpb.ReplicateRequest) bool {
		if req.GetSender() == n0.Name() && !isCopy(req) {
			select {
			case stamped <- req.GetPolicyVersion():
			default:
			}
		}
		return false
	})
	admitN(t, n0, key, 2)
	select {
	case v := <-stamped:
		if v != n0.PolicyVersion() {
			t.Fatalf("the holder's replication message carries policy version %d, want its own %d", v, n0.PolicyVersion())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no replication message from the holder reached the backup")
	}
	n1.setReplDropForTest(func(*peerpb.ReplicateRequest) bool { return false })
	if got := copyUnits(n1, n0, pid, key); got != 2 {
		t.Fatalf("the backup's copy holds %d units, want 2", got)
	}
	if err := n1.SetPolicies(oldT); err != nil {
		t.Fatal(err)
	}
	// Past the old window, inside the new one. The holder's next
	// admission, as the holder sends it while it still believes the
	// backup on its own table: its version, no windows.
	clk.Advance(2 * time.Minute)
	epoch := n1.replicaEpochForTest(pid)
	st := stateToWire(shard.KeyState{Key: key, Algorithm: shard.SlidingLog, Runs: []shard.Run{{Count: 1}}})
	resp, err := (&limiterService{n: n1}).Replicate(context.Background(), &peerpb.ReplicateRequest{
		Sender: n0.Name(), Seq: 1 << 50, PolicyVersion: n0.PolicyVersion(),
		Ops: []*peerpb.PartitionOp{{Kind: peerpb.PartitionOp_KIND_ADMIT, Partition: uint32(pid), Epoch: epoch, Keys: []*peerpb.KeyState{st}}},
	})
	if err != nil || len(resp.GetResults()) != 1 || resp.GetResults()[0].GetStatus() != peerpb.OpStatus_OP_STATUS_OK {
		t.Fatalf("Replicate: %v, %v", resp, err)
	}
	if got := copyUnits(n1, n0, pid, key); got != 3 {
		t.Fatalf("the backup's copy holds %d units after an admission 2 min after the first two, want 3 (the holder's window is an hour)", got)
	}
}

// startClockedCrashCluster is startCrashCluster on clk's time.
func startClockedCrashCluster(t *testing.T, clk *hoClock, pols map[string]PolicyConfig) *cluster {
	t.Helper()
	return startCluster(t, 3, Config{
		Clock:          clk.Now,
		Gossip:         hoGossip,
		ForwardTimeout: crashForwardTimeout,
		Policies:       pols,
	})
}

// TestLateReplicationNotApplied delivers a replication message to a
// backup after a newer one, as a message from a connection its holder
// gave up on can arrive: a REPLACE (a reset) older than an admission the
// backup already applied must not remove it. Before messages were
// numbered it did, and a holder crash then lost the admission.
func TestLateReplicationNotApplied(t *testing.T) {
	n0, n1, key, pid, epoch, seq := copiedKey(t, "late")
	if seq == 0 {
		t.Fatalf("the backup's copy has no message number after an admission")
	}
	// Far ahead of n0's own numbers, so its traffic does not interleave.
	base := seq + 1<<40
	srv := &limiterService{n: n1}
	state := func(count int64) *peerpb.KeyState {
		st := shard.KeyState{Key: key, Algorithm: shard.SlidingLog}
		if count > 0 {
			st.Runs = []shard.Run{{Age: 0, Count: count}}
		}
		return stateToWire(st)
	}
	send := func(seq uint64, kind peerpb.PartitionOp_Kind, count int64) peerpb.OpStatus {
		t.Helper()
		resp, err := srv.Replicate(context.Background(), &peerpb.ReplicateRequest{Sender: n0.Name(), Seq: seq, Ops: []*peerpb.PartitionOp{{
			Kind: kind, Partition: uint32(pid), Epoch: epoch, Keys: []*peerpb.KeyState{state(count)},
		}}})
		if err != nil || len(resp.GetResults()) != 1 {
			t.Fatalf("Replicate: %v, %v", resp, err)
		}
		return resp.GetResults()[0].GetStatus()
	}
	units := func() int64 { return copyUnits(n1, n0, pid, key) }
	if st := send(base+2, peerpb.PartitionOp_KIND_ADMIT, 3); st != peerpb.OpStatus_OP_STATUS_OK {
		t.Fatalf("the newer admission: %v", st)
	}
	if got := units(); got != 4 {
		t.Fatalf("the copy holds %d units after the newer admission, want 4", got)
	}
	send(base+1, peerpb.PartitionOp_KIND_REPLACE, 0) // the late reset
	if got := units(); got != 4 {
		t.Fatalf("a late REPLACE changed the copy to %d units, want 4 (it is older than the admission applied)", got)
	}
	// In order, a REPLACE applies.
	if st := send(base+3, peerpb.PartitionOp_KIND_REPLACE, 1); st != peerpb.OpStatus_OP_STATUS_OK || units() != 1 {
		t.Fatalf("an in-order REPLACE: %v, %d units; want OK and 1", st, units())
	}
}

// copiedKey starts the crash tests' cluster with one policy "p" (limit 10
// an hour), admits once a key (subjects from prefix) that n0 holds with n1
// as backup, and returns n0, n1, the key, its partition, and the epoch and
// last message number of n1's copy.
func copiedKey(t *testing.T, prefix string) (n0, n1 *Node, key Key, pid int, epoch, seq uint64) {
	t.Helper()
	c := startCrashCluster(t, map[string]PolicyConfig{"p": {Limit: 10, Window: time.Hour}})
	n0, n1 = c.nodes[0], c.nodes[1]
	key, pid = keyHeldWithBackup(t, n0, n1, prefix, "p")
	admitN(t, n0, key, 1)
	pt := &n1.pt.parts[pid]
	pt.Mu.RLock()
	seq = pt.Rep.Seq
	pt.Mu.RUnlock()
	return n0, n1, key, pid, n1.replicaEpochForTest(pid), seq
}

// copyUnits counts the units backup's copy of holder's partition pid
// holds for key.
func copyUnits(backup, holder *Node, pid int, key Key) int64 {
	st, _ := backup.copyForTest(pid, holder.Name()).Export(key, backup.clock())
	var u int64
	for _, r := range st.Runs {
		u += r.Count
	}
	return u
}

// TestReplicateMalformedWindowsRefused: a replication request whose
// windows are malformed is refused as a whole and changes nothing.
func TestReplicateMalformedWindowsRefused(t *testing.T) {
	n0, n1, key, pid, epoch, _ := copiedKey(t, "mw")
	st := stateToWire(shard.KeyState{Key: key, Algorithm: shard.SlidingLog, Runs: []shard.Run{{Count: 5}}})
	srv := &limiterService{n: n1}
	_, err := srv.Replicate(context.Background(), &peerpb.ReplicateRequest{
		Sender: n0.Name(), Seq: 1 << 50, WindowsPacked: []byte{1, 1, 'p', 0},
		Ops: []*peerpb.PartitionOp{{Kind: peerpb.PartitionOp_KIND_ADMIT, Partition: uint32(pid), Epoch: epoch, Keys: []*peerpb.KeyState{st}}},
	})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Replicate with a zero window = %v, want InvalidArgument", err)
	}
	if units := copyUnits(n1, n0, pid, key); units != 1 {
		t.Fatalf("the copy holds %d units after a refused request, want 1", units)
	}
}

// TestCopyAtEpochZeroRefused: a copy's epoch is above its holder's, so a
// SYNC_BEGIN at epoch 0 is malformed; it is refused and changes nothing
// (before, the receiver worked out the holder's epoch as 0 − 1, wrapped).
func TestCopyAtEpochZeroRefused(t *testing.T) {
	pols := map[string]PolicyConfig{"p": {Limit: 5, Window: time.Minute}}
	c := startCluster(t, 2, Config{Policies: pols})
	n0, n1 := c.nodes[0], c.nodes[1]
	const pid = 7
	role, holder, epoch := n1.roleForTest(pid)
	resp, err := (&limiterService{n: n1}).Replicate(context.Background(), &peerpb.ReplicateRequest{Sender: n0.Name(), Ops: []*peerpb.PartitionOp{{
		Kind: peerpb.PartitionOp_KIND_SYNC_BEGIN, Partition: pid, Epoch: 0,
	}}})
	if err != nil || len(resp.GetResults()) != 1 || resp.GetResults()[0].GetStatus() != peerpb.OpStatus_OP_STATUS_REFUSED {
		t.Fatalf("SYNC_BEGIN at epoch 0: %v, %v; want REFUSED", resp, err)
	}
	if r, h, e := n1.roleForTest(pid); r != role || h != holder || e != epoch {
		t.Fatalf("partition %d changed from %v/%s/%d to %v/%s/%d", pid, role, holder, epoch, r, h, e)
	}
}
