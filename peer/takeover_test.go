package peer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/ring"
)

// A backup's takeover of a partition whose holder stalled: the holder marks
// its backup unreachable, copies the partition to another member and
// stalls, its gossip silent, before the copy's last request, while the
// backup takes the partition over. When the holder resumes it must learn
// of the takeover, not decide again from its old state: whether it resumes
// before the takeover is known, between the takeover's probe and its
// commit, or with the backup unreachable from it alone. And a takeover
// between clocks that run apart.

// stallScene is TestStallMidCopy's scene: n0 holds key's partition
// pid with n1 as its backup; n0 has marked n1 unreachable (a moment
// without its gRPC port), so it copies the partition to pick, and stalls,
// its gossip silent, just before the copy's last request. n1 sees n0
// fail, waits out the lease it granted and takes the partition over (at
// the copy's very epoch). wake resumes n0.
type stallScene struct {
	c       *cluster
	n0, n1  *Node
	key     Key
	pid     int
	pick    string
	cut     *atomic.Bool // n0's gossip link is cut while set
	entered chan struct{}
	wake    func()
}

func startStallScene(t *testing.T, pc PolicyConfig, prefix string) *stallScene {
	t.Helper()
	s := startFiveNodeScene(t, pc, prefix)
	s.stallCopy(t, nil)
	return s
}

// stallCopy makes n0 stall, its gossip silent, just before the last
// request of its first copy of the partition to pick; onStall (if not nil)
// runs as it stalls.
func (s *stallScene) stallCopy(t *testing.T, onStall func()) {
	resume := make(chan struct{})
	var once sync.Once
	s.wake = func() { once.Do(func() { close(resume) }) }
	t.Cleanup(s.wake)
	var stalled atomic.Bool
	s.n0.setCopyFaultForTest(func(p int, to string, last bool) copyFault {
		if p == s.pid && to == s.pick && last && stalled.CompareAndSwap(false, true) {
			s.cut.Store(true)
			if onStall != nil {
				onStall()
			}
			close(s.entered)
			<-resume
			s.cut.Store(false)
		}
		return copySend
	})
}

// startFiveNodeScene starts the stall attacks' 5 members (n0's gossip can
// be cut) with policy "p" and finds their key (subjects from prefix): n0
// holds it with n1 as backup; without n0, n1 holds it, with a backup
// other than pick, the member n0 copies to once n1 is unreachable.
func startFiveNodeScene(t *testing.T, pc PolicyConfig, prefix string) *stallScene {
	t.Helper()
	return startFiveNodeSceneWhere(t, pc, prefix, attackLease, nil, nil)
}

