// Package connlimit bounds the connections a listener holds at once: in
// all, and from one remote IP address. Its Listener wraps the node's gRPC
// listener, so that a client cannot hold an unbounded number of
// connections (and with them, gRPC's buffers, goroutines and streams).
//
// What it guarantees: Accept never returns a connection past either
// bound; a connection past them is closed as soon as it is accepted,
// before anything is read from it or written to it (with a reset, so the
// server keeps no TIME_WAIT state for it). A connection's slot is freed
// once, when the connection is first closed, by whoever closes it. The
// counts are exact under concurrent use.
//
// What it does not do: it does not queue (a refused client sees its
// connection reset and retries as after any failure); it does not look at
// what a connection carries or who sent it (peers and clients count
// alike, so a bound per address must leave room for the peers behind
// one address); it closes nothing that it accepted (idle connections are
// gRPC keepalive's business). It starts no goroutines.
package connlimit
