package peer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pmT0 is the fixed epoch of the shared fake clock: a whole second, so
// whole-millisecond steps land on the default 1 ms resolution grid.
var pmT0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// sharedClock is a fake monotonic clock that several nodes read, each
// optionally with its own offset. The test (or its workers) advance it.
type sharedClock struct{ ns atomic.Int64 }

// pmForwardTimeout bounds forwards in the promise tests. They check
// exactness, not latency: on a loaded 2-core machine a forward can stall
// past the 500 ms default, and an unavailable answer there is a timing
// artefact, not a broken promise.
const pmForwardTimeout = 10 * time.Second

// Now returns the shared time.
func (c *sharedClock) Now() time.Time { return pmT0.Add(time.Duration(c.ns.Load())) }

// Advance moves the shared time forward by d and returns the new time.
func (c *sharedClock) Advance(d time.Duration) time.Time {
	return pmT0.Add(time.Duration(c.ns.Add(int64(d))))
}

// WithOffset returns a node clock that reads the shared time plus off.
func (c *sharedClock) WithOffset(off time.Duration) func() time.Time {
	return func() time.Time { return c.Now().Add(off) }
}

// pmKeys returns n distinct keys of policy.
func pmKeys(n int, policy string) []Key {
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = Key{Tenant: "acme", Subject: fmt.Sprintf("user-%03d", i), Policy: policy}
	}
	return keys
}

// pmOwners returns each key's owner and fails unless every node of c agrees.
func pmOwners(t *testing.T, c *cluster, keys []Key) []string {
	t.Helper()
	owners := make([]string, len(keys))
	for i, k := range keys {
		for j, nd := range c.live() {
			o, err := nd.Owner(k)
			if err != nil {
				t.Fatalf("%s.Owner(%v): %v", nd.Name(), k, err)
			}
			if j == 0 {
				owners[i] = o
			} else if o != owners[i] {
				t.Fatalf("nodes disagree on the owner of %v: %s says %s, %s says %s", k, c.nodes[0].Name(), owners[i], nd.Name(), o)
			}
		}
	}
	return owners
}

// pmKeyOwnedBy returns a key of policy whose owner in nd's ring is owner.
func pmKeyOwnedBy(t *testing.T, nd *Node, policy, owner string) Key {
	t.Helper()
	for i := range 10000 {
		k := Key{Tenant: "acme", Subject: fmt.Sprintf("subject-%05d", i), Policy: policy}
		if o, err := nd.Owner(k); err == nil && o == owner {
			return k
		}
	}
	t.Fatalf("no key of policy %q owned by %s among 10000 candidates", policy, owner)
	return Key{}
}

// refLog is the sequential reference model of one key: a plain list of
// admission times, scanned on every call.
type refLog struct{ ts []time.Time }

// count returns the admissions in (now-w, now].
func (r *refLog) count(now time.Time, w time.Duration) int64 {
	var n int64
	for _, ts := range r.ts {
		if ts.After(now.Add(-w)) && !ts.After(now) {
			n++
		}
	}
	return n
}

// admit decides demand single-hit requests all made at now and returns how
// many it admits. With equal times and one hit each, the outcome does not
// depend on the order the requests arrive in.
func (r *refLog) admit(now time.Time, demand int, limit int64, w time.Duration) int {
	free := limit - r.count(now, w)
	n := int(min(int64(demand), max(free, 0)))
	for range n {
		r.ts = append(r.ts, now)
	}
	return n
}

// checkWindows fails if any rolling window (t-w, t] of the sorted admission
// times ts holds more than limit admissions. The busiest windows end at an
// admission, so only those are examined.
func checkWindows(t *testing.T, what string, ts []int64, limit int64, w time.Duration) {
	t.Helper()
	lo := 0
	for hi, end := range ts {
		for ts[lo] <= end-int64(w) {
			lo++
		}
		if n := int64(hi - lo + 1); n > limit {
			t.Fatalf("%s: %d admissions in the window (%v, %v], limit %d",
				what, n, pmT0.Add(time.Duration(end-int64(w))).Sub(pmT0), pmT0.Add(time.Duration(end)).Sub(pmT0), limit)
		}
	}
}

