package peer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/ring"
)

// hoT0 is the epoch of the handoff tests' fake clocks: a whole second, so
// whole-millisecond steps land on the default 1 ms resolution grid.
var hoT0 = time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)

// hoClock is a fake clock shared by the nodes of a test, each reading it
// with its own offset. Workers that need every decision of a request to see
// one instant hold freeze in read mode around it; Advance takes it in write
// mode, so time never moves during a frozen request.
type hoClock struct {
	ns     atomic.Int64
	freeze sync.RWMutex
}

// Now returns the shared time.
func (c *hoClock) Now() time.Time { return hoT0.Add(time.Duration(c.ns.Load())) }

// Advance moves the shared time forward by d, waiting for frozen requests.
func (c *hoClock) Advance(d time.Duration) {
	c.freeze.Lock()
	c.ns.Add(int64(d))
	c.freeze.Unlock()
}

// WithOffset returns a node clock reading the shared time plus off.
func (c *hoClock) WithOffset(off time.Duration) func() time.Time {
	return func() time.Time { return c.Now().Add(off) }
}

// hoGossip is fastGossip with a patient failure detector, for the cluster
// tests that crash, pause, cut or move members. Joins and leaves still
// spread within tens of milliseconds (they are gossiped), but a member
// starved of CPU by the race detector and parallel tests is not declared
// failed: a false failure moves the ring's targets, and the copies that
// follow never settle while it keeps flapping. Nothing about a takeover
// waits for gossip: a crashed holder's partitions pass to their backups
// once its liveness expires in the log, whatever gossip says.
func hoGossip(mc *memberlist.Config) {
	fastGossip(mc)
	// Suspected for SuspicionMult x ProbeInterval = 3 s before declared
	// dead: time enough to refute. ProbeInterval stays short because a
	// probe goroutine outlives memberlist's Shutdown by up to one interval
	// (the package's goleak check waits about a second).
	mc.ProbeInterval = 300 * time.Millisecond
	mc.ProbeTimeout = 200 * time.Millisecond
	mc.SuspicionMult = 10
	mc.SuspicionMaxTimeoutMult = 2
}

// hoMetrics records handoff and backup counts by direction and outcome,
// and counts resent requests.
type hoMetrics struct {
	nopMetrics
	mu      sync.Mutex
	handoff map[string]int
	backup  map[string]int
	resent  atomic.Int64
}

func (m *hoMetrics) Forward(_, outcome string, _ time.Duration) {
	if outcome == "resent" {
		m.resent.Add(1)
	}
}

func newHoMetrics() *hoMetrics {
	return &hoMetrics{handoff: map[string]int{}, backup: map[string]int{}}
}

func (m *hoMetrics) Handoff(direction, outcome string, keys int) {
	m.mu.Lock()
	m.handoff[direction+"/"+outcome] += keys
	m.mu.Unlock()
}

func (m *hoMetrics) Backup(direction, outcome string, keys int) {
	m.mu.Lock()
	m.backup[direction+"/"+outcome] += keys
	m.mu.Unlock()
}

func (m *hoMetrics) handoffCount(dirOutcome string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.handoff[dirOutcome]
}

// hoRecord is one captured log record with its attributes (the handler's
// own and the record's) flattened by key.
type hoRecord struct {
	at    time.Time
	level slog.Level
	msg   string
	attrs map[string]slog.Value
}

// hoLogs is a slog.Handler that keeps every record, for assertions.
type hoLogs struct {
	mu    *sync.Mutex
	recs  *[]hoRecord
	attrs []slog.Attr
}

func newHoLogs() *hoLogs { return &hoLogs{mu: &sync.Mutex{}, recs: new([]hoRecord)} }

func (h *hoLogs) Enabled(context.Context, slog.Level) bool { return true }

