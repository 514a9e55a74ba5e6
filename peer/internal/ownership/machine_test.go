package ownership

import (
	"testing"
	"time"
)

// step applies every proposal in acts, in order, at now, as a one-member
// log would (answering its own keep-alives as that log's leader), and
// returns the actions the applies gave.
func step(m *Machine, acts []Action, now int64) []Action {
	var out []Action
	for _, a := range acts {
		switch a.Kind {
		case Propose:
			out = append(out, m.Apply(a.Cmd, now)...)
		case KeepAlive:
			m.KeptAlive(m.KeepAlive(a.KeepAlive, now, now), now)
		default:
			out = append(out, a)
		}
	}
	return out
}

// TestLeaseCountsFromSend: the holder's lease is 9/10 of Liveness from
// when it sent the extension, however late it was applied; it decides
// only inside it, and an End of its liveness stops it at once.
func TestLeaseCountsFromSend(t *testing.T) {
	const d = int64(2 * time.Second)
	m := New(Config{ID: "a", Liveness: time.Duration(d)}, 1)
	m.SetLeader(true, 0)
	m.SetView(View{Target: []string{"a"}, Second: []string{""}, Members: []string{"a"}})
	step(m, m.Tick(0), 0) // join
	sent := int64(10)
	acts := m.Tick(sent) // extend #1 sent at 10 (and, as leader, a grant)
	step(m, acts, sent+int64(500*time.Millisecond))
	if want := sent + d/10*9; m.LiveUntil() != want {
		t.Fatalf("lease until %d, want %d (from the send)", m.LiveUntil(), want)
	}
	step(m, m.Tick(sent+1), sent+1) // the grant, now that a is fresh
	if !m.Table().Holds("a", 0) {
		t.Fatalf("a was not granted the partition: %+v", m.Table().Parts[0])
	}
	for _, c := range []struct {
		at   int64
		want bool
	}{{sent + 1, true}, {m.LiveUntil() - 1, true}, {m.LiveUntil(), false}} {
		if got := m.MayDecide(0, c.at); got != c.want {
			t.Errorf("MayDecide at %d = %v, want %v (lease until %d)", c.at, got, c.want, m.LiveUntil())
		}
	}
	rec := m.Table().Members["a"]
	m.Apply(Command{Kind: End, Member: "a", Epoch: rec.Epoch, Version: rec.Version}, sent+2)
	if m.MayDecide(0, sent+3) {
		t.Fatal("a decides after its liveness was ended")
	}
}

// TestFencedUntilSettled: a holder that proposed a Move does not decide
// until a command at the fence's epoch applies, and proposes Keep after
// Retry if none does: within MaxRetry, however long the lease (a 1 min
// lease once made a lost Move cost 30 s).
func TestFencedUntilSettled(t *testing.T) {
	for _, d := range []int64{int64(2 * time.Second), int64(time.Minute)} {
		t.Run(time.Duration(d).String(), func(t *testing.T) { testFencedUntilSettled(t, d) })
	}
}

func testFencedUntilSettled(t *testing.T, d int64) {
	m := New(Config{ID: "a", Liveness: time.Duration(d)}, 1)
	m.SetLeader(true, 0)
	m.SetView(View{Target: []string{"a"}, Members: []string{"a", "b"}})
	now := int64(1)
	step(m, m.Tick(now), now) // joins
	now++
	step(m, m.Tick(now), now) // extend
	now++
	step(m, m.Tick(now), now) // grant: a has extended, so it is in the log
	now++
	step(m, m.Apply(Command{Kind: Extend, Member: "b", Epoch: 1, Seq: 1}, now), now)
	// a has no backup: it copies to b and, once b has the copy, makes it
	// the backup.
	for _, a := range m.Tick(now) {
		if a.Kind == SendCopy {
			step(m, m.CopyAcked(a.P, a.To, a.Epoch, a.Seq, now), now)
		}
	}
	if m.Table().Parts[0].Backup != "b" || !m.MayDecide(0, now) {
		t.Fatalf("a does not decide: %+v until %d", m.Table().Parts[0], m.LiveUntil())
	}
	m.SetView(View{Target: []string{"b"}, Members: []string{"a", "b"}})
	var cp Action
	for _, a := range m.Tick(now) {
		if a.Kind == SendCopy {
			cp = a
		}
	}
	if cp.To != "b" || m.MayDecide(0, now) {
		t.Fatalf("no copy to b, or a decides while copying: %+v", cp)
	}
	acts := m.CopyAcked(0, "b", cp.Epoch, cp.Seq, now)
	if len(acts) != 1 || acts[0].Cmd.Kind != Move {
		t.Fatalf("no Move proposed after the copy: %+v", acts)
	}
	retry := int64(MaxRetry)
	var keep bool
	for _, a := range m.Tick(now + retry) {
		keep = keep || a.Kind == Propose && a.Cmd.Kind == Keep
	}
	if !keep || m.MayDecide(0, now+retry) {
		t.Fatalf("after Retry without a settlement: keep proposed %v, decides %v", keep, m.MayDecide(0, now+retry))
	}
	m.Apply(Command{Kind: Keep, Member: "a", P: 0, Epoch: cp.Epoch}, now+retry)
	m.Apply(acts[0].Cmd, now+retry) // the Move commits after the Keep: refused
	if m.Table().Parts[0].Holder != "a" || !m.MayDecide(0, now+retry) {
		t.Fatalf("after Keep then the late Move: %+v, decides %v", m.Table().Parts[0], m.MayDecide(0, now+retry))
	}
}

