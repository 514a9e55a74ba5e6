package partition_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/shard"
)

// t0 is the fixed epoch every table counts from.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fakeLease is the ownership lease: MayDecide says may until until (mono
// nanoseconds).
type fakeLease struct {
	may   bool
	until int64
}

func (l *fakeLease) MayDecide(pid int, mono int64) bool { return l.may && mono < l.until }
func (l *fakeLease) LiveUntil() int64                   { return l.until }

// fakeCopy is a queued copy whose backup answers err at once.
type fakeCopy struct {
	ch       chan error
	released *int
}

func (c *fakeCopy) Done() <-chan error { return c.ch }
func (c *fakeCopy) Release()           { *c.released++ }

// fakeRepl is the replication link: it records what it is given and
// answers each waited-for copy with answer; full refuses to queue.
type fakeRepl struct {
	admits, states int
	answer         error
	full           bool
	released       int
	lastState      shard.KeyState
}

func (f *fakeRepl) queue(wait bool) (partition.Copy, error) {
	if f.full {
		return nil, errors.New("replication queue is full")
	}
	if !wait {
		return nil, nil
	}
	c := &fakeCopy{ch: make(chan error, 1), released: &f.released}
	c.ch <- f.answer
	return c, nil
}

func (f *fakeRepl) Admission(to string, pid int, epoch uint64, key shard.Key, alg shard.Algorithm, run shard.Run, at time.Time, wait bool) (partition.Copy, error) {
	f.admits++
	return f.queue(wait)
}

func (f *fakeRepl) State(to string, pid int, epoch uint64, st shard.KeyState, at time.Time, wait bool) (partition.Copy, error) {
	f.states++
	f.lastState = st
	return f.queue(wait)
}

// fixture is one holder's partition with its env: the lease lets it
// decide until mono 1 s, and its clock reads mono.
type fixture struct {
	env   *partition.Env
	pt    *partition.Part
	lease *fakeLease
	repl  *fakeRepl
	mono  int64 // the clock after the decision
	// wall and gateMono are the clocks the gate reads.
	wall     time.Time
	gateMono int64
	tab      *policy.Table
}

func newFixture(t *testing.T, backup string, pols map[string]policy.Config) *fixture {
	t.Helper()
	st, err := shard.NewStore(shard.Config{Stripes: 1})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{lease: &fakeLease{may: true, until: int64(time.Second)}, repl: &fakeRepl{}, tab: policy.New(pols)}
	f.pt = &partition.NewParts(1)[0]
	f.pt.Role, f.pt.Holder, f.pt.Epoch, f.pt.Store, f.pt.Backup = partition.RoleHolder, "me", 1, st, backup
	f.env = &partition.Env{Lease: f.lease, Repl: f.repl, Mono: func() int64 { return f.mono },
		Now:      func() (time.Time, int64) { return f.wall, f.gateMono },
		Capacity: func(pid int, err error) error { return err }, Pause: new(atomic.Pointer[func()])}
	return f
}

// req builds a request for policy pol of key t/s.
func (f *fixture) req(t *testing.T, op partition.Op, pol string, hits int64) (*partition.Request, shard.Placed) {
	t.Helper()
	p := f.tab.Lookup(pol)
	if p == nil {
		t.Fatalf("no policy %q", pol)
	}
	r := &partition.Request{Op: op, Key: shard.Key{Tenant: "t", Subject: "s", Policy: pol}, P: p, Hits: hits}
	ek, ok := r.Key.AppendEncoded(nil)
	if !ok {
		t.Fatalf("key %+v does not encode", r.Key)
	}
	r.EK = ek
	return r, shard.Place(ek)
}

// decide decides r at t0+at with the fixture's mono.
func (f *fixture) decide(r *partition.Request, pk shard.Placed, at time.Duration, alone bool) (partition.Status, partition.Result, error) {
	var res partition.Result
	f.wall, f.gateMono = t0.Add(at), f.mono
	st, _, err := f.env.Decide(context.Background(), f.pt, r, pk, alone, &res)
	return st, res, err
}

