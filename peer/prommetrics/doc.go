// Package prommetrics is a ringlimit node's Metrics as Prometheus
// collectors: decisions by policy, reason and path; forwards and their
// batches; the ring, keys and sweeps; handoffs and backups; hot keys;
// readiness and the policy table; a spread key's rights and settlements'
// overage (the optional sinks peer looks for); and the ownership log's
// traffic (peer.RaftTrafficSource, read from the node at each scrape).
// New registers them on a registry the caller owns; set the result as
// peer.Config.Metrics.
//
// What it may import: peer's public API, Prometheus's client and the
// standard library, never a package under peer/internal (peer's
// TestLayoutPublicParts pins it); peer cannot import it back, and does
// not import Prometheus at all.
package prommetrics
