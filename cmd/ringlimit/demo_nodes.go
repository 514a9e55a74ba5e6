package main

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/ringlimit/ringlimit/peer"
)

// ringVersions returns each node's ring version.
func ringVersions(nodes []*peer.Node) []uint64 {
	out := make([]uint64, len(nodes))
	for i, nd := range nodes {
		out[i] = nd.RingVersion()
	}
	return out
}

// keyOwnedBy finds a key tenant/subject-N/policy that node's ring places on
// owner.
func keyOwnedBy(node *peer.Node, owner, tenant, subject, policy string) (peer.Key, error) {
	for i := range 10000 {
		k := peer.Key{Tenant: tenant, Subject: fmt.Sprintf("%s-%d", subject, i), Policy: policy}
		if o, err := node.Owner(k); err == nil && o == owner {
			return k, nil
		}
	}
	return peer.Key{}, fmt.Errorf("no key owned by %s in 10000 tries", owner)
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// startCluster starts one node per name on 127.0.0.1 with ephemeral ports,
// the later ones joining the first, and waits until every node sees all of
// them. On error it closes what it started.
func startCluster(ctx context.Context, names []string, base peer.Config) ([]*peer.Node, error) {
	return startClusterWith(ctx, names, base, nil)
}

// startClusterWith is startCluster with each node's Config passed to each
// (when not nil) before the node starts.
func startClusterWith(ctx context.Context, names []string, base peer.Config, each func(*peer.Config)) ([]*peer.Node, error) {
	var nodes []*peer.Node
	for _, name := range names {
		cfg := base
		cfg.Name = name
		if each != nil {
			each(&cfg)
		}
		if len(nodes) > 0 {
			cfg.Join = []string{nodes[0].GossipAddr()}
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		nd, err := peer.New(sctx, cfg)
		cancel()
		if err != nil {
			closeAll(nodes, 2*time.Second)
			return nil, fmt.Errorf("start %s: %w", name, err)
		}
		nodes = append(nodes, nd)
	}
	err := waitUntil(ctx, time.Minute, fmt.Sprintf("every node to see %d members and hold its partitions", len(names)), func() bool {
		for _, nd := range nodes {
			if len(nd.Members()) != len(names) || !nd.Settled() {
				return false
			}
		}
		return true
	})
	if err != nil {
		closeAll(nodes, 2*time.Second)
		return nil, err
	}
	return nodes, nil
}

// closeAll closes nodes one after the other (each hands its keys to the
// next), bounded by timeout each.
func closeAll(nodes []*peer.Node, timeout time.Duration) {
	for _, nd := range nodes {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		_ = nd.Close(ctx)
		cancel()
	}
}

// waitUntil polls cond every 10 ms until it holds, ctx ends or timeout
// passes; the error names what did not happen.
func waitUntil(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-deadline.C:
			return fmt.Errorf("timed out after %v waiting for %s", timeout, what)
		case <-tick.C:
		}
	}
	return nil
}
