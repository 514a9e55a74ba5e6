package peer

import (
	"github.com/ringlimit/ringlimit/peer/internal/partition"

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

// TestFromStatusInvalidArgument: the three sentinels that share
// InvalidArgument come back from a node's status as the one it sent, and
// only that one (a concurrency policy's check used to read "invalid key").
func TestFromStatusInvalidArgument(t *testing.T) {
	all := []error{ErrInvalidKey, ErrInvalidHits, ErrWrongAlgorithm}
	for _, tc := range []struct {
		name string
		err  error
		want error
	}{
		{"wrong algorithm", partition.ErrNeedsLease("inflight"), ErrWrongAlgorithm},
		{"invalid hits", fmt.Errorf("%w: hits 6 exceed policy %q's limit 5", ErrInvalidHits, "p"), ErrInvalidHits},
		{"invalid key", fmt.Errorf("%w: tenant is empty", ErrInvalidKey), ErrInvalidKey},
		{"bare message", status.Error(codes.InvalidArgument, "bad input"), ErrInvalidKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := FromStatus(ToStatus(tc.err))
			for _, s := range all {
				if errors.Is(got, s) != (s == tc.want) {
					t.Fatalf("FromStatus(ToStatus(%q)) = %q: errors.Is(%v) = %v; want only %v", tc.err, got, s, errors.Is(got, s), tc.want)
				}
			}
		})
	}
}
