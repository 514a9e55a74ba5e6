package ownership

// Transcripts: faults told step by step, in the style of etcd raft's
// interaction tests. Each file in testdata/ is a script of commands, and
// under each command what the machines did: the actions they returned,
// what the log applied, the table, who may decide. A change of behaviour
// changes some output and fails the test; when the change is meant,
// `go test -run TestTranscripts -rewrite ./peer/internal/ownership/`
// writes the new outputs, and the diff shows what changed, step by step.
//
// The world: members with one Machine each, one log that every member
// applies in the same order, and one clock, starting at 10s (offsets
// never matter to the protocol: each member measures durations on its
// own clock). Nothing
// happens unless a command says so: a member that is not ticked is
// paused, a proposal not applied is in flight, an answer not delivered
// is lost.
//
// Commands (lists as (a,b,c); every member, in creation order, when ids
// is left out):
//
//	member ids=(a,b,c) [partitions=1] [liveness=2s] [mutation=name]
//	                         create the members (mutation: one rule broken
//	                         on purpose, its name with dashes for spaces)
//	view target=(a) second=(b) members=(a,b,c) [on=(..)]   set gossip views
//	leader id=c              c leads the log from now (the others do not)
//	advance by=700ms         move the clock
//	tick [ids=(..)]          run Tick; proposals, keep-alives and copies
//	                         are held until delivered
//	apply [kind=move] [skip=(a)]   commit the proposals in flight (only
//	                         those of kind) to the log, in order; every
//	                         member applies them but those skipped (cut
//	                         off from the log: they fall behind)
//	catch-up id=a            a applies what it missed of the log
//	lose [kind=move]         drop proposals in flight
//	keepalive [ids=(..)] [lost]   deliver keep-alives to the leader and
//	                         its answers back (lost: the answer is dropped)
//	copy-acked from=a [p=0]  the copy in flight from a is installed by its
//	                         receiver (OfferCopy) and acknowledged
//	drain id=b backup-wait=3s   b begins to leave gracefully
//	may-leave id=b alive=3   MayLeave's verdict for b
//	leave id=b               b proposes the End of its liveness for good
//	table                    the leader's table (on=b: b's)
//	may-decide [p=0]         MayDecide of every member, with why not

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

func TestTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		w := &world{}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return w.run(t, d)
		})
	})
}

type sent struct {
	from string
	a    Action
}

type world struct {
	now      int64
	ids      []string
	ms       map[string]*Machine
	leader   string
	flight   []sent // proposals not yet applied
	alive    []sent // keep-alive requests not yet delivered
	copies   []sent // copies not yet installed
	drains   map[string]Drain
	log      []Command      // the committed log
	applied  map[string]int // per member, how much of log it applied
	ref      *Table         // the table at the log's end
	out      strings.Builder
	liveness time.Duration
}

func (w *world) printf(format string, a ...any) { fmt.Fprintf(&w.out, format, a...) }

func at(ns int64) string { return time.Duration(ns).String() }

