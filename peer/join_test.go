package peer

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// freeAddr returns a loopback address nothing listens on (a port the OS
// just handed out and that was released again).
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}

// TestJoinRetriesUntilSeedUp starts a node whose seed is not up yet; the
// seed starts once the node has logged its second failed join. New must
// keep trying and succeed.
func TestJoinRetriesUntilSeedUp(t *testing.T) {
	t.Parallel()
	seedAddr := freeAddr(t)
	watch, log := newLogTap(t)
	failed := watch.on("join failed, retrying", func(a map[string]string) bool { return a["attempt"] == "2" })
	type result struct {
		nd  *Node
		err error
	}
	done := make(chan result, 1)
	started := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		nd, err := New(ctx, Config{Name: "late", GossipProfile: GossipFast, Join: []string{seedAddr}, Logger: log})
		done <- result{nd, err}
	}()
	waitLog(t, failed, 10*time.Second, "second failed join attempt")
	seed, err := New(context.Background(), Config{Name: "seed", GossipAddr: seedAddr, GossipProfile: GossipFast, Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("start seed on %s: %v", seedAddr, err)
	}
	t.Cleanup(func() { _ = seed.Close(context.Background()) })
	seedUp := time.Since(started)
	var res result
	select {
	case res = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("New did not return after the seed came up")
	}
	if res.err != nil {
		t.Fatalf("New with a seed that came up after %v: %v", seedUp, res.err)
	}
	t.Cleanup(func() { _ = res.nd.Close(context.Background()) })
	t.Logf("seed up after %v, joined after %v", seedUp, time.Since(started))
	waitView(t, seed, 10*time.Second, "seed to see 2 members", func() bool { return len(seed.Members()) == 2 })
	waitView(t, res.nd, 10*time.Second, "late node to see 2 members", func() bool { return len(res.nd.Members()) == 2 })
}

// TestJoinTimeout checks that New gives up after JoinTimeout with an error
// naming the seed, having retried.
func TestJoinTimeout(t *testing.T) {
	seedAddr := freeAddr(t)
	watch, log := newLogTap(t)
	retried := watch.on("join failed, retrying", nil)
	_, err := New(context.Background(), Config{GossipProfile: GossipFast, Join: []string{seedAddr}, JoinTimeout: 400 * time.Millisecond, Logger: log})
	if err == nil || !strings.Contains(err.Error(), seedAddr) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("New with an absent seed = %v; want an error naming %s wrapping context.DeadlineExceeded", err, seedAddr)
	}
	select {
	case <-retried:
	default:
		t.Fatalf("New gave up without a logged retry: %v", err)
	}
}

// TestJoinKeyMismatchFailsFast starts a node with a gossip key and another
// without one that joins it: New fails at once (not after JoinTimeout)
// with an error wrapping ErrInvalidConfig that says the
// keys differ and quotes the seed's answer.
func TestJoinKeyMismatchFailsFast(t *testing.T) {
	seed, err := New(context.Background(), Config{GossipProfile: GossipFast, GossipKey: []byte("0123456789abcdef"), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = seed.Close(context.Background()) })
	began := time.Now()
	const joinTimeout = 5 * time.Second
	nd, err := New(context.Background(), Config{GossipProfile: GossipFast, Join: []string{seed.GossipAddr()}, JoinTimeout: joinTimeout, Logger: testLogger(t)})
	took := time.Since(began)
	if err == nil {
		_ = nd.Close(context.Background())
		t.Fatal("New without the seed's gossip key joined it")
	}
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "gossip encryption keys differ") ||
		!strings.Contains(err.Error(), "this node has no gossip key and the seed has one") || !strings.Contains(err.Error(), seed.GossipAddr()) {
		t.Fatalf("New without the seed's key = %v; want ErrInvalidConfig saying the keys differ, which side lacks one, and the seed", err)
	}
	if took >= joinTimeout/2 {
		t.Fatalf("New failed after %v; want at once, not after JoinTimeout %v", took, joinTimeout)
	}
	t.Logf("failed after %v: %v", took.Round(time.Millisecond), err)
}