var pols = map[string]policy.Config{
	"sync":   {Limit: 2, Window: time.Minute},
	"async":  {Limit: 2, Window: time.Minute, Replication: policy.ReplicateAsync},
	"off":    {Limit: 2, Window: time.Minute, Replication: policy.ReplicateOff},
	"shadow": {Limit: 1, Window: time.Minute, Replication: policy.ReplicateOff, Shadow: true},
	"conc":   {Limit: 1, Window: time.Minute, Algorithm: shard.Concurrency},
	"spread": {Limit: 10, Window: time.Minute, Spread: policy.SpreadAuto},
}

// TestGate: the one gate every operation passes, whatever the operation.
func TestGate(t *testing.T) {
	cases := []struct {
		name   string
		role   partition.Role
		may    bool
		backup string
		alone  bool
		op     partition.Op
		pol    string
		want   partition.Status
	}{
		{"holder decides", partition.RoleHolder, true, "b", false, partition.OpCheck, "sync", partition.Decided},
		{"fenced waits", partition.RoleFenced, true, "b", false, partition.OpCheck, "sync", partition.Wait},
		{"a hint is remote", partition.RoleHint, true, "b", false, partition.OpCheck, "sync", partition.Remote},
		{"nothing known is remote", partition.RoleNone, true, "b", false, partition.OpRefund, "sync", partition.Remote},
		{"lease lapsed waits", partition.RoleHolder, false, "b", false, partition.OpCheck, "sync", partition.Wait},
		{"lease lapsed waits for a reset too", partition.RoleHolder, false, "b", false, partition.OpReset, "sync", partition.Wait},
		{"sync without backup waits", partition.RoleHolder, true, "", false, partition.OpCheck, "sync", partition.Wait},
		{"sync refund without backup waits", partition.RoleHolder, true, "", false, partition.OpRefund, "sync", partition.Wait},
		{"sync alone decides", partition.RoleHolder, true, "", true, partition.OpCheck, "sync", partition.Decided},
		{"a peek needs no backup", partition.RoleHolder, true, "", false, partition.OpPeek, "sync", partition.Decided},
		{"async without backup decides", partition.RoleHolder, true, "", false, partition.OpCheck, "async", partition.Decided},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, c.backup, pols)
			f.pt.Role, f.lease.may = c.role, c.may
			r, pk := f.req(t, c.op, c.pol, 1)
			st, _, err := f.decide(r, pk, 0, c.alone)
			if st != c.want || err != nil {
				t.Fatalf("%v of %s: status %d, err %v; want status %d", c.op, c.pol, st, err, c.want)
			}
			if st != partition.Decided && f.pt.Store.Len() != 0 {
				t.Fatalf("not decided, yet the store holds %d keys", f.pt.Store.Len())
			}
		})
	}
}

