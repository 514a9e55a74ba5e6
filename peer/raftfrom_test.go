package peer

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/peer/internal/ownlog"
)

// TestRaftFromNonMemberDropped sends every member of a 3-node cluster a
// forged raft heartbeat from a raft ID no member has, with term 2^40
// (issue 53 item 5: the voters adopted the term, the leader stepped down,
// and 25 of 30 checks answered 503 for about a second). Each member drops
// it before raft sees it: the leader stays, and every member still
// decides at once.
func TestRaftFromNonMemberDropped(t *testing.T) {
	pols := map[string]PolicyConfig{"p": {Limit: 1000, Window: time.Minute}}
	c := startCluster(t, 3, Config{Policies: pols})
	byID := map[uint64]*Node{}
	for _, nd := range c.nodes {
		byID[nd.ops.start] = nd
	}
	var lead uint64
	waitFor(t, 15*time.Second, "every member to know the same leader, and to see every other member's raft ID", func() bool {
		lead = c.nodes[0].lo.run.Lead()
		for _, nd := range c.nodes {
			if l := nd.lo.run.Lead(); l == 0 || l != lead || len(nd.lo.peers.Load().raft) < len(c.nodes)-1 {
				return false
			}
		}
		return true
	})
	const forged uint64 = 0xdead_beef_0000_0001
	if byID[forged] != nil {
		t.Fatalf("a member has the forged raft ID %x", forged)
	}
	tr := ownlog.NewGRPCTransport(func(ctx context.Context, to uint64) (grpc.ClientConnInterface, error) {
		return dialTest(t, byID[to].RPCAddr()), nil
	})
	defer tr.Close()
	for id := range byID {
		msg := &pb.Message{Type: pb.MsgHeartbeat.Enum(), To: proto.Uint64(id), From: proto.Uint64(forged), Term: proto.Uint64(1 << 40)}
		b, err := proto.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		tr.Send(id, b)
	}
	waitForWhy(t, 10*time.Second, "every member to drop the forged heartbeat", func() bool {
		for _, nd := range c.nodes {
			if nd.lo.run.Refused() == 0 {
				return false
			}
		}
		return true
	}, func() string {
		s := ""
		for _, nd := range c.nodes {
			s += fmt.Sprintf("%s: refused %d, leader %x (was %x); ", nd.name, nd.lo.run.Refused(), nd.lo.run.Lead(), lead)
		}
		return s
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, nd := range c.nodes {
		if l := nd.lo.run.Lead(); l != lead {
			t.Errorf("%s: leader %x after the forged heartbeat, want %x still", nd.name, l, lead)
		}
		for i := range 10 {
			k := Key{Tenant: "t", Subject: fmt.Sprintf("s%d", i), Policy: "p"}
			if d, err := nd.Allow(ctx, Request{Key: k}); err != nil || !d.Allowed {
				t.Errorf("%s: Allow %s after the forged heartbeat = %+v, %v; want admitted", nd.name, k.Subject, d, err)
			}
		}
	}
}
