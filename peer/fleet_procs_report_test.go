package peer

// TestFleetProcsRollingDeploy's record of what happened and its reports:
// per wave, the worst key's timeline, the checks as JSON lines.

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/history"
)

// fleetMeta is what a check's answer said beyond its outcome.
type fleetMeta struct {
	node   string // the node asked
	status int    // HTTP status; 0 when there was no answer
	reason string
	err    string // the client's error, if any
}

// fleetEvent is something the test did or saw to a process, on the
// checks' clock.
type fleetEvent struct {
	at   int64
	what string
}

// fleetWave is one wave of the deploy.
type fleetWave struct {
	n           int
	term        int64 // the SIGTERMs, on the checks' clock
	drains      []time.Duration
	toReady     []time.Duration // each restart, from its start
	allReady    time.Duration   // from the SIGTERMs until every node was ready
	loadAverage string          // the machine's, at the SIGTERMs
}

// fleetRecord collects the checks (ops and meta, index for index), the
// events and the waves. add and event are safe for concurrent use; the
// rest is read after the load has stopped.
type fleetRecord struct {
	clock   time.Time
	refused atomic.Int64
	mu      sync.Mutex
	ops     []history.Op
	meta    []fleetMeta
	events  []fleetEvent
	waves   []fleetWave
	end     int64 // when the load stopped
}

func (r *fleetRecord) since() int64         { return int64(time.Since(r.clock)) }
func (r *fleetRecord) at(t time.Time) int64 { return int64(t.Sub(r.clock)) }
func (r *fleetRecord) event(t time.Time, what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, fleetEvent{at: r.at(t), what: what})
}

func (r *fleetRecord) add(op history.Op, m fleetMeta) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, op)
	r.meta = append(r.meta, m)
}

// fleetGap is a stretch in which a key had no decision: from the call of
// the first answer that was not one to the return of the next that was.
type fleetGap struct {
	key      string
	from, to int64
}

func (g fleetGap) len() time.Duration { return time.Duration(g.to - g.from) }

// fleetDecided reports whether o's client learned a decision.
func fleetDecided(o history.Op) bool {
	return o.Outcome == history.Admitted || o.Outcome == history.Rejected
}

// fleetGaps lists every key's stretches without a decision (a stretch
// still open at the end is left out: the load stopped, not the key).
func fleetGaps(ops []history.Op) []fleetGap {
	byKey := map[string][]history.Op{}
	for _, o := range ops {
		byKey[o.Key] = append(byKey[o.Key], o)
	}
	var gaps []fleetGap
	for k, kops := range byKey {
		sort.Slice(kops, func(i, j int) bool { return kops[i].Call < kops[j].Call })
		var from int64 = -1
		for _, o := range kops {
			switch {
			case !fleetDecided(o):
				if from < 0 {
					from = o.Call
				}
			case from >= 0:
				gaps = append(gaps, fleetGap{key: k, from: from, to: o.Return})
				from = -1
			}
		}
	}
	return gaps
}

// fleetSlowest is the longest a decided check took.
func fleetSlowest(ops []history.Op) time.Duration {
	var d int64
	for _, o := range ops {
		if fleetDecided(o) {
			d = max(d, o.Return-o.Call)
		}
	}
	return time.Duration(d)
}

// waveReport is a table with a row per wave: what happened to the checks
// called from its SIGTERMs to the next wave's (the last: to the load's
// end).
func (r *fleetRecord) waveReport(gaps []fleetGap) string {
	var b strings.Builder
	fmt.Fprintf(&b, "per wave (checks called from its SIGTERMs to the next wave's):\n")
	fmt.Fprintf(&b, "  wave | nodes | load avg | checks | 503 | no answer | longest without a decision | last non-decision after | all ready after | drain max | to ready median (max)\n")
	for w, wv := range r.waves {
		end := r.end
		if w+1 < len(r.waves) {
			end = r.waves[w+1].term
		}
		var checks, unavail, noAnswer int
		var lastBad int64 = -1
		for i, o := range r.ops {
			if o.Call < wv.term || o.Call >= end || o.Client < 0 {
				continue
			}
			checks++
			switch m := r.meta[i]; {
			case m.status == 503:
				unavail++
			case m.err != "":
				noAnswer++
			}
			if !fleetDecided(o) {
				lastBad = max(lastBad, o.Return)
			}
		}
		var worst fleetGap
		for _, g := range gaps {
			if g.from >= wv.term && g.from < end && g.len() > worst.len() {
				worst = g
			}
		}
		settled := "—"
		if lastBad >= 0 {
			settled = time.Duration(lastBad - wv.term).Round(time.Millisecond).String()
		}
		toReady := slices.Sorted(slices.Values(wv.toReady))
		fmt.Fprintf(&b, "  %d | %d | %s | %d | %d (%.1f %%) | %d | %v (%s) | %s | %v | %v | %v (%v)\n",
			w, wv.n, wv.loadAverage, checks, unavail, 100*float64(unavail)/float64(max(1, checks)), noAnswer,
			worst.len().Round(time.Millisecond), cmp.Or(worst.key, "—"), settled, wv.allReady.Round(time.Millisecond),
			slices.Max(wv.drains).Round(time.Millisecond), toReady[len(toReady)/2].Round(time.Millisecond), toReady[len(toReady)-1].Round(time.Millisecond))
	}
	return b.String()
}

