package ownlog

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/peer/internal/ownership"
)

// Transport carries one member's raft messages. Send must not block: a
// message it cannot send now is dropped (raft sends again). It is called
// from the Runner's goroutine only.
type Transport interface {
	Send(to uint64, msg []byte)
}

// Data carries out the machine's data actions: export a partition and
// send it (the driver calls CopyAcked when the receiver confirms,
// CopyFailed when it refuses or the copy fails), or
// empty one; and mirrors each partition's published state into the
// driver's own records. Called from the Runner's goroutine, with the
// partition's gate held in write mode, so no decision is in flight on it;
// it must not block on the network (start the copy, return).
type Data interface {
	SendCopy(a ownership.Action)
	Reset(p int)
	// Publish tells the driver what partition p's applied record is now
	// and whether this member may decide for it (its own lease aside:
	// MayDecide checks that). Called whenever either changes.
	Publish(p int, st PartState)
}

// PartState is one partition as the runner last published it.
type PartState struct {
	Holder string // the holder's member ID; "" while vacant
	Epoch  uint64 // the partition epoch replication is tagged with
	Backup string // the backup's member ID; "" when none
	// Have: this member's local state of the partition is the one the
	// table counts on (as holder, or as backup).
	Have bool
	// May: this member may decide for the partition while its lease lasts.
	May bool
	// Held, Backed: the partition depends on this member, as its holder
	// (or a vacancy kept for its state) or as its backup (or by a copy a
	// holder may yet commit): ownership.Machine.DependsOn.
	Held, Backed bool
}

// Runner drives one Member from one goroutine: ticks, inbound messages,
// views and copy acknowledgements in; messages and data actions out. The
// decision path asks MayDecide, which reads a published snapshot without
// locks or allocation, under the partition's Gate in read mode.
// Safe for concurrent use.
type Runner struct {
	m     *Member
	tr    Transport
	data  Data
	tick  time.Duration
	mono  func() int64
	in    chan []byte
	ctl   chan func()
	gates func(p int) *sync.RWMutex
	self  string
	pub   atomic.Pointer[published]
	done  chan struct{}
	// prev is the last published snapshot, scratch the next one as it is
	// built, and parts the scratch its partitions are rebuilt in (nil
	// once published); all owned by the goroutine. gen is the machine's
	// Gen when prev's partitions were built (valid once built).
	prev    *published
	scratch published
	parts   []PartState
	gen     uint64
	built   bool
	// proposed, confChanges and applied count for Traffic; written by
	// the goroutine, read by anyone.
	proposed, confChanges, applied atomic.Uint64
	// shed counts received messages dropped because the goroutine was
	// behind (in full); written by Receive, read by anyone.
	shed atomic.Uint64
	// from, when set (SetFrom, before Run), says whether a received
	// message's sender is a current member; refused counts the messages
	// it refused.
	from    func(raftID uint64) bool
	refused atomic.Uint64
}

// SetFrom makes the runner step only messages whose From ok accepts,
// dropping the rest unread by raft (and counting them in Refused). raft
// takes any message's term before it asks whether the sender is in its
// configuration: a forged heartbeat from an unknown ID with a huge term
// made the voters step down and the log leaderless (issue 53 item 5), so
// the driver, which knows the current members' raft IDs, filters first.
// ok runs on the runner's goroutine and must not block. Call it before
// Run; nil (the default) steps every message.
func (r *Runner) SetFrom(ok func(raftID uint64) bool) { r.from = ok }

// Refused counts the received messages SetFrom's function refused.
// Lock-free.
func (r *Runner) Refused() uint64 { return r.refused.Load() }

// Traffic is what a member's log has cost it since it started: counters
// that only grow.
type Traffic struct {
	// MsgsSent and BytesSent are the raft messages this member's
	// transport sent and their marshalled size (the gRPC framing aside);
	// MsgsDropped the ones it dropped before sending (queue full, no
	// stream). Zero for a transport that does not count.
	MsgsSent, BytesSent, MsgsDropped uint64
	// MsgsShed are the raft messages this member received and dropped
	// unread because its goroutine was that far behind (raft sends
	// again; many of them mean a member too slow for its ticks).
	MsgsShed uint64
	// Proposals counts the ownership commands this member proposed and
	// raft took (a follower's are forwarded to the leader; one may still
	// be lost with it), ConfChanges the configuration changes it proposed
	// as leader (autopilot).
	Proposals, ConfChanges uint64
	// Applied counts the ownership commands this member applied: every
	// member applies every committed command.
	Applied uint64
}

