package bench

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer"
)

// BenchmarkHotKeySpread decides one hot key through every node of 3 and
// 5 (callers spread evenly over the nodes, 64 in all), with the policy's
// spread off (every decision at the key's holder, forwarded and batched)
// and auto (the nodes that do not hold it decide from rights): ops/s,
// p99 and msgs/op (messages between nodes per decision: forwarded
// batches, grant requests and replication messages). The limit is far
// above the load, so every decision is an admission; the saturated case
// (windows full, none over) is TestSpreadHotKey's.
func BenchmarkHotKeySpread(b *testing.B) {
	for _, n := range []int{3, 5} {
		for _, spread := range []peer.Spread{peer.SpreadOff, peer.SpreadAuto} {
			b.Run(fmt.Sprintf("nodes=%d/spread=%v", n, spread), func(b *testing.B) {
				msgs := &msgCounter{}
				nodes := startPeerClusterWith(b, n, func(cfg *peer.Config) {
					cfg.Metrics = msgs
					cfg.Policies = map[string]peer.PolicyConfig{
						peerPolicy: {Limit: 1 << 50, Window: time.Second, Resolution: 10 * time.Millisecond, Spread: spread},
					}
				})
				key := peer.Key{Tenant: "bench", Subject: "org-wide", Policy: peerPolicy}
				batches, repl := msgs.batches.Load(), msgs.repl.Load()
				runTimed(b, max(1, 64/runtime.GOMAXPROCS(0)), func(ctx context.Context, i int) error {
					d, err := nodes[i%n].Allow(ctx, peer.Request{Key: key})
					if err == nil && !d.Allowed {
						err = fmt.Errorf("decision %+v: want admitted", d)
					}
					return err
				})
				batches, repl = msgs.batches.Load()-batches, msgs.repl.Load()-repl
				b.ReportMetric(float64(batches+repl)/float64(b.N), "msgs/op")
			})
		}
	}
}
