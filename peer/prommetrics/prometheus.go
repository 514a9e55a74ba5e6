package prommetrics

import (
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/peer"
)

// Metrics implements peer.Metrics with Prometheus collectors registered
// on a registry the caller owns. Build one per Node: two instances on two
// registries are fully independent, and nothing is registered on the global
// registry. It is safe for concurrent use; every method is cheap and never
// blocks on I/O.
//
// It exports:
//
//	ringlimit_decisions_total{policy,reason,path}      counter
//	ringlimit_forwards_total{peer,outcome}             counter
//	ringlimit_forward_duration_seconds{peer}           histogram, 50µs to 1s
//	ringlimit_batch_size{peer}                         histogram, 1 to 4096 requests
//	ringlimit_ring_version                             gauge
//	ringlimit_members                                  gauge
//	ringlimit_keys                                     gauge
//	ringlimit_bytes                                    gauge
//	ringlimit_evicted_keys_total                       counter
//	ringlimit_handoff_keys_total{direction,outcome}    counter
//	ringlimit_backup_keys_total{direction,outcome}     counter
//	ringlimit_hot_key_rate{rank,policy}                gauge, hits per second
//	  (with Options.HotKeyNames: {rank,tenant,subject,policy})
//	ringlimit_peer_rpc_open                            gauge, 1 if peer RPCs are unauthenticated
//	ringlimit_ready                                    gauge, 1 if ready (peer.Node.Ready)
//	ringlimit_unready_reason{reason}                   gauge, 1 for the current reason
//	ringlimit_policy_table_version                     gauge, the table in force (peer.Node.PolicyVersion)
//	ringlimit_policy_reloads_total{result}             counter, ok or rejected
//	ringlimit_raft_messages_sent_total                 counter, ownership log messages sent (peer.RaftTraffic)
//	ringlimit_raft_bytes_sent_total                    counter, their marshalled bytes
//	ringlimit_raft_messages_received_total             counter, ownership log messages received
//	ringlimit_raft_bytes_received_total                counter, their marshalled bytes
//	ringlimit_raft_messages_dropped_total              counter, dropped unsent (raft sends again)
//	ringlimit_raft_messages_shed_total                 counter, received and dropped unread (log behind)
//	ringlimit_raft_proposals_total{kind}               counter, command or conf_change
//	ringlimit_raft_applied_total                       counter, ownership commands applied
//
// The ringlimit_raft_* series appear once a node in log mode
// (peer.OwnershipLog) has been built with this Metrics, and are read from the
// node at each scrape.
//
// Label cardinality is bounded: policy comes from the server's table, reason
// and path are enums, peer is a member name (series for a peer that left stay
// until the process restarts, so a cluster whose member names change on every
// deploy grows by one set of peer series per departed member).
//
// ringlimit_hot_key_rate exposes the rate and policy of the at most K
// heaviest keys the node owns, K being peer.Config.HotKeys (16 by default): each
// HotKeys call replaces the whole set atomically, so keys that cooled down
// disappear and the series count never exceeds K. By default a key is named
// by its rank and policy only: its tenant and subject are other tenants'
// authenticated identities, readable by whoever scrapes (issue 53 item 8);
// Node.HotKeys (serve's /debug/hotkeys on the ops listener) names them.
// Options.HotKeyNames adds them as labels; restrict access to the metrics
// endpoint accordingly.
type Metrics struct {
	decisions   *prometheus.CounterVec
	forwards    *prometheus.CounterVec
	forwardDur  *prometheus.HistogramVec
	batchSize   *prometheus.HistogramVec
	ringVersion prometheus.Gauge
	members     prometheus.Gauge
	keys        prometheus.Gauge
	bytes       prometheus.Gauge
	evicted     prometheus.Counter
	handoff     *prometheus.CounterVec
	backup      *prometheus.CounterVec
	hot         *hotKeyCollector
	peerRPCOpen prometheus.Gauge
	ready       prometheus.Gauge
	unready     *prometheus.GaugeVec
	policyVer   prometheus.Gauge
	reloads     *prometheus.CounterVec
	overage     *prometheus.CounterVec
	spread      *prometheus.CounterVec
	raft        *raftCollector

	// Caches of resolved children, so the decision path does a lock-free
	// map lookup instead of hashing label values inside the vector.
	decisionC labelCache[decisionLabels, prometheus.Counter]
	forwardC  labelCache[pairLabels, prometheus.Counter]
	durationC labelCache[string, prometheus.Observer]
	batchC    labelCache[string, prometheus.Observer]
	handoffC  labelCache[pairLabels, prometheus.Counter]
	backupC   labelCache[pairLabels, prometheus.Counter]
}