// TestMayDecideDoesNotAllocate: the decision path's question costs no
// allocation.
func TestMayDecideDoesNotAllocate(t *testing.T) {
	m := New(Config{ID: "a"}, 4)
	if n := testing.AllocsPerRun(100, func() { _ = m.MayDecide(2, 5) }); n != 0 {
		t.Fatalf("MayDecide allocates %v times", n)
	}
}

// TestCopyWaitGrows: a copy that does not finish in time lifts the fence
// and doubles the wait for the next one, up to MaxCopyWait, so that a
// machine whose copies are slow (a loaded host) finishes one instead of
// beginning them again forever; a copy that finishes brings the wait back
// toward twice its duration, never under Retry.
func TestCopyWaitGrows(t *testing.T) {
	m, now, copies := copyScene(4*time.Second, 1)
	retry := int64(m.cfg.Retry)
	var cp []Action
	for wantWait := retry; wantWait <= int64(4*time.Second); wantWait *= 2 {
		if cp = copies(now); len(cp) != 1 {
			t.Fatalf("at %d: %d copies begun, want 1", now, len(cp))
		}
		if m.MayDecide(0, now) {
			t.Fatal("a decides while copying")
		}
		if got := int64(m.CopyWait()); got != wantWait {
			t.Fatalf("copy wait %v, want %v", time.Duration(got), time.Duration(wantWait))
		}
		if c := copies(now + wantWait - 1); len(c) != 0 {
			t.Fatalf("a copy begun again before the wait ended: %+v", c)
		}
		now += wantWait
		step(m, m.Tick(now), now) // the copy times out here
	}
	if got := m.CopyWait(); got != 4*time.Second {
		t.Fatalf("copy wait %v after repeated timeouts, want the 4s cap", got)
	}
	if m.Counters().CopyTimeouts != 3 {
		t.Fatalf("%d copy timeouts counted, want 3", m.Counters().CopyTimeouts)
	}
	// A copy that takes 100 ms brings the wait down by a quarter of the
	// way to max(Retry, 200 ms) = Retry.
	cp = copies(now)
	now += int64(100 * time.Millisecond)
	acts := m.CopyAcked(0, "b", cp[0].Epoch, cp[0].Seq, now)
	if len(acts) != 1 || acts[0].Cmd.Kind != SetBackup {
		t.Fatalf("no SetBackup after the copy: %+v", acts)
	}
	step(m, acts, now)
	if want := 4*time.Second - (4*time.Second-time.Duration(retry))/4; m.CopyWait() != want {
		t.Fatalf("copy wait %v after a fast copy, want %v", m.CopyWait(), want)
	}
	if m.Table().Parts[0].Backup != "b" || !m.MayDecide(0, now) {
		t.Fatalf("a does not decide with b as its backup: %+v", m.Table().Parts[0])
	}
}

// TestCopyFailedLiftsFence: a copy its receiver refuses lifts the fence
// at once (not after the copy wait), leaves the wait for later copies as
// it was, and the partition begins no new copy for Retry/4. Copies begun
// together that time out together double the wait once, not once each.
func TestCopyFailedLiftsFence(t *testing.T) {
	m, now, copies := copyScene(16*time.Second, 4)
	retry := int64(m.cfg.Retry)
	cp := copies(now)
	if len(cp) != 4 {
		t.Fatalf("%d copies begun, want one per partition (4)", len(cp))
	}
	// All four time out together: the wait doubles once.
	now += retry
	copies(now)
	if got := int64(m.CopyWait()); got != 2*retry {
		t.Fatalf("copy wait %v after four copies timed out together, want %v (doubled once)", time.Duration(got), time.Duration(2*retry))
	}
	cp = copies(now + 1)
	now++
	if len(cp) != 4 {
		t.Fatalf("%d copies begun again, want 4", len(cp))
	}
	// b refuses the first: its fence lifts at once, the wait stays.
	if acts := m.CopyFailed(cp[0].P, "b", cp[0].Epoch, cp[0].Seq+1, now); acts != nil || m.parts[cp[0].P].fence != fenceCopy {
		t.Fatal("a failure of another copy (wrong seq) lifted the fence")
	}
	m.CopyFailed(cp[0].P, "b", cp[0].Epoch, cp[0].Seq, now)
	if m.parts[cp[0].P].fence != fenceNone {
		t.Fatal("a refused copy still fences its partition")
	}
	if got := int64(m.CopyWait()); got != 2*retry {
		t.Fatalf("copy wait %v after a refusal, want %v (unchanged)", time.Duration(got), time.Duration(2*retry))
	}
	if c := copies(now + retry/4 - 1); len(c) != 0 {
		t.Fatalf("a copy begun again %v after a refusal: %+v; want none before Retry/4", time.Duration(retry/4-1), c)
	}
	if c := copies(now + retry/4); len(c) != 1 || c[0].P != cp[0].P {
		t.Fatalf("copies begun Retry/4 after the refusal: %+v; want partition %d's again", c, cp[0].P)
	}
}