// timeline lists, in time order, the events from 3 s before g to 1 s
// after, and g's key's checks around it: the last decision before, every
// check in it, the first decision after.
func (r *fleetRecord) timeline(g fleetGap) string {
	type line struct {
		at int64
		s  string
	}
	var lines []line
	for _, e := range r.events {
		if e.at >= g.from-int64(3*time.Second) && e.at <= g.to+int64(time.Second) {
			lines = append(lines, line{e.at, "event  " + e.what})
		}
	}
	before, after := -1, -1
	for i, o := range r.ops {
		if o.Key != g.key {
			continue
		}
		switch {
		case o.Call < g.from && fleetDecided(o) && (before < 0 || o.Call > r.ops[before].Call):
			before = i
		case o.Call >= g.from && o.Call < g.to && !fleetDecided(o):
			lines = append(lines, line{o.Call, r.opLine(i)})
		case o.Return >= g.to && fleetDecided(o) && (after < 0 || o.Call < r.ops[after].Call):
			after = i
		}
	}
	for _, i := range []int{before, after} {
		if i >= 0 {
			lines = append(lines, line{r.ops[i].Call, r.opLine(i)})
		}
	}
	slices.SortStableFunc(lines, func(a, b line) int { return cmp.Compare(a.at, b.at) })
	var b strings.Builder
	for _, l := range lines {
		fmt.Fprintf(&b, "  %9.3f  %s\n", float64(l.at)/1e6, l.s)
	}
	return b.String()
}

func (r *fleetRecord) opLine(i int) string {
	o, m := r.ops[i], r.meta[i]
	s := fmt.Sprintf("check  %s via %s: %s after %v", o.Key, m.node, o.Outcome, time.Duration(o.Return-o.Call).Round(time.Millisecond))
	if m.status != 0 {
		s += fmt.Sprintf(", status %d", m.status)
	}
	if m.reason != "" {
		s += ", reason " + m.reason
	}
	if o.Owner != "" {
		s += ", owner " + o.Owner
	}
	if m.err != "" {
		s += ", error " + m.err
	}
	return s
}

// writeOps writes every check as a JSON line, for a look after the run.
func (r *fleetRecord) writeOps(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for i, o := range r.ops {
		m := r.meta[i]
		_ = enc.Encode(map[string]any{"key": o.Key, "client": o.Client, "call_ms": float64(o.Call) / 1e6, "return_ms": float64(o.Return) / 1e6,
			"outcome": o.Outcome.String(), "owner": o.Owner, "node": m.node, "status": m.status, "reason": m.reason, "err": m.err})
	}
	for _, e := range r.events {
		_ = enc.Encode(map[string]any{"event": e.what, "at_ms": float64(e.at) / 1e6})
	}
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// loadAverage is the machine's 1-minute load average, or "?" where there
// is no /proc/loadavg.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}

// fleetWatch polls every node's /metrics every 500 ms until stop closes,
// and records as events what changes in the ownership log as each node
// sees it: who leads, who votes, whose own liveness lapsed. It is for
// diagnosis (on with fleetProcsLogsEnv): 2 × n scrapes a second load the
// machine a little. The caller waits for done.
func (r *fleetRecord) watch(h fleetHTTP, nodes func() []*fleetProc, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	type state struct {
		leader, voter, live bool
		term                float64
		lagging             bool // applied the log more than fleetLag entries behind its commit
	}
	const fleetLag = 20
	last := map[*fleetProc]state{}
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for range 2 * 60 * 20 { // 20 minutes: a bound, never reached
		for _, p := range nodes() {
			v := h.metrics(p, "ringlimit_log_leader", "ringlimit_log_voter", "ringlimit_liveness_remaining_seconds", "ringlimit_log_term", "ringlimit_log_apply_lag_entries")
			if v == nil {
				continue
			}
			s := state{leader: v[0] == 1, voter: v[1] == 1, live: v[2] > 0, term: v[3], lagging: v[4] > fleetLag}
			old, seen := last[p]
			last[p] = s
			now := time.Now()
			if !seen {
				old = state{live: true}
			}
			if s.leader != old.leader {
				r.event(now, fmt.Sprintf("%s leads the log: %v (term %v)", p.name, s.leader, s.term))
			}
			if s.voter != old.voter {
				r.event(now, fmt.Sprintf("%s votes: %v", p.name, s.voter))
			}
			if s.live != old.live {
				r.event(now, fmt.Sprintf("%s own liveness holds: %v", p.name, s.live))
			}
			if s.lagging != old.lagging {
				r.event(now, fmt.Sprintf("%s applies more than %d entries behind the commit: %v (%v)", p.name, fleetLag, s.lagging, v[4]))
			}
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// metrics returns the values of the named unlabelled metrics on p's
// /metrics, nil if it did not answer with all of them.
func (h fleetHTTP) metrics(p *fleetProc, names ...string) []float64 {
	resp, err := h.c.Get("http://" + p.http + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	out := make([]float64, len(names))
	found := 0
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 4<<20))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		if i := slices.Index(names, name); i >= 0 {
			if f, err := strconv.ParseFloat(val, 64); err == nil {
				out[i] = f
				found++
			}
		}
	}
	if found != len(names) {
		return nil
	}
	return out
}
