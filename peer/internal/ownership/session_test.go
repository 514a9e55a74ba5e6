package ownership

import (
	"errors"
	"testing"
	"time"
)

// sessionScene is a leader "a" and an active member "b" that holds
// nothing: b's record at epoch 1, activated by one Extend.
func sessionScene(t *testing.T) (m *Machine, now int64) {
	t.Helper()
	m = New(Config{ID: "a", Liveness: 2 * time.Second}, 1)
	m.SetLeader(true, 0)
	m.SetView(View{Target: []string{"a"}, Members: []string{"a", "b"}})
	for _, c := range []Command{{Kind: Join, Member: "b"}, {Kind: Extend, Member: "b", Epoch: 1, Seq: 1}} {
		if err := m.table.Apply(c); err != nil {
			t.Fatal(err)
		}
		m.noteRecord(c.Member, 1)
	}
	return m, 1
}

// TestKeepAliveGrants: the leader grants an active member at its epoch,
// counting its whole Liveness from the request's arrival (here, the grant); a request at another epoch,
// or from a member never activated, is refused; and the member counts 9/10
// of Liveness from its send, not from the answer.
func TestKeepAliveGrants(t *testing.T) {
	m, now := sessionScene(t)
	const live = int64(2 * time.Second)
	at := now + live/2
	if a := m.KeepAlive(KeepAliveRequest{Member: "b", Epoch: 1, Seq: 2}, at, at); !a.Granted {
		t.Fatal("active b refused")
	}
	if m.expired("b", at+live-1) || !m.expired("b", at+live) {
		t.Fatal("the leader does not count a whole Liveness from its grant")
	}
	for _, r := range []KeepAliveRequest{{Member: "b", Epoch: 2}, {Member: "c", Epoch: 1}} {
		if m.KeepAlive(r, at, at).Granted {
			t.Fatalf("granted %+v", r)
		}
	}
	// The member's side.
	b := New(Config{ID: "b", Liveness: 2 * time.Second}, 1)
	_ = b.table.Apply(Command{Kind: Join, Member: "b"})
	_ = b.table.Apply(Command{Kind: Extend, Member: "b", Epoch: 1})
	var req KeepAliveRequest
	for _, a := range b.Tick(100) {
		if a.Kind == KeepAlive {
			req = a.KeepAlive
		}
	}
	if req.Member != "b" {
		t.Fatal("an active member sent no keep-alive")
	}
	b.KeptAlive(KeepAliveAnswer{Member: "b", Epoch: 1, Seq: req.Seq, Granted: true}, 100+live/2)
	if want := 100 + live/10*9; b.LiveUntil() != want {
		t.Fatalf("lease until %d, want %d: 9/10 of Liveness from the send", b.LiveUntil(), want)
	}
	b.KeptAlive(KeepAliveAnswer{Member: "b", Epoch: 1, Seq: req.Seq + 5, Granted: true}, 100+live)
	if want := 100 + live/10*9; b.LiveUntil() != want {
		t.Fatalf("an answer to a request never sent moved the lease to %d", b.LiveUntil())
	}
}

// TestNoKeepAliveWhileEnding: once the leader has proposed a member's End
// it grants that record no keep-alive until the End is applied or refused
// (the record moved on): a grant between the proposal and its commit
// would let the member decide after the End handed its partitions on.
// With MutKeepAliveWhileEnding it grants (the mutation is beyond the
// simulator's reach: the window is one round trip).
func TestNoKeepAliveWhileEnding(t *testing.T) {
	for _, mut := range []Mutation{MutNone, MutKeepAliveWhileEnding} {
		m, now := sessionScene(t)
		m.cfg.Mutation = mut
		m.table.Parts[0] = Partition{Holder: "b", HolderEpoch: 1, Epoch: 1}
		now += int64(3 * time.Second) // b's session lapsed
		var end Command
		for _, a := range m.Tick(now) {
			if a.Kind == Propose && a.Cmd.Kind == End && a.Cmd.Member == "b" {
				end = a.Cmd
			}
		}
		if end.Kind != End {
			t.Fatal("the leader did not end b")
		}
		granted := m.KeepAlive(KeepAliveRequest{Member: "b", Epoch: 1, Seq: 9}, now+1, now+1).Granted
		if granted != (mut == MutKeepAliveWhileEnding) {
			t.Fatalf("%v: keep-alive granted %v while b's End is pending", mut, granted)
		}
		if mut != MutNone {
			continue
		}
		// A refused End (an Extend applied first) releases the record.
		if err := m.table.Apply(Command{Kind: Extend, Member: "b", Epoch: 1}); err != nil {
			t.Fatal(err)
		}
		if err := m.table.Apply(end); !errors.Is(err, ErrRefused) {
			t.Fatalf("End after an Extend: %v", err)
		}
		if !m.KeepAlive(KeepAliveRequest{Member: "b", Epoch: 1, Seq: 10}, now+2, now+2).Granted {
			t.Fatal("b refused after its pending End lost to an Extend")
		}
	}
}

