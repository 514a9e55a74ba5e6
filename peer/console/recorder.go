package console

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/peer"
)

// Outcome classes the traffic chart draws. A decision the owner made is
// allowed or over limit; one it could not make (owner not reached,
// capacity, failed open, local fallback) is unavailable.
const (
	outAllowed = iota
	outOver
	outUnavailable
	nOutcomes
)

// maxPolicies bounds the policies traffic is kept for; decisions of any
// further policy are counted under otherPolicy. Policy names come from
// the server's table, so the bound is only ever reached by a huge table.
const (
	maxPolicies = 64
	otherPolicy = "(other)"
)

// History: 15 minutes in buckets of bucketSeconds, each the sum of the
// Ticks (one a second) within it.
const (
	historySeconds = 900
	bucketSeconds  = 10
)

// Forward latency buckets: upper bounds latBase·2^i, the last unbounded.
const (
	latBuckets = 16
	latBase    = 50 * time.Microsecond
)

type policyCount struct{ n [nOutcomes]atomic.Uint64 }

// Recorder is a peer.Metrics that keeps this node's decisions per policy
// and outcome, and its forward latencies, for the console's traffic
// chart, and passes every call on to the Metrics it wraps (the
// Prometheus one in serve). Give it to peer.Config.Metrics, then to
// Config.Recorder. Safe for concurrent use.
//
// What it counts: the decisions this node answered to its own callers
// (peer.PathLocal and peer.PathForwarded), not those it made as owner
// for a peer (peer.PathRemote, already counted by the asking node), so
// the sum over members is the cluster's decisions, each once. Peeks,
// refunds, resets, releases and settlements are not decisions and are
// not counted. The decision path costs a read-locked map lookup and an
// atomic add; it allocates only the first time a policy is seen.
type Recorder struct {
	inner peer.Metrics

	mu   sync.RWMutex
	pols map[string]*policyCount
	lat  [latBuckets]atomic.Uint64

	hmu     sync.Mutex // guards what follows (Tick and readers)
	buckets []bucket   // ring of historySeconds/bucketSeconds buckets
	last    map[string][nOutcomes]uint64
	lastLat [latBuckets]uint64
}

// bucket is what the Ticks in one bucketSeconds-long span saw.
type bucket struct {
	start int64 // unix second the bucket begins at; 0 for an empty slot
	pols  map[string][nOutcomes]uint64
	lat   [latBuckets]uint64
}

// NewRecorder returns a Recorder passing every call on to inner (nil:
// to nothing).
func NewRecorder(inner peer.Metrics) *Recorder {
	if inner == nil {
		inner = nop{}
	}
	return &Recorder{inner: inner, pols: map[string]*policyCount{}, buckets: make([]bucket, historySeconds/bucketSeconds), last: map[string][nOutcomes]uint64{}}
}

func outcome(r peer.Reason) (int, bool) {
	switch r {
	case peer.ReasonAdmitted, peer.ReasonShadow, peer.ReasonUnlimited, peer.ReasonSpread:
		return outAllowed, true
	case peer.ReasonOverLimit:
		return outOver, true
	case peer.ReasonUnavailable, peer.ReasonCapacity, peer.ReasonFailedOpen, peer.ReasonFallback:
		return outUnavailable, true
	}
	return 0, false
}

// Decision implements peer.Metrics.
func (r *Recorder) Decision(policy string, reason peer.Reason, path peer.Path) {
	r.inner.Decision(policy, reason, path)
	o, ok := outcome(reason)
	if !ok || path == peer.PathRemote {
		return
	}
	r.mu.RLock()
	c := r.pols[policy]
	r.mu.RUnlock()
	if c == nil {
		c = r.addPolicy(policy)
	}
	c.n[o].Add(1)
}

func (r *Recorder) addPolicy(policy string) *policyCount {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c := r.pols[policy]; c != nil {
		return c
	}
	if len(r.pols) >= maxPolicies-1 { // one slot stays for otherPolicy
		policy = otherPolicy
		if c := r.pols[policy]; c != nil {
			return c
		}
	}
	c := new(policyCount)
	r.pols[policy] = c
	return c
}

// Forward implements peer.Metrics; it records the duration of every
// forward that got an answer ("ok").
func (r *Recorder) Forward(p, outcome string, d time.Duration) {
	r.inner.Forward(p, outcome, d)
	if outcome == "ok" {
		r.lat[latBucket(d)].Add(1)
	}
}

func latBucket(d time.Duration) int {
	if d <= latBase {
		return 0
	}
	i := int(math.Ceil(math.Log2(float64(d) / float64(latBase))))
	return min(i, latBuckets-1)
}

func (r *Recorder) Batch(p string, size int)         { r.inner.Batch(p, size) }
func (r *Recorder) Ring(version uint64, members int) { r.inner.Ring(version, members) }
func (r *Recorder) Keys(keys int, bytes int64)       { r.inner.Keys(keys, bytes) }
func (r *Recorder) Evicted(n int)                    { r.inner.Evicted(n) }
func (r *Recorder) Handoff(direction, outcome string, keys int) {
	r.inner.Handoff(direction, outcome, keys)
}
func (r *Recorder) Backup(direction, outcome string, keys int) {
	r.inner.Backup(direction, outcome, keys)
}
func (r *Recorder) HotKeys(top []peer.HotKey)           { r.inner.HotKeys(top) }
func (r *Recorder) PeerRPCOpen(open bool)               { r.inner.PeerRPCOpen(open) }
func (r *Recorder) Ready(ready bool, reason string)     { r.inner.Ready(ready, reason) }
func (r *Recorder) PolicyTable(version uint64, ok bool) { r.inner.PolicyTable(version, ok) }

