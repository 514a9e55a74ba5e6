package peer

import (
	"context"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/shard"
)

// Allow decides one request. It routes the key to its owner (this node, or a
// peer over gRPC), and returns the owner's decision. Over limit is a
// Decision with Allowed == false and a nil error. When the owner cannot be
// reached in time the policy's OnUnavailable applies: fail closed returns an
// error wrapping ErrUnavailable (and the cause, such as
// context.DeadlineExceeded); fail open and fallback return a Decision whose
// Reason says so. Invalid input returns an error wrapping ErrInvalidKey,
// ErrInvalidHits or ErrUnknownPolicy and changes nothing. After Close it
// returns ErrClosed. Safe for concurrent use; the local path does not
// allocate.
func (n *Node) Allow(ctx context.Context, req Request) (Decision, error) {
	if len(req.Policies) > 0 {
		return n.do(ctx, partition.OpCheck, req)
	}
	// A closing node keeps routing while it drains (it holds fewer and
	// fewer partitions and forwards the rest); only once Close has
	// stopped it do calls fail. (An atomic flag: a context's Err takes a
	// lock every caller would contend on.)
	if n.stopped.Load() {
		return Decision{}, ErrClosed
	}
	// ek is appended to buf and travels beside r, not in it: r's strings
	// leak (to replication, the fallback store), and escape analysis would
	// move the buffer ek points into to the heap with them.
	var buf [shard.MaxEncodedKeyLen]byte
	var r opReq
	ek, err := n.parseReqInto(&r, partition.OpCheck, req.Key, nil, req.Hits, buf[:0])
	if err != nil {
		return Decision{}, err
	}
	var d Decision
	err = n.routeInto(ctx, &r, ek, &d)
	return d, err
}

// Peek answers what Allow would decide now for req, recording nothing: the
// Decision's Reason is ReasonPeek and Allowed says whether the request
// would be admitted. It goes to the key's holder like Allow; when the
// holder cannot be reached it returns an error wrapping ErrUnavailable
// (peeks never fail open).
func (n *Node) Peek(ctx context.Context, req Request) (Decision, error) {
	return n.do(ctx, partition.OpPeek, req)
}

// Refund gives back up to req.Hits units (zero means 1) of the key's
// admissions still inside the window, newest first, never below empty, and
// returns the key's new state (Reason ReasonRefunded; Allowed reports
// whether anything was given back). Hits above the policy's limit (for
// the key, overrides applied) is ErrInvalidHits and changes nothing: the
// key never holds more. Any caller may refund any key's admissions; on
// the public gRPC API Config.AuthorizeRefund says who may. For token_bucket it moves the bucket
// back by that many units' worth, never past full; for fixed_window it
// lowers the current window's count, never below zero. Decided by the
// key's holder and replicated like an admission, but answered as done
// once the holder has decided it, even if its backup does not confirm it
// (a backup without it only refuses more after a takeover): a caller
// that asks again after an error must not give a unit back twice. Only
// an answer lost on its way back (a forward that timed out) leaves a
// refund's outcome unknown.
func (n *Node) Refund(ctx context.Context, req Request) (Decision, error) {
	return n.do(ctx, partition.OpRefund, req)
}

// Reset clears key's state at its holder (an operator action) and
// replicates the reset: the key starts empty. Reason is ReasonReset. Like
// a refund, a reset whose forward got no answer is not sent to another
// member (a second reset, decided later, would clear what was admitted in
// between): the error wraps ErrUnavailable and the outcome is unknown.
func (n *Node) Reset(ctx context.Context, key Key) (Decision, error) {
	return n.do(ctx, partition.OpReset, Request{Key: key})
}
