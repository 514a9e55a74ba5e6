// Package policy is ringlimit's server-side policy table: the entries
// (Config, with their Overrides), how a table is validated (Validate), and
// the compiled, immutable Table a holder decides with, with its version.
//
// What it owns:
//
//   - The entry types peer re-exports as aliases (peer.PolicyConfig is
//     Config; peer.Override, peer.OnUnavailable and peer.Replication are
//     Override, OnUnavailable and Replication), their String and For
//     methods, and Override.Validate. peer's alias docs repeat these
//     types' field and method docs for embedders (go doc peer shows no
//     fields of an alias): change both together.
//   - Validate: every problem of a table, one error each, wrapping
//     nothing; the caller (peer) wraps each in its ErrInvalidConfig.
//   - New: a validated table compiled into a Table, each entry's shard
//     form precomputed and its overrides resolved into maps, so that the
//     decision path looks a key's entry up with two map reads and no
//     allocation (Table.Lookup, Entry.ForKey).
//   - The table's version (Table.Version): a hash of what changes a
//     holder's decision, 53 bits and never zero.
//
// What it guarantees:
//
//   - A Table and the Entries reached through it are never mutated after
//     New returns: safe for concurrent use without locks, so peer
//     publishes one behind an atomic pointer and swaps in a new one whole.
//   - Two tables that decide alike have one version; two that do not
//     differ (see Table.Version for what counts).
//
// What it does not do: it knows nothing of gossip, Node, members or the
// network. It does not publish its version, compare it with other
// members', log, count metrics or read a clock: peer, the driver, asks the
// table for its version and puts it into gossip metadata, reports it to
// Metrics, and logs a change.
//
// What it may import: the standard library (no net), shard, and xxhash.
// Never peer, cmd or bench, memberlist, gRPC or net (pinned by peer's
// TestLayout).
package policy