func (h *hoLogs) Handle(_ context.Context, r slog.Record) error {
	rec := hoRecord{at: r.Time, level: r.Level, msg: r.Message, attrs: map[string]slog.Value{}}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value
		return true
	})
	h.mu.Lock()
	*h.recs = append(*h.recs, rec)
	h.mu.Unlock()
	return nil
}

func (h *hoLogs) WithAttrs(as []slog.Attr) slog.Handler {
	return &hoLogs{mu: h.mu, recs: h.recs, attrs: append(slices.Clip(h.attrs), as...)}
}

func (h *hoLogs) WithGroup(string) slog.Handler { return h }

// find returns the records with message msg logged by node.
func (h *hoLogs) find(node, msg string) []hoRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []hoRecord
	for _, r := range *h.recs {
		if r.msg == msg && r.attrs["node"].String() == node {
			out = append(out, r)
		}
	}
	return out
}

// hoKeys returns n keys of policy, distinct from other tests' keys.
func hoKeys(prefix string, n int, policy string) []Key {
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = Key{Tenant: "ho-" + prefix, Subject: fmt.Sprintf("user-%04d", i), Policy: policy}
	}
	return keys
}

// hoLoad drives concurrent Allow calls on random keys from many nodes and
// counts, per key, admissions and unavailable answers. With a clock, every
// request is frozen at one instant of it, and admissions are recorded with
// that instant (the deciding owner's time: all nodes read the same clock).
type hoLoad struct {
	t        *testing.T
	keys     []Key
	admitted []atomic.Int64
	unavail  []atomic.Int64
	requests atomic.Int64
	clock    *hoClock // nil: no recording of times
	// wall: record admissions with the wall-clock time Allow returned.
	wall bool
	// crashAt (unix ns, 0 = none) and resumed: per key, the first wall
	// time after crashAt at which a request got a decision.
	crashAt atomic.Int64
	resumed []atomic.Int64

	mu    sync.Mutex
	times [][]time.Time // per key, admission instants (with clock)
	who   [][]string    // per key, the deciding owner and its ring version
	owner [][]string    // per key, the deciding owner

	stop chan struct{}
	wg   sync.WaitGroup
	seed atomic.Uint64
	// only, if set, limits checkRolling to keys of that policy.
	only string
}

func newHoLoad(t *testing.T, keys []Key, clock *hoClock) *hoLoad {
	return &hoLoad{
		t: t, keys: keys, clock: clock,
		admitted: make([]atomic.Int64, len(keys)),
		unavail:  make([]atomic.Int64, len(keys)),
		resumed:  make([]atomic.Int64, len(keys)),
		times:    make([][]time.Time, len(keys)),
		who:      make([][]string, len(keys)),
		owner:    make([][]string, len(keys)),
		stop:     make(chan struct{}),
	}
}

// drive starts workers goroutines sending requests through nd until
// halt is called or nd is closed.
func (l *hoLoad) drive(nd *Node, workers int) {
	for range workers {
		seed := l.seed.Add(1)
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rng := rand.New(rand.NewPCG(seed, 0x5eed))
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				i := rng.IntN(len(l.keys))
				if !l.one(nd, i) {
					return
				}
			}
		}()
	}
}

