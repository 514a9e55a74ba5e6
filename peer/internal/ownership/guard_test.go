package ownership

import (
	"testing"
	"time"
)

// The guards below are rules the simulator's schedules do not reach (its
// mutation catalogue says why for each): a narrow race, or a second
// guard behind another rule. Each is pinned here the way the simulator
// pins the others: the check must hold with the rule in place and fail
// with it broken, so that these tests cannot pass by accident.

// twoMembers is a table where a holds partition 0 at epoch 2 with b as
// its backup, both extended once, and a's record at version v.
func twoMembers(mut Mutation) *Table {
	t := NewTable(1)
	t.mut = mut
	for _, c := range []Command{
		{Kind: Join, Member: "a"}, {Kind: Join, Member: "b"},
		{Kind: Extend, Member: "a", Epoch: 1, Seq: 1}, {Kind: Extend, Member: "b", Epoch: 1, Seq: 1},
		{Kind: Grant, P: 0, Epoch: 0, To: "a", ToEpoch: 1},
		{Kind: SetBackup, Member: "a", P: 0, Epoch: 1, To: "b", Seq: 1},
	} {
		if err := t.Apply(c); err != nil {
			panic(err)
		}
	}
	return t
}

// bites runs guard with the rule in place and broken, and fails t unless
// it holds in place and fails broken.
func bites(t *testing.T, mut Mutation, guard func(Mutation) bool) {
	t.Helper()
	if !guard(MutNone) {
		t.Errorf("the guard against %q does not hold", mut)
	}
	if guard(mut) {
		t.Errorf("the check passes with %q broken: it cannot fail", mut)
	}
}

// TestEndNamesTheVersionSeen: an End proposed when a's record was seen
// expiring at version v is refused once an extension of a applied in
// between (a counts a fresh lease from it).
func TestEndNamesTheVersionSeen(t *testing.T) {
	bites(t, MutEndIgnoresVersion, func(mut Mutation) bool {
		tb := twoMembers(mut)
		seen := tb.Members["a"].Version
		if err := tb.Apply(Command{Kind: Extend, Member: "a", Epoch: 1, Seq: 2}); err != nil {
			t.Fatal(err)
		}
		err := tb.Apply(Command{Kind: End, Member: "a", Epoch: 1, Version: seen})
		return err != nil && tb.Holds("a", 0)
	})
}

// vacant is twoMembers after both ended: partition 0 vacant with b as
// its Last (a's End handed it to b, b's End left it vacant), and c live.
func vacant(mut Mutation) *Table {
	tb := twoMembers(mut)
	for _, c := range []Command{
		{Kind: End, Member: "a", Epoch: 1, Version: tb.Members["a"].Version},
		{Kind: End, Member: "b", Epoch: 1, Version: tb.Members["b"].Version},
		{Kind: Join, Member: "c"}, {Kind: Extend, Member: "c", Epoch: 1, Seq: 1},
	} {
		if err := tb.Apply(c); err != nil {
			panic(err)
		}
	}
	if pt := tb.Parts[0]; pt.Holder != "" || pt.Last != "b" {
		panic("not vacant with b as its last")
	}
	return tb
}

// TestGrantWaitsForLast: a vacancy whose Last is live (only out of
// reach) is not granted empty to another member by a plain grant.
func TestGrantWaitsForLast(t *testing.T) {
	bites(t, MutGrantIgnoresLast, func(mut Mutation) bool {
		tb := vacant(mut)
		err := tb.Apply(Command{Kind: Grant, P: 0, Epoch: tb.Parts[0].Epoch, To: "c", ToEpoch: 1})
		return err != nil && tb.Parts[0].Holder == ""
	})
}

