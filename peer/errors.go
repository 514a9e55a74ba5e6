package peer

import (
	"errors"
	"fmt"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
)

// capacityError is a request's error when its key's holder has no room for
// a new key: ErrCapacity and ErrUnavailable, with the store's cause. Its
// message starts with ErrCapacity's text, which is how it crosses a
// forward (fromWire).
type capacityError struct{ cause error }

func (e *capacityError) Error() string {
	return ErrCapacity.Error() + ": the key's holder has no room for a new key (keys it holds are still decided)"
}

func (e *capacityError) Unwrap() []error { return []error{ErrCapacity, ErrUnavailable, e.cause} }

// The errors a decision can return are internal/partition's very values,
// so errors.Is matches them whichever package wrapped them.
var (
	// ErrUnavailable is returned by Allow when the key's owner could not be
	// reached in time and the policy fails closed. It is never "over limit":
	// the limiter could not decide. When the request was sent to the owner
	// and no answer came in time (the error then also wraps
	// context.DeadlineExceeded), the owner may have admitted it: it then
	// counts against the quota, so the limit still holds, but the caller
	// cannot know that unit was spent.
	ErrUnavailable = partition.ErrUnavailable
	// ErrClosed is returned by Allow after Close has started. A call
	// that was in flight when Close stopped the node may have been
	// decided (its forward sent, its admission made): like
	// ErrUnavailable, its outcome is unknown.
	ErrClosed = errors.New("peer: node closed")
	// ErrInvalidConfig is wrapped by every problem New finds in a Config.
	ErrInvalidConfig = errors.New("peer: invalid config")
	// ErrInvalidKey is returned when a key part is empty, too long or has a
	// character outside visible ASCII. It wraps shard.ErrInvalidKey's cause.
	ErrInvalidKey = partition.ErrInvalidKey
	// ErrUnknownPolicy is returned when the request names a policy that is
	// not in the node's policy table.
	ErrUnknownPolicy = errors.New("peer: unknown policy")
	// ErrInvalidHits is returned when hits is negative or exceeds the
	// policy's limit (it could never be admitted).
	ErrInvalidHits = partition.ErrInvalidHits
	// ErrWrongAlgorithm is returned when an operation does not apply to the
	// policy's algorithm: Allow, a multi-policy check or Refund on a
	// concurrency policy (use Acquire and Release), or Acquire or Release
	// on any other policy.
	ErrWrongAlgorithm = partition.ErrWrongAlgorithm
	// ErrCapacity is returned when the key's holder has no room for a new
	// key (Config.Store.MaxKeys; serve's --max-keys): keys it holds are
	// still decided. The error also wraps ErrUnavailable (the limiter
	// could not decide), so the policy's OnUnavailable applies: fail
	// closed returns it, fail open admits. It is never over limit.
	ErrCapacity = errors.New("peer: key capacity reached")
	// ErrDuplicateName is returned by New when another live member already
	// uses the node's name.
	ErrDuplicateName = errors.New("peer: duplicate member name")
	// errNotOwner is the receiver's answer when its ring view says another
	// node owns the key; it never leaves the package.
	errNotOwner = errors.New("peer: not owner")
	// errMoving: the holder waited for the partition's move and decided
	// nothing.
	errMoving = errors.New("peer: partition moving")
)

// notOwnerError is a receiver's "not owner" answer, with the member it
// believes holds the partition and that holder's epoch (0 when it only
// names its ring's target).
type notOwnerError struct {
	owner string
	epoch uint64
}

func (e *notOwnerError) Error() string {
	return fmt.Sprintf("peer: not owner (holder %q, epoch %d)", e.owner, e.epoch)
}
func (e *notOwnerError) Unwrap() error { return errNotOwner }
