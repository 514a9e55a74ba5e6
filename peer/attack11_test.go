package peer

import (
	"testing"
	"time"
)

// TestAttack11PromoteTargetLongerLease: the members' LeaseDuration
// differs (a configuration change rolling out): the joiner n2 has four
// times the others'. A partition moves from n0 to n2; n2 applies the
// Promote, but its answer and everything of n2's after it are lost, and
// its gossip goes silent. n0 waits out the Promote's timeout and its own
// lease, then takes the partition back. n2 used to count on a lease of
// its own length from the Promote (9/10 of 12 s) and went on deciding
// for almost 3 s after n0 took the partition back: two decision points.
// Now the Promote carries the sender's lease length and n2 counts on the
// shorter of the two, so every admission of n2's comes before any of
// n0's.
func TestAttack11PromoteTargetLongerLease(t *testing.T) {
	t.Parallel()
	pc := startPromoteCutLease(t, PolicyConfig{Limit: 1 << 20, Window: time.Hour, Replication: ReplicateOff}, "promote-long-lease", true, 4*attackLease)
	n0, n2 := pc.n0, pc.n2
	by, n0First, n2Last := watchTakeBack(t, pc)
	if n0First.IsZero() || by[n2.Name()] == 0 {
		t.Fatalf("want n2 to decide under the promote's lease, then n0 to take the partition back (admissions by decider: %v); n0: %s", by, n0.partForTest(pc.pid))
	}
	// n2 decided under the sender's lease length (9/10 of it), not its own.
	if d := n2Last.Sub(pc.promotedAt); d > attackLease {
		t.Fatalf("n2 decided until %v after the promote, longer than the sender's lease %v", d.Round(time.Millisecond), attackLease)
	}
	t.Logf("admissions by decider: %v; n2 decided until %v after the promote, n0 took over after %v", by,
		n2Last.Sub(pc.promotedAt).Round(time.Millisecond), n0First.Sub(pc.promotedAt).Round(time.Millisecond))
}

// TestPromoteLease: the promoted holder's lease length is the shorter of
// its own and the sender's; an older sender's (none) leaves its own.
func TestPromoteLease(t *testing.T) {
	for _, c := range []struct {
		own    time.Duration
		sender int64
		want   time.Duration
	}{
		{3 * time.Second, 0, 3 * time.Second},
		{3 * time.Second, int64(time.Second), time.Second},
		{3 * time.Second, int64(12 * time.Second), 3 * time.Second},
		{3 * time.Second, -1, 3 * time.Second},
	} {
		if got := promoteLease(c.own, c.sender); got != c.want {
			t.Errorf("promoteLease(%v, %d) = %v, want %v", c.own, c.sender, got, c.want)
		}
	}
}
