package partition

import (
	"errors"
	"fmt"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/grantee"
	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/shard"
)

// The errors a decision returns. Package peer exports these very values
// (peer.ErrUnavailable is ErrUnavailable), so errors.Is works on either.
var (
	ErrUnavailable    = errors.New("peer: limiter unavailable")
	ErrInvalidKey     = errors.New("peer: invalid key")
	ErrInvalidHits    = errors.New("peer: invalid hits")
	ErrWrongAlgorithm = errors.New("peer: operation does not apply to the policy")
	// ErrLeaseEnded answers an admission whose partition lease ended
	// while it was being decided.
	ErrLeaseEnded = fmt.Errorf("%w: the partition's lease ended during the decision", ErrUnavailable)
)

// Request is one validated request: an operation on one key, or a check
// (or peek) of several policies of one tenant and subject. Package peer
// parses it; the decision fills in the fields marked as answers.
type Request struct {
	Op  Op
	Key shard.Key // Policy is "" for a multi-policy request
	EK  []byte    // the encoded key (of the first policy for multi): placement
	P   *policy.Entry
	// Hits is the cost in units (at least 1).
	Hits int64
	// Multi holds the policies of a multi-policy request, Names their names.
	Multi []*policy.Entry
	Names []string
	// DeferWait, set by a receiver deciding a batch, leaves the wait for a
	// single check's synchronous copy to the caller: the decision returns
	// with the copy in Wait, so a batch's admissions reach the backup
	// together instead of one round trip each. The decision must not be
	// answered before Wait's Done yields nil.
	DeferWait bool
	Wait      Copy
	// DurIdx, under DeferWait, is the data directory's record the
	// decision must wait for before it is answered (durability disk), so
	// a batch's admissions share one fsync: the receiver syncs it after
	// deciding the whole batch.
	DurIdx uint64
	// Lease is the id of a release, settle or grant, and the answer of an
	// acquire, reserve or grant; LeaseTTL the holder's TTL of it.
	Lease    uint64
	LeaseTTL time.Duration
	// Actual is a settle's actual cost; Estimate and Overage its answer.
	Actual, Estimate, Overage int64
	// Returns are a grant's grants to end, Granted its answer.
	Returns []grantee.Return
	Granted int64
}

// Sync reports whether any of the request's policies replicates
// synchronously.
func (r *Request) Sync() bool {
	sync := r.P.Config.Replication == policy.ReplicateSync
	for _, q := range r.Multi {
		sync = sync || q.Config.Replication == policy.ReplicateSync
	}
	return sync
}

// fenced reports whether an admission of r is copied synchronously: a
// backup that has taken over refuses the copy, so the answer is not
// confirmed. A synchronous policy the key is unlimited in records and
// copies nothing, so it fences nothing.
func (r *Request) fenced() bool {
	fenced := r.P.Config.Replication == policy.ReplicateSync && !r.P.Unlimited
	for _, q := range r.Multi {
		fenced = fenced || q.Config.Replication == policy.ReplicateSync && !q.Unlimited
	}
	return fenced
}

// Reason says how a decision was reached. The values are package peer's
// Reason's, which converts by a cast.
type Reason uint8

const (
	ReasonAdmitted Reason = iota + 1
	ReasonOverLimit
	ReasonShadow
	ReasonFailedOpen
	ReasonFallback
	ReasonUnavailable
	ReasonPeek
	ReasonRefunded
	ReasonReset
	ReasonUnlimited
	ReasonReleased
	ReasonSettled
	ReasonSpread
	ReasonCapacity
)

// Result is a holder's decision. Package peer stamps it into its Decision,
// adding who decided and in which ring version.
type Result struct {
	Allowed    bool
	Limit      int64
	Remaining  int64
	RetryAfter time.Duration
	ResetAfter time.Duration
	Reason     Reason
	DecidedAt  time.Time
	// Limits has one entry per policy of a multi-policy request.
	Limits    []PolicyDecision
	RefusedBy string
	// Counted: a single check counted its hits on the store (what the
	// hot-key tracker samples).
	Counted bool
	// Mono is the monotonic clock's reading the decision was made at.
	Mono int64
}

// PolicyDecision is one policy's part of a multi-policy decision (package
// peer's PolicyDecision is this type).
type PolicyDecision struct {
	// Policy is the policy's name.
	Policy string
	// Allowed is what this policy alone would answer.
	Allowed bool
	// Limit, Remaining, RetryAfter and ResetAfter are as in Decision, for
	// this policy's key.
	Limit      int64
	Remaining  int64
	RetryAfter time.Duration
	ResetAfter time.Duration
}

// fill copies a store's decision into res with reason.
func (res *Result) fill(sd shard.Decision, reason Reason) {
	res.Allowed, res.Limit, res.Remaining, res.RetryAfter, res.ResetAfter, res.Reason = sd.Allowed, sd.Limit, sd.Remaining, sd.RetryAfter, sd.ResetAfter, reason
}

// refused marks a refusal: over limit, or admitted anyway in shadow mode.
func (res *Result) refused(p *policy.Entry) {
	res.Reason = ReasonOverLimit
	if p.Config.Shadow {
		res.Allowed, res.Reason = true, ReasonShadow
	}
}
