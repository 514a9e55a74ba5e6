// Package envoyrls serves Envoy's global rate limit API
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) from a
// ringlimit node, so an Envoy HTTP filter (envoy.filters.http.ratelimit)
// can use a ringlimit cluster as its rate limit service. It lives under
// cmd/ringlimit so that the core packages (peer, ring, shard) never import
// Envoy's protos; serve registers it on the node's gRPC port through
// peer.Config.RegisterServices.
//
// # Configuration
//
// A Domain mirrors one envoyproxy/ratelimit configuration file: a domain
// name and a tree of descriptors, each matched by Key and, optionally,
// Value (an empty Value matches any value of Key, as in envoyproxy/
// ratelimit). Compile turns the tree into a Table: each descriptor with a
// Limit becomes a ringlimit policy named by PolicyName
// ("envoy:<domain>:<key>[=<value>]/..."), which serve adds to the node's
// policy table, so it is versioned, gossiped and reloaded like any other
// (Server.SetTable swaps the compiled domains with it). A
// Limit is a count per rolling window: ringlimit decides rolling windows
// exactly (sliding_log, fail_closed), not fixed calendar units.
//
// # Keys
//
// A request descriptor that matches a limited leaf is decided on the key
// tenant = shard.KeyPart(domain), subject = the descriptor's entry values,
// each mapped by shard.KeyPart and joined with '|' (which KeyPart never
// produces; a join longer than 128 bytes is itself passed through KeyPart,
// which hashes it), policy = the leaf's generated name. So the subject is
// collision-free (up to a 128-bit hash for long ones): two descriptors
// share a counter exactly when they match the same leaf with the same
// values.
//
// # Semantics
//
//   - hits_addend: the descriptor's own hits_addend when set, else the
//     request's; 0 means 1 in both, as Envoy defines. A cost above the
//     leaf's limit is OVER_LIMIT (it can never fit).
//   - is_negative_hits: the descriptor's hits are given back (Node.Refund,
//     newest admissions first, never below empty); its status is OK with
//     the key's new state. A refund undoes anyone's admissions, so when
//     the server guards refunds (Server.GuardRefunds; serve does once it
//     has an admin or refund token), a request with such a descriptor is
//     refused whole (the guard's status, Unauthenticated, and nothing
//     decided) unless the guard allows the call: send the token as Envoy's
//     grpc_service initial_metadata (authorization: Bearer <token>), or a
//     client certificate the node verifies.
//   - Descriptors of one request with the same entry values (so the same
//     tenant and subject), the same cost and the same shadow_mode are
//     decided atomically (peer.Request.Policies): either every one of them
//     records the hits or none does. envoyproxy/ratelimit cannot do that:
//     a request refused by one descriptor there still consumes the others.
//     Groups of more than 16 such descriptors are split in 16s, and
//     different groups are decided independently.
//   - Each limited descriptor's status carries current_limit (see
//     CurrentLimit for how a window maps to unit and unit_multiplier),
//     limit_remaining, and duration_until_reset: when refused, the time
//     until the request would fit; otherwise the time until the key's
//     window is empty.
//   - overall_code is OVER_LIMIT when any descriptor is.
//   - shadow_mode: the leaf is decided and counted, but its status is
//     always OK.
//   - unlimited, or a descriptor that matches no leaf with a limit: status
//     OK with no current_limit, as envoyproxy/ratelimit answers.
//   - A domain the table does not define: the table's UnknownDomain
//     (Table.WithUnknownDomain; serve reads the policy file's
//     unknown_domain). The default is an error (NotFound), not
//     envoyproxy/ratelimit's OK, under which a typo in a domain turned
//     limiting off without a trace: an error is what Envoy already
//     handles by its failure_mode_deny and counts among its rate limit
//     errors. Every such request is counted by answer (the Server is a
//     prometheus.Collector) and logged at Warn, at most once a second.
//   - When ringlimit cannot decide (peer.ErrUnavailable, or the node is
//     closing), ShouldRateLimit returns gRPC status Unavailable, so Envoy's
//     failure_mode_deny decides; ResourceExhausted when the key's holder
//     has no room for a new key (peer.ErrCapacity). Decisions already made
//     for other groups of the same request stay recorded.
//   - Optional response headers (Domain.ResponseHeaders): RateLimit-Policy
//     and RateLimit in the IETF draft's form, one item per limited
//     descriptor, in response_headers_to_add.
//
// Not supported: replaces, detailed_metric, value_to_metric, share_threshold,
// wildcard values ("foo*"), quota mode and the response's quota field, the
// descriptor's limit override (RateLimitDescriptor.limit: each holder
// decides with its server-side table, which cannot change per request; the
// configured limit applies), request_headers_to_add, dynamic metadata, and
// units month and year (use a window such as 720h).
package envoyrls
