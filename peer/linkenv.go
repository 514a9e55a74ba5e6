package peer

import (
	"context"
	"crypto/tls"
	"iter"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/transport"
	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// linkEnv is everything the links to peers (peerLinks and each
// peerLink: forward batching, replication, their pipes) take from their
// node, set once when the node starts its RPC server and never changed.
// The links reach nothing else of the node: what they read is here, what
// they change is the counters and pools below (peerLinks' own), and
// their goroutines join the node's group and end with the node's
// context.
type linkEnv struct {
	ctx     context.Context // the node's lifetime: cancelled by Close
	wg      *sync.WaitGroup // the node's goroutines; the client's join it
	self    string          // this node's name, the sender of every request
	log     *slog.Logger
	metrics Metrics
	clock   func() time.Time // the node's clock: replication's ages

	maxBatch           int            // Config.MaxBatch
	maxInFlight        int            // Config.MaxInFlight: batches in flight per link
	noBatching         bool           // Config.DisableBatching: a forward is its own call
	forwardTimeout     time.Duration  // Config.ForwardTimeout
	framedWriteTimeout time.Duration  // bounds each write on a framed pipe
	noStreams          bool           // Config.DisableStreams: unary calls only
	noFramed           bool           // Config.DisableFramedPipes: gRPC streams only
	tls                *tls.Config    // Config.ClientTLS
	auth               transport.Auth // answers a framed pipe's challenge

	view   *atomic.Pointer[view] // the node's current view (ring, members)
	gather *atomic.Int64         // ns a batch waits for more calls (adapted by the node)

	replSeq      *atomic.Uint64 // numbers replication messages, node-wide
	framedOpened *atomic.Int64  // framed pipes opened (tests)
	pipeBreaks   *atomic.Int64  // pipes that broke (tests)
	replItems    *sync.Pool     // *replItem

	// warn logs a degraded-service warning, throttled node-wide.
	warn func(msg string, args ...any)
	// stamp sets a replication message's policy version and, while
	// member's policy table may differ, the windows of names.
	stamp func(req *peerpb.ReplicateRequest, member string, names iter.Seq[string])
	// recopy tells the ownership runner, without blocking, that an item
	// of partition pid replicated at epoch without waiting did not reach
	// the backup, so the holder copies the partition to it again
	// (recopy.go).
	recopy func(pid int, epoch uint64)
	// diskPolicy reports whether policy name's admissions are answered
	// only once on disk (durability disk).
	diskPolicy func(name string) bool
}

// pipeConfig is what the client's pipes to its peer (framed or not) need.
func (e *linkEnv) pipeConfig(framed bool) transport.PipeConfig {
	return transport.PipeConfig{WG: e.wg, Timeout: e.forwardTimeout, Breaks: e.pipeBreaks, Framed: framed}
}
