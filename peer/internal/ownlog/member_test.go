package ownlog

import (
	"errors"
	"fmt"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/ringlimit/ringlimit/peer/internal/ownership"
)

// cluster is members wired to each other by an in-memory, lossless,
// in-order network: enough to test the glue; faults are the simulator's.
type cluster struct {
	t       *testing.T
	members map[uint64]*Member
	now     int64
	inbox   []*pb.Message
}

func newCluster(t *testing.T, n int) *cluster {
	t.Helper()
	c := &cluster{t: t, members: map[uint64]*Member{}}
	cs := &pb.ConfState{}
	for i := 1; i <= n; i++ {
		cs.Voters = append(cs.Voters, uint64(i))
	}
	var ids []string
	for i := 1; i <= n; i++ {
		ids = append(ids, fmt.Sprintf("m%d", i))
	}
	for i := 1; i <= n; i++ {
		m, err := New(Config{RaftID: uint64(i), Ownership: ownership.Config{ID: ids[i-1]}, Partitions: 4, Bootstrap: cs})
		if err != nil {
			t.Fatal(err)
		}
		var roster []Peer
		for j, id := range ids {
			roster = append(roster, Peer{RaftID: uint64(j + 1), Member: id})
		}
		m.SetView(ownership.View{Members: ids, Target: []string{ids[0], ids[1%n], ids[2%n], ids[0]}}, roster)
		c.members[uint64(i)] = m
	}
	return c
}

func (c *cluster) carry(from uint64, out Output) {
	for _, msg := range out.Messages {
		c.inbox = append(c.inbox, msg)
		if msg.GetType() == pb.MsgSnap {
			c.members[from].ReportSnapshot(msg.GetTo(), true, c.now)
		}
	}
	for _, a := range out.Actions {
		if a.Kind == ownership.SendCopy {
			to := c.byMember(a.To)
			if to.Own().OfferCopy(a.P, c.members[from].Own().ID(), a.Epoch, a.Seq) {
				c.carry(from, c.members[from].CopyAcked(a.P, a.To, a.Epoch, a.Seq, c.now))
			}
		}
	}
}

func (c *cluster) byMember(id string) *Member {
	for _, m := range c.members {
		if m.Own().ID() == id {
			return m
		}
	}
	c.t.Fatalf("no member %s", id)
	return nil
}

// run ticks every member every 100 ms of virtual time for d, delivering
// messages between ticks.
func (c *cluster) run(d time.Duration) {
	for end := c.now + int64(d); c.now < end; c.now += int64(100 * time.Millisecond) {
		for id := uint64(1); id <= uint64(len(c.members)); id++ {
			c.carry(id, c.members[id].Tick(c.now))
		}
		for len(c.inbox) > 0 {
			msg := c.inbox[0]
			c.inbox = c.inbox[1:]
			if to := c.members[msg.GetTo()]; to != nil {
				c.carry(msg.GetTo(), to.Step(msg, c.now))
			}
		}
	}
}

// TestFounding: three members elect a leader, join, extend their
// liveness, and every partition gets exactly one holder, which decides,
// with a backup; all members apply the same table.
func TestFounding(t *testing.T) {
	c := newCluster(t, 3)
	c.run(5 * time.Second)
	leaders := 0
	for _, m := range c.members {
		if m.Leader() {
			leaders++
		}
	}
	if leaders != 1 {
		t.Fatalf("%d leaders", leaders)
	}
	first := c.members[1].Own().Table()
	for p := range first.Parts {
		pt := first.Parts[p]
		deciders := 0
		for _, m := range c.members {
			if m.Own().MayDecide(p, c.now) {
				deciders++
			}
			if got := m.Own().Table().Parts[p]; got != pt {
				t.Errorf("p%d: %s applied %+v, %s %+v", p, m.Own().ID(), got, c.members[1].Own().ID(), pt)
			}
		}
		if pt.Holder == "" || pt.Backup == "" || deciders != 1 {
			t.Errorf("p%d: %+v, %d members decide", p, pt, deciders)
		}
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	for _, cfg := range []Config{{}, {RaftID: 1, Partitions: 4}, {RaftID: 1, Ownership: ownership.Config{ID: "a"}}} {
		if _, err := New(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("New(%+v): %v, want ErrConfig", cfg, err)
		}
	}
}
