// Package partition is what a node does with a partition's keys: the
// partition's state as this node sees it (Part), the operations a holder
// decides on them (one table, ops), the one gate every operation passes
// before it decides, and the backup's copy of a holder's keys (Replica).
//
// # What it owns
//
//   - Part: a partition's role here (holder, fenced, a hint of another
//     holder), epoch, backup, its store of keys, and its gate (Part.Mu).
//   - The operation table: an entry per operation saying whether it is
//     decided under the gate in write mode (exclusive), whether it admits
//     units (the lease is checked again after it), whether it gives units
//     back (answered once decided, whatever the backup answers), whether a
//     forward whose answer was lost may be sent elsewhere (resendable), and
//     how it decides.
//   - Env.Decide: the gate (role, the ownership lease's MayDecide, a
//     synchronous policy's backup, the lease again after an admission no
//     backup fences), then the operation's decision on the store, the copy
//     for the backup, and the wait for it.
//
// # What it guarantees
//
// A decision lands only on a store whose partition this node holds at the
// instant of the decision, under its lease (DESIGN §5): the role check, the
// lease check and the store update happen under Part.Mu, which every role
// change takes in write mode. An admission that no synchronous copy
// fences is not confirmed when the lease ended during the decision.
//
// # What it does not do
//
// No I/O of its own and no clock of its own: time is an argument (now,
// mono), as in golang.org/x/time/rate. Its collaborators are interfaces
// declared here, where they are used: the ownership lease (Lease, which
// the ownership runner satisfies), the per-peer replication link
// (Replicator), and the data directory (Disk). Routing, forwarding, the
// failure policy and the public Decision belong to package peer, which
// stamps a Result into its Decision.
package partition