// startFiveNodeSceneWhere is startFiveNodeScene with leases of lease, for
// a partition that also fits (nil: any), given pick, and edit0 (if not
// nil) applied to n0's memberlist config after the rest.
func startFiveNodeSceneWhere(t *testing.T, pc PolicyConfig, prefix string, lease time.Duration, fits func(pid int, pick string) bool, edit0 func(*memberlist.Config)) *stallScene {
	t.Helper()
	cut := new(atomic.Bool)
	c := startClusterWith(t, 5, Config{
		LeaseDuration: lease,
		Policies:      map[string]PolicyConfig{"p": pc},
	}, func(i int, cfg *Config) {
		cfg.Gossip = attackGossip
		if i == 0 {
			cutGossip := withCutTransport(t, cut)
			cfg.Gossip = func(mc *memberlist.Config) {
				cutGossip(mc)
				mc.SuspicionMaxTimeoutMult = 50
				if edit0 != nil {
					edit0(mc)
				}
			}
		}
	})
	s := &stallScene{c: c, n0: c.nodes[0], n1: c.nodes[1], pid: -1, cut: cut, entered: make(chan struct{})}
	without0, err := ring.New(s.n0.cfg.Ring, []string{"n1", "n2", "n3", "n4"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	others := []string{"n2", "n3", "n4"} // n0's ring without n0 and n1
	for _, k := range hoKeys(prefix, 8000, "p") {
		p := s.n0.partIDForTest(k)
		if o, _ := s.n0.Owner(k); o != "n0" || s.n0.backupForTest(p) != "n1" {
			continue
		}
		// n1 keeps what it takes over, with a backup other than pick.
		if without0.PartitionOwner(p) == "n1" && others[p%3] != without0.PartitionBackup(p) && (fits == nil || fits(p, others[p%3])) {
			s.key, s.pid, s.pick = k, p, others[p%3]
			break
		}
	}
	if s.pid < 0 {
		t.Fatal("no partition fitting the scenario")
	}
	return s
}

// fillAtN1 waits until n1 decides the key (its takeover done) and admits
// through it until confirmed reaches limit.
func (s *stallScene) fillAtN1(t *testing.T, confirmed *int, limit int) {
	t.Helper()
	waitFor(t, 20*time.Second, "n1 to decide", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		d, err := s.n1.Allow(ctx, Request{Key: s.key})
		if err == nil && d.Allowed {
			*confirmed++
		}
		return err == nil
	})
	for *confirmed < limit {
		*confirmed += admitN(t, s.n1, s.key, 1)
	}
}

// stall makes n0 copy the partition to pick and waits until it has
// stalled and n1 has taken the partition over.
func (s *stallScene) stall(t *testing.T) {
	t.Helper()
	s.n0.markUnreachable("n1")
	s.n0.kickOwnership()
	select {
	case <-s.entered:
	case <-time.After(20 * time.Second):
		t.Fatalf("n0 never copied the partition to %s: %s", s.pick, s.n0.partForTest(s.pid))
	}
	waitFor(t, 30*time.Second, "n1 to take the partition over", func() bool {
		r, _, _ := s.n1.roleForTest(s.pid)
		return r == roleHolder
	})
}

func (s *stallScene) parts() string { return partsOf(s.c.live(), s.pid) }

// fillOnN1 waits for n1, which took the partition over, to decide the
// scene's key, then admits it there until confirmed (the admissions
// confirmed so far) reaches limit, counting n1's in by; it returns the new
// confirmed count.
func (s *stallScene) fillOnN1(t *testing.T, confirmed, limit int, by map[string]int) int {
	t.Helper()
	waitFor(t, 10*time.Second, "n1 to decide", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		d, err := s.n1.Allow(ctx, Request{Key: s.key})
		if err == nil && d.Allowed {
			confirmed++
			by["n1"]++
		}
		return err == nil
	})
	for confirmed < limit {
		confirmed += admitN(t, s.n1, s.key, 1)
		by["n1"]++
	}
	return confirmed
}

// holdN1Copies makes n1's copies of the scene's partition fail unsent
// while the flag it returns is set (it starts set): n1, once it has taken
// the partition over, tells nobody of it through a copy until the test
// clears it.
func (s *stallScene) holdN1Copies() *atomic.Bool {
	hold := new(atomic.Bool)
	hold.Store(true)
	s.n1.setCopyFaultForTest(func(p int, _ string, _ bool) copyFault {
		if p == s.pid && hold.Load() {
			return copyUnsent
		}
		return copySend
	})
	return hold
}

// TestStallMidCopy: a holder (n0) stops reaching its backup (n1)
// over gRPC for a moment and marks it unreachable, so it copies the
// partition to another member (pick). Its lease from n1 still runs, so it
// asks nobody whether it still holds the partition; then, between that
// check and the copy's last request, it stalls with its gossip silent. n1
// sees n0 fail, waits out the lease it granted, finds no newer copy
// anywhere (pick has none yet) and takes the partition over at the next
// epoch, confirming the rest of the limit. When n0 resumes, pick, which
// has heard of no takeover, completes the copy and grants n0 a lease: n0
// decided again from its state of before the stall, at the very epoch n1
// holds the partition at (the copy's), so that neither yields to the
// other.
func TestStallMidCopy(t *testing.T) {
	ownByGossip(t)
	t.Parallel()
	const limit = 5
	s := startStallScene(t, PolicyConfig{Limit: limit, Window: time.Hour}, "stall-mid-copy")
	confirmed := admitN(t, s.n0, s.key, 2)
	// A probe of n1 failed: n0 copies the partition elsewhere, and stalls.
	s.stall(t)
	s.fillAtN1(t, &confirmed, limit)
	s.wake()
	by := map[string]int{"n0": 2, "n1": limit - 2}
	countAdmissions(s.c, s.key, 2*attackLease, limit, &confirmed, by)
	if confirmed > limit {
		t.Fatalf("%d admissions confirmed in one window of limit %d (by decider: %v; n0's new backup %s):\n%s", confirmed, limit, by, s.pick, s.parts())
	}
	t.Logf("confirmed %d (by decider: %v):\n%s", confirmed, by, s.parts())
}

