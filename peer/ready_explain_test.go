package peer

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestReadyNamesStuckPartition: while a node's partitions cannot move
// (every copy its one peer would send fails), Ready's reason names the
// first partition that keeps it unsettled and how it stands, and once the
// copies go through the node is ready with no reason.
func TestReadyNamesStuckPartition(t *testing.T) {
	c := startCluster(t, 1, Config{Policies: map[string]PolicyConfig{"p": {Limit: 5, Window: time.Minute}}})
	n0 := c.nodes[0]
	n0.setCopyUnsentForTest(func(int, string) bool { return true })
	n1 := c.add("n1")
	var reason string
	waitFor(t, 10*time.Second, "n1 unready with a partition named in its reason", func() bool {
		var ok bool
		ok, reason = n1.Ready()
		return !ok && strings.Contains(reason, "partitions moving") && strings.Contains(reason, "(first: p")
	})
	t.Logf("n1: %s", reason)
	if !strings.Contains(reason, "holder") || !strings.Contains(reason, "target") {
		t.Errorf("n1's reason %q does not say how the partition stands (holder, target)", reason)
	}
	n0.setCopyUnsentForTest(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := WaitSettled(ctx, []*Node{n0, n1}, 0); err != nil {
		t.Fatal(err)
	}
	if ok, reason := n1.Ready(); !ok || reason != "" {
		t.Fatalf("settled n1: Ready = %v, %q; want true, \"\"", ok, reason)
	}
}
