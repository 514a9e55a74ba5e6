package peer_test

import (
	"context"
	"fmt"
	"time"

	"github.com/ringlimit/ringlimit/peer"
)

// Example embeds a single node: start it, ask it for decisions, close it.
// A cluster differs only in Config (Name, reachable addresses, Join).
func Example() {
	ctx := context.Background()
	node, err := peer.New(ctx, peer.Config{
		Policies: map[string]peer.PolicyConfig{
			"login": {Limit: 2, Window: time.Minute},
		},
	})
	if err != nil {
		fmt.Println("start:", err)
		return
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := node.Close(closeCtx); err != nil {
			fmt.Println("close:", err)
		}
	}()

	// Build keys from authenticated identity, never from raw client input.
	key := peer.Key{Tenant: "acme", Subject: "alice", Policy: "login"}
	for range 3 {
		d, err := node.Allow(ctx, peer.Request{Key: key})
		if err != nil {
			// Unavailable, invalid input or closed: not "over limit".
			fmt.Println("allow:", err)
			return
		}
		fmt.Println(d.Allowed, d.Remaining, d.Reason)
	}
	// Output:
	// true 1 admitted
	// true 0 admitted
	// false 0 over_limit
}