// TestNewLeaderWaits: a member that becomes leader ends nobody until a
// whole Liveness after its election, whatever it saw before: an earlier
// leader's grant may have come just before it.
func TestNewLeaderWaits(t *testing.T) {
	for _, mut := range []Mutation{MutNone, MutLeaderNoWait} {
		m, now := sessionScene(t)
		m.cfg.Mutation = mut
		m.SetLeader(false, now)
		m.table.Parts[0] = Partition{Holder: "b", HolderEpoch: 1, Epoch: 1}
		now += int64(5 * time.Second)
		m.SetLeader(true, now)
		ends := 0
		for _, a := range m.Tick(now + int64(time.Second)) {
			if a.Kind == Propose && a.Cmd.Kind == End {
				ends++
			}
		}
		if (ends > 0) != (mut == MutLeaderNoWait) {
			t.Fatalf("%v: %d Ends a second after the election", mut, ends)
		}
	}
}

// TestKeepAliveCodec: requests and answers survive their wire form;
// malformed ones are refused.
func TestKeepAliveCodec(t *testing.T) {
	r := KeepAliveRequest{Member: "m1", Epoch: 3, Seq: 77, Watch: []string{"m2", "m3"}}
	got, err := DecodeKeepAliveRequest(r.Encode(nil))
	if err != nil || got.Member != r.Member || got.Epoch != 3 || got.Seq != 77 || len(got.Watch) != 2 || got.Watch[1] != "m3" {
		t.Fatalf("request round trip: %+v %v", got, err)
	}
	a := KeepAliveAnswer{Member: "m1", Epoch: 3, Seq: 77, Granted: true, Ages: []WatchAge{{ID: "m2", Age: 12345}}}
	ga, err := DecodeKeepAliveAnswer(a.Encode(nil))
	if err != nil || !ga.Granted || ga.Seq != 77 || len(ga.Ages) != 1 || ga.Ages[0] != a.Ages[0] {
		t.Fatalf("answer round trip: %+v %v", ga, err)
	}
	for _, b := range [][]byte{nil, {9}, r.Encode(nil)[:4], append(r.Encode(nil), 0)} {
		if _, err := DecodeKeepAliveRequest(b); !errors.Is(err, ErrBadCommand) {
			t.Errorf("request %x: %v", b, err)
		}
	}
	if _, err := DecodeKeepAliveAnswer(append(a.Encode(nil), 1)); !errors.Is(err, ErrBadCommand) {
		t.Errorf("answer with a trailing byte: %v", err)
	}
}

// TestStalledLeaderWaits: a leader that ran nothing for a while ends
// nobody for a lapse before its grace has passed (keep-alives may be
// waiting unread in its inbox), then does; and keeps the Ends it had
// proposed pending.
func TestStalledLeaderWaits(t *testing.T) {
	m, now := sessionScene(t)
	m.table.Parts[0] = Partition{Holder: "b", HolderEpoch: 1, Epoch: 1}
	now += int64(3 * time.Second) // b's last grant long ago
	grace := int64(250 * time.Millisecond)
	m.Stalled(now, grace)
	for _, a := range m.Tick(now + grace - 1) {
		if a.Kind == Propose && a.Cmd.Kind == End {
			t.Fatalf("a stalled leader ended %s within its grace", a.Cmd.Member)
		}
	}
	ended := false
	for _, a := range m.Tick(now + grace) {
		ended = ended || a.Kind == Propose && a.Cmd.Kind == End && a.Cmd.Member == "b"
	}
	if !ended {
		t.Fatal("b not ended once the grace had passed")
	}
	m.Stalled(now+grace+1, grace)
	if m.KeepAlive(KeepAliveRequest{Member: "b", Epoch: 1, Seq: 3}, now+grace+2, now+grace+2).Granted {
		t.Fatal("a stall forgot the End pending for b: its keep-alive was granted")
	}
}

