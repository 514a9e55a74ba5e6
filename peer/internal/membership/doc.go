// Package membership is the node's glue to hashicorp/memberlist: what a
// node gossips about itself, how memberlist's callbacks become a member
// list and events without blocking memberlist, memberlist's log in slog,
// and joining seeds with backoff.
//
// What it owns:
//
//   - Meta, the member metadata every node gossips (placement fingerprint,
//     gRPC address, draining flag, process start id, cluster id, policy
//     table version), its versioned encoding, and the decoding of older
//     versions so a rolling upgrade reads older members.
//   - Queue, the member list the ring rebuild reads and the events it
//     logs: metadata copied inside the callbacks (memberlist rewrites its
//     own Node values afterwards), a leave told apart from a failure (a
//     member's own "leaving" notice, or its draining flag), the metadata
//     of members declared dead kept until the driver lets them go, and
//     bounded log detail.
//   - Delegate, memberlist's Delegate and EventDelegate: callbacks that
//     never block; each change is noted in the Queue and handed to the
//     driver's OnEvent.
//   - Log, memberlist's standard logger bridged into slog, with repeated
//     warnings of one kind rate-limited.
//   - OtherClaimant, which finds in a join's state exchange another
//     member that may still hold this node's name, whatever state the
//     seed gives it (memberlist reports only an alive one).
//   - Join, joining seeds with backoff until one answers or a timeout; a
//     seed that answers that its gossip key differs ends it at once
//     (ErrKeyMismatch, with which side lacks a key and the answer).
//
// What it does not do: it builds no ring, decides no ownership, and knows
// nothing of the node's RPCs or policies beyond the numbers it gossips.
// What a member set means (who may hold partitions, which cluster wins,
// readiness) is peer's, the driver, which reads the Queue.
//
// What it may import: the standard library and memberlist. Never peer,
// cmd or bench, ring, shard, gRPC, raft, ownership or policy (pinned by
// peer's TestLayout).
package membership
