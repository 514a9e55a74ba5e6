package shard

import (
	"reflect"
	"testing"
	"time"
)

// TestExportInto: ExportInto gives what Export gives, for each algorithm
// and with reservations and grants, into a state reused from another key
// (its old contents replaced, not added to), and allocates nothing once
// the state's slices are large enough.
func TestExportInto(t *testing.T) {
	s, err := NewStore(Config{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	sliding := Policy{Limit: 100, Window: time.Minute}
	keys := []Key{}
	add := func(sub string, p Policy, f func(k Key) error) {
		t.Helper()
		k := Key{Tenant: "t", Subject: sub, Policy: "p"}
		if err := f(k); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	add("sliding", sliding, func(k Key) error {
		for i := range 5 {
			if _, err := s.Allow(k, sliding, 2, now.Add(time.Duration(i)*time.Second)); err != nil {
				return err
			}
		}
		if _, err := s.Reserve(k, sliding, 3, 7, now.Add(5*time.Second)); err != nil {
			return err
		}
		_, err := s.Grant(k, sliding, 4, 10*time.Second, 9, now.Add(5*time.Second))
		return err
	})
	for _, p := range []Policy{
		{Limit: 10, Window: time.Minute, Algorithm: TokenBucket},
		{Limit: 10, Window: time.Minute, Algorithm: FixedWindow},
		{Limit: 10, Algorithm: Calendar, Period: CalendarDay, Zone: time.UTC},
		{Limit: 10, Window: time.Minute, Algorithm: Concurrency},
	} {
		add(p.Algorithm.String(), p, func(k Key) error {
			if p.Algorithm == Concurrency {
				_, err := s.Acquire(k, p, 2, 5, now)
				return err
			}
			_, err := s.Allow(k, p, 2, now)
			return err
		})
	}
	at := now.Add(6 * time.Second)
	var dst KeyState
	// Reused in both orders: a state with many runs into one with few,
	// and back.
	for _, k := range append(append([]Key{}, keys...), keys...) {
		want, ok := s.Export(k, at)
		if !ok {
			t.Fatalf("%v not held", k)
		}
		if !s.ExportInto(k, at, &dst) {
			t.Fatalf("ExportInto %v: not held", k)
		}
		if !reflect.DeepEqual(normal(dst), normal(want)) {
			t.Fatalf("%v: ExportInto %+v, Export %+v", k, dst, want)
		}
	}
	if s.ExportInto(Key{Tenant: "t", Subject: "none", Policy: "p"}, at, &dst) {
		t.Fatal("ExportInto of a key not held reported true")
	}
	if s.ExportInto(keys[0], at, &dst); len(dst.Runs) < 5 || len(dst.Reservations) != 1 || len(dst.Grants) != 1 {
		t.Fatalf("the sliding key's state %+v: want 5 runs, a reservation and a grant", dst)
	}
	if n := testing.AllocsPerRun(100, func() { s.ExportInto(keys[0], at, &dst) }); n != 0 {
		t.Fatalf("ExportInto allocates %v times", n)
	}
}

// normal maps empty slices to nil, for comparison.
func normal(ks KeyState) KeyState {
	for _, r := range []*[]Run{&ks.Runs, &ks.Reservations, &ks.Grants} {
		if len(*r) == 0 {
			*r = nil
		}
	}
	return ks
}
