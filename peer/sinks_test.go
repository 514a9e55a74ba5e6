package peer

import "sync"

// sinkRecorder is a Metrics that records the optional sinks (spreadSink,
// overageSink) for tests, and drops the rest.
type sinkRecorder struct {
	nopMetrics
	mu      sync.Mutex
	spread  map[[2]string]int64 // policy, event → units
	overage map[string]int64    // policy → units
}

func newSinkRecorder() *sinkRecorder {
	return &sinkRecorder{spread: map[[2]string]int64{}, overage: map[string]int64{}}
}

func (r *sinkRecorder) Spread(policy, event string, units int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.spread[[2]string{policy, event}] += units
}

func (r *sinkRecorder) Overage(policy string, units int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.overage[policy] += units
}

func (r *sinkRecorder) spreadUnits(policy, event string) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.spread[[2]string{policy, event}]
}

func (r *sinkRecorder) overageUnits(policy string) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.overage[policy]
}
