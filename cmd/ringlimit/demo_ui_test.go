package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/ring"
)

// TestDemoUI: demo --ui's consoles, on an in-process cluster as the demo
// starts it: the first node's console shows every node, each console
// reached through the others' URLs, and the traffic the nodes decide.
func TestDemoUI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	names := []string{"u1", "u2", "u3"}
	ui, err := newDemoUI("127.0.0.1:0", names, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ui.close()
	// testPartitions rather than the demo's 271: what is checked is the
	// consoles' view of the nodes and their traffic, and each partition
	// is a move and a copy before the cluster settles.
	base := peer.Config{Policies: demoPolicies(), GossipProfile: peer.GossipFast, Logger: slog.New(slog.DiscardHandler),
		Ring: ring.Config{PartitionCount: testPartitions}}
	nodes, err := startClusterWith(ctx, names, base, ui.configure)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(nodes, 5*time.Second)
	if err := ui.serve(nodes); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if _, err := nodes[1].Allow(ctx, peer.Request{Key: peer.Key{Tenant: "acme", Subject: "alice", Policy: "api"}}); err != nil {
			t.Fatal(err)
		}
	}
	var cluster struct {
		Nodes []struct {
			Name    string `json:"name"`
			Traffic struct {
				Policies map[string][][3]uint64 `json:"policies"`
			} `json:"traffic"`
		} `json:"nodes"`
		Unreached []any `json:"unreached"`
	}
	waitFor(t, 10*time.Second, "the first console to show 3 nodes and u2's 20 decisions", func() bool {
		resp, err := http.Get(ui.urls[0] + "api/cluster")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		if json.NewDecoder(resp.Body).Decode(&cluster) != nil || len(cluster.Nodes) != 3 || len(cluster.Unreached) != 0 {
			return false
		}
		for _, n := range cluster.Nodes {
			var sum uint64
			for _, b := range n.Traffic.Policies["api"] {
				sum += b[0]
			}
			if n.Name == "u2" && sum == 20 {
				return true
			}
		}
		return false
	})
}
