package peer

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// TestRefundPastLimit replays issue 53's refund: after 5 admitted of 5 and
// a refusal, a refund of 2^63-1 units is refused as invalid hits, in
// process and over gRPC, and changes nothing (the next check is still
// refused); a refund of the limit itself still gives everything back.
func TestRefundPastLimit(t *testing.T) {
	t.Parallel()
	clk := &hoClock{}
	c := startCluster(t, 1, Config{Clock: clk.Now, Policies: map[string]PolicyConfig{"p": {Limit: 5, Window: time.Minute}}})
	nd := c.nodes[0]
	ctx := context.Background()
	k := Key{Tenant: "acme", Subject: "victim", Policy: "p"}
	for i := range 6 {
		clk.Advance(time.Millisecond)
		if d, err := nd.Allow(ctx, Request{Key: k}); err != nil || d.Allowed != (i < 5) {
			t.Fatalf("check %d: %+v, %v; want admitted for the first 5", i+1, d, err)
		}
	}
	rl := peerpb.NewRateLimiterClient(dialTest(t, nd.RPCAddr()))
	for _, tc := range []struct {
		name string
		hits int64
	}{{"max int64", math.MaxInt64}, {"limit+1", 6}} {
		t.Run(tc.name, func(t *testing.T) {
			if d, err := nd.Refund(ctx, Request{Key: k, Hits: tc.hits}); !errors.Is(err, ErrInvalidHits) {
				t.Fatalf("Node.Refund(%d) = %+v, %v; want ErrInvalidHits", tc.hits, d, err)
			}
			_, err := rl.Refund(ctx, &peerpb.AllowRequest{Key: &peerpb.Key{Tenant: k.Tenant, Subject: k.Subject, Policy: k.Policy}, Hits: tc.hits})
			if status.Code(err) != codes.InvalidArgument || !errors.Is(FromStatus(err), ErrInvalidHits) {
				t.Fatalf("gRPC Refund(%d) = %v; want InvalidArgument carrying ErrInvalidHits", tc.hits, err)
			}
			if d, err := nd.Peek(ctx, Request{Key: k}); err != nil || d.Allowed || d.Remaining != 0 {
				t.Fatalf("Peek after the refused refund = %+v, %v; want still refused, 0 remaining", d, err)
			}
		})
	}
	if d, err := nd.Refund(ctx, Request{Key: k, Hits: 5}); err != nil || !d.Allowed || d.Remaining != 5 {
		t.Fatalf("Refund of the limit = %+v, %v; want everything given back, 5 remaining", d, err)
	}
}

// TestRefundAuthorized checks Config.AuthorizeRefund on the public gRPC
// API: a refund without the credential is refused with the hook's status
// and gives nothing back; with it, the refund works; Node.Refund in
// process is not asked; and Reset keeps its own hook.
func TestRefundAuthorized(t *testing.T) {
	t.Parallel()
	var asked atomic.Int32 // the hook runs on the server's goroutines
	c := startCluster(t, 1, Config{
		Policies: map[string]PolicyConfig{"p": {Limit: 3, Window: time.Minute}},
		AuthorizeRefund: func(ctx context.Context) error {
			asked.Add(1)
			for _, v := range metadata.ValueFromIncomingContext(ctx, "authorization") {
				if v == "Bearer refund" {
					return nil
				}
			}
			return status.Error(codes.Unauthenticated, "refund needs the token")
		},
		AuthorizeReset: func(context.Context) error { return errors.New("no resets here") },
	})
	nd := c.nodes[0]
	ctx := context.Background()
	k := Key{Tenant: "acme", Subject: "s", Policy: "p"}
	wk := &peerpb.AllowRequest{Key: &peerpb.Key{Tenant: k.Tenant, Subject: k.Subject, Policy: k.Policy}}
	for range 3 {
		if d, err := nd.Allow(ctx, Request{Key: k}); err != nil || !d.Allowed {
			t.Fatalf("Allow: %+v, %v", d, err)
		}
	}
	rl := peerpb.NewRateLimiterClient(dialTest(t, nd.RPCAddr()))
	for _, tc := range []struct {
		name string
		md   []string
	}{{"no token", nil}, {"wrong token", []string{"authorization", "Bearer reset"}}} {
		if _, err := rl.Refund(metadata.AppendToOutgoingContext(ctx, tc.md...), wk); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("Refund with %s: %v, want Unauthenticated", tc.name, err)
		}
	}
	if d, err := nd.Peek(ctx, Request{Key: k}); err != nil || d.Allowed {
		t.Fatalf("Peek after refused refunds = %+v, %v; want still refused (nothing given back)", d, err)
	}
	if _, err := rl.Reset(ctx, wk); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Reset: %v, want PermissionDenied (its own hook)", err)
	}
	r, err := rl.Refund(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer refund"), wk)
	if err != nil || !r.GetAllowed() || r.GetRemaining() != 1 {
		t.Fatalf("Refund with the token = %v, %v; want 1 given back, 1 remaining", r, err)
	}
	if d, err := nd.Refund(ctx, Request{Key: k}); err != nil || !d.Allowed || d.Remaining != 2 {
		t.Fatalf("Node.Refund in process = %+v, %v; want 2 remaining", d, err)
	}
	if n := asked.Load(); n != 3 {
		t.Fatalf("AuthorizeRefund asked %d times, want 3 (the gRPC refunds only)", n)
	}
}
