package peer

import (
	"fmt"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/shard"
)

// Key identifies one quota. It is shard.Key, re-exported so an embedder
// imports one package:
//
//	type Key struct {
//		Tenant  string // the customer or application the quota belongs to
//		Subject string // the authenticated account (never a client-chosen string)
//		Policy  string // the name of an entry in Config.Policies
//	}
//
// Each part is 1 to 128 bytes of visible ASCII (0x21 to 0x7E); anything
// else is ErrInvalidKey. shard.KeyPart turns any string (an email, a UTF-8
// name, an address) into a valid, collision-free part. Keys are placed by
// Tenant and Subject: every policy of one subject has the same holder.
type Key = shard.Key

// Request asks for a decision on one key.
type Request struct {
	// Key is the quota key, built from authenticated identity. Its Policy
	// names an entry of the server-side policy table.
	Key Key
	// Hits is the request's cost in units. Zero means 1; negative or above
	// the policy's limit is ErrInvalidHits.
	Hits int64
	// Policies, when not empty, names several policies of Key's tenant and
	// subject, decided as one: the request is admitted only if every policy
	// admits Hits, and then every policy records them, else none does. Key's
	// Policy must then be empty. At most 16 names, none twice. Keys are
	// placed by tenant and subject, so one holder decides all of them.
	Policies []string
}

// MaxBatch is the most requests one AllowBatch call (or HTTP /v1/checks
// body) may carry.
const MaxBatch = 1000

// PolicyDecision is one policy's part of a multi-policy decision: its
// name, what it alone would answer (Allowed), and its Limit, Remaining,
// RetryAfter and ResetAfter as in Decision, for this policy's key.
type PolicyDecision = partition.PolicyDecision

// Reason says how a decision was reached.
type Reason uint8

const (
	// ReasonAdmitted: the owner admitted the request.
	ReasonAdmitted Reason = iota + 1
	// ReasonOverLimit: the owner refused it; the key is over its limit.
	ReasonOverLimit
	// ReasonShadow: the policy is in shadow mode and the owner would have
	// refused; the request is admitted anyway.
	ReasonShadow
	// ReasonFailedOpen: the owner could not be reached and the policy fails
	// open; admitted without a decision.
	ReasonFailedOpen
	// ReasonFallback: the owner could not be reached and the policy falls
	// back to a reduced local limit; this node decided.
	ReasonFallback
	// ReasonUnavailable labels fail-closed unavailability in metrics and
	// HTTP bodies. Allow never returns it in a Decision: it returns an error
	// wrapping ErrUnavailable instead.
	ReasonUnavailable
	// ReasonPeek: the holder answered what a check would decide now;
	// nothing was recorded.
	ReasonPeek
	// ReasonRefunded: the holder gave back units; the Decision is the key's
	// new state (Allowed reports whether anything was given back).
	ReasonRefunded
	// ReasonReset: the holder cleared the key.
	ReasonReset
	// ReasonUnlimited: an Unlimited override covers the key; admitted
	// without counting (Limit and Remaining are 0).
	ReasonUnlimited
	// ReasonReleased: the holder ended a lease (Node.Release); Allowed
	// reports whether a live lease was ended, Remaining is the new state.
	ReasonReleased
	// ReasonSettled: the holder settled a reservation (Node.Settle);
	// Allowed reports whether one was pending, Remaining is the new state.
	ReasonSettled
	// ReasonSpread: admitted by this node from rights the key's holder
	// granted it (a spread key, PolicyConfig.Spread); Remaining is the
	// rights this node has left, not the key's.
	ReasonSpread
	// ReasonCapacity labels, in metrics and HTTP bodies, a request refused
	// because its key's holder had no room for a new key (fail closed).
	// Like ReasonUnavailable it is never in a Decision: the error wraps
	// ErrCapacity.
	ReasonCapacity
)

var reasonNames = [...]string{"", "admitted", "over_limit", "shadow", "failed_open", "fallback", "unavailable", "peek", "refunded", "reset", "unlimited", "released", "settled", "spread", "capacity"}

// String returns the reason's stable name: admitted, over_limit, shadow,
// failed_open, fallback, unavailable, peek, refunded, reset, unlimited,
// released, settled, spread or capacity.
func (r Reason) String() string {
	if int(r) < len(reasonNames) && r != 0 {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// Decision is a node's answer to a Request.
type Decision struct {
	// Allowed reports whether the caller may proceed.
	Allowed bool
	// Limit is the policy's limit (the fallback limit for ReasonFallback).
	Limit int64
	// Remaining is how many units are still available after this decision.
	Remaining int64
	// RetryAfter is, when refused, the exact time until this request would
	// fit. Zero when allowed.
	RetryAfter time.Duration
	// ResetAfter is the time until the key's state is empty.
	ResetAfter time.Duration
	// Reason says how the decision was reached.
	Reason Reason
	// Owner is the name of the node that decided (this node for
	// ReasonFailedOpen and ReasonFallback).
	Owner string
	// RingVersion is the deciding node's local ring version when it
	// decided: which ownership epoch produced the decision.
	RingVersion uint64
	// DecidedAt is the deciding node's clock when it decided (the owner's
	// clock is the authority); zero for ReasonFailedOpen.
	DecidedAt time.Time
	// Limits has one entry per policy of a multi-policy request, in the
	// request's order; nil otherwise. The top-level fields then describe
	// the policy that refused (RefusedBy), or the one with the least
	// Remaining when all admitted.
	Limits []PolicyDecision
	// RefusedBy names the first policy that refused a multi-policy request.
	RefusedBy string
}