var _ peer.Metrics = (*Metrics)(nil)

// errNilRegisterer is returned by New for a nil registry.
var errNilRegisterer = errors.New("peer: nil prometheus registerer")

// forwardBuckets spans a loopback hop (tens of µs) to the slowest forward a
// sane ForwardTimeout allows, in seconds.
var forwardBuckets = []float64{
	50e-6, 100e-6, 250e-6, 500e-6,
	1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3,
	100e-3, 250e-3, 500e-3, 1,
}

// New builds the collectors and registers them on reg. It
// returns an error if reg is nil or refuses a collector (for example because
// another Metrics is already registered on it); in that case
// nothing it registered stays registered.
func New(reg prometheus.Registerer) (*Metrics, error) {
	return NewWithOptions(reg, Options{})
}

// Options change what New exports.
type Options struct {
	// HotKeyNames labels ringlimit_hot_key_rate with each key's tenant
	// and subject (beside rank and policy). Off by default: they are
	// other tenants' identities.
	HotKeyNames bool
}

// NewWithOptions is New with opts.
func NewWithOptions(reg prometheus.Registerer, opts Options) (*Metrics, error) {
	if reg == nil {
		return nil, errNilRegisterer
	}
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_decisions_total",
			Help: "Decisions answered by this node (path local or forwarded) or made as owner for a peer (path remote), by policy and reason.",
		}, []string{"policy", "reason", "path"}),
		forwards: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_forwards_total",
			Help: "Forwarded RPCs to a key's owner, by peer and outcome (ok, error, not_owner; resent: a request sent on to another member after peer's port died, which may count twice).",
		}, []string{"peer", "outcome"}),
		forwardDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ringlimit_forward_duration_seconds",
			Help:    "Duration of forwarded RPCs to a key's owner, by peer.",
			Buckets: forwardBuckets,
		}, []string{"peer"}),
		batchSize: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "ringlimit_batch_size",
			Help:    "Requests carried by one forwarded RPC, by peer.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 13), // 1, 2, 4, ..., 4096 (wire.MaxBatch)
		}, []string{"peer"}),
		ringVersion: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_ring_version",
			Help: "This node's local ring version; it increases by one on each member-set change.",
		}),
		members: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_members",
			Help: "Members in this node's current ring.",
		}),
		keys: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_keys",
			Help: "Keys held by this node's local store.",
		}),
		bytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_bytes",
			Help: "Estimated bytes held by this node's local store.",
		}),
		evicted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ringlimit_evicted_keys_total",
			Help: "Idle keys reclaimed by sweeps.",
		}),
		handoff: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_handoff_keys_total",
			Help: "Keys moved on membership changes, by direction (sent, received, pulled) and outcome.",
		}, []string{"direction", "outcome"}),
		backup: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_backup_keys_total",
			Help: "Keys streamed to or received from backups, by direction (sent, received, restored) and outcome.",
		}, []string{"direction", "outcome"}),
		peerRPCOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_peer_rpc_open",
			Help: "1 if this node accepts peer-only RPCs without authentication (no peer secret, gossip key or required client certificates), else 0.",
		}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_ready",
			Help: "1 if this node is part of its cluster (joined, not alone, ignoring no live member, not closing), else 0.",
		}),
		unready: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ringlimit_unready_reason",
			Help: "1 for the reason this node is not ready (closing, alone, ignored_members), 0 for the others.",
		}, []string{"reason"}),
		policyVer: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ringlimit_policy_table_version",
			Help: "Version (a 53-bit hash of what changes a decision) of the policy table this node decides with.",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_policy_reloads_total",
			Help: "Policy tables offered to this node (at start and by reloads), by result (ok, rejected).",
		}, []string{"result"}),
		overage: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_overage_units_total",
			Help: "Units that settlements answered by this node recorded beyond their reservations' estimates (spent without admission), by policy.",
		}, []string{"policy"}),
		spread: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_spread_rights_total",
			Help: "Rights of spread keys at this node as a grantee, by policy and event: granted (received from holders), used (admitted from them), unused (replaced or expired with rights left: the under-admission spreading costs).",
		}, []string{"policy", "event"}),
		hot:  newHotKeyCollector(opts.HotKeyNames),
		raft: newRaftCollector(),
	}
	m.decisionC.resolve = func(k decisionLabels) prometheus.Counter {
		return m.decisions.WithLabelValues(k.policy, k.reason.String(), k.path.String())
	}
	m.forwardC.resolve = func(k pairLabels) prometheus.Counter { return m.forwards.WithLabelValues(k.a, k.b) }
	m.durationC.resolve = func(peer string) prometheus.Observer { return m.forwardDur.WithLabelValues(peer) }
	m.batchC.resolve = func(peer string) prometheus.Observer { return m.batchSize.WithLabelValues(peer) }
	m.handoffC.resolve = func(k pairLabels) prometheus.Counter { return m.handoff.WithLabelValues(k.a, k.b) }
	m.backupC.resolve = func(k pairLabels) prometheus.Counter { return m.backup.WithLabelValues(k.a, k.b) }

	cs := []prometheus.Collector{
		m.decisions, m.forwards, m.forwardDur, m.batchSize,
		m.ringVersion, m.members, m.keys, m.bytes,
		m.evicted, m.handoff, m.backup, m.hot, m.peerRPCOpen,
		m.ready, m.unready, m.policyVer, m.reloads, m.overage, m.spread, m.raft,
	}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return nil, err
		}
	}
	return m, nil
}

