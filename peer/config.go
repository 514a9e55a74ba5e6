package peer

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/hashicorp/memberlist"
	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/peer/internal/transport"
	"github.com/ringlimit/ringlimit/peer/internal/wire"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/shard"
)

// Algorithm is shard.Algorithm, re-exported.
type Algorithm = shard.Algorithm

// The algorithms a policy can use; see shard for each one's promise.
const (
	SlidingLog  = shard.SlidingLog
	TokenBucket = shard.TokenBucket
	FixedWindow = shard.FixedWindow
	// Concurrency caps the requests in progress: Node.Acquire and
	// Node.Release (Limit leases held at once, Window the lease TTL).
	Concurrency = shard.Concurrency
	// Calendar counts per calendar period (PolicyConfig.Period) in
	// PolicyConfig.Zone; Window stays zero.
	Calendar = shard.Calendar
)

// Period is shard.Period, re-exported: the calendar unit of a Calendar
// policy.
type Period = shard.Period

// The calendar periods; see shard.Period. A week is the ISO week, from
// Monday 00:00.
const (
	CalendarDay   = shard.CalendarDay
	CalendarWeek  = shard.CalendarWeek
	CalendarMonth = shard.CalendarMonth
	CalendarYear  = shard.CalendarYear
)

// OnUnavailable says what a node does when a key's owner cannot be reached in
// time. Whatever it says, the outcome is reported as unavailability, never as
// over limit. It is policy.OnUnavailable, re-exported; its String method
// returns fail_closed, fail_open or fallback.
type OnUnavailable = policy.OnUnavailable

const (
	// FailClosed (the default) refuses: Allow returns an error wrapping
	// ErrUnavailable.
	FailClosed = policy.FailClosed
	// FailOpen admits without a decision: Decision.Reason is
	// ReasonFailedOpen.
	FailOpen = policy.FailOpen
	// Fallback decides on a local log with a reduced limit
	// (PolicyConfig.FallbackLimit): Decision.Reason is ReasonFallback.
	Fallback = policy.Fallback
)

