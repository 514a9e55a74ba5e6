package peer

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestDNSJoinNodeJoin starts two single-node clusters and has one contact
// the other with Node.Join, as serve's DNS re-resolution does. The two
// were founded separately, so they refuse each other, each saying so in
// its readiness, and never merge. A second call with the same addresses
// contacts no one, and a closed node refuses.
func TestDNSJoinNodeJoin(t *testing.T) {
	t.Parallel()
	pols := map[string]PolicyConfig{"p": {Limit: 10, Window: time.Minute}}
	// Two clusters of one node each, with distinct names (a cluster
	// refuses a duplicate name).
	a := &cluster{t: t, base: Config{Policies: pols}}
	a.add("a")
	b := &cluster{t: t, base: Config{Policies: pols}}
	b.add("b")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// b's own address is known to b and skipped; a's is new.
	n, err := b.nodes[0].Join(ctx, []string{b.nodes[0].GossipAddr(), a.nodes[0].GossipAddr()})
	if err != nil || n != 1 {
		t.Fatalf("Join(self, a) = %d, %v; want 1, nil", n, err)
	}
	refused := func(nd *Node, other string) bool {
		ok, why := nd.Ready()
		return !ok && strings.Contains(why, other+" (member of another cluster")
	}
	waitFor(t, 15*time.Second, "each node to refuse the other's cluster", func() bool {
		return refused(a.nodes[0], "b") && refused(b.nodes[0], "a")
	})
	if m := len(a.nodes[0].Members()) + len(b.nodes[0].Members()); m != 2 {
		t.Errorf("the separately founded clusters merged: %d ring members in all, want 1 each", m)
	}
	if n, err := b.nodes[0].Join(ctx, []string{a.nodes[0].GossipAddr()}); err != nil || n != 0 {
		t.Errorf("Join(known member) = %d, %v; want 0, nil", n, err)
	}
	closeCtx, cancelClose := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelClose()
	// Close's own error (a leave broadcast nobody acknowledged in time)
	// is not what this test is about.
	_ = b.nodes[0].Close(closeCtx)
	if _, err := b.nodes[0].Join(ctx, []string{a.nodes[0].GossipAddr()}); !errors.Is(err, ErrClosed) {
		t.Errorf("Join after Close = %v, want ErrClosed", err)
	}
}