// Spread counts rights of spread keys (the optional method spread keys
// call): event is granted, used or unused.
func (m *Metrics) Spread(policy, event string, units int64) {
	m.spread.WithLabelValues(policy, event).Add(float64(units))
}

// Overage counts units a settlement recorded beyond its reservation's
// estimate (the optional overage method peer.Node.Settle calls).
func (m *Metrics) Overage(policy string, units int64) {
	m.overage.WithLabelValues(policy).Add(float64(units))
}

// Decision implements peer.Metrics.
func (m *Metrics) Decision(policy string, reason peer.Reason, path peer.Path) {
	m.decisionC.get(decisionLabels{policy, reason, path}).Inc()
}

// Forward implements peer.Metrics.
func (m *Metrics) Forward(peer, outcome string, d time.Duration) {
	m.forwardC.get(pairLabels{peer, outcome}).Inc()
	if outcome != "resent" {
		m.durationC.get(peer).Observe(d.Seconds())
	}
}

// Batch implements peer.Metrics.
func (m *Metrics) Batch(peer string, size int) {
	m.batchC.get(peer).Observe(float64(size))
}

// Ring implements peer.Metrics.
func (m *Metrics) Ring(version uint64, members int) {
	m.ringVersion.Set(float64(version))
	m.members.Set(float64(members))
}

// Keys implements peer.Metrics.
func (m *Metrics) Keys(keys int, bytes int64) {
	m.keys.Set(float64(keys))
	m.bytes.Set(float64(bytes))
}

// Evicted implements peer.Metrics. A count below one is ignored (a counter
// never decreases).
func (m *Metrics) Evicted(n int) {
	if n > 0 {
		m.evicted.Add(float64(n))
	}
}

