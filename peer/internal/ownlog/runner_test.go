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

type memTransport struct {
	net  *memNet
	from uint64
}

func (t memTransport) Send(to uint64, msg []byte) {
	t.net.mu.Lock()
	r, down := t.net.runners[to], t.net.stopped[to] || t.net.stopped[t.from]
	t.net.mu.Unlock()
	if r != nil && !down {
		r.Receive(msg)
	}
}

// memData copies nothing (these tests check ownership, not state): a copy
// is offered to its receiver and acknowledged at once.
type memData struct {
	net  *memNet
	self *Runner
	id   string
	ids  map[string]uint64
}

func (d *memData) SendCopy(a ownership.Action) {
	d.net.mu.Lock()
	to, down := d.net.runners[d.ids[a.To]], d.net.stopped[d.ids[a.To]]
	d.net.mu.Unlock()
	if to == nil || down {
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

func (d *memData) Reset(int) {}

// TestRunnerTakeover runs three members on real time: every partition
// gets exactly one decider; when one member stops, the others take its
// partitions over once its liveness has expired, and never two decide at
// once. No goroutine outlives the runners.
func TestRunnerTakeover(t *testing.T) {
	defer goleak.VerifyNone(t)
	const n, parts = 3, 6
	liveness := 400 * time.Millisecond
	start := time.Now()
	mono := func() int64 { return int64(time.Since(start)) }
	net := &memNet{runners: map[uint64]*Runner{}, stopped: map[uint64]bool{}}
	cs := &pb.ConfState{Voters: []uint64{1, 2, 3}}
	ids := map[string]uint64{}
	var names []string
	for i := 1; i <= n; i++ {
		names = append(names, fmt.Sprintf("m%d", i))
		ids[names[i-1]] = uint64(i)
	}
	var roster []Peer
	for i, id := range names {
		roster = append(roster, Peer{RaftID: uint64(i + 1), Member: id})
	}
	ctxs := map[uint64]context.CancelFunc{}
	var wg sync.WaitGroup
	for i := 1; i <= n; i++ {
		m, err := New(Config{RaftID: uint64(i), Ownership: ownership.Config{ID: names[i-1], Liveness: liveness}, Partitions: parts, Bootstrap: cs})
		if err != nil {
			t.Fatal(err)
		}
		d := &memData{net: net, id: names[i-1], ids: ids}
		r := NewRunner(m, memTransport{net: net, from: uint64(i)}, d, 20*time.Millisecond, mono)
		d.self = r
		net.mu.Lock()
		net.runners[uint64(i)] = r
		net.mu.Unlock()
		ctx, cancel := context.WithCancel(context.Background())
		ctxs[uint64(i)] = cancel
		wg.Add(1)
		go func() { defer wg.Done(); r.Run(ctx) }()
	}
	defer func() {
		for _, c := range ctxs {
			c()
		}
		wg.Wait()
	}()
	view := func(live []string) {
		v := ownership.View{Members: live, Target: make([]string, parts), Second: make([]string, parts)}
		for p := range parts {
			v.Target[p], v.Second[p] = live[p%len(live)], live[(p+1)%len(live)]
		}
		for i := 1; i <= n; i++ {
			net.runners[uint64(i)].SetView(v, roster)
		}
	}
	view(names)
	deciders := func(p int, skip uint64) (c int) {
		for i := uint64(1); i <= n; i++ {
			if i != skip && net.runners[i].MayDecide(p, mono()) {
				c++
			}
		}
		return c
	}
	waitAll := func(what string, skip uint64, d time.Duration) {
		t.Helper()
		deadline := time.Now().Add(d)
		tick := time.NewTicker(5 * time.Millisecond) // polls the condition, bounded by the deadline
		defer tick.Stop()
		for {
			ok := true
			for p := range parts {
				c := deciders(p, skip)
				if c > 1 {
					t.Fatalf("p%d has %d deciders", p, c)
				}
				ok = ok && c == 1
			}
			if ok {
				return
			}
			if time.Now().After(deadline) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				for i := uint64(1); i <= n; i++ {
					tb, _ := net.runners[i].Table(ctx)
					t.Logf("m%d: may %v counters %+v", i, net.runners[i].pub.Load().may, net.runners[i].m.Own().Counters())
					t.Logf("m%d: live until %v (now %v), table %+v", i, time.Duration(net.runners[i].pub.Load().until), time.Duration(mono()), tb)
				}
				t.Fatalf("timed out after %v waiting for %s", d, what)
			}
			<-tick.C
		}
	}
	waitAll("every partition to have one decider", 0, 20*time.Second)
	waitBackups := func() {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			tb, ok := net.runners[1].Table(ctx)
			cancel()
			backed := ok
			for _, pt := range tb.Parts {
				backed = backed && pt.Backup != ""
			}
			if backed {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for every partition to have a backup: %+v", tb)
			}
			<-tick.C
		}
	}
	waitBackups()
	net.mu.Lock()
	net.stopped[3] = true
	net.mu.Unlock()
	stopped := time.Now()
	view(names[:2])
	waitAll("m3's partitions to be taken over", 3, 20*time.Second)
	t.Logf("partitions decided again %v after m3 stopped (liveness %v)", time.Since(stopped).Round(time.Millisecond), liveness)
}