// TrafficCounter is a transport that counts what it sends (GRPCTransport
// does); Runner.Traffic reads it.
type TrafficCounter interface {
	Traffic() Traffic
}

// Traffic returns the member's log traffic so far: its transport's
// counts, when the transport keeps them (TrafficCounter), and its own
// proposals and applied commands. Lock-free; safe from any goroutine.
func (r *Runner) Traffic() Traffic {
	var t Traffic
	if c, ok := r.tr.(TrafficCounter); ok {
		t = c.Traffic()
	}
	t.Proposals, t.ConfChanges, t.Applied = r.proposed.Load(), r.confChanges.Load(), r.applied.Load()
	t.MsgsShed = r.shed.Load()
	return t
}

// published is what the decision path reads: which partitions this
// member may decide for, until when.
type published struct {
	until int64
	parts []PartState
	// voters is the applied configuration's voter count; voter whether
	// it lists this member.
	voters int
	voter  bool
	// lead is the leader this member knows of (0: none), and since when
	// it has known of none (monotonic ns; 0 while it knows one).
	lead, leaderless int64
}

// NewRunner returns a runner of m. mono is the member's monotonic clock in
// ns; tick is the raft tick (the election timeout is Config.ElectionTicks
// of them). gates returns partition p's gate, the lock a decision holds
// in read mode from its MayDecide to the end of its store update (the
// driver's own per-partition lock); nil gives the runner gates of its own.
// Call Run to start it.
func NewRunner(m *Member, tr Transport, data Data, tick time.Duration, mono func() int64, gates func(p int) *sync.RWMutex) *Runner {
	if gates == nil {
		own := make([]sync.RWMutex, m.cfg.Partitions)
		gates = func(p int) *sync.RWMutex { return &own[p] }
	}
	r := &Runner{m: m, tr: tr, data: data, tick: tick, mono: mono, gates: gates, self: m.cfg.Ownership.ID,
		in: make(chan []byte, 1024), ctl: make(chan func(), 64), done: make(chan struct{})}
	r.prev = &published{parts: make([]PartState, m.cfg.Partitions)}
	r.pub.Store(r.prev)
	return r
}

// Gate returns partition p's gate: a decision holds it in read mode from
// MayDecide to the end of its store update.
func (r *Runner) Gate(p int) *sync.RWMutex { return r.gates(p) }

// MayDecide reports whether this member may decide for p at now (its
// monotonic ns), from the last published snapshot.
func (r *Runner) MayDecide(p int, now int64) bool {
	s := r.pub.Load()
	return now < s.until && s.parts[p].May
}

// LiveUntil returns the end of this member's own lease as last published
// (monotonic ns).
func (r *Runner) LiveUntil() int64 { return r.pub.Load().until }

// Lead returns the raft ID of the leader this member knew of at the last
// publication (0: none).
func (r *Runner) Lead() uint64 { return uint64(r.pub.Load().lead) }

// Leaderless returns since when (monotonic ns) this member has known of no
// leader, or 0 while it knows one.
func (r *Runner) Leaderless() int64 { return r.pub.Load().leaderless }

// ReachesMajority asks, on the runner's goroutine, whether this member
// heard from a majority of the log's voters within the last within
// (Member.ReachesMajority). ok is false when ctx ended or the runner
// stopped before it answered.
func (r *Runner) ReachesMajority(ctx context.Context, within time.Duration) (reach, ok bool) {
	return ask(ctx, r, func() bool { return r.m.ReachesMajority(r.mono() - int64(within)) })
}

// Voters returns the voter count of the configuration last published.
func (r *Runner) Voters() int { return r.pub.Load().voters }

// Voter reports whether the applied configuration lists this member as a
// voter.
func (r *Runner) Voter() bool { return r.pub.Load().voter }

// Part returns partition p as last published.
func (r *Runner) Part(p int) PartState { return r.pub.Load().parts[p] }