// TestCheck steps single checks through the fast path: admissions, the
// limit, the copy to the backup and the lease again after.
func TestCheck(t *testing.T) {
	type step struct {
		at      time.Duration
		mono    int64 // when the decision ends (the lease's check after)
		hits    int64
		allowed bool
		reason  partition.Reason
		err     error
	}
	cases := []struct {
		name   string
		pol    string
		backup string
		answer error // the backup's answer to a waited-for copy
		steps  []step
		admits int // copies of admissions sent
	}{
		{"sync admits up to the limit", "sync", "b", nil, []step{
			{0, 0, 1, true, partition.ReasonAdmitted, nil},
			{time.Second, 0, 1, true, partition.ReasonAdmitted, nil},
			{2 * time.Second, 0, 1, false, partition.ReasonOverLimit, nil},
			{time.Minute, 0, 1, true, partition.ReasonAdmitted, nil},
		}, 3},
		{"sync backup refuses", "sync", "b", partition.ErrUnavailable, []step{
			{0, 0, 1, false, 0, partition.ErrUnavailable},
		}, 1},
		{"async is not waited for", "async", "b", partition.ErrUnavailable, []step{
			{0, 0, 1, true, partition.ReasonAdmitted, nil},
		}, 1},
		{"async lease ended during the decision", "async", "b", nil, []step{
			{0, int64(time.Second), 1, false, 0, partition.ErrLeaseEnded},
		}, 1},
		{"sync fenced by its copy: the lease is not asked again", "sync", "b", nil, []step{
			{0, int64(time.Second), 1, true, partition.ReasonAdmitted, nil},
		}, 1},
		{"off copies nothing", "off", "b", nil, []step{
			{0, 0, 2, true, partition.ReasonAdmitted, nil},
			{0, 0, 1, false, partition.ReasonOverLimit, nil},
		}, 0},
		{"shadow admits a refusal", "shadow", "", nil, []step{
			{0, 0, 1, true, partition.ReasonAdmitted, nil},
			{0, 0, 1, true, partition.ReasonShadow, nil},
		}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, c.backup, pols)
			f.repl.answer = c.answer
			for i, s := range c.steps {
				r, pk := f.req(t, partition.OpCheck, c.pol, s.hits)
				f.mono = s.mono
				// The gate reads mono as passed in; the check after reads
				// the fixture's clock, moved to s.mono by the decision.
				var res partition.Result
				f.wall, f.gateMono = t0.Add(s.at), 0
				st, _, err := f.env.Decide(context.Background(), f.pt, r, pk, false, &res)
				if st != partition.Decided || !errors.Is(err, s.err) || (s.err != nil) != (err != nil) {
					t.Fatalf("step %d (%+v): status %d, err %v; want decided, err %v", i, s, st, err, s.err)
				}
				if err == nil && (res.Allowed != s.allowed || res.Reason != s.reason || !res.Counted || !res.DecidedAt.Equal(t0.Add(s.at))) {
					t.Fatalf("step %d (%+v): %+v", i, s, res)
				}
			}
			if f.repl.admits != c.admits || f.repl.states != 0 {
				t.Fatalf("copies sent: %d admissions, %d states; want %d admissions", f.repl.admits, f.repl.states, c.admits)
			}
			if c.answer == nil && c.pol == "sync" && f.repl.released != c.admits {
				t.Fatalf("%d of %d waited-for copies handed back", f.repl.released, c.admits)
			}
		})
	}
}

// TestCheckDeferWait: a batch's receiver gets the copy to wait for itself.
func TestCheckDeferWait(t *testing.T) {
	f := newFixture(t, "b", pols)
	r, pk := f.req(t, partition.OpCheck, "sync", 1)
	r.DeferWait = true
	st, res, err := f.decide(r, pk, 0, false)
	if st != partition.Decided || err != nil || !res.Allowed || r.Wait == nil {
		t.Fatalf("status %d, err %v, %+v, wait %v: want an admission with its copy left to wait for", st, err, res, r.Wait)
	}
	if err := <-r.Wait.Done(); err != nil || f.repl.released != 0 {
		t.Fatalf("copy answered %v, released %d times before the caller waited", err, f.repl.released)
	}
}

