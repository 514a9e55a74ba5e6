package durable

import (
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

var t0 = time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)

var policies = map[string]shard.Policy{
	"slide": {Limit: 3, Window: time.Minute},
	"month": {Limit: 3, Algorithm: shard.Calendar, Period: shard.CalendarMonth},
}

func policyOf(k shard.Key) (shard.Policy, bool) {
	p, ok := policies[k.Policy]
	return p, ok
}

// holder decides on a store and logs each admission as a replicated
// admission would be: the key's new state, ages relative to the wall time.
type holder struct {
	t     *testing.T
	st    *shard.Store
	parts *Parts
}

func newStore(t *testing.T) *shard.Store {
	t.Helper()
	st, err := shard.NewStore(shard.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func (h *holder) allow(k shard.Key, now time.Time) bool {
	h.t.Helper()
	p, _ := policyOf(k)
	d, err := h.st.Allow(k, p, 1, now)
	if err != nil {
		h.t.Fatal(err)
	}
	if d.Allowed {
		ks, _ := h.st.Export(k, now)
		i, err := h.parts.Log(now.UnixNano(), &peerpb.PartitionOp{Kind: peerpb.PartitionOp_KIND_REPLACE, Partition: 1, Epoch: 4, Keys: []*peerpb.KeyState{KeyToWire(ks)}})
		if err != nil {
			h.t.Fatal(err)
		}
		if err := h.parts.Sync(i); err != nil {
			h.t.Fatal(err)
		}
	}
	return d.Allowed
}

// restart reopens dir and restores partition 1 with the clock at now.
func restart(t *testing.T, dir string, now time.Time) (*shard.Store, time.Time, time.Duration) {
	t.Helper()
	p, rec, err := OpenParts(dir, "c1", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	rp := rec.Part(1)
	if rp == nil || !rp.Complete || rp.Epoch != 4 || rp.Seq != 9 {
		t.Fatalf("recovered partition 1: %+v, want complete at epoch 4 from copy 9", rp)
	}
	at, back := rec.At(now)
	st := newStore(t)
	if _, skipped, err := rp.Restore(st, policyOf, at); err != nil || skipped != 0 {
		t.Fatalf("Restore: %v, %d skipped", err, skipped)
	}
	return st, at, back
}

// TestRestartKeepsWindows: admissions logged before a restart count after
// it, each at the wall time it was made, for a sliding window and a
// calendar month; and a clock that moved backwards across the restart
// holds the keys' time at the newest instant written rather than letting
// a window or period start again.
func TestRestartKeepsWindows(t *testing.T) {
	slide := shard.Key{Tenant: "t", Subject: "a", Policy: "slide"}
	month := shard.Key{Tenant: "t", Subject: "a", Policy: "month"}
	fill := func(t *testing.T) string {
		dir := t.TempDir()
		p, _, err := OpenParts(dir, "c1", 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range []*peerpb.PartitionOp{
			{Kind: peerpb.PartitionOp_KIND_SYNC_BEGIN, Partition: 1, Epoch: 4, HolderEpoch: 9},
			{Kind: peerpb.PartitionOp_KIND_SYNC_END, Partition: 1, Epoch: 4, HolderEpoch: 9},
		} {
			p.Log(t0.UnixNano(), op)
		}
		h := &holder{t: t, st: newStore(t), parts: p}
		// slide: admissions at t0, t0+10s, t0+20s; month: three on
		// 10 March.
		for i := range 3 {
			at := t0.Add(time.Duration(i) * 10 * time.Second)
			if !h.allow(slide, at) || !h.allow(month, at) {
				t.Fatalf("admission %d refused before the restart", i)
			}
		}
		p.Close()
		return dir
	}
	type step struct {
		key  shard.Key
		at   time.Duration // from t0
		want bool
	}
	cases := []struct {
		name     string
		restart  time.Duration // the restarted clock, from t0
		wantBack time.Duration
		steps    []step
	}{
		{"clock forward", 30 * time.Second, 0, []step{
			{slide, 30 * time.Second, false},
			{slide, 59*time.Second + 999*time.Millisecond, false},
			{slide, 60 * time.Second, true}, // t0's admission has expired
			{slide, 61 * time.Second, false},
			{month, 30 * time.Second, false},
			{month, 15 * 24 * time.Hour, false},
			{month, 22 * 24 * time.Hour, true}, // 1 April
		}},
		{"clock back an hour", -time.Hour, time.Hour + 20*time.Second, []step{
			// The restored keys stand at t0+20s until the clock passes it.
			{slide, -time.Hour, false},
			{slide, -30 * time.Minute, false},
			{slide, 60 * time.Second, true},
			// 10 March at 11:00 is the same month; so is the clamped time.
			{month, -time.Hour, false},
		}},
		{"clock back past the month", -11 * 24 * time.Hour, 11*24*time.Hour + 20*time.Second, []step{
			// 27 February: the restored month must not be taken for
			// February's (which would start empty).
			{month, -11 * 24 * time.Hour, false},
			{month, -24 * time.Hour, false},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := fill(t)
			st, at, back := restart(t, dir, t0.Add(tc.restart))
			if back != tc.wantBack {
				t.Fatalf("restart at t0%+v: back %v, want %v (at %v)", tc.restart, back, tc.wantBack, at)
			}
			for _, s := range tc.steps {
				p, _ := policyOf(s.key)
				d, err := st.Allow(s.key, p, 1, t0.Add(s.at))
				if err != nil || d.Allowed != s.want {
					t.Fatalf("%s at t0%+v: allowed %v (%v), want %v", s.key.Policy, s.at, d.Allowed, err, s.want)
				}
			}
		})
	}
}

// TestSnapshotThenLog: a snapshot and the records after it restore the
// state; records the snapshot also holds count twice at worst (refusing
// more), and Forget drops a partition.
func TestSnapshotThenLog(t *testing.T) {
	dir := t.TempDir()
	p, _, err := OpenParts(dir, "c1", 256)
	if err != nil {
		t.Fatal(err)
	}
	h := &holder{t: t, st: newStore(t), parts: p}
	p.Log(t0.UnixNano(), &peerpb.PartitionOp{Kind: peerpb.PartitionOp_KIND_SYNC_BEGIN, Partition: 1, Epoch: 4, HolderEpoch: 9})
	p.Log(t0.UnixNano(), &peerpb.PartitionOp{Kind: peerpb.PartitionOp_KIND_SYNC_END, Partition: 1, Epoch: 4, HolderEpoch: 9})
	p.Log(t0.UnixNano(), &peerpb.PartitionOp{Kind: peerpb.PartitionOp_KIND_SYNC_BEGIN, Partition: 2, Epoch: 1, HolderEpoch: 1})
	var keys []*peerpb.KeyState
	for i := range 20 {
		k := shard.Key{Tenant: "t", Subject: string(rune('a' + i)), Policy: "slide"}
		h.allow(k, t0)
	}
	covers := p.Next()
	h.st.Range(func(k shard.Key) bool {
		ks, _ := h.st.Export(k, t0)
		keys = append(keys, KeyToWire(ks))
		return true
	})
	if err := p.Snapshot(t0.UnixNano(), covers, []*peerpb.PartitionOp{{Kind: peerpb.PartitionOp_KIND_SYNC_CHUNK, Partition: 1, Epoch: 4, HolderEpoch: 9, Keys: keys}}); err != nil {
		t.Fatal(err)
	}
	b := shard.Key{Tenant: "t", Subject: "b", Policy: "slide"}
	h.allow(b, t0.Add(time.Second))
	p.Forget(t0.UnixNano(), 2)
	p.Close()
	st, _, _ := restart(t, dir, t0.Add(2*time.Second))
	if n := st.Len(); n != 20 {
		t.Fatalf("%d keys restored, want 20", n)
	}
	pol, _ := policyOf(b)
	// b had two admissions: one more fits, then none.
	for i, want := range []bool{true, false} {
		if d, _ := st.Allow(b, pol, 1, t0.Add(2*time.Second)); d.Allowed != want {
			t.Fatalf("key b after the restart, request %d: allowed %v, want %v (2 admissions of 3 before)", i, d.Allowed, want)
		}
	}
	_, rec, _ := OpenParts(dir, "c1", 256)
	if rec.Part(2) != nil {
		t.Fatalf("partition 2, forgotten, recovered as %+v", rec.Part(2))
	}
}