// AcceptReplica reports, from the last published snapshot, whether an
// admission of p replicated by from at epoch may be applied here: the
// table names this member p's backup and from its holder at exactly that
// epoch, and this member's copy is the one the table counts on. A
// snapshot a moment old errs only toward applying an admission to a copy
// that has just stopped mattering, which can only make it refuse more.
func (r *Runner) AcceptReplica(p int, from string, epoch uint64) bool {
	st := r.pub.Load().parts[p]
	return st.Backup == r.self && st.Holder == from && st.Epoch == epoch && st.Have
}

// Receive hands an inbound raft message to the runner; when its queue is
// full the message is dropped (raft sends again).
func (r *Runner) Receive(msg []byte) {
	select {
	case r.in <- msg:
	default:
		r.shed.Add(1)
	}
}

// SetView passes a gossip view on, in order with other events.
func (r *Runner) SetView(v ownership.View, roster []Peer) {
	r.do(func() { r.m.SetView(v, roster) })
}

// Raise tells the machine that a policy's replication became stronger
// (Member.Raise) and waits, within ctx, until the runner has published
// that every held partition waits for its re-copy.
func (r *Runner) Raise(ctx context.Context) {
	ask(ctx, r, func() bool {
		r.carry(r.m.Raise(r.mono()))
		return true
	})
}

// SetEmptyAfter changes how long a vacancy waits for its last holder
// (Member.SetEmptyAfter), in order with other events.
func (r *Runner) SetEmptyAfter(d time.Duration) {
	r.do(func() { r.m.SetEmptyAfter(d) })
}

// Recopy tells the machine that an admission of partition p replicated
// without waiting at epoch did not reach the backup (Member.Recopy). It
// does not wait: the failed batch's sender must not block on the runner.
func (r *Runner) Recopy(p int, epoch uint64) {
	r.do(func() { r.carry(r.m.Recopy(p, epoch, r.mono())) })
}

// CopyAcked tells the machine a copy was installed by its receiver.
func (r *Runner) CopyAcked(p int, to string, epoch, seq uint64) {
	r.do(func() { r.carry(r.m.CopyAcked(p, to, epoch, seq, r.mono())) })
}

// CopyFailed tells the machine a copy was refused or failed.
func (r *Runner) CopyFailed(p int, to string, epoch, seq uint64) {
	r.do(func() { r.carry(r.m.CopyFailed(p, to, epoch, seq, r.mono())) })
}

// OfferCopy asks the machine whether a copy may be installed; it waits for
// the runner's answer (or ctx).
func (r *Runner) OfferCopy(ctx context.Context, p int, from string, epoch, seq uint64) bool {
	ok, _ := ask(ctx, r, func() bool { return r.m.Own().OfferCopy(p, from, epoch, seq) })
	return ok
}

// Explain describes each of the partitions pids as the machine sees them
// now (ownership.Machine.Explain), from the runner's goroutine, for
// operators and failure messages; nil when the runner did not answer
// within ctx.
func (r *Runner) Explain(ctx context.Context, pids []int) []string {
	out, _ := ask(ctx, r, func() []string {
		now, own := r.mono(), r.m.Own()
		out := make([]string, len(pids))
		for i, p := range pids {
			out[i] = own.Explain(p, now)
		}
		return out
	})
	return out
}

// Table returns a copy of the applied table, for status pages and tests.
func (r *Runner) Table(ctx context.Context) (*ownership.Table, bool) {
	return ask(ctx, r, func() *ownership.Table { return r.m.Own().Table().Clone() })
}

// Fresh returns which of the member IDs ids the machine finds live and
// extending (Machine.Fresh), from the runner's goroutine; nil when the
// runner did not answer within ctx.
func (r *Runner) Fresh(ctx context.Context, ids []string) map[string]bool {
	out, _ := ask(ctx, r, func() map[string]bool {
		now, own := r.mono(), r.m.Own()
		out := make(map[string]bool, len(ids))
		for _, id := range ids {
			out[id] = own.Fresh(id, now)
		}
		return out
	})
	return out
}

