// Package console is a node's web console: one page, served from assets
// embedded in the binary (no CDN, no build step), that shows the cluster
// as this node and its peers see it.
//
// # What it shows
//
//   - Members: name, address, gossip state, incarnation, liveness epoch
//     and lease left, voter or learner, the log's leader and term, ready
//     or why not; a member whose policy table or placement fingerprint
//     differs from the others' stands out.
//   - Partitions: every partition coloured by holder (vacant, fenced and
//     moving ones outlined), counts per member; a click shows its holder,
//     backup, epoch, ring target and key count.
//   - Timeline: joins, leaves, failures, liveness ends and lapses,
//     takeovers, moves, leader changes, policy reloads and readiness, as
//     each node saw them, merged.
//   - Traffic: decisions per second per policy over 15 minutes (allowed,
//     over limit, not decided by the holder), summed over the members, and
//     the p99 of forwarded decisions' latency.
//   - Hot keys, with their holder and, for spread keys, the rights.
//   - A key inspector, from Node.Peek (looking records nothing): holder,
//     count in the window, remaining, when the next unit frees, and the
//     window's admissions by age (from one Peek per step of units).
//   - Policies: the table in force and its version on every member.
//
// # Where the data comes from
//
// Each Console reads its own node (peer.Node.Overview, HotKeys, Policies,
// Peek) and samples it once a second into a bounded timeline (the last
// 512 events). Traffic comes from a Recorder, a peer.Metrics that wraps
// the application's own (serve's Prometheus one) and keeps 15 minutes in
// 10-second buckets. A node's own answer (api/node) is built from its
// last sample, encoded once per sample however many pages ask, so it is
// up to a second old. The cluster view is gathered by the node the page
// asks (api/cluster): it asks each peer's console (Config.Peers) for its
// api/node over HTTP, in parallel, with a deadline, and caches the
// answer for 900 ms (requests meanwhile wait for the gathering under
// way rather than start another). Gathering on the server keeps the page on one origin
// (its Content-Security-Policy allows no other, and no node need let
// other origins read it), needs no new RPC on the peers' authenticated
// channel (which would open limiter state to every holder of the peer
// secret), and a peer that does not answer is shown as such.
//
// # What it guarantees
//
// Read-only unless Config.AdminToken is set; then one action, resetting a
// key, for a request that carries the token as a bearer token (a header
// a cross-site form cannot send). Every answer carries CSP, and the page
// puts every string it receives into the document as text, never as
// HTML: keys are client-derived. It shows what the listener it is mounted
// on already shows (serve mounts it at /ui/ on --ops-addr, beside
// /metrics and /debug/*, which name keys too): keep that listener
// private.
//
// # What it does not do
//
// It keeps no history beyond memory (a restart starts the timeline and
// the traffic afresh), samples once a second (two changes within one
// sample are one event), and measures no latency of local decisions (they
// are not timed by peer.Metrics; the chart's p99 is of forwards).
package console
