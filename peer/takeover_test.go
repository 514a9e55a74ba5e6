package peer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/ring"
)

// A takeover between clocks that run apart, and the five-member scene
// the paused-holder tests start from.

// stallScene: n0 holds key's partition pid with n1 as its backup; pick is
// a third member, neither the partition's backup in n0's ring nor n1's
// backup once n1 holds it. n0's gossip link and log messages are cut
// while cut is set.
type stallScene struct {
	c      *cluster
	n0, n1 *Node
	key    Key
	pid    int
	pick   string
	cut    *atomic.Bool // n0's gossip link and its log messages are cut while set
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
		// 31 partitions rather than 271: the scene needs one partition
		// that fits, and every partition costs a move and a backup copy
		// (commands through the log) before the five members settle.
		Ring:          ring.Config{PartitionCount: 31},
		LeaseDuration: lease,
		Policies:      map[string]PolicyConfig{"p": pc},
		// A synchronous replication on a loaded machine (race detector,
		// other suites) can take longer than the 500 ms default.
		ForwardTimeout: 2 * time.Second,
	}, func(i int, cfg *Config) {
		cfg.Gossip = attackGossip
		if i == 0 {
			cutGossip := withCutTransport(t, cut)
			cfg.Gossip = func(mc *memberlist.Config) {
				cutGossip(mc)
				// attackGossip's timings, on the cut transport.
				mc.ProbeTimeout, mc.SuspicionMult = 250*time.Millisecond, 5
				mc.SuspicionMaxTimeoutMult = 50
				if edit0 != nil {
					edit0(mc)
				}
			}
		}
	})
	s := &stallScene{c: c, n0: c.nodes[0], n1: c.nodes[1], pid: -1, cut: cut}
	// The cut silences n0's log traffic too: a member gossip declares dead
	// stays on the ring while the log sees it extend, so a stall that
	// left its log traffic flowing would stall nothing the others see.
	cutLog(c, 0, cut)
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
	// A call that timed out above may still have been admitted (its
	// answer waited on a slow replication): n1 then refuses before
	// confirmed reaches limit, and confirmed stays a lower bound.
	deadline := time.Now().Add(20 * time.Second)
	for *confirmed < limit && time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		d, err := s.n1.Allow(ctx, Request{Key: s.key})
		cancel()
		switch {
		case err != nil:
			continue
		case d.Allowed:
			*confirmed++
		case d.Reason == ReasonOverLimit:
			return
		default:
			t.Fatalf("admission through n1: %+v", d)
		}
	}
	if *confirmed < limit {
		t.Fatalf("n1 confirmed %d of %d within 20 s", *confirmed, limit)
	}
}

