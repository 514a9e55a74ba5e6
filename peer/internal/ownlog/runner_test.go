package ownlog

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"go.uber.org/goleak"

	"github.com/ringlimit/ringlimit/peer/internal/ownership"
)

// memNet delivers raft messages between runners of one process; a
// stopped member's messages are dropped both ways.
type memNet struct {
	mu      sync.Mutex
	runners map[uint64]*Runner
	stopped map[uint64]bool
}

func (n *memNet) runner(id uint64) (*Runner, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.runners[id], n.stopped[id]
}

type memTransport struct {
	net  *memNet
	from uint64
}

func (t memTransport) Send(to uint64, msg []byte) {
	r, down := t.net.runner(to)
	if _, self := t.net.runner(t.from); r != nil && !down && !self {
		r.Receive(msg)
	}
}

// memData copies nothing (these tests check ownership, not state): a copy
// is offered to its receiver and acknowledged at once.
type memData struct {
	net  *memNet
	self *Runner
	from uint64
	id   string
	ids  map[string]uint64
}

func (d *memData) SendCopy(a ownership.Action) {
	to, down := d.net.runner(d.ids[a.To])
	if _, self := d.net.runner(d.from); to == nil || down || self {
		return
	}
	go func() { // never block the sender's goroutine on the receiver's
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if to.OfferCopy(ctx, a.P, d.id, a.Epoch, a.Seq) {
			d.self.CopyAcked(a.P, a.To, a.Epoch, a.Seq)
		}
	}()
}

func (d *memData) Reset(int)              {}
func (d *memData) Publish(int, PartState) {}

// harness runs n members on real time with a 1 s liveness; transport
// gives member i's raft transport (nil: the in-memory one).
type harness struct {
	t        *testing.T
	n, parts int
	net      *memNet
	names    []string
	roster   []Peer
	start    time.Time
	liveness time.Duration
}

func (h *harness) mono() int64 { return int64(time.Since(h.start)) }

func startHarness(t *testing.T, n, parts int, transport func(i uint64, r func() *Runner) Transport) *harness {
	t.Helper()
	h := &harness{t: t, n: n, parts: parts, net: &memNet{runners: map[uint64]*Runner{}, stopped: map[uint64]bool{}}, start: time.Now(), liveness: time.Second}
	cs := &pb.ConfState{}
	ids := map[string]uint64{}
	for i := 1; i <= n; i++ {
		cs.Voters = append(cs.Voters, uint64(i))
		h.names = append(h.names, fmt.Sprintf("m%d", i))
		ids[h.names[i-1]] = uint64(i)
		h.roster = append(h.roster, Peer{RaftID: uint64(i), Member: h.names[i-1]})
	}
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); wg.Wait() })
	for i := uint64(1); i <= uint64(n); i++ {
		m, err := New(Config{RaftID: i, Ownership: ownership.Config{ID: h.names[i-1], Liveness: h.liveness}, Partitions: parts, Bootstrap: cs})
		if err != nil {
			t.Fatal(err)
		}
		d := &memData{net: h.net, from: i, id: h.names[i-1], ids: ids}
		var tr Transport = memTransport{net: h.net, from: i}
		var r *Runner
		if transport != nil {
			tr = transport(i, func() *Runner { return r })
		}
		r = NewRunner(m, tr, d, 20*time.Millisecond, h.mono, nil)
		d.self = r
		h.net.mu.Lock()
		h.net.runners[i] = r
		h.net.mu.Unlock()
		wg.Add(1)
		go func() { defer wg.Done(); r.Run(ctx) }()
	}
	h.view(h.names)
	return h
}

func (h *harness) view(live []string) {
	v := ownership.View{Members: live, Target: make([]string, h.parts), Second: make([]string, h.parts)}
	for p := range h.parts {
		v.Target[p], v.Second[p] = live[p%len(live)], live[(p+1)%len(live)]
	}
	for i := uint64(1); i <= uint64(h.n); i++ {
		r, _ := h.net.runner(i)
		r.SetView(v, h.roster)
	}
}

// stop cuts member i off from every other, both ways.
func (h *harness) stop(i uint64) {
	h.net.mu.Lock()
	h.net.stopped[i] = true
	h.net.mu.Unlock()
}

// waitFor polls cond every 5 ms until it holds or d passes; fatal
// failures inside cond end the test at once.
func (h *harness) waitFor(what string, d time.Duration, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			for i := uint64(1); i <= uint64(h.n); i++ {
				r, _ := h.net.runner(i)
				tb, _ := r.Table(ctx)
				h.t.Logf("m%d: published %+v, table %+v", i, r.pub.Load().parts, tb)
			}
			h.t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		<-tick.C
	}
}

// oneDecider reports whether every partition has exactly one decider
// among the members not in skip, and fails the test at once if any has
// two.
func (h *harness) oneDecider(skip uint64) bool {
	ok := true
	for p := range h.parts {
		c := 0
		for i := uint64(1); i <= uint64(h.n); i++ {
			if r, _ := h.net.runner(i); i != skip && r.MayDecide(p, h.mono()) {
				c++
			}
		}
		if c > 1 {
			h.t.Fatalf("p%d has %d deciders", p, c)
		}
		ok = ok && c == 1
	}
	return ok
}

func (h *harness) backedUp() bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, _ := h.net.runner(1)
	tb, ok := r.Table(ctx)
	for _, pt := range tb.Parts {
		ok = ok && pt.Backup != ""
	}
	return ok
}

