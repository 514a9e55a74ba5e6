package peer

import (
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// A tenth round of attacks on the ownership protocol: a link broken one
// way only.

// TestAttack10TakeoverUnreachableFromHolder: TestAttack3CopyBeforeTakeoverKnown
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
func TestAttack10TakeoverUnreachableFromHolder(t *testing.T) {
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
