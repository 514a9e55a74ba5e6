package ownlog

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestGRPCTakeover plays the takeover with every raft message on real
// gRPC over 127.0.0.1: one server per member, GRPCTransport between them.
// The cut-off member's server stops, so its streams break both ways.
func TestGRPCTakeover(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // registered first: runs after every other cleanup
	const n = 3
	var mu sync.Mutex
	addrs := map[uint64]string{}
	servers := map[uint64]*grpc.Server{}
	var conns []*grpc.ClientConn
	var transports []*GRPCTransport
	t.Cleanup(func() {
		for _, tr := range transports {
			tr.Close()
		}
		for _, c := range conns {
			c.Close()
		}
		for _, s := range servers {
			s.Stop()
		}
	})
	listeners := map[uint64]net.Listener{}
	for i := uint64(1); i <= n; i++ {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		listeners[i], addrs[i] = lis, lis.Addr().String()
	}
	h := startHarness(t, n, 6, func(i uint64, runner func() *Runner) Transport {
		s := grpc.NewServer()
		Register(s, func(msg []byte) { runner().Receive(msg) }, nil)
		servers[i] = s
		lis := listeners[i]
		go func() { _ = s.Serve(lis) }()
		tr := NewGRPCTransport(func(ctx context.Context, to uint64) (grpc.ClientConnInterface, error) {
			mu.Lock()
			defer mu.Unlock()
			addr, ok := addrs[to]
			if !ok {
				return nil, fmt.Errorf("no address for %d", to)
			}
			c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err == nil {
				conns = append(conns, c)
			}
			return c, err
		})
		transports = append(transports, tr)
		return tr
	})
	// Cutting m3 off: its server stops and its own streams close.
	takeover(t, h, func() {
		mu.Lock()
		delete(addrs, 3)
		mu.Unlock()
		servers[3].Stop()
		transports[2].Close()
	})
	checkTraffic(t, h, true)
}
