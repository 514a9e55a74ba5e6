// Package peer is the ringlimit node an application embeds. Every
// application instance runs one Node; together they form a cluster in which
// each quota key has exactly one owner, so a limit of L per window holds
// across the whole cluster, not per instance.
//
// A Node keeps membership with hashicorp/memberlist gossip, places keys on a
// consistent hash ring (package ring), decides for the keys it owns on its
// local store (package shard) and forwards every other key to its owner over
// gRPC, coalescing concurrent forwards to one peer into batched RPCs.
//
// What it guarantees:
//
//   - One decision point per key per ring: a node decides only for keys its
//     own ring says it owns (or that were handed to it explicitly during a
//     move); otherwise it answers "not owner" and the sender retries.
//   - The owner's clock is the authority for its keys, clamped per key so it
//     never moves backward.
//   - When the owner cannot decide in time, the policy's OnUnavailable
//     applies (fail closed by default), and the outcome is reported as
//     unavailability — an error wrapping ErrUnavailable, or a Decision whose
//     Reason is ReasonFailedOpen or ReasonFallback — never as over limit.
//   - Membership changes do not reset quotas: keys move with their logs
//     (see handoff.go), and Config.Backup streams state to a backup member
//     so a crash loses at most one BackupInterval of admissions.
//
// What it does not do: it does not authenticate callers (the embedding
// application builds Keys from authenticated identity), and it does not
// split one hot key across nodes (hot keys are reported by HotKeys and
// metrics instead).
package peer
