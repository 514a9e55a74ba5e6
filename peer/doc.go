// Package peer is the ringlimit node an application embeds. Every
// application instance runs one Node; together they form a cluster in which
// each quota key has exactly one owner, so a limit of L per window holds
// across the whole cluster, not per instance.
//
// A Node keeps membership with hashicorp/memberlist gossip, places each
// key's (tenant, subject) in a partition of a consistent hash ring (package
// ring), decides for the partitions it holds on their local stores (package
// shard) and forwards every other key to its partition's holder,
// coalescing concurrent forwards to one peer into batches on one
// long-lived pipe to it (a framed TCP connection to the peer's gRPC port,
// or a gRPC stream when the peer takes none). A process
// that does not embed a Node uses Client (Dial): it reads where keys live
// (the Placement RPC) and sends each check to its key's holder on one
// stream per node (AllowStream), and each peek, refund and lease as a
// unary call to it; the holder still decides.
//
// What it guarantees:
//
//   - One decision point per partition: each partition has at most one
//     holder, named by an epoch that only grows; the holder changes only by
//     a compare-and-set command in the ownership log, a raft log every
//     member runs (a move to the ring's target, or the partition handed to
//     its backup once the holder's liveness lease expired), and decides
//     only while the log names it and its lease holds on its own clock
//     (package internal/ownership states every rule; logown.go drives it).
//     A node that does not hold a partition never decides for it: it
//     forwards, or waits for a move in progress.
//   - The owner's clock is the authority for its keys, clamped per key so it
//     never moves backward.
//   - When the owner cannot decide in time, the policy's OnUnavailable
//     applies (fail closed by default), and the outcome is reported as
//     unavailability — an error wrapping ErrUnavailable, or a Decision whose
//     Reason is ReasonFailedOpen or ReasonFallback — never as over limit.
//   - Membership changes do not reset quotas: partitions move with their
//     logs. With the default synchronous replication an admission is
//     answered only after the partition's backup has it, so a crash of the
//     holder loses nothing; the backup continues after one to two
//     LeaseDurations. A partition whose holder and backup are both
//     gone waits for the member with its state; only once that member is
//     gone for good is it restarted empty (logged at Error and counted).
//   - A hot key can be spread (PolicyConfig.Spread auto) and stay exact:
//     a node that forwards it often asks its holder for rights and admits
//     from them with no network on the decision. The holder counts a
//     grant of k rights with lease T as k admissions at every instant of
//     [grant, grant+T], so the grant holds its slots until grant+T+W and
//     the log plus the outstanding grants bound every window; the grantee
//     uses rights only inside the lease on its own clock (with the
//     clock-rate margin) and reports its uses as ages, recorded no
//     earlier than they happened, which frees the rest. Grants are key
//     state: under sync replication replicated before they are handed
//     out, moved with the partition and charged by a new holder after a
//     takeover (under async or off a takeover may lose the newest, as it
//     may lose the newest admissions). The rules and the argument are in
//     spread.go, internal/grantee and shard's grant.go; the ownership
//     simulator runs the grantee's own code and the holder's rules under
//     every fault kind (internal/ownership/sim, grants.go).
//   - Data directory (Config.DataDir; datadir.go, partlog.go): quotas
//     survive a restart of every member at once. The ownership log is on
//     disk (each Ready fsynced before its messages go out); a member
//     restarted with its directory resumes it as the same raft member
//     under a new incarnation, which gossips the old one as the one it
//     inherits, and the ownership machine gives it back the partitions
//     the log kept for its old self (the heir rule). For a policy with
//     Durability disk, an admission (or any operation that changes a
//     key) is answered only once the key's state is fsynced on the
//     holder's disk and, under sync replication, on the backup's;
//     concurrent ones share one fsync. disk_async answers at once and
//     fsyncs every 10 ms. A partition granted to the heir empty is
//     restored from its directory: restoring what a member of the
//     partition really had only adds admissions, so it can only refuse
//     more. Windows across the restart are counted on the wall clock the
//     state was written with; a clock found behind the newest state
//     written holds the restored keys at that instant until it passes it
//     (windows count longer, never shorter).
//
// How it is built: this package is the public face (Node, Config,
// Request and Decision, Client, the errors) and the one place that drives
// the parts under internal/, each of which knows nothing of Node:
// internal/partition (what a node does with a partition's keys: the
// partition's state, the one operation table, the one gate before every
// decision, and each operation's decision, with the lease, the
// replication link and the disk as interfaces it declares; the router,
// router.go, hands it every request it may decide here),
// internal/membership (the memberlist glue: gossiped metadata, members
// and events, joining), internal/transport (framed pipes, the pipe to a
// peer, the sniffing listener, peer authentication), internal/connlimit
// (the gRPC port's bounds on connections, in all and per address),
// internal/wire (the
// packed layout of forwarded batches and replicated admissions, with its
// bounds-checked reader), internal/grantee (a spread key's rights on
// the node that uses them, as state with time passed in, which the
// ownership simulator drives too), internal/policy (the
// compiled, versioned policy table), internal/ownership and
// internal/ownlog (the ownership protocol as a state machine, and its raft
// log), and internal/history (the checker the tests judge histories
// with). Each part's package doc says what it owns and may import;
// TestLayout pins the import rules. Beside it, two public packages use
// only its public API: httplimit (HTTP middleware, and the RateLimit
// headers and statuses every front end answers with) and prommetrics (a
// Metrics of Prometheus collectors); this package imports neither, nor
// Prometheus (TestLayoutPublicParts).
//
// What it does not do: it does not authenticate callers (the embedding
// application builds Keys from authenticated identity); on its gRPC port
// it only asks Config.AuthorizeReset and AuthorizeRefund before the calls
// that undo admissions, and bounds what any client can make it hold
// there (Config.RPCLimits, Store.MaxKeys). A hot key that is
// not spread is one decision point (HotKeys and metrics report it).
package peer