// takeover is the scene both transports play: every partition gets one
// decider and a backup; one member is cut off; the others decide for its
// partitions once its liveness has expired, never two at once.
func takeover(t *testing.T, h *harness, cut func()) {
	h.waitFor("every partition to have one decider", 20*time.Second, func() bool { return h.oneDecider(0) })
	h.waitFor("every partition to have a backup", 20*time.Second, h.backedUp)
	cut()
	h.stop(3)
	stopped := time.Now()
	h.view(h.names[:2])
	h.waitFor("m3's partitions to be taken over", 20*time.Second, func() bool { return h.oneDecider(3) })
	t.Logf("partitions decided again %v after m3 was cut off (liveness %v)", time.Since(stopped).Round(time.Millisecond), h.liveness)
}

// TestRunnerTakeover plays the takeover on the in-memory network. No
// goroutine outlives the runners.
func TestRunnerTakeover(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // registered first: runs after every other cleanup
	h := startHarness(t, 3, 6, nil)
	takeover(t, h, func() {})
	checkTraffic(t, h, false)
}

// checkTraffic checks that every runner counted its proposals and the
// commands it applied and, with a counting transport (msgs), its
// messages and their bytes.
func checkTraffic(t *testing.T, h *harness, msgs bool) {
	t.Helper()
	var proposals, applied uint64
	for i := uint64(1); i <= uint64(h.n); i++ {
		r, _ := h.net.runner(i)
		tr := r.Traffic()
		t.Logf("m%d traffic %+v", i, tr)
		proposals += tr.Proposals
		applied += tr.Applied
		if tr.Applied == 0 {
			t.Errorf("m%d: Applied = 0 after the takeover", i)
		}
		if msgs && (tr.MsgsSent == 0 || tr.BytesSent <= tr.MsgsSent) {
			t.Errorf("m%d: %d messages sent, %d bytes: want some, of more than a byte each", i, tr.MsgsSent, tr.BytesSent)
		}
		if !msgs && tr.MsgsSent+tr.BytesSent != 0 {
			t.Errorf("m%d: %d messages, %d bytes counted by a transport that does not count", i, tr.MsgsSent, tr.BytesSent)
		}
	}
	// Every member extends its liveness, and the leader grants every
	// partition: more commands than members were proposed.
	if proposals < uint64(h.n) {
		t.Errorf("%d proposals counted, want at least %d", proposals, h.n)
	}
	// Each member applies what was committed, so at most about n times
	// the proposals (a proposal lost in an election is never applied).
	if applied > uint64(h.n)*proposals {
		t.Errorf("%d applied, more than %d members × %d proposals", applied, h.n, proposals)
	}
}

// TestRunnerCountsShed: messages received while the runner's queue is full
// are dropped, and counted (Traffic.MsgsShed), never silently.
func TestRunnerCountsShed(t *testing.T) {
	m, err := New(Config{RaftID: 1, Ownership: ownership.Config{ID: "m1", Liveness: time.Second}, Partitions: 4,
		Bootstrap: &pb.ConfState{Voters: []uint64{1}}})
	if err != nil {
		t.Fatal(err)
	}
	r := NewRunner(m, nil, nil, 20*time.Millisecond, func() int64 { return 1 }, nil)
	// Not running: nothing reads the queue.
	for i := 0; i < cap(r.in)+3; i++ {
		r.Receive([]byte{byte(i)})
	}
	if got := r.Traffic().MsgsShed; got != 3 {
		t.Fatalf("MsgsShed = %d after %d messages into a queue of %d, want 3", got, cap(r.in)+3, cap(r.in))
	}
}

// TestRunnerActsBetweenTicks: what a commit makes possible is proposed as
// soon as the runner has caught up, not at the next tick. A founder on a
// tick of an hour still joins, extends its liveness and is granted every
// partition (each a commit that enables the next), from the view it is
// given alone.
func TestRunnerActsBetweenTicks(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	const parts = 4
	start := time.Now()
	mono := func() int64 { return int64(time.Since(start)) }
	m, err := New(Config{RaftID: 1, Ownership: ownership.Config{ID: "m1", Liveness: time.Minute}, Partitions: parts,
		Bootstrap: &pb.ConfState{Voters: []uint64{1}}})
	if err != nil {
		t.Fatal(err)
	}
	net := &memNet{runners: map[uint64]*Runner{}, stopped: map[uint64]bool{}}
	d := &memData{net: net, from: 1, id: "m1", ids: map[string]uint64{"m1": 1}}
	r := NewRunner(m, memTransport{net: net, from: 1}, d, time.Hour, mono, nil)
	d.self = r
	net.runners[1] = r
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	v := ownership.View{Members: []string{"m1"}, Target: make([]string, parts), Second: make([]string, parts)}
	for p := range parts {
		v.Target[p] = "m1"
	}
	r.SetView(v, []Peer{{RaftID: 1, Member: "m1"}})
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	step := time.NewTicker(time.Millisecond)
	defer step.Stop()
	for p := 0; p < parts; p++ {
		for !r.MayDecide(p, mono()) {
			select {
			case <-deadline.C:
				t.Fatalf("partition %d not decidable by the founder %v after its view, with no tick yet: %+v", p, time.Since(start), r.Part(p))
			case <-step.C:
			}
		}
	}
}