// TestCopyBeforeTakeoverKnown: TestStallMidCopy, with n0
// resuming as soon as n1 has taken the partition over, before n1's first
// copy of its holding reaches anyone (its copies are held back until n0's
// copy is answered). n0's check that nobody took the partition over while
// its lease had ended (confirmHolding) asks every member but the one
// marked unreachable — n1, the only member that could have taken it over,
// and the only one that knows it did. Nobody else knows, so n0 used its
// copy's lease and decided from its old state at the epoch n1 holds the
// partition at, while n1 decided too: the equal epochs made each refuse
// the other's copies as stale without either learning of the other.
func TestCopyBeforeTakeoverKnown(t *testing.T) {
	ownByGossip(t)
	t.Parallel()
	for _, mode := range []Replication{ReplicateAsync, ReplicateSync} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			const limit = 5
			s := startStallScene(t, PolicyConfig{Limit: limit, Window: time.Hour, Replication: mode}, "copy-before-takeover-"+mode.String())
			n0, n1 := s.n0, s.n1
			confirmed := admitN(t, n0, s.key, 2)
			hold := s.holdN1Copies()
			s.stall(t)
			by := map[string]int{"n0": 2}
			if mode == ReplicateAsync {
				// n1 holds without a backup: it decides at once.
				confirmed = s.fillOnN1(t, confirmed, limit, by)
			}
			s.wake()
			// n0's copy completes; then n1's copies go out.
			within(5*time.Second, func() bool {
				r, _, _ := n0.roleForTest(s.pid)
				return r == roleHolder && n0.backupForTest(s.pid) == s.pick || r == roleMoved || r == roleHint
			})
			hold.Store(false) // n1's copies go out
			n1.kickOwnership()
			countAdmissions(s.c, s.key, 2*n0.cfg.LeaseDuration, limit, &confirmed, by)
			if confirmed > limit {
				t.Fatalf("%d admissions confirmed in one window of limit %d (by decider: %v; n0's new backup %s):\n%s", confirmed, limit, by, s.pick, s.parts())
			}
			t.Logf("confirmed %d (by decider: %v):\n%s", confirmed, by, s.parts())
		})
	}
}

// TestProbeDuringTakeover: TestStallMidCopy's scene, with n1
// held between its takeover's probe and its commit. n0 resumes, completes
// its copy to pick and, its lease from n1 having ended, asks every member
// whether anyone took the partition over (confirmHolding): n1, not yet
// committed, answers that it keeps a copy of n0's holding, so n0 uses its
// copy's lease and decides; n1 then commits and decides too (n0's release
// of n1's copy, which would have stopped it, is lost).
func TestProbeDuringTakeover(t *testing.T) {
	ownByGossip(t)
	t.Parallel()
	for _, mode := range []Replication{ReplicateAsync, ReplicateSync} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			const limit = 5
			s := startStallScene(t, PolicyConfig{Limit: limit, Window: time.Hour, Replication: mode}, "probe-during-takeover-"+mode.String())
			n0, n1 := s.n0, s.n1
			confirmed := admitN(t, n0, s.key, 2)
			probed, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			free := func() { once.Do(func() { close(release) }) }
			t.Cleanup(free)
			var held atomic.Bool
			n1.setTakeoverHookForTest(func(p int) {
				if p == s.pid && held.CompareAndSwap(false, true) {
					close(probed)
					<-release
				}
			})
			// n0's release of n1's copy, sent once its copy to pick is
			// confirmed, is lost (else it makes n1's commit find no copy).
			n1.setReplDropForTest(func(req *peerpb.ReplicateRequest) bool {
				if req.GetSender() != "n0" {
					return false
				}
				for _, op := range req.GetOps() {
					if op.GetKind() != peerpb.PartitionOp_KIND_RELEASE || int(op.GetPartition()) != s.pid {
						return false
					}
				}
				return len(req.GetOps()) > 0
			})
			n0.markUnreachable("n1")
			n0.kickOwnership()
			select {
			case <-s.entered:
			case <-time.After(20 * time.Second):
				t.Fatalf("n0 never copied the partition to %s: %s", s.pick, n0.partForTest(s.pid))
			}
			select {
			case <-probed:
			case <-time.After(30 * time.Second):
				t.Fatalf("n1 never began a takeover:\n%s", s.parts())
			}
			s.wake()
			// n0's copy completes and is confirmed (or not) while n1 waits
			// between its probe and its commit.
			within(5*time.Second, func() bool {
				r, _, _ := n0.roleForTest(s.pid)
				return r == roleHolder && n0.backupForTest(s.pid) == s.pick || r == roleMoved || r == roleHint
			})
			free()
			by := map[string]int{"n0": 2}
			countAdmissions(s.c, s.key, 2*n0.cfg.LeaseDuration, limit, &confirmed, by)
			if confirmed > limit {
				t.Fatalf("%d admissions confirmed in one window of limit %d (by decider: %v; n0's new backup %s):\n%s", confirmed, limit, by, s.pick, s.parts())
			}
			t.Logf("confirmed %d (by decider: %v):\n%s", confirmed, by, s.parts())
		})
	}
}

