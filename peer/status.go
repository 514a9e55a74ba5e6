package peer

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// statusTable maps peer's sentinels to gRPC codes and back: one table for
// both directions. Over limit is never a status: it travels in the body.
var statusTable = []struct {
	err  error
	code codes.Code
}{
	{ErrInvalidKey, codes.InvalidArgument},
	{ErrInvalidHits, codes.InvalidArgument},
	{ErrUnknownPolicy, codes.NotFound},
	{ErrWrongAlgorithm, codes.InvalidArgument},
	{ErrClosed, codes.Unavailable},
	{ErrCapacity, codes.ResourceExhausted}, // before ErrUnavailable, which it wraps too
	{ErrUnavailable, codes.Unavailable},
	{errNotOwner, codes.FailedPrecondition},
}

// ToStatus converts an error from Allow into a gRPC status error carrying
// the matching code (Unavailable, ResourceExhausted for ErrCapacity,
// InvalidArgument, NotFound) and the message. The sentinel decides the code even when the error also wraps a
// gRPC status: a forward that timed out is ErrUnavailable wrapping the
// transport's DeadlineExceeded, and its caller must see Unavailable. An
// error that wraps no sentinel but is a status (an interceptor's
// Unauthenticated) keeps its code; any other error becomes codes.Internal.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	for _, e := range statusTable {
		if errors.Is(err, e.err) {
			return status.Error(e.code, err.Error())
		}
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Internal, err.Error())
}

// FromStatus converts a gRPC status error returned by the RateLimiter
// service back into an error wrapping the matching sentinel, for clients of
// a ringlimit server: Unavailable (and any transport failure) wraps
// ErrUnavailable, ResourceExhausted ErrCapacity (and ErrUnavailable),
// NotFound ErrUnknownPolicy, and InvalidArgument
// ErrWrongAlgorithm (an Allow or Refund of a concurrency policy, an Acquire
// or Release of another), ErrInvalidHits (hits beyond the policy's limit)
// or else ErrInvalidKey.
func FromStatus(err error) error {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return err
	}
	wrap := func(sentinel error) error {
		// The server's message usually starts with the same sentinel text.
		msg := strings.TrimPrefix(st.Message(), sentinel.Error()+": ")
		return fmt.Errorf("%w: %s", sentinel, msg)
	}
	switch st.Code() {
	case codes.InvalidArgument:
		// Three sentinels share the code, and the wire has no other field
		// for the difference (an AllowStreamResult is a code and a
		// message). A node's message starts with its sentinel's text:
		// ToStatus sends err.Error(), and each of these errors wraps its
		// sentinel first. The prefix is all that is read; a message with
		// neither is a bad key, as before.
		for _, sentinel := range [...]error{ErrWrongAlgorithm, ErrInvalidHits} {
			if strings.HasPrefix(st.Message(), sentinel.Error()+": ") {
				return wrap(sentinel)
			}
		}
		return wrap(ErrInvalidKey)
	case codes.NotFound:
		return wrap(ErrUnknownPolicy)
	case codes.ResourceExhausted:
		return &capacityError{cause: errors.New(st.Message())}
	case codes.OK:
		return nil
	default:
		return wrap(ErrUnavailable)
	}
}

func statusInvalid(msg string) error {
	return status.Error(codes.InvalidArgument, "peer: "+msg)
}
