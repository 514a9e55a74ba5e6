package partition

import (
	"fmt"

	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/shard"
)

// Op is an operation on a partition's keys. Its values are the wire's
// (ringlimit.proto's Op), so package peer converts by a cast; a test there
// pins that every wire value has its entry here.
type Op uint8

const (
	OpCheck   Op = iota // admit hits if they fit, else refuse
	OpPeek              // what a check would answer now, recording nothing
	OpRefund            // give back up to hits units, newest first
	OpReset             // clear the key
	OpAcquire           // take a lease of a concurrency policy
	OpRelease           // end a lease by id
	OpReserve           // admit an estimate, pending under an id
	OpSettle            // replace a reservation's estimate with its actual cost
	OpGrant             // grant a spreading node rights to admit (and end returned grants)
	numOps
)

// Failure says what a request whose holder could not decide gets.
type Failure uint8

const (
	// FailNever: never answered without the holder (ErrUnavailable).
	FailNever Failure = iota
	// FailPolicy: the policy's OnUnavailable (fail closed, open, or the
	// local fallback).
	FailPolicy
	// FailLease: the policy's OnUnavailable, a fallback taking an id on
	// the local fallback store (acquire, reserve).
	FailLease
)

// Spec is what is true of one operation: one entry per operation, read by
// the gate, the router, the parser and the failure policy, so that adding
// an operation is one entry and its decide function.
type Spec struct {
	Name string
	// Exclusive: decided under the gate in write mode, and the key's whole
	// new state is copied to the backup (KIND_REPLACE) before the gate is
	// released, so no admission slips between the change and the copy.
	Exclusive bool
	// Admits: it may admit units, so unless a synchronous copy fences it,
	// the lease is checked again after the decision: a process paused
	// between the check and the decision may wake after its backup took
	// over, and must not confirm what it admitted.
	Admits bool
	// Frees: it gives units back (or settles). It takes effect here once
	// decided, whatever the backup answers: the backup is waited for, but
	// a backup that does not confirm does not fail it (a caller would ask
	// again, and a refund done twice gives back units never admitted).
	Frees bool
	// Resendable: after a forward whose outcome is unknown it may go to
	// another member. An admission decided twice only counts twice (the
	// limiter refuses more, never less), a peek or a release by id changes
	// nothing the second time; a refund would give back twice, a reset
	// would clear what was admitted in between.
	Resendable bool
	// Bounded: hits above the policy's limit is ErrInvalidHits (a key
	// never holds more than its limit, so more could only be a mistake or
	// an attempt to empty it).
	Bounded bool
	// Multi: it may name several policies of one subject (checks, peeks).
	Multi bool
	// OwnRPC: it carries an id the holder chooses or is given, so it
	// travels one per RPC (Limiter.Lease): the packed batch has no ids.
	OwnRPC bool
	// Fail is what it gets when its holder cannot decide.
	Fail Failure
	// Applies refuses a policy the operation does not apply to (nil: any).
	Applies func(p *policy.Entry) error
	// decide names how the request is decided under the gate (held in
	// write mode when Exclusive): call.run calls it. Multi-policy requests
	// go to decideMulti, and a single check takes Env.check, the hot path,
	// so check's entry is byMulti. (A name, not a func value: a call
	// through a func value would move the call and its Result to the heap.)
	decide decider
}

// decider names an operation's decide function.
type decider uint8

const (
	byNone decider = iota // not an operation
	byMulti
	byPeek
	byRefund
	byReset
	byAcquire
	byRelease
	byReserve
	bySettle
	byGrant
)

// run decides c's request by d.
func (c *call) run(d decider) error {
	switch d {
	case byMulti:
		return decideMulti(c)
	case byPeek:
		return decidePeek(c)
	case byRefund:
		return decideRefund(c)
	case byReset:
		return decideReset(c)
	case byAcquire:
		return decideAcquire(c)
	case byRelease:
		return decideRelease(c)
	case byReserve:
		return decideReserve(c)
	case bySettle:
		return decideSettle(c)
	case byGrant:
		return decideGrant(c)
	}
	return fmt.Errorf("%w: unknown operation", ErrInvalidKey)
}

// ops is the operation table.
var ops = [numOps]Spec{
	OpCheck: {Name: "check", Admits: true, Resendable: true, Bounded: true, Multi: true, Fail: FailPolicy,
		Applies: notConcurrency, decide: byMulti},
	OpPeek: {Name: "peek", Resendable: true, Bounded: true, Multi: true, decide: byPeek},
	OpRefund: {Name: "refund", Exclusive: true, Frees: true, Bounded: true,
		Applies: notConcurrency, decide: byRefund},
	OpReset: {Name: "reset", Exclusive: true, Frees: true, decide: byReset},
	OpAcquire: {Name: "acquire", Exclusive: true, Admits: true, Resendable: true, Bounded: true, OwnRPC: true, Fail: FailLease,
		Applies: concurrency, decide: byAcquire},
	OpRelease: {Name: "release", Exclusive: true, Resendable: true, OwnRPC: true,
		Applies: concurrency, decide: byRelease},
	OpReserve: {Name: "reserve", Exclusive: true, Admits: true, Resendable: true, Bounded: true, OwnRPC: true, Fail: FailLease,
		Applies: slidingLog, decide: byReserve},
	OpSettle: {Name: "settle", Exclusive: true, Frees: true, Resendable: true, OwnRPC: true,
		Applies: slidingLog, decide: bySettle},
	OpGrant: {Name: "grant", Exclusive: true, Admits: true, Resendable: true, OwnRPC: true,
		Applies: spreads, decide: byGrant},
}

// Spec returns o's entry; an unknown operation has the zero Spec (Name "").
func (o Op) Spec() *Spec {
	if o >= numOps {
		return &Spec{}
	}
	return &ops[o]
}

// Valid reports whether o is an operation of the table.
func (o Op) Valid() bool { return o < numOps }

func (o Op) String() string {
	if o >= numOps {
		return fmt.Sprintf("op(%d)", uint8(o))
	}
	return ops[o].Name
}

// ErrNeedsLease is the error of a check or refund of a concurrency policy.
func ErrNeedsLease(policy string) error {
	return fmt.Errorf("%w: policy %q is a concurrency policy: take a lease with Acquire and end it with Release", ErrWrongAlgorithm, policy)
}

func notConcurrency(p *policy.Entry) error {
	if p.Shard.Algorithm == shard.Concurrency {
		return ErrNeedsLease(p.Name)
	}
	return nil
}

func concurrency(p *policy.Entry) error {
	if p.Shard.Algorithm != shard.Concurrency {
		return fmt.Errorf("%w: policy %q is %v; acquire and release need a concurrency policy", ErrWrongAlgorithm, p.Name, p.Shard.Algorithm)
	}
	return nil
}

func slidingLog(p *policy.Entry) error {
	if p.Shard.Algorithm != shard.SlidingLog {
		return fmt.Errorf("%w: policy %q is %v; reserve and settle need a sliding_log policy", ErrWrongAlgorithm, p.Name, p.Shard.Algorithm)
	}
	return nil
}

func spreads(p *policy.Entry) error {
	if p.Config.Spread == policy.SpreadOff {
		return fmt.Errorf("%w: policy %q does not spread its keys", ErrWrongAlgorithm, p.Name)
	}
	return nil
}
