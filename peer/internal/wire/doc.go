// Package wire is the packed layout of the peers' batches: on CheckStream
// a batch's items and decisions travel as one bytes field each
// (CheckRequest.items_packed, CheckResponse.decisions_packed) instead of
// one nested message per item, and a replication request's admissions
// and their results likewise (ReplicateRequest.admits_packed,
// ReplicateResponse.results_packed).
//
// Why: decoding nested messages costs several allocations per item (the
// item, its key, each string); a packed batch is decoded from one string
// per batch, its keys' parts are substrings of it, and decisions are
// plain values. The layout is a count, then per entry its fields in a
// fixed order: unsigned integers as uvarints, signed ones as zigzag
// varints, strings as a uvarint length and the bytes, booleans as one
// byte.
//
//	Item:     tenant, subject, policy, hits, op, policy count, policies...
//	Decision: status, allowed, limit, remaining, retry_after_ns,
//	          reset_after_ns, owner, ring_version, members_hash, reason,
//	          error, holder_epoch, decided_at_unix_ns, refused_by,
//	          limit count, limits (policy, allowed, limit, remaining,
//	          retry_after_ns, reset_after_ns)...
//	OpResult: status, holder, epoch, accepted
//
// What it owns: these layouts, their encoders and decoders, and Reader,
// the bounds-checked decoder the admissions' layout (which peer packs
// from its replication queue) is read with too.
//
// What it guarantees: a malformed batch is rejected as a whole
// (ErrMalformed): every length is checked against what is left, so no
// input can make a decoder allocate more than the batch's own size or
// index out of range. Decoding into reused memory allocates nothing for
// items.
//
// What it does not do: it decides nothing and knows no node, partition
// or policy table; what an item asks and what a decision means are peer's.
//
// What it may import: the standard library, shard (for keys) and peerpb
// (for the enums and nested forms). Never peer, cmd or bench.
package wire