// Handoff implements peer.Metrics. A negative count is ignored.
func (m *Metrics) Handoff(direction, outcome string, keys int) {
	if keys >= 0 {
		m.handoffC.get(pairLabels{direction, outcome}).Add(float64(keys))
	}
}

// Backup implements peer.Metrics. A negative count is ignored.
func (m *Metrics) Backup(direction, outcome string, keys int) {
	if keys >= 0 {
		m.backupC.get(pairLabels{direction, outcome}).Add(float64(keys))
	}
}

// HotKeys implements peer.Metrics: it replaces the exported hot-key series with
// one per entry, ranked "1" (heaviest) to len(top). The caller keeps top.
func (m *Metrics) HotKeys(top []peer.HotKey) {
	snap := make([]peer.HotKey, len(top))
	copy(snap, top)
	m.hot.mu.Lock()
	m.hot.top = snap
	m.hot.mu.Unlock()
}

// hotKeyCollector exports the latest hot-key view. Replacing the whole
// snapshot under one lock, rather than resetting a GaugeVec and setting its
// children one by one, means a scrape never sees a half-written top-K.
type hotKeyCollector struct {
	desc  *prometheus.Desc
	names bool          // tenant and subject labels
	mu    sync.Mutex    // guards top
	top   []peer.HotKey // never mutated once published
}

func newHotKeyCollector(names bool) *hotKeyCollector {
	labels := []string{"rank", "policy"}
	if names {
		labels = []string{"rank", "tenant", "subject", "policy"}
	}
	return &hotKeyCollector{names: names, desc: prometheus.NewDesc(
		"ringlimit_hot_key_rate",
		"Time-decayed hit rate, in hits per second, of the heaviest keys this node owns (at most Config.HotKeys series).",
		labels, nil,
	)}
}

func (c *hotKeyCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *hotKeyCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	top := c.top
	c.mu.Unlock()
	for i, h := range top {
		// Key parts are validated visible ASCII, so NewConstMetric cannot
		// fail on them; a key that somehow is not is skipped, not panicked on.
		values := []string{strconv.Itoa(i + 1), h.Key.Policy}
		if c.names {
			values = []string{strconv.Itoa(i + 1), h.Key.Tenant, h.Key.Subject, h.Key.Policy}
		}
		mt, err := prometheus.NewConstMetric(c.desc, prometheus.GaugeValue, h.Rate, values...)
		if err == nil {
			ch <- mt
		}
	}
}

type decisionLabels struct {
	policy string
	reason peer.Reason
	path   peer.Path
}

type pairLabels struct{ a, b string }

// maxCachedLabels bounds each labelCache. Past it, lookups go straight to
// the vector (slower, still correct), so an unexpected label explosion
// cannot grow the cache without bound.
const maxCachedLabels = 1024

// labelCache maps label values to a vector's child. Reads are one atomic
// load and one map lookup, with no lock and no allocation; a miss copies the
// map under mu (copy-on-write), which happens once per label set.
type labelCache[K comparable, V any] struct {
	m       atomic.Pointer[map[K]V]
	mu      sync.Mutex // serialises misses
	resolve func(K) V  // finds a child in the vector; set once at construction
}

