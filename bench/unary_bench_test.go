package bench

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// unarySink keeps the last unary answer alive.
var unarySink *peerpb.AllowResponse

// BenchmarkUnaryAllow measures the public gRPC RateLimiter.Allow, the path
// of a client in another language that calls any node: peerpb's generated
// client over a loopback connection to one node of a 3-node cluster
// (sync replication, the default), 10 000 keys. path=local: the receiving
// node holds every key (its decision still waits for the backup's copy);
// path=forwarded: another node holds them, so each call also crosses the
// peers' pipe. callers=1 is one call at a time (ns/op is its latency);
// callers=64 is issue 9's load through b.RunParallel, with runTimed's
// figures (ops/s, p50-ns, p99-ns, cpu-ns/op and mallocs/op, all of the
// process: client, receiver and holder).
func BenchmarkUnaryAllow(b *testing.B) {
	nodes := startPeerCluster(b, 3, true)
	via := nodes[0]
	conn, err := grpc.NewClient(via.RPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	cl := peerpb.NewRateLimiterClient(conn)
	for _, path := range []string{"local", "forwarded"} {
		local := path == "local"
		keys := peerKeys(b, via, 10000, func(owner string) bool { return (owner == via.Name()) == local })
		reqs := make([]*peerpb.AllowRequest, len(keys))
		for i, k := range keys {
			reqs[i] = &peerpb.AllowRequest{Key: &peerpb.Key{Tenant: k.Tenant, Subject: k.Subject, Policy: k.Policy}}
		}
		check := func(r *peerpb.AllowResponse) error {
			if !r.GetAllowed() || (r.GetOwner() == via.Name()) != local {
				return fmt.Errorf("answer %v: want admitted by the %s holder", r, path)
			}
			return nil
		}
		b.Run("path="+path+"/callers=1", func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			var r *peerpb.AllowResponse
			i := 0
			for b.Loop() {
				r, err = cl.Allow(ctx, reqs[i&(peerKeySlots-1)])
				if err != nil {
					b.Fatal(err)
				}
				if err := check(r); err != nil {
					b.Fatal(err)
				}
				i++
			}
			unarySink = r
			reportOpsPerSec(b)
		})
		b.Run("path="+path+"/callers=64", func(b *testing.B) {
			runTimed(b, max(1, 64/runtime.GOMAXPROCS(0)), func(ctx context.Context, i int) error {
				r, err := cl.Allow(ctx, reqs[i&(peerKeySlots-1)])
				if err != nil {
					return err
				}
				return check(r)
			})
		})
	}
}