// ParseOnUnavailable maps fail_closed, fail_open or fallback (or "", meaning
// fail_closed) to its value.
func ParseOnUnavailable(s string) (OnUnavailable, error) {
	if s == "" {
		return FailClosed, nil
	}
	for o := FailClosed; o <= Fallback; o++ {
		if o.String() == s {
			return o, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown on_unavailable %q (want fail_closed, fail_open or fallback)", ErrInvalidConfig, s)
}

// PolicyConfig is one entry of the server-side policy table. The owner's
// table decides: a request only names the policy. It is policy.Config
// (peer/internal/policy, the table's own package), re-exported:
//
//	type PolicyConfig struct {
//		// Limit is the number of units per Window (for Concurrency, the units
//		// held at once). Must be positive.
//		Limit int64
//		// Window is the rolling window (for Concurrency, the lease TTL: a lease
//		// not released expires Window after it was taken). Must be positive,
//		// except under Calendar, where it must be zero (Period sets the length).
//		Window time.Duration
//		// Algorithm is the limiting algorithm. Zero means SlidingLog.
//		Algorithm Algorithm
//		// Resolution is the sliding log's timestamp granularity. Zero means 1 ms.
//		Resolution time.Duration
//		// Period is the calendar unit of a Calendar policy (calendar day,
//		// ISO week from Monday, month or year); required there, and must be
//		// zero for every other algorithm.
//		Period Period
//		// Zone is the IANA time zone ("Europe/Berlin") whose calendar a
//		// Calendar policy follows. Empty means UTC. Only for Calendar. The zone
//		// rules come from the host's zoneinfo, else from the copy embedded in
//		// the binary (time/tzdata).
//		Zone string
//		// OnUnavailable is what to do when the owner cannot be reached. Zero
//		// means FailClosed.
//		OnUnavailable OnUnavailable
//		// FallbackLimit is the local limit used by Fallback. Zero means Limit
//		// divided by the number of members in the ring (at least 1), so the
//		// members together stay near Limit.
//		FallbackLimit int64
//		// Shadow computes, records and reports decisions but admits every
//		// request: a refusal comes back Allowed with ReasonShadow. Use it to try
//		// a new limit on live traffic.
//		Shadow bool
//		// Replication says how the partition holder copies this policy's
//		// admissions to the partition's backup before a crash can lose them.
//		// Zero means ReplicateSync.
//		Replication Replication
//		// Overrides give exact tenants, or (tenant, subject) pairs, another
//		// limit than Limit, or none. A (tenant, subject) override wins over a
//		// tenant's. Everything else (window, algorithm, failure policy,
//		// replication) is the policy's. They are part of the table and of its
//		// version; the holder applies its own. Nil means none.
//		Overrides []Override
//	}
//
// Its method:
//
//	func (p PolicyConfig) For(tenant, subject string) PolicyConfig
//
// For returns the entry that applies to the keys of tenant and subject:
// p with the limit of the override that covers them (a (tenant, subject)
// override before a tenant's), or p itself; Limit is 0 for an Unlimited
// override. Overrides is nil in the result. It scans the overrides: for
// error and unavailability answers, not for the decision path (which uses
// the node's prepared table).
type PolicyConfig = policy.Config

// Override is one exception in a policy: the keys of Tenant (and, when
// Subject is set, of that subject only) are limited by Limit instead of
// the policy's, or not at all when Unlimited. An unlimited key is admitted
// without being recorded (Reason ReasonUnlimited, Limit 0). It is
// policy.Override, re-exported:
//
//	type Override struct {
//		// Tenant is the key's tenant, exactly. Required.
//		Tenant string
//		// Subject is the key's subject, exactly; "" means every subject of
//		// Tenant.
//		Subject string
//		// Limit replaces the policy's limit. Must be positive unless
//		// Unlimited.
//		Limit int64
//		// Unlimited admits every request of these keys without counting.
//		// Limit must then be zero.
//		Unlimited bool
//	}
//
// Its method:
//
//	func (o Override) Validate() error
//
// Validate checks the override's own fields and reports every problem,
// joined with errors.Join, one error per problem, so that a caller can
// unwrap them (Unwrap() []error) and put where the override stands in
// front of each. It returns nil for a usable override. The problems are:
// "tenant is missing" when Tenant is empty; "tenant must be ..." when it is
// not a valid key part (1 to shard.MaxKeyPartLen bytes of visible ASCII);
// "subject must be ..." when Subject is neither empty nor a valid key
// part; "not both" when Unlimited comes with a non-zero Limit; and "must
// be positive" when a limited override has no positive Limit. The errors
// wrap nothing: SetPolicies wraps them in ErrInvalidConfig. Validate does
// not check the override against its policy (whether the policy is valid
// with the override's limit, or whether another override has the same
// tenant and subject); SetPolicies does.
type Override = policy.Override

// Spread is whether a policy's hot keys are decided from rights by the
// nodes that receive them (see the package doc's "Spread keys"). It is
// policy.Spread, re-exported; String returns "off" or "auto".
type Spread = policy.Spread

const (
	// SpreadOff: every decision of a key is its holder's (the default).
	SpreadOff = policy.SpreadOff
	// SpreadAuto: a node forwarding more than the policy's
	// SpreadThreshold decisions a second for a key asks for rights and
	// decides from them.
	SpreadAuto = policy.SpreadAuto
)

// ParseSpread parses "off" or "auto" ("" is off).
func ParseSpread(s string) (Spread, error) {
	switch s {
	case "", "off":
		return SpreadOff, nil
	case "auto":
		return SpreadAuto, nil
	}
	return SpreadOff, fmt.Errorf("peer: spread %q: want off or auto", s)
}

// Replication is how a policy's admissions reach the partition's backup.
// It is policy.Replication, re-exported; its String method returns "sync",
// "async" or "off".
type Replication = policy.Replication

const (
	// ReplicateSync answers an admission only after the backup has it: a
	// crash of the holder loses nothing. Costs one batched round trip per
	// admission (refusals record nothing and are not replicated).
	ReplicateSync = policy.ReplicateSync
	// ReplicateAsync answers at once and sends the admission to the backup
	// in the next batch: a crash of the holder loses at most the
	// admissions whose replication the backup had not yet acknowledged. A
	// failed or refused batch makes the holder copy the partition to its
	// backup again (the partition is unavailable for that copy), so what a
	// blip lost is lost until that copy, not for the rest of the window.
	ReplicateAsync = policy.ReplicateAsync
	// ReplicateOff never copies admissions: a crash of the holder resets
	// the policy's keys of its partitions. A graceful move still keeps them.
	ReplicateOff = policy.ReplicateOff
)

// Durability is whether a policy's admissions are kept on the holder's
// data directory. It is policy.Durability, re-exported; its String method
// returns "memory", "disk" or "disk_async".
type Durability = policy.Durability

const (
	// DurabilityMemory keeps admissions in memory (and on the backup, by
	// Replication) only: a restart of every member loses them.
	DurabilityMemory = policy.DurabilityMemory
	// DurabilityDisk answers an admission only after the key's state is
	// on the holder's disk, fsynced; concurrent admissions share one
	// fsync (group commit). Without a data directory: memory.
	DurabilityDisk = policy.DurabilityDisk
	// DurabilityDiskAsync answers at once and writes and fsyncs the
	// holder's log every diskFlushInterval: a restart of every member
	// loses at most the admissions of the last interval.
	DurabilityDiskAsync = policy.DurabilityDiskAsync
)

// ParseDurability parses "memory", "disk" or "disk_async".
func ParseDurability(s string) (Durability, error) {
	for d := DurabilityMemory; d <= DurabilityDiskAsync; d++ {
		if d.String() == s {
			return d, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown durability %q (want memory, disk or disk_async)", ErrInvalidConfig, s)
}

// ParseReplication parses "sync", "async" or "off".
func ParseReplication(s string) (Replication, error) {
	for r := ReplicateSync; r <= ReplicateOff; r++ {
		if r.String() == s {
			return r, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown replication %q (want sync, async or off)", ErrInvalidConfig, s)
}

// Config configures a Node. The zero value runs a working single node on
// loopback with ephemeral ports and one policy named "default" (100 per
// minute). Production must set Name, GossipAddr, RPCAddr (reachable
// addresses), Join, Policies, and should set TLS, GossipKey and Logger.
// New works on a copy and never writes into the caller's struct.
type Config struct {
	// Name is the node's unique member name. Zero means "node-" plus 8
	// random hex digits.
	Name string
	// GossipAddr is the memberlist bind address, host:port; port 0 picks a
	// free port (read it back with Node.GossipAddr). Zero means
	// "127.0.0.1:0".
	GossipAddr string
	// RPCAddr is the gRPC listen address, host:port; port 0 picks a free
	// port (Node.RPCAddr). Zero means "127.0.0.1:0".
	RPCAddr string
	// GossipAdvertiseAddr is the gossip address peers should use, when it
	// differs from the bound one (NAT, 0.0.0.0 binds). Zero means the bound
	// address.
	GossipAdvertiseAddr string
	// RPCAdvertiseAddr is the gRPC address peers should dial, when it
	// differs from the bound one. Zero means the bound address.
	RPCAdvertiseAddr string
	// Join lists gossip addresses of existing members. Zero means start a
	// new cluster.
	Join []string
	// Policies is the server-side policy table, by policy name: the node's
	// initial table (Node.SetPolicies replaces it). Members may run
	// different tables; each holder decides with its own. Zero means
	// {"default": 100 per minute, sliding log, fail closed}.
	Policies map[string]PolicyConfig
	// Ring holds the placement parameters; zero fields take ring's defaults
	// (ExpectedMembers sets the partition count). Every member must use
	// the same values.
	Ring ring.Config
	// ExpectedMembers is the most members the cluster is expected to
	// reach, fixed when it is founded; give every member the same. Beyond
	// 16 it sets Ring.PartitionCount when that is zero (ring.PartitionsFor:
	// 16 partitions a member, so none owns nothing) and scales the gossip
	// profile's suspicion and retransmission to the size
	// (GossipProfile.ApplySized). Zero means 16 or fewer: 271 partitions
	// and the profile as it is. At most ring.MaxExpectedMembers.
	ExpectedMembers int
	// ForwardTimeout bounds one forwarded request when the caller's context
	// has no earlier deadline. Zero means 500 ms.
	ForwardTimeout time.Duration
	// MaxBatch is the most requests one forwarded RPC carries. Zero means 256.
	MaxBatch int
	// MaxInFlight is how many batches of forwards, and separately of
	// replication on the peer's stream, may be in flight to one peer at
	// once. Zero means 4. Forwards, and replication, gather into one
	// message while another is out and use a further slot only when that
	// one is slow to answer (5 ms).
	MaxInFlight int
	// DisableBatching sends every forwarded request as its own RPC (for
	// comparison).
	DisableBatching bool
	// DisableStreams sends every batch of forwards and of replication as a
	// unary RPC instead of on the long-lived stream to the peer (for
	// comparison, and for peers behind proxies that cut long streams).
	// Zero (false) means streams.
	DisableStreams bool
	// DisableFramedPipes keeps those streams on gRPC instead of on a
	// framed TCP connection of their own to the peer's gRPC port (for
	// comparison, and for peers behind proxies that pass only HTTP/2;
	// without it a peer that refuses a framed pipe gets a gRPC stream
	// anyway, after one try). Zero (false) means framed pipes.
	DisableFramedPipes bool
	// noFramedServer (tests only) serves gRPC alone on the port, as a
	// node from before framed pipes did.
	noFramedServer bool
	// refuseFramed (tests only) starts the node refusing framed pipes
	// as Unavailable (Node.hooks.refuseFramed).
	refuseFramed bool
	// framedWriteTimeout (tests only) bounds a write on a framed pipe;
	// zero means framedWriteTimeout's default (Node.framedWriteTimeout).
	framedWriteTimeout time.Duration
	// NotOwnerRetries bounds how often a request is retried after a peer
	// answers "not owner". Zero means 3.
	NotOwnerRetries int
	// ServerTLS, if set, secures the gRPC server; ClientTLS secures the
	// connections to peers. Nil means plaintext.
	ServerTLS *tls.Config
	// ClientTLS, see ServerTLS.
	ClientTLS *tls.Config
	// GossipKey, if set, encrypts gossip (AES, 16, 24 or 32 bytes). Members
	// with another key cannot join. Unless PeerSecret is set, it also
	// authenticates peer RPCs (see PeerSecret).
	GossipKey []byte
	// PeerSecret authenticates peer-only RPCs (the ringlimit.v1.Limiter
	// service: forwards, handoff, pull, backup; the ownership log) on the
	// shared gRPC port: each call carries a fresh HMAC-SHA256 token
	// derived from it, accepted once (bound to the method, both members'
	// names, a session and counter, and a time within 30 s of the
	// receiver's wall clock), and a framed pipe's hello answers a
	// challenge of the receiver's; calls without a right token are refused
	// (Unauthenticated or PermissionDenied). A captured token or hello
	// cannot be replayed. Any length; use 32 random bytes. Every member
	// must use the same secret, and members' wall clocks must agree within
	// 30 s. Zero means GossipKey; with neither, and no mutual TLS
	// (ServerTLS.ClientAuth RequireAndVerifyClientCert, which authenticates
	// peers by certificate), peer RPCs are open to anyone who reaches the
	// port and New logs a warning.
	PeerSecret []byte
	// PeerCertNames, under mutual TLS, tell peers' certificates from
	// clients' of the same CA: a verified certificate is a peer's only if
	// one of its DNS or URI SANs matches one of these patterns (path.Match:
	// "*.ringlimit.default.svc.cluster.local",
	// "spiffe://cluster.local/ns/default/sa/ringlimit"). Any other
	// certificate of the CA (Envoy's, an application's) may call the
	// public API but no peer RPC (with PeerSecret set it may still present
	// the token, as a peer). Nil means every verified certificate is a
	// peer's, and New logs a warning under mutual TLS. A malformed
	// pattern is ErrInvalidConfig.
	PeerCertNames []string
	// GossipProfile selects memberlist's timings: GossipLAN, GossipFast or
	// GossipWAN (see each for its failure-detection time). Gossip runs
	// after it and may adjust single knobs. Every member should use the
	// same profile. Zero means GossipLAN.
	GossipProfile GossipProfile
	// Gossip adjusts the memberlist config after ringlimit's defaults
	// (memberlist.DefaultLANConfig, GossipProfile's timings, name,
	// addresses, delegates and logger). Nil means no change. Called once,
	// from New.
	Gossip func(*memberlist.Config)
	// RegisterServices, when not nil, registers further gRPC services on
	// the node's gRPC server, so they share its listener (RPCAddr), TLS
	// and authentication. It is called once, from New, after the node's
	// own services are registered and before the server starts serving;
	// node is the node being started: its methods may be called from the
	// registered handlers, which may run before New returns (while the
	// node is still joining). Nil registers nothing. cmd/ringlimit uses it
	// for Envoy's rate limit service, so peer never imports Envoy's
	// protos.
	RegisterServices func(s grpc.ServiceRegistrar, node *Node)
	// AuthorizeReset, when not nil, is asked before each public
	// RateLimiter.Reset call runs, with the call's context (its metadata
	// and peer.FromContext's TLS state): a non-nil error refuses the call
	// and is its answer (return a gRPC status, such as Unauthenticated;
	// any other error is answered PermissionDenied). Nil leaves Reset open
	// to whoever reaches the gRPC port, like the rest of the public API
	// (serve it with mutual TLS where clients must not reset quotas).
	// Node.Reset, called in-process, is not asked.
	// cmd/ringlimit always sets it: the --admin-token-file token or a
	// verified client certificate, and without the flag only the
	// certificate.
	AuthorizeReset func(ctx context.Context) error
	// AuthorizeRefund, when not nil, is asked before each public
	// RateLimiter.Refund call runs, as AuthorizeReset is before Reset. A
	// refund gives back the newest admissions of a key whoever made them
	// (nothing ties it to the caller that was admitted), so a client that
	// may refund can undo its key's limit as a reset would, up to the
	// limit at a time: guard it wherever clients must not. Nil leaves
	// Refund open like the rest of the public API. Node.Refund, called
	// in-process, is not asked. cmd/ringlimit uses it for
	// --admin-token-file and --refund-token-file.
	AuthorizeRefund func(ctx context.Context) error
	// RPCLimits bounds the connections and calls clients (and peers)
	// hold on the gRPC port, and closes idle and vanished connections;
	// zero fields take their defaults (see RPCLimits).
	RPCLimits RPCLimits
	// JoinTimeout bounds how long New keeps trying to join Join's seeds
	// when none answers: tries are spaced 100 ms apart, doubling up to 2 s,
	// and each failure is logged with its attempt number. The ctx passed
	// to New bounds it too. A seed that answers that its gossip key
	// differs from GossipKey (or that one side has none) ends the join at
	// once: New returns an error wrapping ErrInvalidConfig that quotes the
	// answer. Zero means 30 s.
	JoinTimeout time.Duration
	// ReconnectInterval is how often the node tries to rejoin members that
	// failed (memberlist never contacts a member again once it declared it
	// dead, so after a network partition each side would keep its own ring)
	// and, while it is alone, the Join seeds. Zero means the profile's: 1 s
	// for GossipFast, 10 s for GossipLAN, 30 s for GossipWAN.
	ReconnectInterval time.Duration
	// ReconnectTimeout is how long after a member failed the node keeps
	// trying to rejoin it; at most 256 failed members are remembered, the
	// oldest forgotten first. Members that left gracefully are never
	// retried. Zero means 6 h.
	ReconnectTimeout time.Duration
	// Clock is the node's time source; as owner, it is the authority for the
	// keys it owns. Nil means time.Now.
	Clock func() time.Time
	// Logger receives structured logs. Nil means slog.Default() as it is
	// when New is called, so that an embedder who sets none still sees
	// the node's warnings (open peer RPCs, for one) and its Info lines;
	// to discard logs, pass slog.New(slog.DiscardHandler).
	Logger *slog.Logger
	// Metrics receives counters and timings. Nil means none.
	Metrics Metrics
	// Store bounds local state; zero fields take shard's defaults.
	// MaxKeys is the most keys this node holds, its partitions' and its
	// backup copies' together: each of the ring's partitions may hold
	// MaxKeys/PartitionCount keys (at least 64) on whichever member holds
	// or backs it up, so every partition's copy fits on every member with
	// the same value. The cluster thus holds at most MaxKeys distinct keys
	// (when its keys spread evenly) whatever its size: raise it with the
	// keys, not with the members. A new key past its partition's share is
	// ErrCapacity; keys held are still decided. Zero means shard's default
	// for each partition (1 048 576: no practical bound).
	Store shard.Config
	// SweepInterval is how often idle keys are reclaimed. Zero means 10 s.
	SweepInterval time.Duration
	// HotKeys is how many hot keys the node tracks and reports. Zero means
	// 16.
	HotKeys int
	// HotKeysHalfLife is the decay half-life of hot-key rates. Zero means
	// 10 s.
	HotKeysHalfLife time.Duration
	// LeaseDuration is the liveness period: every member extends its
	// liveness record through the ownership log every LeaseDuration/3,
	// and a holder decides only within 9/10 of LeaseDuration of sending
	// its latest extension, on its own monotonic clock. A crashed holder's
	// partitions are taken over once its liveness has expired on the
	// log's leader (LeaseDuration from when it applied the last extension,
	// plus the clock-rate margin), so they are unavailable for about one
	// to two LeaseDurations. Zero means 2 s.
	LeaseDuration time.Duration
	// FailedMemberTimeout is how long a member that gossip reports failed
	// (rather than left) stays a voter of the ownership log: a member cut
	// off for a while is still a voter when it comes back; after it, the
	// voters are chosen again without it. Zero means 10 minutes.
	FailedMemberTimeout time.Duration
	// TransferChunkBytes bounds one message of a partition copy. Zero means
	// 1 MiB.
	TransferChunkBytes int
	// DataDir is a directory this node keeps on disk what a restart of
	// every member at once must not lose: the ownership log (raft's hard
	// state, entries and snapshots), the cluster id and its raft ID, and
	// the state of the partitions it holds and backs up for the policies
	// whose Durability is disk or disk_async. Empty keeps everything in
	// memory, as before. A node restarted with its DataDir rejoins its
	// cluster as the same raft member under a new incarnation, and takes
	// back the partitions its old incarnation held with their state (the
	// package doc, "Data directory"). The directory must keep the node's
	// Name; one of another cluster or member, damaged, or written by a
	// newer version is refused by New with an error naming the file, and
	// left as it was. One process at a time (locked).
	DataDir string
	// Ownership is how partition holders change; the only mode is
	// OwnershipLog (also ""): by compare-and-set commands in a replicated
	// log (raft) with liveness leases, which keeps one decision point per
	// partition under any single fault, network splits included, once the
	// cluster has 3 members (of 2 only the founder votes: its crash stops
	// every holder, the other's is survived). "gossip", the rules over
	// each node's gossip view that came before, was removed: it is
	// refused as ErrInvalidConfig.
	Ownership OwnershipMode

	clockIsDefault bool // set by withDefaults when Clock was nil
}

// OwnershipMode is how partition holders change; see Config.Ownership.
type OwnershipMode string

// OwnershipLog: holders change by commands in a replicated log.
const OwnershipLog OwnershipMode = "log"

// ParseOwnership parses "log" ("" is log too).
func ParseOwnership(s string) (OwnershipMode, error) {
	switch OwnershipMode(s) {
	case "", OwnershipLog:
		return OwnershipLog, nil
	case "gossip":
		return "", fmt.Errorf("peer: ownership %q was removed: holders change only through the ownership log (log)", s)
	}
	return "", fmt.Errorf("peer: ownership %q: want log", s)
}

// defaultPolicy is the table a zero Config gets.
var defaultPolicy = PolicyConfig{Limit: 100, Window: time.Minute}

// defaultForwardTimeout is Config.ForwardTimeout's zero value; a client's
// DecisionTimeout defaults to twice it, so a node's failure answer comes
// first.
const defaultForwardTimeout = 500 * time.Millisecond

// withDefaults returns a copy of c with zero fields filled in. Maps and
// slices are copied so the caller's values are never written.
func (c Config) withDefaults() Config {
	if c.Name == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		c.Name = "node-" + hex.EncodeToString(b[:])
	}
	if c.GossipAddr == "" {
		c.GossipAddr = "127.0.0.1:0"
	}
	if c.RPCAddr == "" {
		c.RPCAddr = "127.0.0.1:0"
	}
	if c.Ownership == "" {
		c.Ownership = OwnershipLog
	}
	c.Join = append([]string(nil), c.Join...)
	pols := make(map[string]PolicyConfig, len(c.Policies))
	for k, v := range c.Policies {
		pols[k] = v
	}
	if len(pols) == 0 {
		pols["default"] = defaultPolicy
	}
	c.Policies = pols
	if c.Ring.PartitionCount == 0 && c.ExpectedMembers > 0 && c.ExpectedMembers <= ring.MaxExpectedMembers {
		c.Ring.PartitionCount, _ = ring.PartitionsFor(c.ExpectedMembers) // in range: no error
	}
	c.Ring = c.Ring.WithDefaults()
	if c.ForwardTimeout == 0 {
		c.ForwardTimeout = defaultForwardTimeout
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = 256
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 4
	}
	if c.NotOwnerRetries == 0 {
		c.NotOwnerRetries = 3
	}
	c.RPCLimits = c.RPCLimits.WithDefaults()
	c.GossipKey = append([]byte(nil), c.GossipKey...)
	c.PeerSecret = append([]byte(nil), c.PeerSecret...)
	c.PeerCertNames = append([]string(nil), c.PeerCertNames...)
	if c.GossipProfile == "" {
		c.GossipProfile = GossipLAN
	}
	if c.JoinTimeout == 0 {
		c.JoinTimeout = 30 * time.Second
	}
	if c.ReconnectInterval == 0 {
		c.ReconnectInterval = c.GossipProfile.reconnectInterval()
	}
	if c.ReconnectTimeout == 0 {
		c.ReconnectTimeout = 6 * time.Hour
	}
	if c.Clock == nil {
		c.Clock = time.Now
		c.clockIsDefault = true
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Metrics == nil {
		c.Metrics = nopMetrics{}
	}
	if c.SweepInterval == 0 {
		c.SweepInterval = 10 * time.Second
	}
	if c.HotKeys == 0 {
		c.HotKeys = 16
	}
	if c.HotKeysHalfLife == 0 {
		c.HotKeysHalfLife = 10 * time.Second
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = 2 * time.Second
	}
	if c.FailedMemberTimeout == 0 {
		c.FailedMemberTimeout = 10 * time.Minute
	}
	if c.TransferChunkBytes == 0 {
		c.TransferChunkBytes = 1 << 20
	}
	return c
}

// validate reports every problem at once, joined, each wrapping
// ErrInvalidConfig. It expects defaults filled in.
func (c Config) validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
	}
	if len(c.Name) > 128 {
		bad("name is %d bytes, longer than 128", len(c.Name))
	}
	if _, err := ParseOwnership(string(c.Ownership)); err != nil {
		bad("%s", strings.TrimPrefix(err.Error(), "peer: "))
	}
	if err := transport.ValidPeerNames(c.PeerCertNames); err != nil {
		bad("%v", err)
	}
	for _, a := range []struct{ name, v string }{{"gossip address", c.GossipAddr}, {"rpc address", c.RPCAddr}} {
		if _, _, err := net.SplitHostPort(a.v); err != nil {
			bad("%s %q: %v", a.name, a.v, err)
		}
	}
	for _, a := range []struct{ name, v string }{{"gossip advertise address", c.GossipAdvertiseAddr}, {"rpc advertise address", c.RPCAdvertiseAddr}} {
		if a.v == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a.v); err != nil {
			bad("%s %q: %v", a.name, a.v, err)
		}
	}
	errs = append(errs, validatePolicies(c.Policies)...)
	if err := c.Ring.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidConfig, err))
	}
	if c.ExpectedMembers < 0 || c.ExpectedMembers > ring.MaxExpectedMembers {
		bad("expected members %d must be between 0 and %d", c.ExpectedMembers, ring.MaxExpectedMembers)
	}
	if c.ForwardTimeout < 0 {
		bad("forward timeout %v must not be negative", c.ForwardTimeout)
	}
	if c.MaxBatch < 0 || c.MaxBatch > wire.MaxBatch {
		bad("max batch %d must be between 1 and %d", c.MaxBatch, wire.MaxBatch)
	}
	if c.MaxInFlight < 0 {
		bad("max in flight %d must not be negative", c.MaxInFlight)
	}
	if c.NotOwnerRetries < 0 {
		bad("not-owner retries %d must not be negative", c.NotOwnerRetries)
	}
	for _, p := range c.RPCLimits.problems() {
		bad("%s", p)
	}
	switch len(c.GossipKey) {
	case 0, 16, 24, 32:
	default:
		bad("gossip key is %d bytes, want 16, 24 or 32", len(c.GossipKey))
	}
	if _, err := ParseGossipProfile(string(c.GossipProfile)); err != nil {
		errs = append(errs, err)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"sweep interval", c.SweepInterval}, {"hot keys half-life", c.HotKeysHalfLife}, {"lease duration", c.LeaseDuration}, {"failed member timeout", c.FailedMemberTimeout},
		{"join timeout", c.JoinTimeout}, {"reconnect interval", c.ReconnectInterval}, {"reconnect timeout", c.ReconnectTimeout}} {
		if d.v < 0 {
			bad("%s %v must not be negative", d.name, d.v)
		}
	}
	if c.LeaseDuration > 0 && c.LeaseDuration < 10*time.Millisecond {
		bad("lease duration %v must be at least 10ms", c.LeaseDuration)
	}
	if c.TransferChunkBytes < 0 {
		bad("transfer chunk bytes %d must not be negative", c.TransferChunkBytes)
	}
	if c.HotKeys < 0 {
		bad("hot keys %d must not be negative", c.HotKeys)
	}
	if c.Store.Stripes < 0 || c.Store.MaxKeys < 0 {
		bad("store stripes %d and max keys %d must not be negative", c.Store.Stripes, c.Store.MaxKeys)
	}
	return errors.Join(errs...)
}