// RaftTrafficFrom passes the node's raft counters on to the wrapped
// Metrics when it exports them (peer.RaftTrafficSource).
func (r *Recorder) RaftTrafficFrom(read func() peer.RaftTraffic) {
	if s, ok := r.inner.(peer.RaftTrafficSource); ok {
		s.RaftTrafficFrom(read)
	}
}

// Spread and Overage pass peer's optional Metrics methods (rights of
// spread keys, a settlement's overage) on to the wrapped Metrics when it
// has them: wrapping must not lose a series.
func (r *Recorder) Spread(policy, event string, units int64) {
	if m, ok := r.inner.(interface{ Spread(string, string, int64) }); ok {
		m.Spread(policy, event, units)
	}
}

// Overage: see Spread.
func (r *Recorder) Overage(policy string, units int64) {
	if m, ok := r.inner.(interface{ Overage(string, int64) }); ok {
		m.Overage(policy, units)
	}
}

// Tick adds what was counted since the last Tick to the history's bucket
// of now. The console's goroutine calls
// it once a second; tests call it directly.
func (r *Recorder) Tick(now time.Time) {
	r.mu.RLock()
	cur := make(map[string][nOutcomes]uint64, len(r.pols))
	for name, c := range r.pols {
		var v [nOutcomes]uint64
		for i := range v {
			v[i] = c.n[i].Load()
		}
		cur[name] = v
	}
	r.mu.RUnlock()
	var lat [latBuckets]uint64
	for i := range lat {
		lat[i] = r.lat[i].Load()
	}
	r.hmu.Lock()
	defer r.hmu.Unlock()
	start := now.Unix() / bucketSeconds * bucketSeconds
	b := &r.buckets[int(start/bucketSeconds)%len(r.buckets)]
	if b.start != start {
		*b = bucket{start: start, pols: map[string][nOutcomes]uint64{}}
	}
	for name, v := range cur {
		prev := r.last[name]
		sum := b.pols[name]
		for i := range v {
			sum[i] += v[i] - prev[i]
		}
		if sum != ([nOutcomes]uint64{}) {
			b.pols[name] = sum
		}
	}
	for i := range lat {
		b.lat[i] += lat[i] - r.lastLat[i]
	}
	r.last, r.lastLat = cur, lat
}

// Traffic is a node's decisions over the last 15 minutes, in buckets of
// BucketSeconds, oldest first: the JSON the page charts.
type Traffic struct {
	BucketSeconds int `json:"bucket_seconds"`
	// Start is the unix second the first bucket begins at.
	Start int64 `json:"start"`
	// Policies maps a policy to its [allowed, over_limit, unavailable]
	// counts per bucket.
	Policies map[string][][nOutcomes]uint64 `json:"policies"`
	// Latency is, per bucket, the forward latency histogram: counts per
	// bucket of LatencyBounds (seconds; the last is unbounded).
	Latency       [][latBuckets]uint64 `json:"latency"`
	LatencyBounds []float64            `json:"latency_bounds"`
}

// Traffic returns the history up to now, in buckets aligned to
// bucketSeconds.
func (r *Recorder) Traffic(now time.Time) Traffic {
	n := historySeconds / bucketSeconds
	end := now.Unix()/bucketSeconds*bucketSeconds + bucketSeconds
	start := end - int64(n*bucketSeconds)
	t := Traffic{BucketSeconds: bucketSeconds, Start: start, Policies: map[string][][nOutcomes]uint64{}, Latency: make([][latBuckets]uint64, n)}
	for i := range latBuckets {
		t.LatencyBounds = append(t.LatencyBounds, (latBase << i).Seconds())
	}
	r.hmu.Lock()
	defer r.hmu.Unlock()
	for _, bk := range r.buckets {
		if bk.start == 0 || bk.start < start || bk.start >= end {
			continue
		}
		b := int((bk.start - start) / bucketSeconds)
		for name, v := range bk.pols {
			series := t.Policies[name]
			if series == nil {
				series = make([][nOutcomes]uint64, n)
				t.Policies[name] = series
			}
			series[b] = v
		}
		t.Latency[b] = bk.lat
	}
	return t
}

type nop struct{}

func (nop) Decision(string, peer.Reason, peer.Path) {}
func (nop) Forward(string, string, time.Duration)   {}
func (nop) Batch(string, int)                       {}
func (nop) Ring(uint64, int)                        {}
func (nop) Keys(int, int64)                         {}
func (nop) Evicted(int)                             {}
func (nop) Handoff(string, string, int)             {}
func (nop) Backup(string, string, int)              {}
func (nop) HotKeys([]peer.HotKey)                   {}
func (nop) PeerRPCOpen(bool)                        {}
func (nop) Ready(bool, string)                      {}
func (nop) PolicyTable(uint64, bool)                {}
