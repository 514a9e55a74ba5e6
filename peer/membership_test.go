package peer

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

// TestMembershipLogTellsLeaveFromFailure checks the "gossip membership" lines
// an operator reads: a graceful Close is logged as event=left on the
// survivors (the leaver announced its drain), an abrupt death as
// event=failed, each with the ring version, member count and partitions.
func TestMembershipLogTellsLeaveFromFailure(t *testing.T) {
	logs := newHoLogs()
	c := startClusterWith(t, 4, Config{Gossip: hoCrashGossip}, func(_ int, cfg *Config) {
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