// TestTakeoverUnreachableFromHolder: TestCopyBeforeTakeoverKnown
// with n1's gRPC port unreachable from n0 alone (n0 reaches n1 through a
// proxy that is cut as n0 stalls; everyone else, gossip included, reaches
// n1 as before). n0 stalls just before the last request of its copy to
// pick; n1 sees n0 fail, waits out the lease it granted, takes the
// partition over and decides (async, off: at once, without a backup)
// before its first copy reaches anyone. n0 resumes, its lease has ended:
// it asks every member whether the partition was taken over
// (confirmHolding). n1, the only member that knows it was, is marked
// unreachable on n0 and its silence was borne; nobody else knew, so n0
// used pick's lease and decided from its old state beside n1 (6 of 5 off
// and async, 7 of 5 sync). Now n0 asks n1 again through the members that
// answered, and learns n1's holding.
func TestTakeoverUnreachableFromHolder(t *testing.T) {
	ownByGossip(t)
	inEveryMode(t, func(t *testing.T, mode Replication) {
		const limit = 5
		const lease = time.Second
		px := newTestProxy(t, nil)
		s := startFiveNodeSceneWhere(t, PolicyConfig{Limit: limit, Window: time.Hour, Replication: mode}, "unreachable-from-holder-"+mode.String(), lease, nil,
			func(mc *memberlist.Config) { mc.Events = &rpcAddrRewrite{inner: mc.Events, member: "n1", to: px.via} })
		s.stallCopy(t, px.cut)
		n0, n1 := s.n0, s.n1
		if got, want := n0.view.Load().alive["n1"], px.addr(); got != want {
			t.Fatalf("n0 reaches n1 at %s, want the proxy %s", got, want)
		}
		confirmed := 0
		hold := s.holdN1Copies()
		s.stall(t)
		by := map[string]int{}
		if mode != ReplicateSync {
			// n1 holds without a backup: it decides at once.
			confirmed = s.fillOnN1(t, confirmed, limit, by)
		}
		s.wake()
		// n0's copy completes; then n1's copies go out.
		within(5*time.Second, func() bool {
			r, _, _ := n0.roleForTest(s.pid)
			return r == roleHolder && n0.backupForTest(s.pid) == s.pick || r == roleMoved || r == roleHint
		})
		t.Logf("after n0's copy: %s", n0.partForTest(s.pid))
		hold.Store(false) // n1's copies go out
		n1.kickOwnership()
		countAdmissions(s.c, s.key, 3*lease, limit, &confirmed, by)
		if confirmed > limit {
			t.Fatalf("%d admissions confirmed in one window of limit %d (by decider: %v; n0's new backup %s):\n%s", confirmed, limit, by, s.pick, s.parts())
		}
		t.Logf("confirmed %d (by decider: %v):\n%s", confirmed, by, s.parts())
	})
}

