package peer

import (
	"context"
	"fmt"
	"net"
)

// Join contacts the gossip addresses addrs (host:port) and joins their
// cluster, as the Join seeds are at start-up; it returns how many of them
// answered. Addresses of members this node already knows (by gossip
// address) are skipped, so calling it periodically with the same list
// (cmd/ringlimit re-resolves a DNS name every few seconds) contacts only
// newcomers; it returns 0 and nil when every address is known. It is for
// discovering members after start-up: a node that was never given seeds
// and joins another cluster this way merges with it as after a healed
// partition.
//
// Join makes one attempt and does not retry; it runs on the caller's
// goroutine and starts none. Each address costs at most one memberlist
// exchange, bounded by memberlist's TCPTimeout; ctx is checked before the
// attempt, not during it. The error, when no address answered, wraps
// memberlist's; after Close it is ErrClosed. Safe for concurrent use.
func (n *Node) Join(ctx context.Context, addrs []string) (int, error) {
	if n.closing.Load() {
		return 0, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("peer: join: %w", err)
	}
	// Copies taken in memberlist's callbacks: its own Node values are
	// rewritten by its goroutines (see membership.Queue.GossipAddrs).
	known := make(map[string]bool)
	for _, m := range n.gossiper.events.GossipAddrs() {
		known[net.JoinHostPort(m.Addr.String(), fmt.Sprint(m.Port))] = true
	}
	var fresh []string
	for _, a := range addrs {
		if !known[a] {
			fresh = append(fresh, a)
		}
	}
	if len(fresh) == 0 {
		return 0, nil
	}
	joined, err := n.gossiper.ml.Join(fresh)
	if err != nil {
		return joined, fmt.Errorf("peer: join %v: %w", fresh, err)
	}
	return joined, nil
}