func (w *world) run(t *testing.T, d *datadriven.TestData) string {
	w.out.Reset()
	ids := w.ids
	if d.HasArg("ids") {
		ids = nil
		d.ScanArgs(t, "ids", &ids)
	}
	p := 0
	if d.HasArg("p") {
		d.ScanArgs(t, "p", &p)
	}
	switch d.Cmd {
	case "member":
		parts, live := 1, "2s"
		if d.HasArg("partitions") {
			d.ScanArgs(t, "partitions", &parts)
		}
		if d.HasArg("liveness") {
			d.ScanArgs(t, "liveness", &live)
		}
		w.liveness = duration(t, live)
		// Monotonic clocks do not start at 0, and the machine reads 0
		// as never.
		w.now = int64(10 * time.Second)
		var mut Mutation
		if d.HasArg("mutation") {
			var name string
			d.ScanArgs(t, "mutation", &name)
			i := slices.IndexFunc(mutationNames[:], func(n string) bool { return strings.ReplaceAll(n, " ", "-") == name })
			if i <= 0 {
				t.Fatalf("%s: no mutation %q", d.Pos, name)
			}
			mut = Mutation(i)
		}
		w.ms, w.ids, w.drains, w.applied = map[string]*Machine{}, ids, map[string]Drain{}, map[string]int{}
		w.ref = NewTable(parts)
		w.ref.mut = mut
		for _, id := range ids {
			// The scripts were written for a keep-alive every third of a
			// Liveness (the default before Liveness/2): the cadence is no
			// rule, and their steps count on it.
			w.ms[id] = New(Config{ID: id, Liveness: w.liveness, ExtendEvery: w.liveness / 3, Mutation: mut}, parts)
		}
		c := w.ms[ids[0]].cfg
		w.printf("now %s; liveness %v (a holder counts %v from its send), extend every %v, retry %v\n",
			at(w.now), c.Liveness, time.Duration(float64(c.Liveness)*HolderShare), c.ExtendEvery, c.Retry)
	case "view":
		var v View
		for _, f := range []struct {
			key string
			to  *[]string
		}{{"target", &v.Target}, {"second", &v.Second}, {"members", &v.Members}} {
			if d.HasArg(f.key) {
				d.ScanArgs(t, f.key, f.to)
			}
		}
		on := w.ids
		if d.HasArg("on") {
			on = nil
			d.ScanArgs(t, "on", &on)
		}
		for _, id := range on {
			w.m(t, id).SetView(v)
		}
		w.printf("view on %v: target %v second %v members %v\n", on, v.Target, v.Second, v.Members)
	case "leader":
		var id string
		d.ScanArgs(t, "id", &id)
		for _, o := range w.ids {
			w.ms[o].SetLeader(o == id, w.now)
		}
		w.leader = id
		w.printf("%s leads from %s\n", id, at(w.now))
	case "advance":
		var by string
		d.ScanArgs(t, "by", &by)
		w.now += int64(duration(t, by))
		w.printf("now %s\n", at(w.now))
	case "tick":
		for _, id := range ids {
			for _, a := range w.m(t, id).Tick(w.now) {
				w.queue(id, a)
			}
		}
		if w.out.Len() == 0 {
			w.printf("no actions\n")
		}
	case "apply":
		w.apply(t, d)
	case "catch-up":
		var id string
		d.ScanArgs(t, "id", &id)
		w.m(t, id)
		w.catchUp(id, true)
	case "lose":
		kind := kindArg(t, d)
		w.flight = slices.DeleteFunc(w.flight, func(s sent) bool {
			if kind == 0 || s.a.Cmd.Kind == kind {
				w.printf("lost: %v\n", s.a.Cmd)
				return true
			}
			return false
		})
	case "keepalive":
		w.keepAlive(t, ids, d.HasArg("lost"))
	case "copy-acked":
		var from string
		d.ScanArgs(t, "from", &from)
		i := slices.IndexFunc(w.copies, func(s sent) bool { return s.from == from && s.a.P == p })
		if i < 0 {
			t.Fatalf("%s: no copy of p%d from %s in flight", d.Pos, p, from)
		}
		c := w.copies[i].a
		w.copies = slices.Delete(w.copies, i, i+1)
		if !w.m(t, c.To).OfferCopy(c.P, from, c.Epoch, c.Seq) {
			w.printf("%s refuses the copy of p%d@%d #%d\n", c.To, c.P, c.Epoch, c.Seq)
			break
		}
		w.printf("%s installs the copy of p%d@%d #%d\n", c.To, c.P, c.Epoch, c.Seq)
		for _, a := range w.ms[from].CopyAcked(c.P, c.To, c.Epoch, c.Seq, w.now) {
			w.queue(from, a)
		}
	case "drain":
		var id, wait string
		d.ScanArgs(t, "id", &id)
		d.ScanArgs(t, "backup-wait", &wait)
		w.m(t, id)
		w.drains[id] = Drain{Since: w.now, BackupWait: duration(t, wait)}
		w.printf("%s drains from %s\n", id, at(w.now))
	case "may-leave":
		var id string
		d.ScanArgs(t, "id", &id)
		dr := w.drains[id]
		d.ScanArgs(t, "alive", &dr.Alive)
		v, held, backed := w.m(t, id).MayLeave(dr, w.now)
		w.printf("%s: %v (holds %d, backs %d)\n", id, v, held, backed)
	case "leave":
		var id string
		d.ScanArgs(t, "id", &id)
		c, ok := w.m(t, id).Leave()
		if !ok {
			w.printf("%s: nothing to end\n", id)
			break
		}
		w.queue(id, Action{Kind: Propose, Cmd: c})
	case "table":
		on := w.leader
		if d.HasArg("on") {
			d.ScanArgs(t, "on", &on)
		}
		w.table(t, on)
	case "may-decide":
		for _, id := range w.ids {
			w.printf("%s: %s\n", id, w.mayDecide(w.ms[id], p))
		}
	default:
		t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	}
	if w.out.Len() == 0 {
		return "ok\n"
	}
	return w.out.String()
}

func (w *world) m(t *testing.T, id string) *Machine {
	m := w.ms[id]
	if m == nil {
		t.Fatalf("no member %q", id)
	}
	return m
}

