// Package shard holds per-key rate-limit state and makes the admission
// decision. It knows nothing of the network, of the ring, of logging or of
// metrics: it returns numbers and errors, and its callers record them.
//
// # The promise
//
// For a key with limit L and window W, the default algorithm (SlidingLog)
// admits at most L units in any rolling interval (t − W, t]. The interval is
// open on the left: an admission exactly W old has expired. A request costing
// hits units is admitted only if count + hits ≤ L, and then hits units are
// recorded at t; a rejected request records nothing. Admissions at equal
// timestamps stay distinct: the log stores runs of (timestamp, count).
//
// Timestamps are rounded up to the policy's Resolution (1 ms by default).
// Rounding up makes entries expire later, never earlier, so it keeps the
// promise while bounding a key's log to min(L, W/Resolution) runs.
//
// TokenBucket (GCRA), FixedWindow and Calendar (at most L per calendar day,
// ISO week, month or year in a time zone) are separate, named policies with
// different promises, documented on their constants. Concurrency is not a
// rate at all: it caps the units held at once by leases (Store.Acquire and
// Store.Release), each expiring after the policy's Window unless released
// first; Allow refuses it.
//
// # Time
//
// shard never reads a clock. Every method that depends on time takes now.
// Limiter (one key, the caller's time) rejects a backward now with
// ErrTimeBackwards; Store (many keys, the owner's clock) clamps now per key so
// a key's time never decreases.
//
// # Concurrency
//
// Store is safe for concurrent use: keys are spread over lock stripes chosen
// by xxhash of the encoding of the key's (tenant, subject) part
// (Key.AppendPlacement), and one stripe lock covers one key's whole decision
// (drop expired, count, compare, record). All policies of one subject share
// a stripe, so AllowMulti decides several of them as one atomic decision.
//
// # Beyond Allow
//
// Peek answers what Allow would decide, recording nothing. Refund gives back
// admissions that still count, newest first. Delete is the reset primitive.
//
// # Bounds
//
// Window is at most MaxWindow (100 years); Limit may be any positive int64.
// No sum wraps: counts are compared as hits ≤ Limit − count, and sums of
// times saturate, so a far expiry stays far. Store starts no
// goroutines; Sweep is called by whoever owns the schedule. Limiter and
// HotKeys document their own rules.
package shard
