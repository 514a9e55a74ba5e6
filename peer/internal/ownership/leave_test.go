package ownership

import (
	"testing"
	"time"
)

// TestMayLeave walks a leaver, b, through the rule: it backs a's
// partition, holds it once a is ended, and is free once it holds and
// backs nothing; gossip's count of members never lets it go while it
// holds, nor while the holder it backs may have failed.
func TestMayLeave(t *testing.T) {
	const L = int64(2 * time.Second)
	b := New(Config{ID: "b", Liveness: time.Duration(L)}, 2)
	apply := func(now int64, cs ...Command) {
		t.Helper()
		for _, c := range cs {
			if err := b.table.Clone().Apply(c); err != nil {
				t.Fatalf("%v: %v", c, err)
			}
			b.Apply(c, now)
		}
	}
	apply(0,
		Command{Kind: Join, Member: "a"}, Command{Kind: Join, Member: "b"}, Command{Kind: Join, Member: "c"},
		Command{Kind: Extend, Member: "a", Epoch: 1}, Command{Kind: Extend, Member: "b", Epoch: 1}, Command{Kind: Extend, Member: "c", Epoch: 1},
		Command{Kind: Grant, P: 0, To: "a", ToEpoch: 1}, Command{Kind: Grant, P: 1, To: "c", ToEpoch: 1})
	check := func(d Drain, now int64, want LeaveVerdict, why string) {
		t.Helper()
		if got, held, backed := b.MayLeave(d, now); got != want {
			t.Errorf("%s: MayLeave = %v (held %d, backed %d), want %v", why, got, held, backed, want)
		}
	}
	since := int64(100)
	d := Drain{Since: since, Alive: 3, BackupWait: 10 * time.Second}
	check(d, since, Go, "holding and backing nothing")
	apply(since, Command{Kind: SetBackup, Member: "a", P: 0, Epoch: 1, To: "b", Seq: 1})
	check(d, since, Stay, "backing a, which has not extended since the drain began")
	for _, alive := range []int{1, 2} {
		check(Drain{Since: since, Alive: alive, BackupWait: d.BackupWait}, since, Stay, "the same, whatever gossip lists")
	}
	apply(since+10, Command{Kind: Extend, Member: "a", Epoch: 1})
	check(d, since+20, Stay, "backing a live holder, before BackupWait")
	check(Drain{Since: since, Alive: 2, BackupWait: d.BackupWait}, since+20, GoBacking, "backing a live holder, nobody else to back it")
	check(d, since+int64(d.BackupWait), Stay, "backing a holder silent for half a liveness, after BackupWait")
	apply(since+int64(d.BackupWait)-1, Command{Kind: Extend, Member: "a", Epoch: 1})
	check(d, since+int64(d.BackupWait), GoBacking, "backing a live holder, after BackupWait")

	// a fails: its End hands p0 to b, with the only copy.
	rec := b.table.Members["a"]
	apply(since+int64(d.BackupWait)+1, Command{Kind: End, Member: "a", Epoch: rec.Epoch, Version: rec.Version, Ended: true})
	if !b.table.Holds("b", 0) {
		t.Fatalf("b does not hold p0 after a's end: %+v", b.table.Parts[0])
	}
	for _, alive := range []int{1, 2, 3} {
		check(Drain{Since: since, Alive: alive, BackupWait: d.BackupWait}, since+int64(time.Minute), Stay, "holding, c still holds a partition")
	}
	// c ends too (the cluster stops): alone, b has nobody to hand p0 to.
	rec = b.table.Members["c"]
	apply(since+int64(time.Minute), Command{Kind: End, Member: "c", Epoch: rec.Epoch, Version: rec.Version, Ended: true})
	check(Drain{Since: since, Alive: 1}, since+int64(time.Minute), Go, "alone, no other member live")
	check(Drain{Since: since, Alive: 3}, since+int64(time.Minute), Stay, "holding, gossip lists others")
}