// TestKeepAliveCountsFromArrival: the leader counts a granted keep-alive's
// Liveness from when the request arrived, not from the grant a read later
// (a crashed holder's End is not put off by the read), and never from
// before it arrived: from an earlier keep-alive's arrival
// (MutLeaderFromEarlier) it would end the member while its lease, counted
// from a later send, still runs.
func TestKeepAliveCountsFromArrival(t *testing.T) {
	const live = int64(2 * time.Second)
	for _, mut := range []Mutation{MutNone, MutLeaderFromEarlier} {
		m, now := sessionScene(t)
		m.cfg.Mutation = mut
		first := now + live/2
		m.KeepAlive(KeepAliveRequest{Member: "b", Epoch: 1, Seq: 2}, first, first+live/10)
		arrived := first + live/2
		if a := m.KeepAlive(KeepAliveRequest{Member: "b", Epoch: 1, Seq: 3}, arrived, arrived+live/10); !a.Granted {
			t.Fatal("active b refused")
		}
		early := m.expired("b", arrived+live-1)
		if mut == MutNone && (early || !m.expired("b", arrived+live)) {
			t.Fatal("the leader does not count a whole Liveness from the granted request's arrival")
		}
		if mut == MutLeaderFromEarlier && !early {
			t.Fatal("the mutation changed nothing")
		}
	}
}

// TestHeardKeepAliveNotEnded: a leader holding a member's keep-alive that
// no read has confirmed yet ends it for no lapse (the member is alive;
// under a starved run the read took seconds and live holders were taken
// over), until a whole Liveness after it heard it; a keep-alive at an
// older epoch, or heard by a member that does not lead, postpones nothing.
func TestHeardKeepAliveNotEnded(t *testing.T) {
	const live = int64(2 * time.Second)
	ends := func(m *Machine, at int64) bool {
		for _, a := range m.Tick(at) {
			if a.Kind == Propose && a.Cmd.Kind == End && a.Cmd.Member == "b" {
				return true
			}
		}
		return false
	}
	for _, tc := range []struct {
		name     string
		epoch    uint64
		leader   bool
		heardAt  int64 // after b's Extend applied at 1
		tickAt   int64
		wantEnds bool
	}{
		{"nothing heard: lapsed", 0, true, 0, live + 1, true},
		{"heard, read unconfirmed: alive", 1, true, live - 1, live + 1, false},
		{"heard, a Liveness ago: lapsed", 1, true, live - 1, 2*live - 1, true},
		{"heard just before the tick", 1, true, live, live + 1, false},
		{"heard at an older epoch", 7, true, live - 1, live + 1, true},
		{"heard while not leading", 1, false, live - 1, live + 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := sessionScene(t)
			m.table.Parts[0] = Partition{Holder: "b", HolderEpoch: 1, Epoch: 1}
			if tc.epoch != 0 {
				if !tc.leader {
					m.SetLeader(false, 0)
				}
				m.Heard(KeepAliveRequest{Member: "b", Epoch: tc.epoch, Seq: 2}, tc.heardAt)
				m.SetLeader(true, 0)
			}
			if got := ends(m, tc.tickAt); got != tc.wantEnds {
				t.Fatalf("End of b at %v (heard at %v, epoch %d): %v, want %v", time.Duration(tc.tickAt), time.Duration(tc.heardAt), tc.epoch, got, tc.wantEnds)
			}
		})
	}
	// Once the read confirms it, the grant counts as before: b is fresh
	// for a whole Liveness from the request's arrival (rule 2), not from
	// the grant a read later.
	m, _ := sessionScene(t)
	m.Heard(KeepAliveRequest{Member: "b", Epoch: 1, Seq: 2}, live-1)
	if !m.KeepAlive(KeepAliveRequest{Member: "b", Epoch: 1, Seq: 2}, live-1, live+10).Granted {
		t.Fatal("the heard keep-alive was refused when its read was confirmed")
	}
	if ends(m, 2*live-2) {
		t.Fatal("b ended within a Liveness of its keep-alive's arrival")
	}
	if !ends(m, 2*live-1) {
		t.Fatal("b not ended a Liveness after its keep-alive's arrival")
	}
	// The grant ends what Heard held: a leader counting from an earlier
	// keep-alive (MutLeaderFromEarlier) is not put right by the one it
	// heard and granted since (else the simulator could not see it).
	m, _ = sessionScene(t)
	m.cfg.Mutation = MutLeaderFromEarlier
	m.KeepAlive(KeepAliveRequest{Member: "b", Epoch: 1, Seq: 2}, live/2, live/2)
	m.Heard(KeepAliveRequest{Member: "b", Epoch: 1, Seq: 3}, live)
	m.KeepAlive(KeepAliveRequest{Member: "b", Epoch: 1, Seq: 3}, live, live+10)
	if !ends(m, live/2+live) {
		t.Fatal("a Heard keep-alive outlived its grant")
	}
}