// TestOperations steps the other operations: what each decides, copies
// and answers, and which fail with their backup.
func TestOperations(t *testing.T) {
	type step struct {
		op      partition.Op
		pol     string
		hits    int64
		allowed bool
		reason  partition.Reason
		err     error
	}
	cases := []struct {
		name   string
		answer error
		steps  []step
		states int // whole states copied
	}{
		{"refund gives back, a failing backup does not fail it", partition.ErrUnavailable, []step{
			{partition.OpCheck, "sync", 1, false, 0, partition.ErrUnavailable}, // admitted here, unconfirmed
			{partition.OpRefund, "sync", 1, true, partition.ReasonRefunded, nil},
			{partition.OpPeek, "sync", 2, true, partition.ReasonPeek, nil},
		}, 1},
		{"reset clears", nil, []step{
			{partition.OpCheck, "sync", 2, true, partition.ReasonAdmitted, nil},
			{partition.OpPeek, "sync", 1, false, partition.ReasonPeek, nil},
			{partition.OpReset, "sync", 1, true, partition.ReasonReset, nil},
			{partition.OpPeek, "sync", 2, true, partition.ReasonPeek, nil},
		}, 1},
		{"acquire up to the limit, release", nil, []step{
			{partition.OpAcquire, "conc", 1, true, partition.ReasonAdmitted, nil},
			{partition.OpAcquire, "conc", 1, false, partition.ReasonOverLimit, nil},
		}, 1},
		{"acquire fails with its sync backup", partition.ErrUnavailable, []step{
			{partition.OpAcquire, "conc", 1, false, 0, partition.ErrUnavailable},
		}, 1},
		{"reserve admits an estimate", nil, []step{
			{partition.OpReserve, "sync", 2, true, partition.ReasonAdmitted, nil},
			{partition.OpCheck, "sync", 1, false, partition.ReasonOverLimit, nil},
		}, 1},
		{"grant gives rights", nil, []step{
			{partition.OpGrant, "spread", 4, true, partition.ReasonAdmitted, nil},
		}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, "b", pols)
			f.repl.answer = c.answer
			for i, s := range c.steps {
				r, pk := f.req(t, s.op, s.pol, s.hits)
				st, res, err := f.decide(r, pk, time.Duration(i)*time.Millisecond, false)
				if st != partition.Decided || !errors.Is(err, s.err) || (s.err != nil) != (err != nil) {
					t.Fatalf("step %d (%v %s %d): status %d, err %v; want err %v", i, s.op, s.pol, s.hits, st, err, s.err)
				}
				if err == nil && (res.Allowed != s.allowed || res.Reason != s.reason) {
					t.Fatalf("step %d (%v %s %d): %+v; want allowed %v, reason %d", i, s.op, s.pol, s.hits, res, s.allowed, s.reason)
				}
				if s.op == partition.OpGrant && r.Granted <= 0 {
					t.Fatalf("step %d: granted %d rights", i, r.Granted)
				}
				if (s.op == partition.OpAcquire || s.op == partition.OpReserve) && err == nil && res.Allowed && (r.Lease == 0 || r.LeaseTTL != time.Minute) {
					t.Fatalf("step %d: lease %d ttl %v", i, r.Lease, r.LeaseTTL)
				}
			}
			if f.repl.states != c.states {
				t.Fatalf("%d states copied, want %d", f.repl.states, c.states)
			}
		})
	}
}

// TestReleaseAndSettle: an id ends once; the second time is harmless.
func TestReleaseAndSettle(t *testing.T) {
	f := newFixture(t, "b", pols)
	acq, pk := f.req(t, partition.OpAcquire, "conc", 1)
	if _, res, err := f.decide(acq, pk, 0, false); err != nil || !res.Allowed {
		t.Fatalf("acquire: %+v, %v", res, err)
	}
	for i, want := range []bool{true, false} {
		rel, pk := f.req(t, partition.OpRelease, "conc", 1)
		rel.Lease = acq.Lease
		if _, res, err := f.decide(rel, pk, time.Millisecond, false); err != nil || res.Allowed != want || res.Reason != partition.ReasonReleased {
			t.Fatalf("release %d: %+v, %v; want allowed %v", i, res, err, want)
		}
	}
	res1, pk := f.req(t, partition.OpReserve, "sync", 2)
	if _, res, err := f.decide(res1, pk, 0, false); err != nil || !res.Allowed {
		t.Fatalf("reserve: %+v, %v", res, err)
	}
	for i, want := range []bool{true, false} {
		s, pk := f.req(t, partition.OpSettle, "sync", 1)
		s.Lease, s.Actual = res1.Lease, 1
		if _, res, err := f.decide(s, pk, time.Millisecond, false); err != nil || res.Allowed != want || res.Reason != partition.ReasonSettled {
			t.Fatalf("settle %d: %+v, %v; want allowed %v", i, res, err, want)
		}
		if want && s.Estimate != 2 {
			t.Fatalf("settle: estimate %d, want 2", s.Estimate)
		}
	}
}

