package peer

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestMembershipLogTellsLeaveFromFailure checks the "gossip membership" lines
// an operator reads: a graceful Close is logged as event=left on the
// survivors (the leaver announced its drain), an abrupt death as
// event=failed, each with the ring version, member count and partitions.
func TestMembershipLogTellsLeaveFromFailure(t *testing.T) {
	t.Parallel()
	logs := newHoLogs()
	c := startClusterWith(t, 4, Config{Gossip: hoGossip}, func(_ int, cfg *Config) {
		cfg.Logger = slog.New(logs)
	})
	leaver, victim, watcher := c.nodes[2], c.nodes[3], c.nodes[0]

	event := func(member string) string {
		for _, r := range logs.find(watcher.Name(), "gossip membership") {
			if r.attrs["member"].String() == member && (r.attrs["event"].String() == "left" || r.attrs["event"].String() == "failed") {
				return r.attrs["event"].String()
			}
		}
		return ""
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := leaver.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	c.waitMembers(3)
	waitFor(t, 10*time.Second, "the watcher to log the leaver's departure", func() bool { return event(leaver.Name()) != "" })
	for _, r := range logs.find(watcher.Name(), "gossip membership") {
		t.Logf("%v %v", r.attrs["event"], r.attrs["member"])
	}
	if got := event(leaver.Name()); got != "left" {
		t.Fatalf("graceful Close of %s logged as event=%q on %s, want left", leaver.Name(), got, watcher.Name())
	}

	victim.KillForTest()
	c.waitMembers(2)
	waitFor(t, 10*time.Second, "the watcher to log the victim's departure", func() bool { return event(victim.Name()) != "" })
	if got := event(victim.Name()); got != "failed" {
		t.Fatalf("abrupt death of %s logged as event=%q on %s, want failed", victim.Name(), got, watcher.Name())
	}

	for _, r := range logs.find(watcher.Name(), "gossip membership") {
		if r.attrs["member"].String() != victim.Name() || r.attrs["event"].String() != "failed" {
			continue
		}
		if r.attrs["members"].Int64() != 2 || r.attrs["ring_version"].Uint64() == 0 || r.attrs["partitions_owned"].Int64() <= 0 {
			t.Fatalf("failure line lacks the ring facts: members=%v ring_version=%v partitions_owned=%v",
				r.attrs["members"], r.attrs["ring_version"], r.attrs["partitions_owned"])
		}
	}
}

// TestAdvertisedRPCAddr checks that peers dial the advertised gRPC address,
// not the bound one, and that a malformed advertise address is a config
// error.
func TestAdvertisedRPCAddr(t *testing.T) {
	const advertised = "127.0.0.1:1" // nothing listens there
	c := &cluster{t: t}
	c.add("n0")
	c.addWith("n1", func(cfg *Config) { cfg.RPCAdvertiseAddr = advertised })
	// n1 cannot be reached, so partitions cannot settle on it: wait for
	// the members only.
	waitFor(t, 10*time.Second, "n0 to learn n1's advertised address", func() bool {
		return c.nodes[0].view.Load().alive["n1"] == advertised
	})
	if got := c.nodes[1].view.Load().alive["n1"]; got != advertised {
		t.Fatalf("n1 lists itself at %q, want the advertised %q", got, advertised)
	}

	_, err := New(context.Background(), Config{RPCAdvertiseAddr: "no-port", GossipAdvertiseAddr: "also:bad:colons"})
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "rpc advertise address") || !strings.Contains(err.Error(), "gossip advertise address") {
		t.Fatalf("New with bad advertise addresses: %v; want ErrInvalidConfig naming both", err)
	}
}

// TestFromStatusMessage checks that FromStatus maps codes to sentinels
// without repeating the sentinel's text.
func TestFromStatusMessage(t *testing.T) {
	for _, tc := range []struct {
		in   error
		want error
		msg  string
	}{
		{status.Error(codes.NotFound, `peer: unknown policy: "x"`), ErrUnknownPolicy, `peer: unknown policy: "x"`},
		{status.Error(codes.Unavailable, "peer: limiter unavailable: owner down"), ErrUnavailable, "peer: limiter unavailable: owner down"},
		{status.Error(codes.InvalidArgument, "bad hits"), ErrInvalidKey, "peer: invalid key: bad hits"},
	} {
		got := FromStatus(tc.in)
		if !errors.Is(got, tc.want) || got.Error() != tc.msg {
			t.Errorf("FromStatus(%v) = %q, want %q wrapping %v", tc.in, got, tc.msg, tc.want)
		}
	}
	if FromStatus(nil) != nil {
		t.Error("FromStatus(nil) != nil")
	}
}