// validatePolicies reports every problem of a policy table, each wrapping
// ErrInvalidConfig.
func validatePolicies(pols map[string]PolicyConfig) []error {
	errs := policy.Validate(pols)
	for i, err := range errs {
		// %s, not %w: the problem wraps nothing, and the result unwraps to
		// ErrInvalidConfig alone, as every other Config problem does.
		errs[i] = fmt.Errorf("%w: %s", ErrInvalidConfig, err)
	}
	return errs
}

// fingerprint identifies the cluster-wide placement contract: the ring
// parameters and how keys map to partitions. Members gossip it; a member
// with another fingerprint is never used as an owner. The policy table is
// not part of it: each holder decides with its own table, and its version
// is gossiped separately (see SetPolicies), so a rolling policy change
// never splits the ring.
func (c Config) fingerprint() uint64 {
	h := xxhash.New()
	// Placement hashes (tenant, subject) to a partition and ownership moves
	// by partition with epochs: both are part of the contract.
	fmt.Fprintf(h, "ring=%d;placement=%s;", c.Ring.Fingerprint(), placementScheme)
	// Log-owned members never mix with the gossip-owned members of older
	// releases: each would think it decides.
	fmt.Fprintf(h, "ownership=log;")
	return h.Sum64()
}

// maxWireBatch is the most items a Check RPC may carry; more is
// InvalidArgument.
const maxWireBatch = wire.MaxBatch