// countIn returns how many of the sorted times ts fall in (t-w, t].
func countIn(ts []int64, t int64, w time.Duration) int {
	hi, _ := slices.BinarySearch(ts, t+1)
	lo, _ := slices.BinarySearch(ts, t-int64(w)+1)
	return hi - lo
}

// TestPromiseRounds drives 50 keys from all three nodes concurrently in
// rounds: all requests of a round are decided at one instant of the shared
// fake clock, which then moves on. With one hit per request the number a
// round admits per key does not depend on arrival order, so the cluster is
// compared round by round with the sequential reference model, exactly, and
// the owners' logs are compared with the model's at the end.
func TestPromiseRounds(t *testing.T) {
	const (
		limit          = 10
		window         = 100 * time.Millisecond
		step           = 7 * time.Millisecond // not a divisor of window, so edges vary
		rounds         = 100                  // 700 ms: the window rolls over 7 times
		nkeys          = 50
		workersPerNode = 4
		perWorker      = 6 // requests per worker per round: ~2 per key, 28 per window
	)
	clk := &sharedClock{}
	c := startCluster(t, 3, Config{
		Policies:       map[string]PolicyConfig{"p": {Limit: limit, Window: window}},
		Clock:          clk.Now,
		ForwardTimeout: pmForwardTimeout,
		Gossip:         hoGossip,
		LeaseDuration:  6 * time.Second,
	})
	keys := pmKeys(nkeys, "p")
	owners := pmOwners(t, c, keys)
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 1))

	type worker struct {
		nd   *Node
		plan []int // key indices for this round
	}
	var workers []*worker
	for _, nd := range c.nodes {
		for range workersPerNode {
			workers = append(workers, &worker{nd: nd, plan: make([]int, perWorker)})
		}
	}
	ref := make([]refLog, nkeys)
	admitted := make([]atomic.Int64, nkeys)
	errs := make(chan error, len(workers)*perWorker)
	total, refused := 0, 0
	for r := range rounds {
		now := clk.Advance(step)
		demand := make([]int, nkeys)
		for _, w := range workers {
			for i := range w.plan {
				k := rng.IntN(nkeys)
				w.plan[i] = k
				demand[k]++
			}
		}
		for i := range admitted {
			admitted[i].Store(0)
		}
		var wg sync.WaitGroup
		for _, w := range workers {
			wg.Go(func() {
				for _, k := range w.plan {
					d, err := w.nd.Allow(context.Background(), Request{Key: keys[k]})
					switch {
					case err != nil:
						errs <- fmt.Errorf("round %d: %s.Allow(%v): %w", r, w.nd.Name(), keys[k], err)
						return
					case d.Owner != owners[k] || d.RingVersion == 0 || d.Limit != limit:
						errs <- fmt.Errorf("round %d: %s.Allow(%v) = %+v, want owner %s, ring version > 0, limit %d", r, w.nd.Name(), keys[k], d, owners[k], limit)
						return
					case d.Allowed != (d.Reason == ReasonAdmitted) || (!d.Allowed && d.Reason != ReasonOverLimit):
						errs <- fmt.Errorf("round %d: %s.Allow(%v) = %+v: allowed and reason disagree", r, w.nd.Name(), keys[k], d)
						return
					}
					if d.Allowed {
						admitted[k].Add(1)
					}
				}
			})
		}
		wg.Wait()
		select {
		case err := <-errs:
			t.Fatalf("seed %d: %v", seed, err)
		default:
		}
		for k := range nkeys {
			want := ref[k].admit(now, demand[k], limit, window)
			if got := int(admitted[k].Load()); got != want {
				t.Fatalf("seed %d, round %d (t0+%v): key %v (owner %s) admitted %d of %d requests, reference model admits %d",
					seed, r, now.Sub(pmT0), keys[k], owners[k], got, demand[k], want)
			}
			total += demand[k]
			refused += demand[k] - want
		}
	}
	if refused == 0 || refused == total {
		t.Fatalf("%d of %d requests refused: the load does not exercise the limit", refused, total)
	}
	t.Logf("%d requests, %d refused, %d windows", total, refused, rounds*int(step)/int(window))

	// The owners' own logs hold exactly the reference model's admissions
	// of the last window, at the same owner times.
	now := clk.Now()
	byName := map[string]*Node{}
	for _, nd := range c.nodes {
		byName[nd.Name()] = nd
	}
	for k, key := range keys {
		runs, _ := byName[owners[k]].ExportForTest(key)
		got := map[time.Duration]int64{}
		for _, r := range runs {
			// The log drops expired runs lazily, at the key's next decision.
			if r.At.After(now.Add(-window)) {
				got[r.At.Sub(pmT0)] += r.Count
			}
		}
		want := map[time.Duration]int64{}
		for _, ts := range ref[k].ts {
			if ts.After(now.Add(-window)) {
				want[ts.Sub(pmT0)]++
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("owner %s log of %v = %v, reference model %v", owners[k], key, got, want)
		}
	}
}

