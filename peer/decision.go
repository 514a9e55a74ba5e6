package peer

import (
	"fmt"
	"time"
)

// Request asks for a decision on one key.
type Request struct {
	// Key is the quota key, built from authenticated identity. Its Policy
	// names an entry of the server-side policy table.
	Key Key
	// Hits is the request's cost in units. Zero means 1; negative or above
	// the policy's limit is ErrInvalidHits.
	Hits int64
}

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
)

var reasonNames = [...]string{"", "admitted", "over_limit", "shadow", "failed_open", "fallback", "unavailable"}

// String returns the reason's stable name: admitted, over_limit, shadow,
// failed_open, fallback or unavailable.
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
}