// TestAgedGrant: an aged grant restarts a vacancy empty while its Last
// is only out of reach, counted apart from restarts; it names Last's
// record version, and an extension of Last applied in between (Last
// came back with the state) refuses it.
func TestAgedGrant(t *testing.T) {
	tb := vacant(MutNone)
	pt := tb.Parts[0]
	if err := tb.Apply(Command{Kind: Grant, P: 0, Epoch: pt.Epoch, To: "c", ToEpoch: 1, Ended: true, Version: tb.Members["b"].Version}); err != nil {
		t.Fatalf("aged grant refused: %v", err)
	}
	if pt := tb.Parts[0]; pt.Holder != "c" || pt.Aged != 1 || pt.Restarts != 0 || !pt.Fresh {
		t.Fatalf("after the aged grant: %+v, want c holding, aged 1, restarts 0, fresh", pt)
	}
	bites(t, MutAgedGrantIgnoresVersion, func(mut Mutation) bool {
		tb := vacant(mut)
		seen := tb.Members["b"].Version
		if err := tb.Apply(Command{Kind: Extend, Member: "b", Epoch: 2, Seq: 9}); err != nil {
			t.Fatal(err)
		}
		err := tb.Apply(Command{Kind: Grant, P: 0, Epoch: tb.Parts[0].Epoch, To: "c", ToEpoch: 1, Ended: true, Version: seen})
		return err != nil && tb.Parts[0].Holder == ""
	})
}

// TestReplicaOfItsEpoch: a backup applies a replica only at the epoch it
// backs (a replica of an older holding, delayed, may remove or undo what
// the newer one did: a refund replayed after the units were taken again).
func TestReplicaOfItsEpoch(t *testing.T) {
	bites(t, MutReplicaAnyEpoch, func(mut Mutation) bool {
		m := New(Config{ID: "b", Mutation: mut}, 1)
		tb := twoMembers(MutNone)
		m.Restored(tb, 0)
		m.parts[0].have = true
		e := tb.Parts[0].Epoch
		return m.AcceptReplica(0, "a", e) && !m.AcceptReplica(0, "a", e-1)
	})
}

// TestRestoredCountsAWholeLiveness: a member that replaced its table
// wholesale (a snapshot) and leads ends nobody until a whole Liveness
// has passed since, on its own clock: it cannot tell when the records'
// extensions were applied.
func TestRestoredCountsAWholeLiveness(t *testing.T) {
	const live = int64(2 * time.Second)
	bites(t, MutRestoredNoWait, func(mut Mutation) bool {
		m := New(Config{ID: "c", Liveness: time.Duration(live), Mutation: mut}, 1)
		tb := twoMembers(MutNone)
		tb.Members["c"] = &Liveness{Epoch: 1, Version: 1}
		now := int64(100 * time.Second)
		m.Restored(tb, now)
		m.SetLeader(true, now)
		for at := now; at < now+live; at += live / 10 {
			for _, a := range m.Tick(at) {
				if a.Kind == Propose && a.Cmd.Kind == End {
					return false
				}
			}
		}
		return true
	})
}