// one sends one request for key i through nd and records the outcome. It
// returns false once nd is closed.
func (l *hoLoad) one(nd *Node, i int) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var at time.Time
	if l.clock != nil {
		l.clock.freeze.RLock()
		at = l.clock.Now()
	}
	d, err := nd.Allow(ctx, Request{Key: l.keys[i]})
	if l.clock != nil {
		l.clock.freeze.RUnlock()
	}
	l.requests.Add(1)
	if err == nil {
		if c, now := l.crashAt.Load(), time.Now().UnixNano(); c != 0 && now > c {
			l.resumed[i].CompareAndSwap(0, now)
		}
	}
	switch {
	case errors.Is(err, ErrClosed):
		// A call in flight when nd stopped may have been decided (its
		// forward sent, or its admission replicated before the wait for
		// the backup gave up): its outcome is unknown.
		l.unavail[i].Add(1)
		return false
	case errors.Is(err, ErrUnavailable):
		l.unavail[i].Add(1)
	case err != nil:
		l.t.Errorf("Allow(%v) via %s: %v, want a decision or ErrUnavailable", l.keys[i], nd.Name(), err)
		return false
	case d.Reason != ReasonAdmitted && d.Reason != ReasonOverLimit:
		l.t.Errorf("Allow(%v) via %s: %+v is not an owner's decision", l.keys[i], nd.Name(), d)
	case d.Allowed:
		l.admitted[i].Add(1)
		if l.wall {
			at = time.Now()
		}
		if l.clock != nil || l.wall {
			l.mu.Lock()
			l.times[i] = append(l.times[i], at)
			l.who[i] = append(l.who[i], fmt.Sprintf("%s@%d via %s", d.Owner, d.RingVersion, nd.Name()))
			l.owner[i] = append(l.owner[i], d.Owner)
			l.mu.Unlock()
		}
	}
	return true
}

// progress waits until at least n more requests have been answered.
func (l *hoLoad) progress(n int64) {
	l.t.Helper()
	want := l.requests.Load() + n
	waitFor(l.t, 30*time.Second, fmt.Sprintf("%d more requests under load", n), func() bool {
		return l.requests.Load() >= want
	})
}

// halt stops every worker and waits for them.
func (l *hoLoad) halt() {
	close(l.stop)
	l.wg.Wait()
}

func (l *hoLoad) totals() (admitted, unavailable int64) {
	for i := range l.keys {
		admitted += l.admitted[i].Load()
		unavailable += l.unavail[i].Load()
	}
	return admitted, unavailable
}

// checkRolling fails if any key has more than limit admissions in a rolling
// window (t - w, t].
func (l *hoLoad) checkRolling(limit int64, w time.Duration) (windowsChecked int) {
	l.t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, ts := range l.times {
		if l.only != "" && l.keys[i].Policy != l.only {
			continue
		}
		idx := make([]int, len(ts))
		for j := range idx {
			idx[j] = j
		}
		slices.SortStableFunc(idx, func(a, b int) int { return ts[a].Compare(ts[b]) })
		lo := 0
		for hi, j := range idx {
			t := ts[j]
			for !ts[idx[lo]].After(t.Add(-w)) {
				lo++
			}
			if n := int64(hi - lo + 1); n > limit {
				var detail []string
				for _, x := range idx[lo : hi+1] {
					detail = append(detail, fmt.Sprintf("%v %s", ts[x].Sub(hoT0), l.who[i][x]))
				}
				l.t.Fatalf("key %v: %d admissions in the window (%v, %v], limit %d:\n%s", l.keys[i], n, t.Add(-w).Sub(hoT0), t.Sub(hoT0), limit, strings.Join(detail, "\n"))
			}
			windowsChecked++
		}
	}
	return windowsChecked
}

// hoMembership runs rounds of 3 -> 5 -> 3 members on c while the load runs:
// two joins, then two graceful leaves (one original node, one that just
// joined), waiting for the ring to converge after each step and for the
// load to make progress in each configuration.
func hoMembership(t *testing.T, c *cluster, load *hoLoad, rounds, workers int, progress int64) {
	t.Helper()
	for r := range rounds {
		var joined []*Node
		for j := range 2 {
			nd := c.add(fmt.Sprintf("r%dj%d", r, j))
			c.waitMembers(4 + j)
			load.drive(nd, workers)
			joined = append(joined, nd)
			load.progress(progress)
		}
		for j, nd := range []*Node{c.nodes[r], joined[0]} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			start := time.Now()
			err := nd.Close(ctx)
			cancel()
			if err != nil {
				if d := os.Getenv("RINGLIMIT_STACKS"); d != "" {
					buf := make([]byte, 8<<20)
					_ = os.WriteFile(d, buf[:runtime.Stack(buf, true)], 0o644)
				}
				t.Fatalf("round %d: graceful Close of %s: %v", r, nd.Name(), err)
			}
			t.Logf("round %d: %s left in %v", r, nd.Name(), time.Since(start).Round(time.Millisecond))
			c.waitMembers(4 - j)
			load.progress(progress)
		}
	}
}

