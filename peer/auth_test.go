package peer

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/peerpb"

	"github.com/ringlimit/ringlimit/peer/internal/transport"
)

// openMetrics records PeerRPCOpen.
type openMetrics struct {
	nopMetrics
	open chan bool
}

func (m *openMetrics) PeerRPCOpen(open bool) { m.open <- open }

func dialTest(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestAuthPeerRPCs runs a cluster with a gossip key: peers forward to each
// other, while an outside client without the token, or with a wrong one,
// is refused every peer RPC and changes nothing. The public API and
// health stay open.
func TestAuthPeerRPCs(t *testing.T) {
	pols := map[string]PolicyConfig{"p": {Limit: 3, Window: time.Minute}}
	c := startCluster(t, 2, Config{Policies: pols, GossipKey: []byte("0123456789abcdef")})
	n0, n1 := c.nodes[0], c.nodes[1]
	key := pmKeyOwnedBy(t, n0, "p", "n1")
	if d, err := n0.Allow(context.Background(), Request{Key: key}); err != nil || d.Owner != "n1" || d.Remaining != 2 {
		t.Fatalf("forwarded Allow between peers with the key = %+v, %v; want admitted by n1 with 2 remaining", d, err)
	}
	stranger := dialTest(t, n1.RPCAddr())
	lim := peerpb.NewLimiterClient(stranger)
	wireKey := &peerpb.Key{Tenant: key.Tenant, Subject: key.Subject, Policy: key.Policy}
	other := pmKeyOwnedBy(t, n0, "p", "n1")
	other.Subject += "-handed"
	for _, tc := range []struct {
		name  string
		token string
		want  codes.Code
	}{
		{"no token", "", codes.Unauthenticated},
		{"wrong token", "00ff", codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if tc.token != "" {
				ctx = metadata.AppendToOutgoingContext(ctx, transport.TokenKey, tc.token)
			}
			_, err := lim.Check(ctx, &peerpb.CheckRequest{Sender: "n0", Items: []*peerpb.CheckItem{{Key: wireKey, Hits: 2}}})
			if got := status.Code(err); got != tc.want {
				t.Fatalf("Limiter/Check = %v, want %v", err, tc.want)
			}
			_, err = lim.Replicate(ctx, &peerpb.ReplicateRequest{Sender: "n0", Ops: []*peerpb.PartitionOp{{
				Kind: peerpb.PartitionOp_KIND_SYNC_BEGIN, Partition: 0, Epoch: 1 << 40,
			}}})
			if got := status.Code(err); got != tc.want {
				t.Fatalf("Limiter/Replicate = %v, want %v", err, tc.want)
			}
			if runs, _ := n1.ExportForTest(key); len(runs) != 1 || runs[0].Count != 1 {
				t.Fatalf("n1's log of the key after refused calls = %v, want the one peer admission", runs)
			}
			if runs, ok := n1.ExportForTest(other); ok {
				t.Fatalf("n1 holds the refused handoff's key: %v", runs)
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if r, err := peerpb.NewRateLimiterClient(stranger).Allow(ctx, &peerpb.AllowRequest{Key: wireKey}); err != nil || !r.GetAllowed() {
		t.Fatalf("public RateLimiter/Allow without a token = %v, %v; want admitted", r, err)
	}
	// Health answers without a token (SERVING once the node is ready:
	// partitions may still be moving a moment after the calls above).
	waitFor(t, 10*time.Second, "a health check without a token answering SERVING", func() bool {
		r, err := healthpb.NewHealthClient(stranger).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("health check without a token: %v", err)
		}
		return r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
}

// TestAuthOpenWarns checks that a node without secret or mutual TLS serves
// peer RPCs to anyone, but says so: a startup warning and the metric.
func TestAuthOpenWarns(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		open bool
	}{
		{"no secret", Config{}, true},
		{"peer secret", Config{PeerSecret: []byte("s3cret")}, false},
		{"gossip key", Config{GossipKey: []byte("0123456789abcdef")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tap, log := newLogTap(t)
			warned := tap.on("peer RPCs are not authenticated: anyone who reaches the gRPC port can decide, hand off and read limiter state; set Config.PeerSecret (or GossipKey), or require client certificates", nil)
			m := &openMetrics{open: make(chan bool, 1)}
			cfg := tc.cfg
			cfg.Logger, cfg.Metrics = log, m
			nd, err := New(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer nd.Close(context.Background())
			select {
			case got := <-m.open:
				if got != tc.open {
					t.Fatalf("PeerRPCOpen(%v), want %v", got, tc.open)
				}
			default:
				t.Fatal("PeerRPCOpen was not reported")
			}
			select {
			case <-warned:
				if !tc.open {
					t.Fatal("warned about open peer RPCs although they are authenticated")
				}
			default:
				if tc.open {
					t.Fatal("no warning about open peer RPCs")
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err = peerpb.NewLimiterClient(dialTest(t, nd.RPCAddr())).Check(ctx, &peerpb.CheckRequest{Sender: "x"})
			if open := status.Code(err) != codes.Unauthenticated; open != tc.open {
				t.Fatalf("Limiter/Check without a token = %v; open = %v, want %v", err, open, tc.open)
			}
		})
	}
}

// TestTLSWithoutGossipKeyWarns checks the start-up warning for a node
// whose gRPC has TLS but whose gossip has no key (issue 53 item 4: a
// stranger joined memberlist and was placed on the ring), and its absence
// once a key is set.
func TestTLSWithoutGossipKeyWarns(t *testing.T) {
	server, client, _ := testMutualTLS(t)
	for _, tc := range []struct {
		name string
		key  []byte
		warn bool
	}{{"no gossip key", nil, true}, {"gossip key", []byte("0123456789abcdef"), false}} {
		t.Run(tc.name, func(t *testing.T) {
			tap, log := newLogTap(t)
			warned := tap.on("gossip is not encrypted: TLS secures gRPC, not gossip; anyone who reaches the gossip port can join the member list; set Config.GossipKey (serve --gossip-key)", nil)
			nd, err := New(context.Background(), Config{ServerTLS: server, ClientTLS: client, GossipKey: tc.key, Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			defer nd.Close(context.Background())
			select {
			case <-warned:
				if !tc.warn {
					t.Fatal("warned about unencrypted gossip although a key is set")
				}
			default:
				if tc.warn {
					t.Fatal("no warning about unencrypted gossip under TLS")
				}
			}
		})
	}
}

// TestAuthorizeReset checks that Config.AuthorizeReset guards the public
// RateLimiter.Reset (it used to answer anyone who reached the port): a
// refused call resets nothing and gets the hook's status, or
// PermissionDenied for a plain error; the other public calls and the
// in-process Node.Reset are not asked.
func TestAuthorizeReset(t *testing.T) {
	pols := map[string]PolicyConfig{"p": {Limit: 3, Window: time.Minute}}
	c := startCluster(t, 1, Config{Policies: pols, AuthorizeReset: func(ctx context.Context) error {
		switch v := metadata.ValueFromIncomingContext(ctx, "authorization"); {
		case len(v) == 1 && v[0] == "Bearer right":
			return nil
		case len(v) == 0:
			return status.Error(codes.Unauthenticated, "reset needs a token")
		}
		return errors.New("wrong token")
	}})
	n := c.nodes[0]
	rl := peerpb.NewRateLimiterClient(dialTest(t, n.RPCAddr()))
	key := &peerpb.Key{Tenant: "t", Subject: "s", Policy: "p"}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for range 3 {
		if r, err := rl.Allow(ctx, &peerpb.AllowRequest{Key: key}); err != nil || !r.GetAllowed() {
			t.Fatalf("Allow = %v, %v; want admitted (Allow is not guarded)", r, err)
		}
	}
	for _, tc := range []struct {
		name  string
		token string
		want  codes.Code
	}{
		{"no token", "", codes.Unauthenticated},
		{"wrong token", "Bearer wrong", codes.PermissionDenied},
	} {
		cctx := ctx
		if tc.token != "" {
			cctx = metadata.AppendToOutgoingContext(ctx, "authorization", tc.token)
		}
		if _, err := rl.Reset(cctx, &peerpb.AllowRequest{Key: key}); status.Code(err) != tc.want {
			t.Fatalf("Reset with %s = %v, want %v", tc.name, err, tc.want)
		}
		if r, err := rl.Peek(ctx, &peerpb.AllowRequest{Key: key}); err != nil || r.GetRemaining() != 0 {
			t.Fatalf("Peek after a refused Reset (%s) = %v, %v; want 0 remaining (nothing reset)", tc.name, r, err)
		}
	}
	if r, err := rl.Reset(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer right"), &peerpb.AllowRequest{Key: key}); err != nil || r.GetRemaining() != 3 {
		t.Fatalf("Reset with the right token = %v, %v; want the key empty (3 remaining)", r, err)
	}
	if d, err := n.Reset(ctx, Key{Tenant: "t", Subject: "s", Policy: "p"}); err != nil || d.Remaining != 3 {
		t.Fatalf("in-process Node.Reset = %+v, %v; want done without the hook", d, err)
	}
}
