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
// send it (the driver calls CopyAcked when the receiver confirms), or
// empty one. Called from the Runner's goroutine, with the partition's
// gate held in write mode, so no decision is in flight on it; it must not
// block on the network (start the copy, return).
type Data interface {
	SendCopy(a ownership.Action)
	Reset(p int)
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
	gates []sync.RWMutex
	pub   atomic.Pointer[published]
	done  chan struct{}
	// prev is the last published snapshot, owned by the goroutine.
	prev *published
}

// published is what the decision path reads: which partitions this
// member may decide for, until when.
type published struct {
	until int64
	may   []bool
}

// NewRunner returns a runner of m. mono is the member's monotonic clock in
// ns; tick is the raft tick (the election timeout is Config.ElectionTicks
// of them). Call Run to start it.
func NewRunner(m *Member, tr Transport, data Data, tick time.Duration, mono func() int64) *Runner {
	r := &Runner{m: m, tr: tr, data: data, tick: tick, mono: mono,
		in: make(chan []byte, 1024), ctl: make(chan func(), 64),
		gates: make([]sync.RWMutex, m.cfg.Partitions), done: make(chan struct{})}
	r.prev = &published{may: make([]bool, m.cfg.Partitions)}
	r.pub.Store(r.prev)
	return r
}

// Gate returns partition p's gate: a decision holds it in read mode from
// MayDecide to the end of its store update.
func (r *Runner) Gate(p int) *sync.RWMutex { return &r.gates[p] }

// MayDecide reports whether this member may decide for p at now (its
// monotonic ns), from the last published snapshot.
func (r *Runner) MayDecide(p int, now int64) bool {
	s := r.pub.Load()
	return now < s.until && s.may[p]
}

// Receive hands an inbound raft message to the runner; when its queue is
// full the message is dropped (raft sends again).
func (r *Runner) Receive(msg []byte) {
	select {
	case r.in <- msg:
	default:
	}
}

// SetView passes a gossip view on, in order with other events.
func (r *Runner) SetView(v ownership.View, roster []Peer) {
	r.do(func() { r.m.SetView(v, roster) })
}

// CopyAcked tells the machine a copy was installed by its receiver.
func (r *Runner) CopyAcked(p int, to string, epoch, seq uint64) {
	r.do(func() { r.carry(r.m.CopyAcked(p, to, epoch, seq, r.mono())) })
}

// OfferCopy asks the machine whether a copy may be installed; it waits for
// the runner's answer (or ctx).
func (r *Runner) OfferCopy(ctx context.Context, p int, from string, epoch, seq uint64) bool {
	ans := make(chan bool, 1)
	r.do(func() { ans <- r.m.Own().OfferCopy(p, from, epoch, seq) })
	select {
	case ok := <-ans:
		return ok
	case <-ctx.Done():
		return false
	case <-r.done:
		return false
	}
}

// Table returns a copy of the applied table, for status pages and tests.
func (r *Runner) Table(ctx context.Context) (*ownership.Table, bool) {
	ans := make(chan *ownership.Table, 1)
	r.do(func() { ans <- r.m.Own().Table().Clone() })
	select {
	case t := <-ans:
		return t, true
	case <-ctx.Done():
		return nil, false
	case <-r.done:
		return nil, false
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
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.carry(r.m.Tick(r.mono()))
		case b := <-r.in:
			msg := &pb.Message{}
			if proto.Unmarshal(b, msg) == nil {
				r.carry(r.m.Step(msg, r.mono()))
			}
		case fn := <-r.ctl:
			fn()
		}
	}
}

// carry publishes what the machine now allows, waits out decisions on
// partitions it no longer allows, then carries out the output.
func (r *Runner) carry(out Output) {
	own := r.m.Own()
	now := r.mono()
	next := &published{until: own.LiveUntil(), may: make([]bool, len(r.gates))}
	for p := range next.may {
		// MayDecide with the lease left out: readers check it with their
		// own now.
		next.may[p] = own.MayDecide(p, min(now, next.until-1))
	}
	changed := next.until != r.prev.until
	for p := range next.may {
		changed = changed || next.may[p] != r.prev.may[p]
	}
	if changed {
		r.pub.Store(next)
		for p := range next.may {
			if r.prev.may[p] && !next.may[p] {
				// A decision that read the old snapshot finishes before
				// the partition is copied or handed on.
				r.gates[p].Lock()
				r.gates[p].Unlock() //nolint:staticcheck // an empty critical section: a barrier
			}
		}
		r.prev = next
	}
	for _, a := range out.Actions {
		switch a.Kind {
		case ownership.SendCopy:
			r.gates[a.P].Lock()
			r.data.SendCopy(a)
			r.gates[a.P].Unlock()
		case ownership.Reset:
			r.gates[a.P].Lock()
			r.data.Reset(a.P)
			r.gates[a.P].Unlock()
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
