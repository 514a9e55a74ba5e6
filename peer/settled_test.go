package peer

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestWaitSettled: a forming cluster settles within the deadline; a node
// list that cannot agree (one node counted twice is not a member set of
// that size) ends with the context's error.
func TestWaitSettled(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 3, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := WaitSettled(ctx, c.nodes, 20*time.Millisecond); err != nil {
		t.Fatalf("3 nodes did not settle: %v", err)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	err := WaitSettled(short, append(c.nodes, c.nodes[0]), 0)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("4 entries for 3 members: got %v, want a deadline error", err)
	}
}