// TestHandoffJoinLeaveUnderLoad drives 200 keys (L = 20, W = 1 h, so
// nothing expires) from every node while the cluster goes 3 -> 5 -> 3
// members (partitions move at each of the four steps; a second
// round added only more of the same moves, and as many seconds). No key may ever exceed its limit, and keys of a policy with
// a limit never reached ("wide") must come out of all the moves with
// Remaining exactly reflecting every admission made before: a lost or
// reset log would show as extra Remaining.
func TestHandoffJoinLeaveUnderLoad(t *testing.T) {
	const tight, wide = 20, 1 << 40
	m := newHoMetrics()
	c := startCluster(t, 3, Config{
		Gossip:  hoGossip,
		Metrics: m,
		Policies: map[string]PolicyConfig{
			"tight": {Limit: tight, Window: time.Hour},
			"wide":  {Limit: wide, Window: time.Hour},
		},
	})
	keys := append(hoKeys("load", 200, "tight"), hoKeys("load", 50, "wide")...)
	load := newHoLoad(t, keys, nil)
	for _, nd := range c.nodes {
		load.drive(nd, 2)
	}
	load.progress(400)
	hoMembership(t, c, load, 1, 2, 400)
	load.halt()

	admitted, unavailable := load.totals()
	t.Logf("%d requests, %d admitted, %d unavailable (%.2f%%)", load.requests.Load(), admitted, unavailable,
		100*float64(unavailable)/float64(load.requests.Load()))
	// A probe through every live node on every key: the owner's Remaining
	// must account for every admission made through any node, before and
	// across all the moves.
	live := c.live()
	full := 0
	// A request whose forward met a dead port went on to another member
	// (its first target may have decided it already), so the owners may
	// count, over all keys, up to that many more than the clients saw.
	resent := m.resent.Load()
	var extra int64
	for i, k := range keys {
		limit := int64(tight)
		if k.Policy == "wide" {
			limit = wide
		}
		before, ghosts := load.admitted[i].Load(), load.unavail[i].Load()
		if before > limit {
			t.Fatalf("key %v: %d admitted, limit %d", k, before, limit)
		}
		if before == limit {
			full++
		}
		d, err := live[i%len(live)].Allow(context.Background(), Request{Key: k})
		if err != nil {
			t.Fatalf("probe %v: %v", k, err)
		}
		got := before
		if d.Allowed {
			got++
		}
		// An unavailable answer may have been admitted by the owner after
		// the caller gave up ("ghosts"), so the owner may count up to that
		// many more; never fewer (that would be a lost admission).
		want := limit - got
		switch {
		case got > limit:
			t.Fatalf("key %v: probe admitted after %d admissions, limit %d", k, before, limit)
		case d.Remaining > want:
			t.Fatalf("key %v: Remaining %d after %d admissions (%d unavailable), want %d: an admission was lost", k, d.Remaining, got, ghosts, want)
		case d.Remaining < want-ghosts:
			extra += want - ghosts - d.Remaining
			t.Logf("key %v: Remaining %d after %d admissions (%d unavailable), want %d", k, d.Remaining, got, ghosts, want)
		case !d.Allowed && before+ghosts < limit:
			extra += limit - before - ghosts
			t.Logf("key %v: probe refused after %d admissions (%d unavailable), limit %d", k, before, ghosts, limit)
		}
	}
	t.Logf("%d of 200 tight keys reached their limit; %d requests resent, owners counted %d more than answered", full, resent, extra)
	if extra > resent {
		t.Fatalf("owners counted %d admissions nobody was told of (beyond the unavailable answers), but only %d requests were resent", extra, resent)
	}

	hoCheckOneDecisionPoint(t, c, keys)
}

