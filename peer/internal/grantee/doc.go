// Package grantee is a node's side of one spread key as a grantee: the
// rights its holder granted it, spent on local decisions, reported back
// as ages and replaced before they run out. It is state with time passed
// in: every method takes now, a reading of the caller's monotonic clock
// in nanoseconds, and none sends, logs, sleeps or counts a metric. peer
// reads the clock, calls these methods and sends the grant requests they
// ask for; the ownership simulator (ownership/sim) drives the same code
// under its faults, so the history checker tests the grantee that runs.
//
// It owns the grantee's rules, told here only (peer's spread.go has the
// protocol and the holder's side, shard's Grant and Return the holder's
// accounting):
//
//   - Spend decides one request: from the oldest usable grant, or
//     refused while the holder granted nothing, or neither (the caller
//     forwards);
//   - a grant is usable until its deadline, 85 % of its lease after the
//     request for it was sent (on the grantee's clock; the holder's lease
//     starts no earlier than the request was sent, so with clock rates
//     within 10 % every use falls inside it on the holder's clock), and
//     while it has rights for the request's hits;
//   - each use is recorded at the end of its 1/64 of the lease (later
//     than it happened, never earlier) and reported with the next request
//     as an age shrunk by 10 % for the rate bound: the holder records the
//     uses no earlier than they happened, frees the rest and ends the
//     grant; a grant never reported stays charged until its lease's end
//     plus the window (under-admission, never over);
//   - a grant that ends here (deadline passed, rights spent, or replaced
//     by a third) is closed: its uses wait for the next request's report,
//     eight kept;
//   - one request for rights is in flight per key (Spent.Refill sets it),
//     ended only by Requeue, Refuse or Install; it is due when the key has
//     no grant, or has spent half its newest, or half that grant's lease
//     has passed, and never while refused.
//
// It may import shard (for shard.Run) and the standard library; nothing
// of the network, the ownership protocol or peer (TestLayout in peer pins
// it).
package grantee
