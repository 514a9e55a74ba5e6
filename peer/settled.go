package peer

import (
	"context"
	"fmt"
	"time"
)

// WaitSettled waits until every node in nodes lists exactly len(nodes)
// members and is Settled, and stays so for stable (zero means at once),
// or until ctx ends. It returns nil, or ctx's error wrapped with how many
// nodes had not settled. Ownership has no change signal, so it checks
// every 5 ms; it is meant for tests, benchmarks and deploy scripts, not
// for the decision path. Safe for concurrent use.
func WaitSettled(ctx context.Context, nodes []*Node, stable time.Duration) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	var since time.Time
	for {
		unsettled := 0
		for _, nd := range nodes {
			if len(nd.Members()) != len(nodes) || !nd.Settled() {
				unsettled++
			}
		}
		switch {
		case unsettled > 0:
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
			if stable <= 0 {
				return nil
			}
		case time.Since(since) >= stable:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("peer: %d of %d nodes not settled: %w", unsettled, len(nodes), ctx.Err())
		case <-tick.C:
		}
	}
}