// hoCheckOneDecisionPoint fails if a key has more than one decision point
// among the live nodes.
func hoCheckOneDecisionPoint(t *testing.T, c *cluster, keys []Key) {
	t.Helper()
	for _, k := range keys {
		var points []string
		for _, nd := range c.live() {
			if nd.decisionPointForTest(k) {
				points = append(points, nd.Name())
			}
		}
		if len(points) > 1 {
			t.Fatalf("key %v has %d decision points: %v", k, len(points), points)
		}
	}
}

// TestHandoffJoinLeaveRollingWindow is the short-window variant: W = 0.5 s on
// a fake clock shared by every node, advanced 10 ms at a time while the
// load runs, so admissions keep expiring and the window slides several
// times through the membership changes. Every request runs at one frozen
// instant, so the recorded admission times are the owners' decision
// times, and a rolling-window checker over all of them must never see more
// than L in any window (t - W, t].
func TestHandoffJoinLeaveRollingWindow(t *testing.T) {
	const limit, window, step = 10, 500 * time.Millisecond, 10 * time.Millisecond
	clk := &hoClock{}
	base := Config{
		Clock:    clk.Now,
		Gossip:   hoGossip,
		Policies: map[string]PolicyConfig{"roll": {Limit: limit, Window: window}},
	}
	c := startCluster(t, 3, base)
	keys := hoKeys("roll", 50, "roll")
	load := newHoLoad(t, keys, clk)
	for _, nd := range c.nodes {
		load.drive(nd, 2)
	}
	// The clock advances one step per 15 answered requests: about 15
	// requests per key per window, so keys keep hitting the limit, and the
	// window slides about four times over one round of 3 -> 5 -> 3.
	stopClock := make(chan struct{})
	var clockDone sync.WaitGroup
	clockDone.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		last := load.requests.Load()
		for {
			select {
			case <-stopClock:
				return
			case <-tick.C:
			}
			if n := load.requests.Load(); n-last >= 15 {
				last = n
				clk.Advance(step)
			}
		}
	})
	load.progress(600)
	hoMembership(t, c, load, 1, 2, 600)
	load.halt()
	close(stopClock)
	clockDone.Wait()

	admitted, unavailable := load.totals()
	windows := load.checkRolling(limit, window)
	t.Logf("%d requests over %v of fake time, %d admitted (%d windows checked), %d unavailable",
		load.requests.Load(), clk.Now().Sub(hoT0), admitted, windows, unavailable)
	if slid := clk.Now().Sub(hoT0); slid < 3*window || admitted <= 3*int64(len(keys))*limit {
		t.Fatalf("%d admissions for %d keys over %v: the window barely slid, the test checks little", admitted, len(keys), slid)
	}
}