// TestPromiseFreeRunning lets 12 workers (4 per node) hammer 50 keys while
// each advances the shared fake clock by a small step after every request,
// so decisions interleave with time moving. Between phases (shorter than a
// window) the workers pause and the test reads every key's log from its
// owner, which yields the exact owner time of every admission. Then:
//
//   - no rolling window (t-W, t] of any key holds more than L admissions;
//   - every admission a caller saw is in the owner's log and vice versa;
//   - every refusal is justified: at some instant between the caller's
//     clock readings before and after the call, the window was full.
//
// The last two together say the cluster behaves like the sequential
// reference model at the owner's decision times.
//
// It runs beside another test: its nodes wait on their forwards' batches
// far more than they compute (about a fifth of a core alone), and nothing
// in it has a deadline but the 10 s forward timeout. Every key must stay
// with its first owner, so a starved member must not lose its partitions:
// the patient failure detector (hoGossip) and 6 s leases. Beside another
// test on a loaded machine, testGossip's suspicions flapped and a key was
// decided by another member in phase 10.
func TestPromiseFreeRunning(t *testing.T) {
	t.Parallel()
	const (
		limit          = 10
		window         = 100 * time.Millisecond
		step           = 100 * time.Microsecond
		nkeys          = 50
		workersPerNode = 4
		phases         = 20 // 960 ms: the window rolls over 9 times
		opsPerPhase    = 40 // per worker: 12*40*100µs = 48 ms of fake time per phase
	)
	clk := &sharedClock{}
	c := startCluster(t, 3, Config{
		// Resolution 1 µs keeps recorded times equal to decision times
		// (steps are whole microseconds), which the refusal check needs.
		Policies:       map[string]PolicyConfig{"p": {Limit: limit, Window: window, Resolution: time.Microsecond}},
		Clock:          clk.Now,
		ForwardTimeout: pmForwardTimeout,
		Gossip:         hoGossip,
		LeaseDuration:  6 * time.Second,
	})
	keys := pmKeys(nkeys, "p")
	owners := pmOwners(t, c, keys)
	byName := map[string]*Node{}
	for _, nd := range c.nodes {
		byName[nd.Name()] = nd
	}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)

	type op struct {
		key     int
		lo, hi  int64 // shared clock before and after the call
		allowed bool
	}
	type worker struct {
		nd  *Node
		rng *rand.Rand
		ops []op
	}
	var workers []*worker
	for i, nd := range c.nodes {
		for j := range workersPerNode {
			workers = append(workers, &worker{nd: nd, rng: rand.New(rand.NewPCG(uint64(seed), uint64(i*workersPerNode+j)))})
		}
	}
	recorded := make([]map[int64]int64, nkeys) // key -> owner time (ns) -> units
	for i := range recorded {
		recorded[i] = map[int64]int64{}
	}
	errs := make(chan error, len(workers))
	for ph := range phases {
		start := clk.ns.Load()
		var wg sync.WaitGroup
		for _, w := range workers {
			wg.Go(func() {
				for range opsPerPhase {
					k := w.rng.IntN(nkeys)
					lo := clk.ns.Load()
					d, err := w.nd.Allow(context.Background(), Request{Key: keys[k]})
					hi := clk.ns.Load()
					clk.Advance(step)
					if err != nil {
						errs <- fmt.Errorf("phase %d: %s.Allow(%v): %w", ph, w.nd.Name(), keys[k], err)
						return
					}
					if d.Owner != owners[k] || d.RingVersion == 0 {
						errs <- fmt.Errorf("phase %d: %s.Allow(%v) = %+v, want owner %s and ring version > 0", ph, w.nd.Name(), keys[k], d, owners[k])
						return
					}
					w.ops = append(w.ops, op{key: k, lo: lo, hi: hi, allowed: d.Allowed})
				}
			})
		}
		wg.Wait()
		select {
		case err := <-errs:
			t.Fatalf("seed %d: %v", seed, err)
		default:
		}
		if d := time.Duration(clk.ns.Load() - start); d >= window {
			t.Fatalf("phase lasted %v of fake time, must stay under the window %v so no admission expires before it is read", d, window)
		}
		// Nothing is in flight: read every admission of the phase from the
		// owners. Units at one time only grow until the clock passes it.
		for k, key := range keys {
			runs, _ := byName[owners[k]].ExportForTest(key)
			for _, r := range runs {
				at := r.At.Sub(pmT0).Nanoseconds()
				recorded[k][at] = max(recorded[k][at], r.Count)
			}
		}
	}

	seen := make([]int64, nkeys)
	var all []op
	for _, w := range workers {
		all = append(all, w.ops...)
		for _, o := range w.ops {
			if o.allowed {
				seen[o.key]++
			}
		}
	}
	times := make([][]int64, nkeys)
	refused := 0
	for k := range keys {
		var units int64
		for at, n := range recorded[k] {
			units += n
			for range n {
				times[k] = append(times[k], at)
			}
		}
		slices.Sort(times[k])
		if units != seen[k] {
			t.Fatalf("seed %d: key %v: callers saw %d admissions, owner %s recorded %d", seed, keys[k], seen[k], owners[k], units)
		}
		checkWindows(t, fmt.Sprintf("seed %d: key %v", seed, keys[k]), times[k], limit, window)
	}
	for _, o := range all {
		if o.allowed {
			continue
		}
		refused++
		// The window's count only rises at an admission, so its maximum
		// over [lo, hi] is at lo or at an admission time inside.
		ts := times[o.key]
		best := countIn(ts, o.lo, window)
		i, _ := slices.BinarySearch(ts, o.lo+1)
		for ; i < len(ts) && ts[i] <= o.hi; i++ {
			best = max(best, countIn(ts, ts[i], window))
		}
		if best < limit {
			t.Fatalf("seed %d: key %v refused while its window held at most %d of %d admissions during the call (t0+%v to t0+%v)",
				seed, keys[o.key], best, limit, time.Duration(o.lo), time.Duration(o.hi))
		}
	}
	if refused == 0 || refused == len(all) {
		t.Fatalf("%d of %d requests refused: the load does not exercise the limit", refused, len(all))
	}
	t.Logf("%d requests, %d refused, %v of fake time", len(all), refused, time.Duration(clk.ns.Load()))
}

