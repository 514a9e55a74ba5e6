// Package transport is the framed pipe: the peers' forwards and
// replication on a plain TCP connection of their own, framed by a length
// prefix, instead of on a gRPC stream. A gRPC stream message costs about
// four times a bare loopback message and a few dozen allocations (HTTP/2
// framing, flow control, a goroutine hand-off per message); on a framed
// pipe the sender writes the frame itself and the receiver reads it
// itself.
//
// What it owns:
//
//   - The wire: Magic, then TLS when the server has it, then a hello frame
//     (the pipe's kind, KindCheck or KindReplicate, and with a secret a
//     nonce and the sender's name, answered by the server's challenge and
//     the client's proof: hello.go), answered by one frame (accepted, or
//     refused with a gRPC status code and message); then each frame is a 4-byte big-endian length and a
//     protobuf message. Conn reads and writes frames; Dial opens a pipe.
//   - Stream: the grpc.BidiStreamingServer a stream handler reads and
//     answers on, and with the types swapped the grpc.BidiStreamingClient
//     a pipe sends on (Open), so the handlers and pipes of gRPC streams
//     run on framed pipes unchanged.
//   - Pipe: one long-lived stream to a peer (a gRPC stream or a framed
//     pipe) that matches answers to requests by id, answers every
//     request exactly once, and breaks on a send or receive error or an
//     answer twice its timeout late.
//   - Auth, peer authentication: a fresh token per call derived from the
//     cluster's secret and accepted once (calltoken.go), a challenge in a
//     framed pipe's hello, or a client certificate verified under mutual
//     TLS whose SANs match the peer name patterns; checked on every call
//     to the protected services (ServerOptions) and on every hello; the
//     tokens made for every call (DialOptions).
//   - Server and Listener: a framed pipe shares the gRPC port. The
//     Listener reads the first bytes of every connection: Magic (which
//     neither an HTTP/2 preface, "PRI ...", nor a TLS record, 0x16 ...,
//     begins with) makes it a framed pipe for the Server; anything else
//     goes to the gRPC server's Accept with the bytes put back. The
//     Server stops its pipes at once (connections closed) or gracefully
//     (no more requests read; answers to those read still sent).
//
// What it guarantees: no input makes a Conn allocate more than the frame
// limit (MaxFrame, or MaxHello before a hello is accepted); a stranger
// gets nothing but a hello's answer; setup is bounded by SetupTimeout on
// each side; each write by the Conn's write timeout, after which the
// connection is closed (a frame may be half written).
//
// What it does not do: it knows nothing of ownership, policies, keys or
// which messages it carries. What runs on an admitted pipe is its
// Handler's (peer: CheckStream and ReplicateStream); which services are the peers' own is its
// caller's. The goroutines it starts belong to
// the WaitGroup its caller passes (the Node's).
//
// What it may import: the standard library, gRPC (for the stream
// interfaces and status codes) and protobuf. Never peer, cmd or bench,
// ownership, raft, memberlist, policy or shard (pinned by peer's
// TestLayout).
package transport