// TestHandoffClockSkew moves keys between nodes whose clocks are 5 s ahead
// of and 5 s behind a shared fake clock, on graceful leave and on join. A
// key with L admissions at t must stay refused on the new owner until
// exactly t + W on the new owner's terms (its clock reading, at the move,
// rebased by the admissions' age), not a nanosecond earlier, and be
// admitted again at t + W.
func TestHandoffClockSkew(t *testing.T) {
	const limit, window = 5, time.Minute
	for _, tc := range []struct {
		name     string
		join     bool
		from, to time.Duration // clock offsets of the old and the new owner
	}{
		{"leave/behind_to_ahead", false, -5 * time.Second, 5 * time.Second},
		{"leave/ahead_to_behind", false, 5 * time.Second, -5 * time.Second},
		{"join/behind_to_ahead", true, -5 * time.Second, 5 * time.Second},
		{"join/ahead_to_behind", true, 5 * time.Second, -5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &hoClock{}
			base := Config{
				Gossip:   hoGossip,
				Policies: map[string]PolicyConfig{"skew": {Limit: limit, Window: window}},
			}
			// Old members all run on the old owner's clock; the new owner
			// (the third node on leave, the joiner on join) on its own.
			offsets := []time.Duration{tc.from, tc.from, tc.to}
			n := 3
			if tc.join {
				n = 2
			}
			c := startClusterWith(t, n, base, func(i int, cfg *Config) { cfg.Clock = clk.WithOffset(offsets[i]) })
			newName := "n2"
			if tc.join {
				newName = "joiner"
			}
			// Find a key the move hands from a node on the old clock to the
			// new owner.
			var key Key
			var oldOwner *Node
			for i, k := range hoKeys("skew-"+tc.name, 500, "skew") {
				o, _ := c.nodes[0].Owner(k)
				var next string
				if tc.join {
					snap, err := ring.New(c.nodes[0].cfg.Ring, []string{"n0", "n1", newName}, 1)
					if err != nil {
						t.Fatal(err)
					}
					var buf [3 * 129]byte
					ek, _ := k.AppendEncoded(buf[:0])
					next = snap.Owner(placement(ek))
				} else if o != newName {
					next = c.nodes[0].backupOwnerForTest(k)
				}
				if next == newName && o != newName {
					key = k
					oldOwner = c.nodes[slices.IndexFunc(c.nodes, func(nd *Node) bool { return nd.Name() == o })]
					break
				}
				if i == 499 {
					t.Fatal("no key moves to the new owner")
				}
			}
			// L admissions at t (= the fake epoch), then time passes.
			ctx := context.Background()
			for i := range limit {
				d, err := oldOwner.Allow(ctx, Request{Key: key})
				if err != nil || !d.Allowed || d.Owner != oldOwner.Name() {
					t.Fatalf("admission %d on %s: %+v, %v", i, oldOwner.Name(), d, err)
				}
			}
			const aged = 7 * time.Second
			clk.Advance(aged)

			var newOwner *Node
			if tc.join {
				newOwner = c.addWith(newName, func(cfg *Config) { cfg.Clock = clk.WithOffset(tc.to) })
				c.waitMembers(3)
			} else {
				newOwner = c.nodes[2]
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err := oldOwner.Close(cctx)
				cancel()
				if err != nil {
					t.Fatalf("Close %s: %v", oldOwner.Name(), err)
				}
				c.waitMembers(2)
			}
			if o, _ := newOwner.Owner(key); o != newOwner.Name() {
				t.Fatalf("after the move %s says %s owns %v, want itself", newOwner.Name(), o, key)
			}
			// The move on join is the old owner's push after its ring
			// changed (or the new owner's pull on first request): wait for
			// it before moving the clock a window ahead.
			waitFor(t, 10*time.Second, "the key's state to reach the new owner", func() bool {
				return newOwner.holdsForTest(key) && !oldOwner.holdsForTest(key)
			})

			// Still refused through any live node, with RetryAfter counting
			// down to exactly t + W.
			for _, nd := range c.live() {
				d, err := nd.Allow(ctx, Request{Key: key})
				if err != nil || d.Allowed || d.Owner != newOwner.Name() || d.RetryAfter != window-aged {
					t.Fatalf("via %s at t+%v: %+v, %v; want refused by %s with RetryAfter %v", nd.Name(), aged, d, err, newOwner.Name(), window-aged)
				}
			}
			clk.Advance(window - aged - time.Nanosecond)
			d, err := newOwner.Allow(ctx, Request{Key: key})
			if err != nil || d.Allowed || d.RetryAfter != time.Nanosecond {
				t.Fatalf("at t+W-1ns: %+v, %v; want refused with RetryAfter 1ns", d, err)
			}
			clk.Advance(time.Nanosecond)
			d, err = newOwner.Allow(ctx, Request{Key: key})
			if err != nil || !d.Allowed || d.Remaining != limit-1 {
				t.Fatalf("at t+W: %+v, %v; want admitted with Remaining %d", d, err, limit-1)
			}
		})
	}
}