// MayLeave asks the machine, on the runner's goroutine, whether a member
// leaving gracefully may end its liveness now (ownership.Machine.MayLeave),
// with drain's Since on the runner's clock. ok is false when ctx ended or
// the runner stopped first: the leaver then stays.
func (r *Runner) MayLeave(ctx context.Context, d ownership.Drain) (v ownership.LeaveVerdict, held, backed int, ok bool) {
	type verdict struct {
		v            ownership.LeaveVerdict
		held, backed int
	}
	a, ok := ask(ctx, r, func() verdict {
		v, h, b := r.m.Own().MayLeave(d, r.mono())
		return verdict{v, h, b}
	})
	return a.v, a.held, a.backed, ok
}

// Ended reports, for each of ids, whether the table has ended that
// incarnation for good (it left, or a later one runs). Nil when ctx ended
// or the runner stopped first.
func (r *Runner) Ended(ctx context.Context, ids []string) map[string]bool {
	out, _ := ask(ctx, r, func() map[string]bool {
		t := r.m.Own().Table()
		out := make(map[string]bool, len(ids))
		for _, id := range ids {
			if l := t.Members[id]; l != nil && l.Ended {
				out[id] = true
			}
		}
		return out
	})
	return out
}

// TransferLeadership hands leadership to another voter if this member
// leads (Member.TransferLeadership), and waits, within ctx, until it no
// longer leads.
func (r *Runner) TransferLeadership(ctx context.Context) {
	r.until(ctx, r.tick, r.m.TransferLeadership)
}

// Leave proposes the end of this member's liveness for good
// (Machine.Leave) and waits, within ctx, until it is applied. It reports
// whether it was.
func (r *Runner) Leave(ctx context.Context) bool {
	return r.until(ctx, 4*r.tick, func() bool {
		c, ok := r.m.Own().Leave()
		if ok {
			r.m.do([]ownership.Action{{Kind: ownership.Propose, Cmd: c}})
		}
		return ok
	})
}

// OthersFresh reports whether a member of the table other than this one
// is live and extending (Machine.Fresh); false when ctx ended first.
func (r *Runner) OthersFresh(ctx context.Context) bool {
	v, _ := ask(ctx, r, func() bool {
		now, own := r.mono(), r.m.Own()
		for id := range own.Table().Members {
			if id != own.ID() && own.Fresh(id, now) {
				return true
			}
		}
		return false
	})
	return v
}

// Describe returns Member.Describe, from the runner's goroutine.
func (r *Runner) Describe(ctx context.Context) string {
	if s, ok := ask(ctx, r, r.m.Describe); ok {
		return s
	}
	if ctx.Err() != nil {
		return "no answer: " + ctx.Err().Error()
	}
	return "stopped"
}

// ask runs fn on the runner's goroutine and returns its answer; false when
// ctx ended or the runner stopped first.
func ask[T any](ctx context.Context, r *Runner, fn func() T) (T, bool) {
	ans := make(chan T, 1)
	r.do(func() { ans <- fn() })
	select {
	case v := <-ans:
		return v, true
	case <-ctx.Done():
	case <-r.done:
	}
	var zero T
	return zero, false
}

// until asks pending, on the runner's goroutine, every wait until it
// answers false, ctx ends or the runner stops. It reports whether pending
// answered false.
func (r *Runner) until(ctx context.Context, wait time.Duration, pending func() bool) bool {
	for {
		more, ok := ask(ctx, r, pending)
		if !ok {
			return false
		}
		if !more {
			return true
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		case <-r.done:
			t.Stop()
			return false
		}
	}
}

func (r *Runner) do(fn func()) {
	select {
	case r.ctl <- fn:
	case <-r.done:
	}
}

// Run runs the member until ctx ends. The caller owns the goroutine and
// waits for Run to return.
func (r *Runner) Run(ctx context.Context) {
	defer close(r.done)
	t := time.NewTicker(r.tick)
	defer t.Stop()
	poke := make(chan struct{}, 1)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.carry(r.m.Tick(r.mono()))
		case b := <-r.in:
			msg := &pb.Message{}
			switch {
			case proto.Unmarshal(b, msg) != nil:
			case r.from != nil && !r.from(msg.GetFrom()):
				r.refused.Add(1)
			default:
				r.carry(r.m.Step(msg, r.mono()))
			}
		case fn := <-r.ctl:
			fn()
		case <-poke:
			r.carry(r.m.Poke(r.mono()))
		}
		if r.m.Poked() && len(r.in) == 0 && len(r.ctl) == 0 {
			// Caught up, and something changed: the machine's next steps
			// now rather than at the next tick, taken as an event of
			// their own (a poke's commits may call for another).
			select {
			case poke <- struct{}{}:
			default:
			}
		}
	}
}

