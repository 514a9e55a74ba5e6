package peer

import (
	"context"
	"testing"
	"time"
)

// TestOverview: on a settled 3-node cluster every node's overview names
// the three members alive with their incarnations and live liveness
// records, one leader and a term, and every partition with a holder that
// is the ring's target; each holder, and only it, reports deciding and
// its keys.
func TestOverview(t *testing.T) {
	c := startCluster(t, 3, Config{Policies: map[string]PolicyConfig{"api": {Limit: 10, Window: time.Minute}}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	key := Key{Tenant: "acme", Subject: "alice", Policy: "api"}
	d, err := c.nodes[0].Allow(ctx, Request{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	var holderKeys int
	var leaders = map[string]bool{}
	for _, nd := range c.nodes {
		o := nd.Overview(ctx)
		if o.Name != nd.Name() || !o.Ready || o.Term == 0 || o.Leader == "" || o.LivenessLeft <= 0 || o.Applied == 0 {
			t.Errorf("%s: overview %+v; want ready, a term, a leader, liveness left and entries applied", nd.Name(), o)
		}
		leaders[o.Leader] = true
		if len(o.Members) != 3 {
			t.Fatalf("%s: %d members, want 3: %+v", nd.Name(), len(o.Members), o.Members)
		}
		for _, m := range o.Members {
			if m.Gossip != "alive" || m.Incarnation == "" || m.RPCAddr == "" || m.LivenessEpoch == 0 || m.LivenessEnded || m.Ignored != "" || m.PolicyVersion != o.PolicyVersion || m.GossipAddr == "" {
				t.Errorf("%s sees member %+v; want alive, with an incarnation, addresses, a live liveness record and its policy version, not ignored", nd.Name(), m)
			}
		}
		if len(o.Partitions) != nd.cfg.Ring.PartitionCount {
			t.Fatalf("%s: %d partitions, want every one of %d", nd.Name(), len(o.Partitions), nd.cfg.Ring.PartitionCount)
		}
		for _, p := range o.Partitions {
			mine := p.Holder == nd.Name()
			if p.Holder == "" || p.Holder != p.Target || p.Backup == "" || p.Deciding != mine || p.Fenced {
				t.Fatalf("%s: partition %+v; want held at its target with a backup, deciding only at its holder", nd.Name(), p)
			}
			if mine {
				holderKeys += p.Keys
			} else if p.Keys != 0 {
				t.Errorf("%s: partition %d held by %s counts %d keys here", nd.Name(), p.Partition, p.Holder, p.Keys)
			}
		}
	}
	if len(leaders) != 1 {
		t.Errorf("the nodes name leaders %v, want one", leaders)
	}
	if holderKeys != 1 {
		t.Errorf("the holders count %d keys in all, want 1 (%s's key, decided by %s)", holderKeys, key.Subject, d.Owner)
	}
}