// TestTakeoverClockSkew: the holder n0 and its backup n1 run on
// clocks 5 s apart (either way). n0 admits the whole limit (sync) of a key
// of each algorithm and crashes; n1 takes the partition over from its
// copy. For each algorithm, n1 must refuse until the first moment n0
// itself would have admitted again (shared time): the copy is rebased on
// n1's clock, so neither offset makes the state expire early. (A window
// that ends later by the replication delay only refuses more; the shared
// clock is frozen here, so the bound is exact.)
//
// The three algorithms' keys share a subject, so a partition, and one
// cluster and one takeover per offset: each key is checked at its own
// instant, the earliest first, on the clock that only moves forward. (A
// cluster and a takeover per algorithm cost three times the start and
// the lease, and the copies they check are the same.)
func TestTakeoverClockSkew(t *testing.T) {
	t.Parallel()
	const limit, window = 5, time.Minute
	algs := map[string]Algorithm{"sliding": SlidingLog, "bucket": TokenBucket, "fixed": FixedWindow}
	pols := map[string]PolicyConfig{}
	for name, alg := range algs {
		pols[name] = PolicyConfig{Limit: limit, Window: window, Algorithm: alg}
	}
	for _, off := range []time.Duration{5 * time.Second, -5 * time.Second} {
		t.Run(fmt.Sprintf("holder_%+v", off), func(t *testing.T) {
			t.Parallel()
			clk := &hoClock{}
			// Start 7 s into a minute, so the fixed window's boundary
			// on n0's clock is not where n1's is.
			clk.Advance(7 * time.Second)
			offsets := []time.Duration{off, -off, 0}
			c := startClusterWith(t, 3, Config{
				Gossip:         hoGossip,
				ForwardTimeout: time.Second,
				Policies:       pols,
			}, func(i int, cfg *Config) { cfg.Clock = clk.WithOffset(offsets[i]) })
			n0, n1 := c.nodes[0], c.nodes[1]
			first, pid := keyHeldWithBackup(t, n0, n1, fmt.Sprintf("skew-takeover-%v", off), "sliding")
			type check struct {
				alg  Algorithm
				key  Key
				free time.Time // the first shared time at which n0 would admit again
			}
			var checks []check
			for name, alg := range algs {
				k := Key{Tenant: first.Tenant, Subject: first.Subject, Policy: name}
				if p := n0.partIDForTest(k); p != pid {
					t.Fatalf("key %v is in partition %d, want %d (that of %v)", k, p, pid, first)
				}
				checks = append(checks, check{alg: alg, key: k})
			}
			for _, ck := range checks {
				admitN(t, n0, ck.key, limit)
			}
			t0 := clk.Now() // shared time of the admissions
			for i := range checks {
				switch checks[i].alg {
				case SlidingLog:
					checks[i].free = t0.Add(window)
				case TokenBucket:
					checks[i].free = t0.Add(window / limit)
				case FixedWindow:
					at := t0.Add(off) // n0's clock
					checks[i].free = at.Truncate(window).Add(window).Add(-off)
				}
			}
			slices.SortFunc(checks, func(a, b check) int { return a.free.Compare(b.free) })
			n0.KillForTest()
			waitFor(t, 30*time.Second, "n1 to take the partition over", func() bool {
				r, _, _ := n1.roleForTest(pid)
				return r == partition.RoleHolder
			})
			for _, ck := range checks {
				// Keys whose instant an earlier key's check passed
				// (the same free) were checked with it.
				if !clk.Now().Before(ck.free) {
					continue
				}
				clk.Advance(ck.free.Add(-time.Millisecond).Sub(clk.Now()))
				for _, same := range checks {
					if same.free.Equal(ck.free) {
						refusedUntilFree(t, n1, same.alg, same.key, limit, t0, same.free, clk)
					}
				}
				clk.Advance(time.Millisecond)
				for _, same := range checks {
					if !same.free.Equal(ck.free) {
						continue
					}
					if d, err := n1.Allow(context.Background(), Request{Key: same.key}); err != nil || !d.Allowed {
						t.Logf("%v: at %v n1 still refuses (%+v, %v): its copy ends later than n0's state would", same.alg, same.free.Sub(t0), d, err)
					}
				}
			}
		})
	}
}

// refusedUntilFree asks n1 for key 2×limit times at the frozen instant 1 ms
// before free (shared time) and fails if one is admitted: n0 would not
// have admitted it yet.
func refusedUntilFree(t *testing.T, n1 *Node, alg Algorithm, key Key, limit int, t0, free time.Time, clk *hoClock) {
	t.Helper()
	for i := range 2 * limit {
		// The clock is frozen: a check that finds the partition
		// fenced (n1 moving its backup) is asked again.
		var d Decision
		var err error
		for end := time.Now().Add(20 * time.Second); ; {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			d, err = n1.Allow(ctx, Request{Key: key})
			cancel()
			if !errors.Is(err, ErrUnavailable) || time.Now().After(end) {
				break
			}
		}
		if err != nil {
			t.Fatalf("%v: check %d on n1 after the takeover: %v", alg, i, err)
		}
		if d.Allowed {
			t.Fatalf("%v: n1 admitted %v after the admissions (shared time), before n0 would have (%v): %+v",
				alg, clk.Now().Sub(t0), free.Sub(t0), d)
		}
	}
}
