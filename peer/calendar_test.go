package peer

import (
	"context"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/shard"
)

// TestAdmissionRunCalendar: the run replicated for a calendar admission is
// the decided period's start instant, so a backup whose clock is behind the
// holder's, across the period's edge, still counts it in that period.
func TestAdmissionRunCalendar(t *testing.T) {
	pc := PolicyConfig{Limit: 3, Algorithm: shard.Calendar, Period: shard.CalendarDay, Zone: "Europe/Berlin"}
	e := policy.New(map[string]PolicyConfig{"daily": pc}).Lookup("daily")
	key := Key{Tenant: "acme", Subject: "u", Policy: "daily"}
	edge := time.Date(2026, 3, 29, 0, 0, 0, 0, e.Shard.Zone) // a 23-hour day
	holder, _ := shard.NewStore(shard.Config{})
	backup, _ := shard.NewStore(shard.Config{})
	at := edge.Add(time.Millisecond)
	for i := range 3 {
		sd, err := holder.Allow(key, e.Shard, 1, at)
		if err != nil || !sd.Allowed {
			t.Fatalf("holder admission %d: %+v, %v", i+1, sd, err)
		}
		run := partition.AdmissionRun(e, sd, 1, at)
		if run.Age != time.Duration(edge.UnixNano()) || run.Count != 1 {
			t.Fatalf("admissionRun = %+v, want the period start %d, count 1", run, edge.UnixNano())
		}
		ks := shard.KeyState{Key: key, Algorithm: shard.Calendar, Runs: []shard.Run{run}}
		if err := backup.Import(ks, e.Shard, edge.Add(-time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	d, err := backup.Peek(key, e.Shard, 1, edge.Add(-time.Second))
	if want := (shard.Decision{Limit: 3, RetryAfter: 23*time.Hour + time.Second, ResetAfter: 23*time.Hour + time.Second}); err != nil || d != want {
		t.Fatalf("backup Peek 1 s behind the edge: %+v, %v, want %+v", d, err, want)
	}
}

// TestClusterCalendarLimit: a calendar policy through a holder and its
// synchronous backup admits exactly its limit, and the backup's copy holds
// the period's count.
func TestClusterCalendarLimit(t *testing.T) {
	t.Parallel()
	pc := PolicyConfig{Limit: 3, Algorithm: shard.Calendar, Period: shard.CalendarMonth}
	c := startCluster(t, 2, Config{Policies: map[string]PolicyConfig{"monthly": pc}})
	n0, n1 := c.nodes[0], c.nodes[1]
	key, pid := keyHeldWithBackup(t, n0, n1, "calendar", "monthly")
	admitN(t, n1, key, 3)
	d, err := n0.Allow(context.Background(), Request{Key: key})
	if err != nil || d.Allowed {
		t.Fatalf("admission 4 of limit 3: %+v, %v", d, err)
	}
	cp := n1.copyForTest(pid, n0.Name())
	if cp == nil {
		t.Fatal("backup n1 has no complete copy of n0's partition")
	}
	sp := shard.Policy{Limit: 3, Algorithm: shard.Calendar, Period: shard.CalendarMonth}
	if sd, err := cp.Peek(key, sp, 1, time.Now()); err != nil || sd.Allowed || sd.Remaining != 0 {
		t.Fatalf("backup copy Peek: %+v, %v; want the period full", sd, err)
	}
}

// TestPackWindowsSkipsCalendar: a calendar policy has no window to send
// (its zero would make the receiver refuse the whole message as
// malformed).
func TestPackWindowsSkipsCalendar(t *testing.T) {
	tab := policy.New(map[string]PolicyConfig{
		"a":   {Limit: 5, Window: time.Hour},
		"cal": {Limit: 5, Algorithm: shard.Calendar, Period: shard.CalendarDay},
	})
	names := func(yield func(string) bool) {
		for _, n := range []string{"cal", "a"} {
			if !yield(n) {
				return
			}
		}
	}
	got, err := decodeWindows(packWindows(tab, names))
	if want := []senderWindow{{"a", time.Hour}}; err != nil || len(got) != 1 || got[0] != want[0] {
		t.Fatalf("decodeWindows(packWindows(cal, a)) = %v, %v; want %v", got, err, want)
	}
}

// TestCalendarSurvivesMoves: a full calendar period stays full when its
// holder leaves gracefully (handoff) and when the next holder crashes
// (takeover from the synchronous copy).
func TestCalendarSurvivesMoves(t *testing.T) {
	t.Parallel()
	const limit = 5
	pc := PolicyConfig{Limit: limit, Algorithm: shard.Calendar, Period: shard.CalendarYear, Zone: "Europe/Berlin"}
	c := startCluster(t, 4, Config{
		Gossip:         hoGossip,
		ForwardTimeout: time.Second,
		Policies:       map[string]PolicyConfig{"yearly": pc},
	})
	n0, n1 := c.nodes[0], c.nodes[1]
	key, pid := keyHeldWithBackup(t, n0, n1, "calendar-moves", "yearly")
	admitted := admitN(t, n0, key, limit)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n0.Close(ctx); err != nil {
		t.Fatalf("n0's close: %v", err)
	}
	after := 0
	for range 2 * limit {
		if d, err := n1.Allow(context.Background(), Request{Key: key}); err == nil && d.Allowed {
			after++
		}
	}
	if after != 0 {
		t.Fatalf("%d admissions after the handoff of a full period of limit %d", after, limit)
	}
	holder, _ := n1.Owner(key)
	var next *Node
	var survivors []*Node
	for _, n := range c.nodes[1:] {
		if n.Name() == holder {
			next = n
		} else {
			survivors = append(survivors, n)
		}
	}
	if next == nil {
		t.Fatalf("holder %q after the handoff is not a live member", holder)
	}
	// The crash is to be a single fault: the new holder has copied the
	// partition to a backup first (a holder without one decides alone).
	waitFor(t, 30*time.Second, "the new holder to have a backup", func() bool { return next.backupForTest(pid) != "" })
	next.KillForTest()
	waitFor(t, 40*time.Second, "a survivor to decide the key after the crash", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		d, err := survivors[0].Allow(ctx, Request{Key: key})
		if err == nil && d.Allowed {
			after++
		}
		return err == nil
	})
	for range 2 * limit {
		if d, err := survivors[1].Allow(context.Background(), Request{Key: key}); err == nil && d.Allowed {
			after++
		}
	}
	if admitted+after > limit {
		t.Fatalf("%d admissions in one period of limit %d (%d before the moves): the period restarted", admitted+after, limit, admitted)
	}
}
