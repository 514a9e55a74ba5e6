package shard

import "errors"

var (
	// ErrTimeBackwards is returned by Limiter.Allow when now is earlier than
	// the latest time the limiter has already seen.
	ErrTimeBackwards = errors.New("shard: time moved backwards")
	// ErrInvalidHits is returned when a request's hits are not positive or
	// exceed the policy limit (such a request could never be admitted).
	ErrInvalidHits = errors.New("shard: invalid hits")
	// ErrInvalidPolicy is returned when a policy's limit, window, algorithm
	// or resolution is out of range.
	ErrInvalidPolicy = errors.New("shard: invalid policy")
	// ErrInvalidKey is returned when a key part is empty, too long or holds a
	// character outside the allowed set.
	ErrInvalidKey = errors.New("shard: invalid key")
	// ErrCapacity is returned when a new key would exceed Config.MaxKeys
	// after reclaiming expired keys; existing keys keep working.
	ErrCapacity = errors.New("shard: key capacity reached")
	// ErrInvalidMulti is returned by Store.AllowMulti for no policies, more
	// than MaxMulti, a policy named twice or an out slice too short.
	ErrInvalidMulti = errors.New("shard: invalid multi-policy request")
	// ErrWrongAlgorithm is returned when an operation does not apply to
	// the policy's algorithm: Allow, AllowMulti or Refund on a Concurrency
	// policy (use Acquire and Release), or Acquire or Release on any other.
	ErrWrongAlgorithm = errors.New("shard: operation does not apply to the policy's algorithm")
	// ErrInvalidLease is returned by Store.Acquire for a lease id of zero
	// or one the key already holds; nothing changes, and the caller may
	// retry with another id.
	ErrInvalidLease = errors.New("shard: invalid lease id")
	// ErrInvalidReservation is returned by Store.Reserve for a reservation
	// id of zero or one the key has pending, or a key with
	// MaxPendingReservations pending; nothing changes.
	ErrInvalidReservation = errors.New("shard: invalid reservation")
	// ErrInvalidState is returned by Store.Import for a malformed key state.
	ErrInvalidState = errors.New("shard: invalid key state")
)
