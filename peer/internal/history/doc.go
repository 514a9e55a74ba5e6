// Package history checks recorded histories of rate-limit decisions — from
// the cluster simulator, later from real cluster tests — against the
// limiter's promise: for a key with limit L and window W, at most L
// admitted units in any rolling interval (t − W, t]. Rejected attempts cost
// nothing. The window is open on the left: a unit admitted at τ counts at
// every t with τ ≤ t < τ + W and has expired at exactly τ + W.
//
// # What is recorded
//
// Each Op is one attempt: its key, units asked for (Hits), the instants it
// was called and answered (Call, Return) on one recording clock (the
// simulator's virtual time; in real tests, one process's monotonic clock),
// and what the client learned: Admitted, Rejected, Unavailable (the limiter
// answered it could not decide: nothing was taken) or Unknown (no answer:
// it may or may not have taken effect). The owner, epoch and decision time
// the answer carried are kept for reports only and never trusted: the
// limiter's clocks are what is under test.
//
// The one assumption is the recording clock: wherever the limiter decided
// an attempt, it did so at some instant τ of the recording clock inside
// [Call, Return]. Nothing is assumed about the limiter's own clocks, its
// owners or its epochs.
//
// # The rules
//
// A Violation is reported only when no assignment of decision instants
// consistent with the record keeps the promise. That is what makes the
// checker sound: every reported violation is a real one, whatever the
// limiter's clocks did, whichever way the unknown attempts went.
//
// Rule 1, the direct window rule (CheckWindow): a set of admitted ops with
// more than L units in total whose intervals all lie inside one interval
// [a, b] with b − a < W. Their decision instants all lie in [a, b], so at
// the latest of them, t, every one is in (t − W, t] (each τ ≥ a > b − W ≥
// t − W): more than L units in one window, in every possible order. It is
// checked exhaustively in O(n log n) per key: for each earliest call c, the
// best set is all admitted ops called at or after c that return before
// c + W, and their units are summed with a Fenwick tree.
//
// Rule 2, linearizability (CheckLinearizable): the history is correct iff
// the admitted ops can be given decision instants τ_i ∈ [Call_i, Return_i]
// such that no window (t − W, t] holds more than L units. Sorting the ops
// by τ gives a linearization consistent with real time, and conversely any
// linearization with non-decreasing τ's in the intervals is such an
// assignment, so porcupine searches linearization orders against a timed
// sliding-log model whose state is the last linearization point lo and the
// (τ, units) entries that may still count (τ > lo − W, sorted, equal τ's
// merged). An admission steps to the earliest τ ≥ max(lo, Call) at which
// the window has room (the count only falls as τ grows, since every entry
// is ≤ lo ≤ τ, so the expiry instants τ' + W are walked in order), and is
// illegal if that τ is after Return. Earliest is optimal for the rest of
// the order: the entry expires soonest and lo grows least, so nothing legal
// after a later τ is illegal after the earliest. Every violation of rule 1
// is one of rule 2, and rule 2 sees more: for instance, three single-unit admissions with L = 1 all
// inside [0, 1.5W] (they need 2W).
//
// Only the admitted ops are searched. A rejected or unavailable attempt
// took nothing; an unknown one either took nothing or took its units at
// some instant after its call. Taking nothing is always the most permissive
// choice (any continuation legal after taking units is legal after not
// taking them), so the history has a legal assignment with them iff the
// admitted ops alone have one. The package's tests check this against the
// full model (porcupine.NondeterministicModel: rejected and unavailable
// linearize at max(lo, Call) and change nothing else, unknown either did
// not happen or was admitted with Return = +∞) on small random histories;
// the full model is exponential in the number of non-admitted ops, which is
// why it is not what ships.
//
// Two further reductions keep the search fast; neither changes a verdict.
// A key's admitted ops are split into stretches where the next op is
// called at least W after every earlier one returned: every unit before the
// split has expired before anything after it is decided, so the stretches
// are independent. And porcupine's cache of visited (linearized set,
// state) pairs, which normally skips a state equal to one already searched,
// skips a state covered by one already searched with the same linearized
// set: one with lo no later and, for every instant that can still matter,
// no more units still to expire. Such a searched state was not on the path
// to the new one (same set, same depth), so its continuations have all
// failed, and every continuation from the covered state would fail too.
// (The model's Equal implements this relation, reading which state is new
// from their creation order; porcupine uses Equal only for that cache.)
// With it a 2 000-op key with 8 clients in flight is accepted in tens of
// milliseconds and proved illegal in about a second.
//
// A porcupine search may still run out of time (the problem is NP-hard in
// general): Check takes a per-key budget, and a key that runs out is listed
// in Report.TimedOut, not reported as a violation. A violation of rule 2
// lists up to 20 ops: the admitted op that porcupine's longest partial
// linearization could not place with the earliest return, and the nearest
// ops that may share its window.
//
// A record that cannot be checked (Hits < 1, Return < Call for an answered
// op, an invalid Outcome, a negative Limit) is reported as a RuleMalformed
// violation — a bug in the recorder, never ignored — and left out of the
// rules; leaving an op out can only hide a violation, never make one.
package history