// join applies Join and a first Extend for each id, at now.
func join(t *testing.T, m *Machine, now int64, ids ...string) {
	t.Helper()
	for _, id := range ids {
		m.Apply(Command{Kind: Join, Member: id}, now)
		rec := m.Table().Members[id]
		m.Apply(Command{Kind: Extend, Member: id, Epoch: rec.Epoch, Seq: 1}, now)
	}
}

// grant applies a Grant of p to id.
func grant(t *testing.T, m *Machine, p int, id string, now int64) {
	t.Helper()
	e, _ := m.Table().Live(id)
	if m.Apply(Command{Kind: Grant, P: p, Epoch: m.Table().Parts[p].Epoch, To: id, ToEpoch: e}, now); !m.Table().Holds(id, p) {
		t.Fatalf("grant of p%d to %s refused: %+v", p, id, m.Table().Parts[p])
	}
}

// TestOwesWhatMayStillArrive: a member that installed a copy is owed the
// partition until the copy's epoch passes (the holder's SetBackup could
// still name it backup, and a failure of the holder then hand it the
// partition), and a vacancy kept for its state is owed to it. A member
// leaving gracefully waits for both: before, it ended its liveness while
// a late SetBackup and a takeover made it holder, and the partition
// restarted empty.
func TestOwesWhatMayStillArrive(t *testing.T) {
	m := New(Config{ID: "b", Liveness: 2 * time.Second}, 2)
	join(t, m, 1, "a", "b", "c")
	grant(t, m, 0, "a", 1)
	grant(t, m, 1, "b", 1)
	if c, l := m.Owes(0); c || l {
		t.Fatalf("before any copy: Owes(0) = %v, %v", c, l)
	}
	e := m.Table().Parts[0].Epoch
	if !m.OfferCopy(0, "a", e, 7) {
		t.Fatal("copy refused")
	}
	if c, _ := m.Owes(0); !c {
		t.Fatal("a copy installed at the current epoch is not owed")
	}
	// The SetBackup commits: b is the backup (counted as such, not owed).
	m.Apply(Command{Kind: SetBackup, Member: "a", P: 0, Epoch: e, To: "b", Seq: 7}, 2)
	if pt := m.Table().Parts[0]; pt.Backup != "b" {
		t.Fatalf("SetBackup refused: %+v", pt)
	}
	if c, _ := m.Owes(0); c {
		t.Fatal("owed as well as named backup")
	}
	// The holder moves its backup to c: nothing can name b any more.
	m.Apply(Command{Kind: SetBackup, Member: "a", P: 0, Epoch: e + 1, To: "c", Seq: 8}, 3)
	if c, l := m.Owes(0); c || l {
		t.Fatalf("after the backup moved on: Owes(0) = %v, %v", c, l)
	}
	// A copy whose epoch passed without a command is owed no more either.
	e = m.Table().Parts[0].Epoch
	m.OfferCopy(0, "a", e, 9)
	m.Apply(Command{Kind: Keep, Member: "a", P: 0, Epoch: e}, 4)
	if c, _ := m.Owes(0); c {
		t.Fatal("a copy of a passed epoch is owed")
	}
	// b's liveness ends (not for good) while it holds p1 without a
	// backup: p1 is vacant, kept for b.
	rec := m.Table().Members["b"]
	m.Apply(Command{Kind: End, Member: "b", Epoch: rec.Epoch, Version: rec.Version}, 5)
	if _, l := m.Owes(1); !l {
		t.Fatalf("a vacancy kept for b's state is not owed: %+v", m.Table().Parts[1])
	}
}