// TestMulti: several policies as one; one refusing records nothing.
func TestMulti(t *testing.T) {
	f := newFixture(t, "b", pols)
	multi := func(op partition.Op, hits int64) (partition.Result, error) {
		r, pk := f.req(t, op, "sync", hits)
		r.Key.Policy, r.Multi = "", []*policy.Entry{f.tab.Lookup("sync"), f.tab.Lookup("off")}
		_, res, err := f.decide(r, pk, 0, false)
		return res, err
	}
	if res, err := multi(partition.OpCheck, 2); err != nil || !res.Allowed || len(res.Limits) != 2 || res.Limits[0].Remaining != 0 {
		t.Fatalf("first: %+v, %v", res, err)
	}
	if res, err := multi(partition.OpCheck, 1); err != nil || res.Allowed || res.RefusedBy != "sync" || res.Reason != partition.ReasonOverLimit {
		t.Fatalf("second: %+v, %v; want refused by sync", res, err)
	}
	if res, err := multi(partition.OpPeek, 1); err != nil || res.Allowed || res.Reason != partition.ReasonPeek {
		t.Fatalf("peek: %+v, %v", res, err)
	}
	if f.repl.admits != 1 {
		t.Fatalf("%d admissions copied, want 1 (the sync policy's first)", f.repl.admits)
	}
}

// TestOpTable pins the facts the router, the parser and the failure
// policy read from the table.
func TestOpTable(t *testing.T) {
	for op := partition.Op(0); op.Valid(); op++ {
		s := op.Spec()
		if s.Name == "" || op.String() != s.Name {
			t.Errorf("op %d has no name", op)
		}
		if s.Frees && s.Admits {
			t.Errorf("%v both frees and admits", op)
		}
		if s.Multi && s.Exclusive {
			t.Errorf("%v is multi-policy and exclusive: a multi-policy decision holds the gate in read mode", op)
		}
	}
	for _, op := range []partition.Op{partition.OpRefund, partition.OpReset} {
		if op.Spec().Resendable {
			t.Errorf("%v is resendable: done twice it gives back or clears twice", op)
		}
	}
	if partition.Op(200).Valid() || partition.Op(200).Spec().Name != "" {
		t.Errorf("op 200 is in the table")
	}
	conc := policy.New(pols).Lookup("conc")
	if err := partition.OpCheck.Spec().Applies(conc); !errors.Is(err, partition.ErrWrongAlgorithm) {
		t.Errorf("a check of a concurrency policy: %v, want ErrWrongAlgorithm", err)
	}
	if err := partition.OpAcquire.Spec().Applies(conc); err != nil {
		t.Errorf("an acquire of a concurrency policy: %v", err)
	}
}

// TestCapacity: a full store's error goes through Env.Capacity.
func TestCapacity(t *testing.T) {
	f := newFixture(t, "", pols)
	st, err := shard.NewStore(shard.Config{Stripes: 1, MaxKeys: 1})
	if err != nil {
		t.Fatal(err)
	}
	f.pt.Store = st
	called := 0
	f.env.Capacity = func(pid int, err error) error { called++; return err }
	r, pk := f.req(t, partition.OpCheck, "async", 1)
	if _, _, err := f.decide(r, pk, 0, false); err != nil {
		t.Fatal(err)
	}
	r2 := &partition.Request{Op: partition.OpCheck, Key: shard.Key{Tenant: "t2", Subject: "s", Policy: "async"}, P: r.P, Hits: 1}
	ek, _ := r2.Key.AppendEncoded(nil)
	if _, _, err := f.decide(r2, shard.Place(ek), 0, false); !errors.Is(err, shard.ErrCapacity) || called != 1 {
		t.Fatalf("second key: %v, Capacity called %d times; want ErrCapacity through it once", err, called)
	}
}
