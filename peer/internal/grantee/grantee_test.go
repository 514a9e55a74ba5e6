package grantee

import (
	"testing"
	"time"
)

// The grantee's rules, driven with time passed in: no node, no network.

const gms = int64(time.Millisecond)

// TestSpend walks one key through its life: below the threshold
// it forwards and asks for nothing; at the threshold it asks once (never
// twice while a request is in flight); with a grant it spends it until
// its rights are spent, closing it, and asks again at half; a grant past
// its deadline is closed with its rights unused and the request
// forwarded.
func TestSpend(t *testing.T) {
	now := int64(time.Hour)
	k := New(now)
	const threshold = 3
	for i := range 2 {
		if s := k.Spend(now+int64(i)*gms, 1, threshold); s.Grant != nil || s.Refill {
			t.Fatalf("decision %d below the threshold: %+v; want forwarded, nothing asked", i+1, s)
		}
	}
	if s := k.Spend(now+2*gms, 1, threshold); s.Grant != nil || !s.Refill {
		t.Fatalf("decision at the threshold: %+v; want forwarded and rights asked for", s)
	}
	if s := k.Spend(now+3*gms, 1, threshold); s.Refill {
		t.Fatalf("a second request while one is in flight: %+v", s)
	}
	want, closed := k.Ask(now+3*gms, time.Second, 1000)
	// 4 decisions in 3 ms, measured over at least 10 ms: 400/s; 1.5 ×
	// that × a lease of 1 s.
	if want != 600 || len(closed) != 0 {
		t.Fatalf("ask = %d, %d closed; want 600 (1.5 × rate × lease), none closed", want, len(closed))
	}
	sent := now + 4*gms
	if unused := k.Install(sent, 7, 4, time.Second); unused != 0 {
		t.Fatalf("the first grant replaced one with %d rights", unused)
	}
	deadline := sent + int64(useFraction*float64(time.Second))
	for i := range 2 {
		s := k.Spend(sent+int64(i+1)*gms, 1, threshold)
		if s.Grant == nil || s.Grant.ID != 7 || s.Left != int64(3-i) || s.Refill != (i == 1) {
			t.Fatalf("spend %d from a grant of 4: %+v; want from grant 7, %d left, asking again at half", i+1, s, 3-i)
		}
	}
	if s := k.Spend(sent+3*gms, 2, threshold); s.Grant == nil || s.Left != 0 {
		t.Fatalf("spending the last 2 rights: %+v", s)
	}
	if len(k.live) != 0 || len(k.closed) != 1 {
		t.Fatalf("after its rights were spent: %d live, %d closed; want the grant closed", len(k.live), len(k.closed))
	}
	// The in-flight request fails: its closed grants wait for the next.
	_, closed = k.Ask(sent+3*gms, time.Second, 1000)
	k.Requeue(closed)
	if len(k.closed) != 1 || k.refilling {
		t.Fatalf("requeue: %d closed, refilling %v; want the report kept and no request in flight", len(k.closed), k.refilling)
	}
	// A grant whose deadline passes unspent is closed with its rights
	// unused, and the request forwarded.
	k.refilling = true
	k.Install(sent+4*gms, 8, 10, time.Second)
	late := sent + 4*gms + int64(useFraction*float64(time.Second)) + 1
	if s := k.Spend(late, 1, threshold); s.Grant != nil || s.Unused != 10 {
		t.Fatalf("spend past the deadline: %+v; want forwarded, 10 rights unused", s)
	}
	if deadline >= late {
		t.Fatal("the test's clock did not pass the first deadline")
	}
}

// TestRefused: a holder that grants nothing makes the key refused
// locally until sent+retry, with no request for rights before then; at
// that instant it is no longer refused and asks again.
func TestRefused(t *testing.T) {
	k := &State{active: true, refilling: true}
	const sent = int64(time.Second)
	k.Refuse(sent, 100*time.Millisecond)
	for _, at := range []int64{sent, sent + 99*gms} {
		if s := k.Spend(at, 1, 1); s.Grant != nil || s.RefusedUntil != sent+100*gms || s.Refill {
			t.Fatalf("spend at +%v: %+v; want refused until +100ms, nothing asked", time.Duration(at-sent), s)
		}
	}
	if s := k.Spend(sent+100*gms, 1, 1); s.RefusedUntil > sent+100*gms || !s.Refill {
		t.Fatalf("spend at +100ms: %+v; want no longer refused and rights asked for", s)
	}
}

// TestInstallReplacesOldest: a node uses at most maxLive
// grants; a third replaces the oldest, whose rights left are unused and
// whose uses are reported with the next request, at ages no younger than
// they happened (shrunk only by the clock-rate bound).
func TestInstallReplacesOldest(t *testing.T) {
	k := &State{}
	k.Install(0, 1, 10, time.Second)
	k.Spend(5*gms, 3, 1)
	k.Install(10*gms, 2, 10, time.Second)
	if unused := k.Install(20*gms, 3, 10, time.Second); unused != 7 {
		t.Fatalf("the third grant replaced one with %d rights left; want 7", unused)
	}
	if len(k.live) != maxLive || k.live[0].ID != 2 || k.live[1].ID != 3 {
		t.Fatalf("live grants after the third: %d, want 2 and 3", len(k.live))
	}
	_, closed := k.Ask(100*gms, time.Second, 100)
	rets := Returns(closed, 100*gms)
	if len(rets) != 1 || rets[0].ID != 1 || len(rets[0].Uses) != 1 || rets[0].Uses[0].Count != 3 {
		t.Fatalf("the report of the replaced grant: %+v; want grant 1, one run of 3", rets)
	}
	// Used at 5 ms, recorded at its bin's end (1 s / 64 = 15.6 ms), aged
	// from 100 ms and shrunk by 10 %: at most 90 % of 95 ms.
	if age := rets[0].Uses[0].Age; age > time.Duration(ageFraction*float64(95*gms)) || age <= 0 {
		t.Fatalf("the reported age %v is older than the use (at most %v)", age, time.Duration(ageFraction*float64(95*gms)))
	}
}

// TestRecordBeforeSent: a decision whose clock read comes
// before its grant's request was sent (the grant arrived while the
// decision waited for the key's lock) records its use in the first bin,
// and a use past the lease in the last; neither panics (a loaded CI's
// demo indexed bin -1).
func TestRecordBeforeSent(t *testing.T) {
	g := &Grant{sent: 1000, bin: 10}
	g.record(950, 2)
	g.record(1000+10*bins+5, 3)
	g.record(1015, 1)
	if g.uses[0] != 2 || g.uses[1] != 1 || g.uses[bins-1] != 3 {
		t.Fatalf("uses: first %d, second %d, last %d; want 2, 1, 3", g.uses[0], g.uses[1], g.uses[bins-1])
	}
	if r := g.report(1000); r[len(r)-1].Age != 0 {
		t.Fatalf("a report sent before the first bin ended gave age %v; want 0 (never earlier than it happened)", r[len(r)-1].Age)
	}
}