// rpcAddrRewrite hands its node's membership the gRPC address to(addr)
// for member instead of the address addr it gossips.
type rpcAddrRewrite struct {
	inner  memberlist.EventDelegate
	member string
	to     func(addr string) string
}

func (r *rpcAddrRewrite) rewrite(n *memberlist.Node) *memberlist.Node {
	if n.Name != r.member {
		return n
	}
	md, err := decodeMeta(n.Meta)
	if err != nil {
		return n
	}
	md.rpcAddr = r.to(md.rpcAddr)
	cp := *n
	cp.Meta = md.encode()
	return &cp
}

func (r *rpcAddrRewrite) NotifyJoin(n *memberlist.Node)   { r.inner.NotifyJoin(r.rewrite(n)) }
func (r *rpcAddrRewrite) NotifyLeave(n *memberlist.Node)  { r.inner.NotifyLeave(r.rewrite(n)) }
func (r *rpcAddrRewrite) NotifyUpdate(n *memberlist.Node) { r.inner.NotifyUpdate(r.rewrite(n)) }

// TestTakeoverClockSkew: the holder n0 and its backup n1 run on
// clocks 5 s apart (either way). n0 admits the whole limit (sync) and
// crashes; n1 takes the partition over from its copy. For each algorithm,
// n1 must refuse until the first moment n0 itself would have admitted
// again (shared time): the copy is rebased on n1's clock, so neither
// offset makes the state expire early. (A window that ends later by the
// replication delay only refuses more; the shared clock is frozen here,
// so the bound is exact.)
func TestTakeoverClockSkew(t *testing.T) {
	t.Parallel()
	const limit, window = 5, time.Minute
	for _, alg := range []Algorithm{SlidingLog, TokenBucket, FixedWindow} {
		for _, off := range []time.Duration{5 * time.Second, -5 * time.Second} {
			t.Run(fmt.Sprintf("%v/holder_%+v", alg, off), func(t *testing.T) {
				t.Parallel()
				clk := &hoClock{}
				// Start 7 s into a minute, so the fixed window's boundary
				// on n0's clock is not where n1's is.
				clk.Advance(7 * time.Second)
				offsets := []time.Duration{off, -off, 0}
				c := startClusterWith(t, 3, Config{
					Gossip:         hoCrashGossip,
					LeaseDuration:  500 * time.Millisecond,
					ForwardTimeout: time.Second,
					Policies:       map[string]PolicyConfig{"p": {Limit: limit, Window: window, Algorithm: alg}},
				}, func(i int, cfg *Config) { cfg.Clock = clk.WithOffset(offsets[i]) })
				n0, n1 := c.nodes[0], c.nodes[1]
				key, pid := keyHeldWithBackup(t, n0, n1, fmt.Sprintf("skew-takeover-%v-%v", alg, off), "p")
				admitN(t, n0, key, limit)
				t0 := clk.Now() // shared time of the admissions
				// The first shared time at which n0 would admit again.
				var free time.Time
				switch alg {
				case SlidingLog:
					free = t0.Add(window)
				case TokenBucket:
					free = t0.Add(window / limit)
				case FixedWindow:
					at := t0.Add(off) // n0's clock
					free = at.Truncate(window).Add(window).Add(-off)
				}
				n0.KillForTest()
				waitFor(t, 30*time.Second, "n1 to take the partition over", func() bool {
					r, _, _ := n1.roleForTest(pid)
					return r == roleHolder
				})
				clk.Advance(free.Add(-time.Millisecond).Sub(clk.Now()))
				for i := range 2 * limit {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					d, err := n1.Allow(ctx, Request{Key: key})
					cancel()
					if err != nil {
						t.Fatalf("check %d on n1 after the takeover: %v", i, err)
					}
					if d.Allowed {
						t.Fatalf("n1 admitted %v after the admissions (shared time), before n0 would have (%v): %+v",
							clk.Now().Sub(t0), free.Sub(t0), d)
					}
				}
				clk.Advance(time.Millisecond)
				if d, err := n1.Allow(context.Background(), Request{Key: key}); err != nil || !d.Allowed {
					t.Logf("at %v n1 still refuses (%+v, %v): its copy ends later than n0's state would", free.Sub(t0), d, err)
				}
			})
		}
	}
}
