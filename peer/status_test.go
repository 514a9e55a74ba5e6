package peer

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestToStatusSentinelWins: the sentinel an error wraps decides its gRPC
// code, even when a transport status is wrapped too (a forward that timed
// out used to reach a stream's caller as DeadlineExceeded, not
// Unavailable); a bare status keeps its code.
func TestToStatusSentinelWins(t *testing.T) {
	deadline := status.Error(codes.DeadlineExceeded, "context deadline exceeded")
	for _, tc := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{"unavailable wrapping a deadline status", fmt.Errorf("%w: forward to n1: %w: %w", ErrUnavailable, deadline, context.DeadlineExceeded), codes.Unavailable},
		{"invalid key wrapping a status", fmt.Errorf("%w: %w", ErrInvalidKey, status.Error(codes.Internal, "x")), codes.InvalidArgument},
		{"unknown policy", fmt.Errorf("%w: %q", ErrUnknownPolicy, "p"), codes.NotFound},
		{"closed", ErrClosed, codes.Unavailable},
		{"bare status", status.Error(codes.Unauthenticated, "no"), codes.Unauthenticated},
		{"wrapped bare status", fmt.Errorf("auth: %w", status.Error(codes.PermissionDenied, "no")), codes.PermissionDenied},
		{"plain error", errors.New("boom"), codes.Internal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := status.Code(ToStatus(tc.err)); got != tc.want {
				t.Fatalf("ToStatus(%v) has code %v; want %v", tc.err, got, tc.want)
			}
		})
	}
	if ToStatus(nil) != nil {
		t.Fatal("ToStatus(nil) is not nil")
	}
}
