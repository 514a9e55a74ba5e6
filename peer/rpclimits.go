package peer

import (
	"fmt"
	"math"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// RPCLimits bounds what a client of the gRPC port can make the node hold:
// connections, the calls in progress on each, and connections that have
// gone quiet. Without them one client with no credentials held 60 000 idle
// AllowStream calls on 3 connections: 172 000 goroutines and 1.1 GB, which
// the process kept after they closed (issue 53). Peers share the port
// (their gRPC connection and two framed pipes each), so the bounds apply
// to them too and must leave them room.
//
// An idle AllowStream call costs about 21 KB (three goroutines and their
// buffers), so what calls can hold is about MaxConns × MaxStreams × 21 KB
// in all, and MaxConnsPerIP × MaxStreams × 21 KB from one address: with
// the defaults, 175 MB from one address (measured: 100 connections of 200
// idle streams from one address held 64 connections, 8 192 streams,
// 174 MB of heap and stacks).
type RPCLimits struct {
	// MaxConns bounds the connections the gRPC port holds at once, peers'
	// included; a connection past it is reset as soon as it is accepted.
	// Zero means 4096; negative means no bound.
	MaxConns int
	// MaxConnsPerIP bounds the connections from one remote IP address held
	// at once, refused likewise. Clients behind one NAT address share it,
	// and members on one host (a test cluster on 127.0.0.1) count three
	// connections for each other member: a cluster of more than 20 on one
	// address needs more. Zero means 64; negative means no bound.
	MaxConnsPerIP int
	// MaxStreams bounds the calls one connection may have in progress at
	// once (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS): a gRPC client queues
	// further calls until one ends; a client that ignores the setting has
	// the extra streams refused (RST_STREAM REFUSED_STREAM). A peer uses
	// a few on its connection. Zero means 128; must not be negative.
	MaxStreams int
	// IdleTimeout closes a connection that has had no call in progress
	// for this long (GOAWAY, then close; a gRPC client reconnects on its
	// next call). Zero means 5 minutes; negative means never.
	IdleTimeout time.Duration
	// KeepaliveTime is how long a connection may be silent before the
	// node pings it; an unanswered ping closes it after KeepaliveTimeout,
	// ending its calls. It finds clients that vanished without closing,
	// whose calls would otherwise be held for good. Zero means 1 minute;
	// at least 1 s.
	KeepaliveTime time.Duration
	// KeepaliveTimeout is how long the node waits for a ping's answer.
	// Zero means 20 s.
	KeepaliveTimeout time.Duration
	// MinPingInterval is how often a client may ping the node, with or
	// without calls in progress; a client that pings more often is sent
	// GOAWAY (too_many_pings) and closed. Zero means 10 s.
	MinPingInterval time.Duration
}

// The RPCLimits defaults: see each field.
const (
	defaultMaxConns         = 4096
	defaultMaxConnsPerIP    = 64
	defaultMaxStreams       = 128
	defaultIdleTimeout      = 5 * time.Minute
	defaultKeepaliveTime    = time.Minute
	defaultKeepaliveTimeout = 20 * time.Second
	defaultMinPingInterval  = 10 * time.Second
)

// WithDefaults returns l with its zero fields set to their defaults.
func (l RPCLimits) WithDefaults() RPCLimits {
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if l.MaxConns == 0 {
		l.MaxConns = defaultMaxConns
	}
	if l.MaxConnsPerIP == 0 {
		l.MaxConnsPerIP = defaultMaxConnsPerIP
	}
	if l.MaxStreams == 0 {
		l.MaxStreams = defaultMaxStreams
	}
	def(&l.IdleTimeout, defaultIdleTimeout)
	def(&l.KeepaliveTime, defaultKeepaliveTime)
	def(&l.KeepaliveTimeout, defaultKeepaliveTimeout)
	def(&l.MinPingInterval, defaultMinPingInterval)
	return l
}

// problems lists what is wrong with l (defaults filled in), one string
// each.
func (l RPCLimits) problems() []string {
	var out []string
	if l.MaxStreams < 0 || int64(l.MaxStreams) > math.MaxUint32 {
		out = append(out, fmt.Sprintf("rpc max streams %d must be between 1 and %d", l.MaxStreams, uint32(math.MaxUint32)))
	}
	if l.KeepaliveTime < time.Second {
		out = append(out, fmt.Sprintf("rpc keepalive time %v must be at least 1s", l.KeepaliveTime))
	}
	if l.KeepaliveTimeout < 0 || l.MinPingInterval < 0 {
		out = append(out, fmt.Sprintf("rpc keepalive timeout %v and min ping interval %v must not be negative", l.KeepaliveTimeout, l.MinPingInterval))
	}
	return out
}

// serverOptions are the gRPC server's options for l.
func (l RPCLimits) serverOptions() []grpc.ServerOption {
	idle := l.IdleTimeout
	if idle < 0 {
		idle = 0 // gRPC's "never"
	}
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(uint32(l.MaxStreams)),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: idle,
			Time:              l.KeepaliveTime,
			Timeout:           l.KeepaliveTimeout,
		}),
		// A client may ping while it has no call in progress (gRPC's
		// default forbids it, closing such clients after a few pings
		// whatever their rate); the rate is what is bounded.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: l.MinPingInterval, PermitWithoutStream: true}),
	}
}