// TestPromiseOwnerClock gives the nodes clocks an hour apart and shows the
// window is measured on the owner's clock only: a sender whose clock is an
// hour ahead neither expires the owner's log early nor shifts RetryAfter,
// and one an hour behind does not extend it.
func TestPromiseOwnerClock(t *testing.T) {
	const (
		limit  = 3
		window = 10 * time.Second
	)
	clk := &sharedClock{}
	offsets := []time.Duration{0, time.Hour, -time.Hour}
	c := startClusterWith(t, 3, Config{
		Policies:       map[string]PolicyConfig{"p": {Limit: limit, Window: window}},
		ForwardTimeout: pmForwardTimeout,
	}, func(i int, cfg *Config) { cfg.Clock = clk.WithOffset(offsets[i]) })

	offsetOf := map[*Node]time.Duration{}
	for i, nd := range c.nodes {
		offsetOf[nd] = offsets[i]
	}
	for oi, owner := range c.nodes {
		t.Run("owner="+owner.Name(), func(t *testing.T) {
			key := pmKeyOwnedBy(t, owner, "p", owner.Name())
			a, b := c.nodes[(oi+1)%3], c.nodes[(oi+2)%3] // the two senders
			type step struct {
				advance    time.Duration
				via        *Node
				allowed    bool
				remaining  int64
				retryAfter time.Duration
			}
			steps := []step{
				{0, a, true, 2, 0},
				{0, b, true, 1, 0},
				{0, a, true, 0, 0},
				{0, b, false, 0, window},
				{0, a, false, 0, window},
				// Just before the admissions are W old on the owner's clock.
				{window - time.Millisecond, a, false, 0, time.Millisecond},
				{0, b, false, 0, time.Millisecond},
				// Exactly W old: expired.
				{time.Millisecond, a, true, 2, 0},
			}
			for i, s := range steps {
				clk.Advance(s.advance)
				d, err := s.via.Allow(context.Background(), Request{Key: key})
				if err != nil {
					t.Fatalf("step %d via %s: %v", i, s.via.Name(), err)
				}
				if d.Allowed != s.allowed || d.Remaining != s.remaining || d.RetryAfter != s.retryAfter || d.Owner != owner.Name() || d.RingVersion == 0 {
					t.Fatalf("step %d via %s (clock offset %v, owner's %v): got %+v, want allowed %v remaining %d retry after %v from owner %s",
						i, s.via.Name(), offsetOf[s.via], offsets[oi], d, s.allowed, s.remaining, s.retryAfter, owner.Name())
				}
			}
		})
	}
}