func (c *labelCache[K, V]) get(k K) V {
	m := c.m.Load()
	if m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
		if len(*m) >= maxCachedLabels {
			return c.resolve(k)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var old map[K]V
	if p := c.m.Load(); p != nil {
		old = *p
	}
	if v, ok := old[k]; ok {
		return v
	}
	v := c.resolve(k)
	if len(old) >= maxCachedLabels {
		return v
	}
	next := make(map[K]V, len(old)+1)
	for ok, ov := range old {
		next[ok] = ov
	}
	next[k] = v
	c.m.Store(&next)
	return v
}

// PeerRPCOpen implements peer.Metrics.
func (m *Metrics) PeerRPCOpen(open bool) { m.peerRPCOpen.Set(b2f(open)) }

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Ready implements peer.Metrics.
func (m *Metrics) Ready(ready bool, reason string) {
	m.ready.Set(b2f(ready))
	for _, r := range []string{peer.ReadyReasonClosing, peer.ReadyReasonAlone, peer.ReadyReasonIgnored, peer.ReadyReasonMoving} {
		m.unready.WithLabelValues(r).Set(b2f(r == reason))
	}
}

// PolicyTable implements peer.Metrics.
func (m *Metrics) PolicyTable(version uint64, ok bool) {
	// The version is 53 bits (policy.Table.Version), so the float is exact.
	m.policyVer.Set(float64(version))
	if ok {
		m.reloads.WithLabelValues("ok").Inc()
	} else {
		m.reloads.WithLabelValues("rejected").Inc()
	}
}

// RaftTrafficFrom implements peer.RaftTrafficSource: a node in log mode
// hands it read, which each scrape calls.
func (m *Metrics) RaftTrafficFrom(read func() peer.RaftTraffic) { m.raft.read.Store(&read) }

// raftCollector exports a node's peer.RaftTraffic, read at each scrape: the
// counters live in the log's runner and transport, so nothing is
// counted twice and the log's paths never call into Prometheus.
type raftCollector struct {
	read                                        atomic.Pointer[func() peer.RaftTraffic]
	msgs, bytes, dropped, shed, proposals, appl *prometheus.Desc
	msgsIn, bytesIn                             *prometheus.Desc
}

func newRaftCollector() *raftCollector {
	return &raftCollector{
		msgs:      prometheus.NewDesc("ringlimit_raft_messages_sent_total", "Ownership log (raft) messages this node sent to its peers.", nil, nil),
		bytes:     prometheus.NewDesc("ringlimit_raft_bytes_sent_total", "Marshalled bytes of the ownership log messages this node sent (gRPC framing aside).", nil, nil),
		dropped:   prometheus.NewDesc("ringlimit_raft_messages_dropped_total", "Ownership log messages dropped unsent (queue full or peer not reached); raft sends again.", nil, nil),
		shed:      prometheus.NewDesc("ringlimit_raft_messages_shed_total", "Ownership log messages this node received and dropped unread because its log was that far behind; raft sends again.", nil, nil),
		proposals: prometheus.NewDesc("ringlimit_raft_proposals_total", "Proposals this node made to the ownership log, by kind (command, conf_change).", []string{"kind"}, nil),
		appl:      prometheus.NewDesc("ringlimit_raft_applied_total", "Ownership commands this node applied from the log.", nil, nil),
		msgsIn:    prometheus.NewDesc("ringlimit_raft_messages_received_total", "Ownership log (raft) messages that reached this node from its peers.", nil, nil),
		bytesIn:   prometheus.NewDesc("ringlimit_raft_bytes_received_total", "Marshalled bytes of the ownership log messages this node received (gRPC framing aside).", nil, nil),
	}
}

func (c *raftCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.msgs
	ch <- c.bytes
	ch <- c.dropped
	ch <- c.shed
	ch <- c.proposals
	ch <- c.appl
	ch <- c.msgsIn
	ch <- c.bytesIn
}

func (c *raftCollector) Collect(ch chan<- prometheus.Metric) {
	read := c.read.Load()
	if read == nil {
		return // no node in log mode uses this Metrics
	}
	t := (*read)()
	for _, s := range []struct {
		d  *prometheus.Desc
		v  uint64
		lv []string
	}{
		{c.msgs, t.MessagesSent, nil},
		{c.bytes, t.BytesSent, nil},
		{c.dropped, t.MessagesDropped, nil},
		{c.shed, t.MessagesShed, nil},
		{c.proposals, t.Proposals, []string{"command"}},
		{c.proposals, t.ConfChanges, []string{"conf_change"}},
		{c.appl, t.Applied, nil},
		{c.msgsIn, t.MessagesReceived, nil},
		{c.bytesIn, t.BytesReceived, nil},
	} {
		ch <- prometheus.MustNewConstMetric(s.d, prometheus.CounterValue, float64(s.v), s.lv...)
	}
}