// TestAgedGrantWaits: the leader grants a vacancy empty while its Last is
// only out of reach once the vacancy has lasted EmptyAfter on its clock,
// never before, and as an aged grant naming Last's version.
func TestAgedGrantWaits(t *testing.T) {
	const live = int64(2 * time.Second)
	empty := 10 * time.Second
	m := New(Config{ID: "c", Liveness: time.Duration(live), EmptyAfter: empty}, 1)
	tb := twoMembers(MutNone)
	tb.Members["c"] = &Liveness{Epoch: 1, Version: 1}
	m.Restored(tb, 0)
	m.SetLeader(true, 0)
	m.SetView(View{Target: []string{"c"}, Second: []string{""}, Members: []string{"c"}, Failed: []string{"a", "b"}})
	var vacatedAt int64
	grant := func(at int64) *Command {
		// c keeps extending; a and b do not.
		step(m, []Action{{Kind: Propose, Cmd: Command{Kind: Extend, Member: "c", Epoch: 1, Seq: uint64(at)}}}, at)
		for _, a := range m.Tick(at) {
			if a.Kind != Propose {
				continue
			}
			switch a.Cmd.Kind {
			case End:
				m.Apply(a.Cmd, at)
				if m.Table().Parts[0].Holder == "" && vacatedAt == 0 {
					vacatedAt = at
				}
			case Grant:
				c := a.Cmd
				return &c
			}
		}
		return nil
	}
	var got *Command
	var at int64
	for at = 0; at < int64(30*time.Second) && got == nil; at += int64(100 * time.Millisecond) {
		got = grant(at)
	}
	if got == nil {
		t.Fatal("no grant in 30 s")
	}
	if vacatedAt == 0 || at-int64(100*time.Millisecond) < vacatedAt+int64(empty) {
		t.Fatalf("granted at %v, vacant since %v: want EmptyAfter %v first", time.Duration(at), time.Duration(vacatedAt), empty)
	}
	if !got.Ended || got.To != "c" || got.Version != m.Table().Members["b"].Version {
		t.Fatalf("grant %v: want an aged grant to c naming b's version %d", got, m.Table().Members["b"].Version)
	}
	if err := m.table.Apply(*got); err != nil {
		t.Fatalf("the aged grant was refused: %v", err)
	}
	// Failed is never gone for good: b may come back (a long split).
	for _, a := range m.Tick(at + int64(time.Second)) {
		if a.Kind == Propose && a.Cmd.Kind == End && a.Cmd.Ended {
			t.Errorf("%s, only failed, was ended for good", a.Cmd.Member)
		}
	}
}

// TestSetBackupOfItsEpoch: a SetBackup proposed at epoch e (naming a copy
// made then) is refused once a Keep moved the partition on: the holder
// decided again after the Keep, and the copy lacks what it decided.
func TestSetBackupOfItsEpoch(t *testing.T) {
	bites(t, MutSetBackupIgnoresEpoch, func(mut Mutation) bool {
		tb := twoMembers(mut)
		_ = tb.Apply(Command{Kind: Join, Member: "c"})
		_ = tb.Apply(Command{Kind: Extend, Member: "c", Epoch: 1, Seq: 1})
		e := tb.Parts[0].Epoch
		late := Command{Kind: SetBackup, Member: "a", P: 0, Epoch: e, To: "c", Seq: 7}
		if err := tb.Apply(Command{Kind: Keep, Member: "a", P: 0, Epoch: e}); err != nil {
			panic(err)
		}
		return tb.Apply(late) != nil && tb.Parts[0].Backup == "b"
	})
}

// TestLeaderCountsFromItsVoters: a member that becomes leader ends a
// silent member a whole Liveness after the instant its driver names
// (when its voters last heard a leader: SetLeaderFrom), but never within
// ExtendEvery of its election.
func TestLeaderCountsFromItsVoters(t *testing.T) {
	const live, tick = 2 * time.Second, 100 * time.Millisecond
	for _, c := range []struct{ from, want time.Duration }{
		{from: 500 * time.Millisecond, want: 1500 * time.Millisecond}, // a Liveness after from
		{from: 1500 * time.Millisecond, want: time.Second},            // ExtendEvery after the election
		{from: -time.Second, want: live},                              // never later than from the election
	} {
		m := New(Config{ID: "c", Liveness: live}, 1)
		tb := twoMembers(MutNone)
		tb.Members["c"] = &Liveness{Epoch: 1, Version: 1}
		m.Restored(tb, 0)
		now := int64(100 * time.Second)
		m.SetLeaderFrom(true, now, now-int64(c.from))
		var ended time.Duration
		for at := now; at < now+int64(3*live) && ended == 0; at += int64(tick) {
			for _, a := range m.Tick(at) {
				if a.Kind == Propose && a.Cmd.Kind == End && a.Cmd.Member != "c" {
					ended = time.Duration(at - now)
				}
			}
		}
		if ended < c.want || ended > c.want+tick {
			t.Errorf("voters last heard a leader %v before the election: a silent member ended %v after it, want %v", c.from, ended, c.want)
		}
	}
}