// TestMayLeaveAloneWhileOthersActive: b, alone in its gossip view, holds
// p0 with its only copy (a's liveness lapsed on a loaded log and was
// ended, handing p0 to its backup b), and c's lapse left p1 vacant.
// Neither a nor c holds anything, but the log may yet hand them what b
// holds: b stays while they are active again at their next epoch, and
// for two Liveness after their ends before they are. It used to go at
// once (nobody else held anything), and its End restarted p0 empty. Once
// they are ended and have not come back for two Liveness, b is alone for
// good and goes.
func TestMayLeaveAloneWhileOthersActive(t *testing.T) {
	aloneLeaverScene(t, MutNone)
}

// TestMayLeaveAloneBrokenRuleCaught: with the rule broken on purpose
// (MutAloneLeaverCountsHolders), the scene above lets the leaver go with
// the only copy of p0 a moment after the others were ended.
func TestMayLeaveAloneBrokenRuleCaught(t *testing.T) {
	inner := &testing.T{}
	done := make(chan struct{})
	go func() { defer close(done); aloneLeaverScene(inner, MutAloneLeaverCountsHolders) }()
	<-done
	if !inner.Failed() {
		t.Fatal("the alone leaver's scene passes with the rule broken: it proves nothing")
	}
}

func aloneLeaverScene(t *testing.T, mut Mutation) {
	const L = int64(2 * time.Second)
	b := New(Config{ID: "b", Liveness: time.Duration(L), Mutation: mut}, 2)
	apply := func(now int64, cs ...Command) {
		t.Helper()
		for _, c := range cs {
			if err := b.table.Clone().Apply(c); err != nil {
				t.Fatalf("%v: %v", c, err)
			}
			b.Apply(c, now)
		}
	}
	end := func(now int64, id string) {
		t.Helper()
		rec := b.table.Members[id]
		apply(now, Command{Kind: End, Member: id, Epoch: rec.Epoch, Version: rec.Version})
	}
	alone := Drain{Since: 0, Alive: 1, BackupWait: 10 * time.Second}
	check := func(now int64, want LeaveVerdict, why string) {
		t.Helper()
		if got, held, backed := b.MayLeave(alone, now); got != want {
			t.Errorf("%s: MayLeave = %v (held %d, backed %d), want %v", why, got, held, backed, want)
		}
	}
	apply(0,
		Command{Kind: Join, Member: "a"}, Command{Kind: Join, Member: "b"}, Command{Kind: Join, Member: "c"},
		Command{Kind: Extend, Member: "a", Epoch: 1}, Command{Kind: Extend, Member: "b", Epoch: 1}, Command{Kind: Extend, Member: "c", Epoch: 1},
		Command{Kind: Grant, P: 0, To: "a", ToEpoch: 1}, Command{Kind: Grant, P: 1, To: "c", ToEpoch: 1},
		Command{Kind: SetBackup, Member: "a", P: 0, Epoch: 1, To: "b", Seq: 1})
	now := 10 * L
	end(now, "a")
	end(now, "c")
	if !b.table.Holds("b", 0) || b.table.Parts[1].Holder != "" {
		t.Fatalf("after a's and c's ends: p0 %+v, p1 %+v; want p0 held by b, p1 vacant", b.table.Parts[0], b.table.Parts[1])
	}
	check(now+1, Stay, "alone in gossip, holding p0, a and c ended a moment ago")
	apply(now+L, Command{Kind: Extend, Member: "a", Epoch: 2}, Command{Kind: Extend, Member: "c", Epoch: 2})
	check(now+10*L, Stay, "alone in gossip, holding p0, a and c active again (holding nothing)")
	now += 10 * L
	end(now, "a")
	end(now, "c")
	check(now+2*L-1, Stay, "a and c ended again, within two Liveness")
	check(now+2*L, Go, "a and c ended two Liveness ago and not back: alone for good")
}