// TestPromiseShadow checks shadow mode on the local and the forwarded path:
// refusals come back Allowed with ReasonShadow, but only real admissions
// are recorded, so Remaining and later decisions reflect the real count.
func TestPromiseShadow(t *testing.T) {
	const (
		limit  = 3
		window = time.Minute
	)
	clk := &sharedClock{}
	c := startCluster(t, 2, Config{
		Policies:       map[string]PolicyConfig{"shadow": {Limit: limit, Window: window, Shadow: true}},
		Clock:          clk.Now,
		ForwardTimeout: pmForwardTimeout,
	})
	via := c.nodes[0]
	for _, owner := range c.nodes {
		path := "local"
		if owner != via {
			path = "forwarded"
		}
		t.Run("path="+path, func(t *testing.T) {
			key := pmKeyOwnedBy(t, via, "shadow", owner.Name())
			type step struct {
				advance   time.Duration
				reason    Reason
				remaining int64
			}
			steps := []step{
				{0, ReasonAdmitted, 2},
				{0, ReasonAdmitted, 1},
				{0, ReasonAdmitted, 0},
				{window / 2, ReasonShadow, 0},
				{0, ReasonShadow, 0},
				// The shadow admissions at W/2 were not recorded: once the
				// three real ones expire, the full limit is back.
				{window / 2, ReasonAdmitted, 2},
			}
			for i, s := range steps {
				clk.Advance(s.advance)
				d, err := via.Allow(context.Background(), Request{Key: key})
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if !d.Allowed || d.Reason != s.reason || d.Remaining != s.remaining || d.Owner != owner.Name() || d.RingVersion == 0 {
					t.Fatalf("step %d: got %+v, want allowed with reason %v, remaining %d, owner %s",
						i, d, s.reason, s.remaining, owner.Name())
				}
			}
			runs, _ := owner.ExportForTest(key)
			var units int64
			for _, r := range runs {
				units += r.Count
			}
			if units != 1 {
				t.Fatalf("owner log holds %d units (%v), want only the last real admission", units, runs)
			}
		})
	}
}

