package peer

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/ring"
)

// A third round of attacks on the ownership protocol, on epochs: two
// members ending up with equal claims on one partition (the same epoch),
// and a later step taking the wrong one.

// stallScene is TestAttack2StallMidCopy's scene: n0 holds key's partition
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

// within polls cond until it holds or d has passed, and reports whether it
// held (a wait whose end is not itself the test's verdict).
func within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

// countAdmissions asks every live node of c for key every 20 ms for d, or
// until more than limit admissions are confirmed, and adds them to
// confirmed and by.
func countAdmissions(c *cluster, key Key, d time.Duration, limit int, confirmed *int, by map[string]int) {
	end := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(end) && *confirmed <= limit {
		for _, nd := range c.nodes {
			if nd.closing.Load() {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			d, err := nd.Allow(ctx, Request{Key: key})
			cancel()
			if err == nil && d.Allowed {
				*confirmed++
				by[d.Owner]++
			}
		}
		<-tick.C
	}
}

func (s *stallScene) parts() string { return partsOf(s.c.live(), s.pid) }

// partsOf describes partition pid on each of nodes, a line each: what a
// failed attack prints.
func partsOf(nodes []*Node, pid int) string {
	var parts []string
	for _, nd := range nodes {
		parts = append(parts, nd.partForTest(pid))
	}
	return strings.Join(parts, "\n")
}

// TestAttack3CopyBeforeTakeoverKnown: TestAttack2StallMidCopy, with n0
// resuming as soon as n1 has taken the partition over, before n1's first
// copy of its holding reaches anyone (its copies are held back until n0's
// copy is answered). n0's check that nobody took the partition over while
// its lease had ended (confirmHolding) asks every member but the one
// marked unreachable — n1, the only member that could have taken it over,
// and the only one that knows it did. Nobody else knows, so n0 used its
// copy's lease and decided from its old state at the epoch n1 holds the
// partition at, while n1 decided too: the equal epochs made each refuse
// the other's copies as stale without either learning of the other.
func TestAttack3CopyBeforeTakeoverKnown(t *testing.T) {
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

// TestAttack3TakeoverTieGoesToLiveHolder: a member (n2) keeps a complete
// copy of a holder that is gone, at the very epoch at which a live member
// (n0) holds the partition — as when a holder that stalled copied its
// partition at the epoch its backup had taken it over at, found that out,
// and its release of the copy was lost. A takeover compared epochs only
// ("strictly newer is stale"), so n2 took the partition over from the
// gone holder's state while n0 went on deciding: two decision points.
func TestAttack3TakeoverTieGoesToLiveHolder(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 3, Config{Policies: map[string]PolicyConfig{"p": {Limit: 5, Window: time.Hour}}})
	n0, n1, n2 := c.nodes[0], c.nodes[1], c.nodes[2]
	key, pid := keyHeldWithBackup(t, n0, n1, "takeover-tie", "p")
	admitN(t, n0, key, 1)
	_, _, epoch := n0.roleForTest(pid)
	pt := &n2.pt.parts[pid]
	pt.mu.Lock()
	pt.rep = replica{holder: "n-gone", epoch: epoch, complete: true, store: n2.newPartStore(), made: n2.mono()}
	pt.mu.Unlock()
	n2.takeOver(context.Background(), pid)
	if r, holder, e := n2.roleForTest(pid); r == roleHolder || r == roleFenced {
		t.Fatalf("n2 took the partition over at epoch %d from a gone holder's copy at %d while n0 holds it at %d (%v %s)", e, epoch, epoch, r, holder)
	}
	if r, _, e := n0.roleForTest(pid); r != roleHolder || e != epoch {
		t.Fatalf("n0: %v at epoch %d; want holder at %d", r, e, epoch)
	}
	if n2.copyForTest(pid, "n-gone") != nil {
		t.Fatal("n2 kept its stale copy")
	}
}

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