func duration(t *testing.T, s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func kindArg(t *testing.T, d *datadriven.TestData) Kind {
	if !d.HasArg("kind") {
		return 0
	}
	var s string
	d.ScanArgs(t, "kind", &s)
	k := Kind(slices.Index(kindNames[:], s))
	if k <= 0 {
		t.Fatalf("%s: no command kind %q", d.Pos, s)
	}
	return k
}

// queue prints one action of from's and holds it until a command delivers
// it (a reset is carried out at once).
func (w *world) queue(from string, a Action) {
	switch a.Kind {
	case Propose:
		w.printf("%s: propose %v\n", from, a.Cmd)
		w.flight = append(w.flight, sent{from, a})
	case KeepAlive:
		r := a.KeepAlive
		w.printf("%s: keep-alive %s@%d #%d", from, r.Member, r.Epoch, r.Seq)
		if len(r.Watch) > 0 {
			w.printf(" watching %v", r.Watch)
		}
		w.printf("\n")
		w.alive = append(w.alive, sent{from, a})
	case SendCopy:
		w.printf("%s: send copy of p%d@%d #%d to %s\n", from, a.P, a.Epoch, a.Seq, a.To)
		w.copies = append(w.copies, sent{from, a})
	case Reset:
		w.printf("%s: reset p%d (empty state)\n", from, a.P)
	}
}

// apply commits the proposals in flight (of one kind, if given) to the
// log, in order: each is checked against the table, and every member not
// skipped (cut off from the log) applies it, after whatever it missed.
func (w *world) apply(t *testing.T, d *datadriven.TestData) {
	kind := kindArg(t, d)
	var skip []string
	if d.HasArg("skip") {
		d.ScanArgs(t, "skip", &skip)
	}
	var now []sent
	w.flight = slices.DeleteFunc(w.flight, func(s sent) bool {
		if kind == 0 || s.a.Cmd.Kind == kind {
			now = append(now, s)
			return true
		}
		return false
	})
	for _, s := range now {
		c := s.a.Cmd
		if err := w.ref.Apply(c); err != nil {
			w.printf("applied %v: %v\n", c, err)
		} else {
			w.printf("applied %v\n", c)
		}
		w.log = append(w.log, c)
		for _, id := range w.ids {
			if !slices.Contains(skip, id) {
				w.catchUp(id, false)
			}
		}
	}
}

// catchUp makes id apply the log entries it has not applied yet.
func (w *world) catchUp(id string, say bool) {
	for ; w.applied[id] < len(w.log); w.applied[id]++ {
		c := w.log[w.applied[id]]
		if say {
			w.printf("%s applies %v\n", id, c)
		}
		for _, a := range w.ms[id].Apply(c, w.now) {
			w.queue(id, a)
		}
	}
}

// keepAlive delivers the keep-alives in flight from ids to the leader,
// and (unless lost) its answers back.
func (w *world) keepAlive(t *testing.T, ids []string, lost bool) {
	if w.leader == "" {
		t.Fatal("keepalive with no leader")
	}
	l := w.ms[w.leader]
	w.alive = slices.DeleteFunc(w.alive, func(s sent) bool {
		if !slices.Contains(ids, s.from) {
			return false
		}
		r := s.a.KeepAlive
		a := l.KeepAlive(r, w.now, w.now)
		verdict := "refused"
		if a.Granted {
			verdict = "granted"
		}
		w.printf("%s %s %s@%d #%d", w.leader, verdict, r.Member, r.Epoch, r.Seq)
		for _, age := range a.Ages {
			w.printf("; %s extended %v ago", age.ID, time.Duration(age.Age))
		}
		if lost {
			w.printf("; the answer is lost\n")
			return true
		}
		m := w.ms[s.from]
		m.KeptAlive(a, w.now)
		w.printf("; %s's lease until %s\n", s.from, at(m.LiveUntil()))
		return true
	})
}

func (w *world) table(t *testing.T, on string) {
	tb := w.m(t, on).Table()
	ids := make([]string, 0, len(tb.Members))
	for id := range tb.Members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		r := tb.Members[id]
		w.printf("%s: epoch %d version %d", id, r.Epoch, r.Version)
		if r.Active {
			w.printf(" active")
		}
		if r.Ended {
			w.printf(" ended for good")
		}
		w.printf("\n")
	}
	for p, pt := range tb.Parts {
		if pt.Holder == "" {
			w.printf("p%d@%d: vacant, last %q\n", p, pt.Epoch, pt.Last)
			continue
		}
		w.printf("p%d@%d: holder %s@%d backup %q\n", p, pt.Epoch, pt.Holder, pt.HolderEpoch, pt.Backup)
	}
}

// mayDecide answers MayDecide(p) for m, with the first reason why not.
func (w *world) mayDecide(m *Machine, p int) string {
	if m.MayDecide(p, w.now) {
		return fmt.Sprintf("decides (lease until %s)", at(m.LiveUntil()))
	}
	l := &m.parts[p]
	switch {
	case !m.table.Holds(m.cfg.ID, p):
		return "no: not the holder"
	case w.now >= m.liveUntil:
		return fmt.Sprintf("no: its lease ended at %s", at(m.liveUntil))
	case !l.have:
		return "no: the state is not here"
	case l.fence == fenceCopy:
		return fmt.Sprintf("no: fenced, copying to %s", l.to)
	case l.fence == fenceProposed:
		return fmt.Sprintf("no: fenced, proposed at epoch %d", l.epoch)
	case l.recopy:
		return "no: owes its backup a re-copy"
	}
	return "no"
}