// TestDecidedAtIsTheRecordedTime makes two decisions on one key read the
// clock in one order and take the key's lock in the other: the later
// reading is recorded first, and the key's clock never goes back, so the
// earlier reading's admission is recorded at the later time. Its
// DecidedAt must say so: the time it was recorded at, never a time before
// the decision it follows.
func TestDecidedAtIsTheRecordedTime(t *testing.T) {
	clk := &hoClock{}
	c := startCluster(t, 1, Config{Clock: clk.Now, Policies: map[string]PolicyConfig{"p": {Limit: 10, Window: time.Minute, Resolution: time.Nanosecond}}})
	nd := c.nodes[0]
	key := Key{Tenant: "t", Subject: "s", Policy: "p"}
	entered, release := pauseFirstDecision(t, nd)
	first := make(chan Decision, 1)
	go func() {
		d, err := nd.Allow(context.Background(), Request{Key: key})
		if err != nil {
			t.Errorf("first Allow: %v", err)
		}
		first <- d
	}()
	<-entered // the first decision has read the clock and waits
	clk.Advance(time.Second)
	second, err := nd.Allow(context.Background(), Request{Key: key})
	if err != nil || !second.Allowed {
		t.Fatalf("second Allow = %+v, %v", second, err)
	}
	release()
	d := <-first
	if !d.Allowed {
		t.Fatalf("first Allow = %+v; want admitted", d)
	}
	if d.DecidedAt.Before(second.DecidedAt) {
		t.Fatalf("first decision reports %v, before the second's %v, which it was recorded after (at the key's clock, %v)",
			d.DecidedAt, second.DecidedAt, second.DecidedAt)
	}
}

// TestMultiDecidedAtIsTheRecordedTime is TestDecidedAtIsTheRecordedTime
// for a multi-policy check: one policy's key has a clock ahead of the
// node's (the node clock stepped back after it decided), so the atomic
// decision is taken, recorded and copied to the backup at that key's time,
// for every policy, and DecidedAt says so. Copied at the node's earlier
// time, the backup's record of the other policy would expire before the
// holder's, so a takeover could admit it early.
func TestMultiDecidedAtIsTheRecordedTime(t *testing.T) {
	clk := &hoClock{}
	c := startCluster(t, 2, Config{Clock: clk.Now, Gossip: hoGossip, Policies: map[string]PolicyConfig{
		"a": {Limit: 10, Window: time.Minute, Resolution: time.Nanosecond},
		"b": {Limit: 10, Window: time.Minute, Resolution: time.Nanosecond},
	}})
	holder, backup := c.nodes[0], c.nodes[1]
	ka, _ := keyHeldWithBackup(t, holder, backup, "multi-at", "a")
	kb := Key{Tenant: ka.Tenant, Subject: ka.Subject, Policy: "b"}
	ctx := context.Background()
	clk.Advance(time.Second)
	ahead := clk.Now()
	if d, err := holder.Allow(ctx, Request{Key: ka}); err != nil || !d.Allowed || !d.DecidedAt.Equal(ahead) {
		t.Fatalf("Allow a = %+v, %v; want admitted at %v", d, err, ahead)
	}
	clk.ns.Add(-int64(time.Second)) // the node clock steps back
	d, err := holder.Allow(ctx, Request{Key: Key{Tenant: ka.Tenant, Subject: ka.Subject}, Policies: []string{"a", "b"}})
	if err != nil || !d.Allowed {
		t.Fatalf("multi Allow = %+v, %v; want admitted", d, err)
	}
	if !d.DecidedAt.Equal(ahead) {
		t.Fatalf("multi decision reports %v; want %v, the time it was recorded at (a's clock)", d.DecidedAt, ahead)
	}
	clk.Advance(2 * time.Second)
	now := clk.Now()
	for _, k := range []Key{ka, kb} {
		runs, ok := holder.ExportForTest(k)
		if !ok || !runs[len(runs)-1].At.Equal(ahead) {
			t.Fatalf("holder's log of %s: %v; want the last admission at %v", k.Policy, runs, ahead)
		}
	}
	copyStore := backup.copyForTest(holder.partIDForTest(kb), holder.Name())
	if copyStore == nil {
		t.Fatalf("%s has no copy of %s's partition", backup.Name(), holder.Name())
	}
	st, ok := copyStore.Export(kb, now)
	if !ok || len(st.Runs) != 1 || !now.Add(-st.Runs[0].Age).Equal(ahead) {
		t.Fatalf("backup's copy of b: %+v (ok %v); want one admission at %v", st, ok, ahead)
	}
}