// TestLeaverIsNoBackupOrGrantee: a member gossip no longer lists (it is
// leaving) is not picked as a backup even where the view's second choice
// still names it, nor granted a vacant partition while a listed member is
// fresh.
func TestLeaverIsNoBackupOrGrantee(t *testing.T) {
	m := New(Config{ID: "a", Liveness: 2 * time.Second}, 1)
	m.SetLeader(true, 0)
	join(t, m, 1, "a", "b", "c")
	grant(t, m, 0, "a", 1)
	m.Apply(Command{Kind: Extend, Member: "a", Epoch: m.Table().Members["a"].Epoch, Seq: 2}, 1)
	m.SetView(View{Target: []string{"a"}, Second: []string{"b"}, Members: []string{"a", "c"}})
	m.liveUntil = int64(time.Hour) // a's own lease: not under test
	var to []string
	for _, act := range m.Tick(2) {
		if act.Kind == SendCopy {
			to = append(to, act.To)
		}
	}
	if len(to) != 1 || to[0] != "c" {
		t.Fatalf("backup copies to %v, want [c] (b is leaving)", to)
	}

	l := New(Config{ID: "x", Liveness: 2 * time.Second}, 1)
	l.SetLeader(true, 0)
	join(t, l, 1, "b", "c", "x")
	// The ring's target is gone; b comes first in ID order but is leaving.
	l.SetView(View{Target: []string{"gone"}, Members: []string{"c", "x"}})
	var granted []string
	for _, act := range l.Tick(2) {
		if act.Kind == Propose && act.Cmd.Kind == Grant {
			granted = append(granted, act.Cmd.To)
		}
	}
	if len(granted) != 1 || granted[0] != "c" {
		t.Fatalf("vacant partition granted to %v, want [c] (b is leaving)", granted)
	}
}

// copyScene makes member a (liveness 2 s) the holder of parts partitions,
// each targeting a, with b joined as the only possible backup. copies
// returns the copies a's tick at at begins, applying its proposals (b
// extends too, so it stays fresh).
func copyScene(maxCopyWait time.Duration, parts int) (m *Machine, now int64, copies func(at int64) []Action) {
	m = New(Config{ID: "a", Liveness: 2 * time.Second, MaxCopyWait: maxCopyWait}, parts)
	m.SetLeader(true, 0)
	targets := make([]string, parts)
	for i := range targets {
		targets[i] = "a"
	}
	m.SetView(View{Target: targets, Members: []string{"a", "b"}})
	now = 1
	for range 3 { // join, extend, grant
		step(m, m.Tick(now), now)
		now++
	}
	copies = func(at int64) []Action {
		step(m, []Action{{Kind: Propose, Cmd: Command{Kind: Extend, Member: "b", Epoch: 1, Seq: uint64(at)}}}, at)
		var out []Action
		for _, a := range step(m, m.Tick(at), at) {
			if a.Kind == SendCopy {
				out = append(out, a)
			}
		}
		return out
	}
	step(m, m.Apply(Command{Kind: Join, Member: "b"}, now), now)
	return m, now, copies
}

// TestLeaverStopsExtending: once a member asks to leave it proposes no
// more extensions, so the End it proposes, a compare-and-set on its
// record's version, is not refused by its own extension committed
// first; asked again, it proposes an End at the current version, which
// applies. Before, every tick kept extending, and on a loaded log each
// End could lose to the extension before it.
func TestLeaverStopsExtending(t *testing.T) {
	const d = int64(2 * time.Second)
	m := New(Config{ID: "a", Liveness: time.Duration(d), ExtendEvery: time.Duration(d / 3)}, 1)
	m.SetView(View{Target: []string{"a"}, Second: []string{""}, Members: []string{"a"}})
	join(t, m, 0, "a")
	now := int64(10)
	step(m, m.Tick(now), now) // an extension, applied
	end, ok := m.Leave()
	if !ok {
		t.Fatal("Leave refused for a live member")
	}
	// An extension proposed before the Leave commits first: the End at
	// the old version is refused.
	rec := m.Table().Members["a"]
	m.Apply(Command{Kind: Extend, Member: "a", Epoch: rec.Epoch, Seq: 99}, now+1)
	m.Apply(end, now+2)
	if m.Table().Members["a"].Ended {
		t.Fatal("an End at a version an extension moved on was applied")
	}
	for at := now + d/3; at < now+3*d; at += d / 6 {
		for _, a := range m.Tick(at) {
			if a.Kind == Propose && a.Cmd.Kind == Extend {
				t.Fatalf("at %d a member that asked to leave proposed %v", at, a.Cmd)
			}
		}
	}
	end, ok = m.Leave()
	if !ok {
		t.Fatal("second Leave refused")
	}
	m.Apply(end, now+3*d)
	if !m.Table().Members["a"].Ended {
		t.Fatal("the End at the current version did not apply")
	}
}