// TestGossipFailureWaitsForLiveness checks that a member gossip declares
// dead stays on the ring while the ownership log finds it live: a false
// failure (a starved host, a lost probe) moves no partition. Once its
// liveness really lapses it leaves the ring and the failure is logged.
func TestGossipFailureWaitsForLiveness(t *testing.T) {
	t.Parallel()
	logs := newHoLogs()
	cfg := logConfig(10, time.Minute)
	c := startClusterWith(t, 3, cfg, func(_ int, cfg *Config) { cfg.Logger = slog.New(logs) })
	watcher, victim := c.nodes[0], c.nodes[2]
	version := watcher.view.Load().snap.Version()
	// The watcher's gossip declares the victim dead; the victim is fine
	// and keeps extending its liveness through the log.
	watcher.gossiper.delegate.NotifyLeave(&memberlist.Node{Name: victim.Name()})
	waitFor(t, 5*time.Second, "the watcher to log the false failure", func() bool {
		return len(logs.find(watcher.Name(), "gossip membership: member declared dead stays on the ring while its liveness holds")) > 0
	})
	// Through a dozen quarter-lease rechecks it stays on the ring: a
	// property over time, so it is watched for that long.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(3 * cfg.LeaseDuration); time.Now().Before(end); <-tick.C {
		if v := watcher.view.Load(); !v.snap.Has(victim.Name()) || v.snap.Version() != version {
			t.Fatalf("the watcher's ring dropped %s (version %d, was %d) while its liveness held", victim.Name(), v.snap.Version(), version)
		}
	}
	victim.KillForTest()
	waitFor(t, 15*time.Second, "the watcher's ring to drop the killed member", func() bool {
		return !watcher.view.Load().snap.Has(victim.Name())
	})
	failed := false
	for _, r := range logs.find(watcher.Name(), "gossip membership") {
		if r.attrs["member"].String() == victim.Name() && r.attrs["event"].String() == "failed" && r.attrs["members"].Int64() == 2 {
			failed = true
		}
	}
	if !failed {
		t.Fatalf("the watcher never logged %s's failure with the ring facts", victim.Name())
	}
}

// TestLateLivenessAnswerKeepsFailedMembers: a member gossip declares
// dead stays in the view while the log finds it live. When the log's
// answer does not come in time (a loaded runner), no news is not a lapsed
// liveness: the member stays. Dropping every such member at once left a
// loaded node alone in its view, and a leave then went with the only copy
// of a partition (TestAloneLeaverKeepsTheOnlyCopy). Once the answer says
// lapsed, the members go.
func TestLateLivenessAnswerKeepsFailedMembers(t *testing.T) {
	t.Parallel()
	cut := new(atomic.Bool)
	tap, logger := newLogTap(t)
	cutGossip := withCutTransport(t, cut)
	c := startClusterWith(t, 3, Config{}, func(i int, cfg *Config) {
		cfg.Gossip = hoGossip
		if i == 1 {
			cfg.Gossip, cfg.Logger = cutGossip, logger
		}
	})
	n1 := c.nodes[1]
	n1.hooks.freshLate.Store(true)
	kept := map[string]<-chan map[string]string{}
	for _, nd := range []*Node{c.nodes[0], c.nodes[2]} {
		name := nd.Name()
		kept[name] = tap.on("gossip membership: member declared dead stays on the ring while its liveness holds",
			func(a map[string]string) bool { return a["node"] == "n1" && a["member"] == name })
	}
	cut.Store(true)
	for name, ch := range kept {
		waitLog(t, ch, 30*time.Second, "n1 keeping "+name+" once gossip declared it dead")
	}
	if got := len(n1.view.Load().alive); got != 3 {
		t.Fatalf("n1's view lists %d members with the log's answer late, want 3", got)
	}
	n1.hooks.freshLate.Store(false)
	n1.hooks.freshLost.Store(true)
	waitFor(t, 30*time.Second, "n1's view to drop the members whose liveness lapsed", func() bool {
		return len(n1.view.Load().alive) == 1
	})
}