// carry empties partitions granted here, publishes what the machine now
// allows (waiting out, under each changed partition's gate, decisions on
// partitions it no longer allows), then starts copies and sends messages.
// A Reset comes first: it is for a partition this member did not hold, so
// no decision is on it, and a decision allowed by the new snapshot must
// never land on a store the Reset then replaces.
func (r *Runner) carry(out Output) {
	if out.Proposed > 0 {
		r.proposed.Add(uint64(out.Proposed))
	}
	if out.ConfChanges > 0 {
		r.confChanges.Add(uint64(out.ConfChanges))
	}
	if out.Applied > 0 {
		r.applied.Add(uint64(out.Applied))
	}
	for _, a := range out.Actions {
		if a.Kind == ownership.Reset {
			g := r.gates(a.P)
			g.Lock()
			r.data.Reset(a.P)
			g.Unlock()
		}
	}
	own := r.m.Own()
	now := r.mono()
	// The snapshot is built in scratch memory and published only when it
	// changed: most calls (heartbeats, ticks) change nothing. Its
	// partitions are rebuilt only when something they come from changed
	// (the machine's Gen); otherwise it shares the last snapshot's, which
	// nobody writes again once published.
	next := &r.scratch
	next.until, next.leaderless = own.LiveUntil(), 0
	next.voters, _ = r.m.Voters(1)
	next.voter = r.m.Voter()
	next.lead = int64(r.m.Lead())
	switch {
	case next.lead != 0:
	case r.prev.leaderless != 0:
		next.leaderless = r.prev.leaderless
	default:
		next.leaderless = now
	}
	changed := next.until != r.prev.until || next.voters != r.prev.voters || next.voter != r.prev.voter || next.lead != r.prev.lead
	rebuilt := false
	if gen := own.Gen(); r.built && gen == r.gen {
		next.parts = r.prev.parts
	} else {
		r.gen, r.built, rebuilt = gen, true, true
		if r.parts == nil {
			r.parts = make([]PartState, len(r.prev.parts))
		}
		next.parts = r.parts
		prev := r.prev.parts
		// May with the lease left out: readers check it with their own now.
		own.Standings(min(now, next.until-1), func(p int, pt *ownership.Partition, s ownership.Standing) {
			st := &next.parts[p]
			*st = PartState{Holder: pt.Holder, Epoch: pt.Epoch, Backup: pt.Backup, Have: s.Have, May: s.May, Held: s.Held, Backed: s.Backed}
			changed = changed || *st != prev[p]
		})
	}
	if changed {
		pub := new(published)
		*pub = *next
		if rebuilt {
			r.parts = nil // published: never written again
		}
		r.pub.Store(pub)
		// Unless rebuilt, the partitions are the last snapshot's.
		for p := range pub.parts {
			if rebuilt && pub.parts[p] != r.prev.parts[p] {
				// A decision that read the old snapshot finishes before
				// the partition is copied or handed on.
				g := r.gates(p)
				g.Lock()
				r.data.Publish(p, pub.parts[p])
				g.Unlock()
			}
		}
		r.prev = pub
	}
	for _, a := range out.Actions {
		if a.Kind == ownership.SendCopy {
			g := r.gates(a.P)
			g.Lock()
			r.data.SendCopy(a)
			g.Unlock()
		}
	}
	for _, msg := range out.Messages {
		b, err := proto.Marshal(msg)
		if err != nil {
			continue
		}
		r.tr.Send(msg.GetTo(), b)
		if msg.GetType() == pb.MsgSnap {
			// The transport sends a message whole or not at all; a lost
			// snapshot is asked for again by the follower's reply.
			r.carry(r.m.ReportSnapshot(msg.GetTo(), true, r.mono()))
		}
	}
}
