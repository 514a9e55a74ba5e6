package ownlog

import (
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
)

// TestKeepAliveAroundADeadRelay: a learner sends its keep-alives through
// a voter that relays them; when its relays never answer (a crashed
// voter that autopilot has not replaced yet), the learner's retries go to
// the leader itself, so its session, and its holdings, last.
func TestKeepAliveAroundADeadRelay(t *testing.T) {
	c := newClusterConf(t, 4, &pb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}})
	c.run(5 * time.Second)
	learner := c.members[4]
	lead := c.leader()
	rec := learner.Own().Table().Members[learner.Own().ID()]
	if rec == nil || !rec.Active || learner.Own().LiveUntil() <= c.now {
		t.Fatalf("the learner is not live after the founding: %+v, lease until %d at %d", rec, learner.Own().LiveUntil(), c.now)
	}
	epoch := rec.Epoch
	relayed, direct := 0, 0
	for end := c.now + int64(4*time.Second); c.now < end; c.now += int64(100 * time.Millisecond) {
		for id := uint64(1); id <= 4; id++ {
			c.carry(id, c.members[id].Tick(c.now))
		}
		for len(c.inbox) > 0 {
			msg := c.inbox[0]
			c.inbox = c.inbox[1:]
			if msg.GetFrom() == 4 && IsKeepAlive(msg) {
				if msg.GetTo() != lead {
					relayed++
					continue // every relay is dead to it
				}
				direct++
			}
			c.carry(msg.GetTo(), c.members[msg.GetTo()].Step(msg, c.now))
		}
	}
	if relayed == 0 || direct == 0 {
		t.Fatalf("%d keep-alives to relays, %d to the leader: want both", relayed, direct)
	}
	rec = c.members[lead].Own().Table().Members[learner.Own().ID()]
	if rec == nil || rec.Epoch != epoch || rec.Ended || learner.Own().LiveUntil() <= c.now {
		t.Fatalf("the learner's session lapsed while its relays were dead: record %+v (epoch was %d), lease until %d at %d", rec, epoch, learner.Own().LiveUntil(), c.now)
	}
}
