package prommetrics_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/peer/prommetrics"
)

// promSample finds the series of family name whose labels include want and
// returns its value: the counter or gauge value, or a histogram's sample
// count and sum. found is false when no series matches.
func promSample(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) (value, sum float64, found bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue series
				}
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				return m.GetCounter().GetValue(), 0, true
			case dto.MetricType_GAUGE:
				return m.GetGauge().GetValue(), 0, true
			case dto.MetricType_HISTOGRAM:
				return float64(m.GetHistogram().GetSampleCount()), m.GetHistogram().GetSampleSum(), true
			default:
				t.Fatalf("%s: unexpected type %v", name, mf.GetType())
			}
		}
	}
	return 0, 0, false
}

func newPromMetrics(t *testing.T) (*prommetrics.Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := prommetrics.New(reg)
	if err != nil {
		t.Fatalf("prommetrics.New: %v", err)
	}
	return m, reg
}

func TestPrometheusEveryMethod(t *testing.T) {
	m, reg := newPromMetrics(t)
	m.Decision("api", peer.ReasonAdmitted, peer.PathLocal)
	m.Decision("api", peer.ReasonAdmitted, peer.PathLocal)
	m.Decision("api", peer.ReasonOverLimit, peer.PathForwarded)
	m.Decision("api", peer.ReasonUnavailable, peer.PathLocal)
	m.Decision("bulk", peer.ReasonShadow, peer.PathRemote)
	m.Forward("n1", "ok", 200*time.Microsecond)
	m.Forward("n1", "ok", 300*time.Microsecond)
	m.Forward("n1", "error", 2*time.Second)
	m.Forward("n2", "not_owner", time.Millisecond)
	m.Forward("n2", "resent", 0) // counted, but no duration: nothing was timed
	m.Batch("n1", 1)
	m.Batch("n1", 300)
	m.Ring(7, 3)
	m.Keys(42, 4096)
	m.Evicted(5)
	m.Evicted(0)
	m.Evicted(-1) // ignored: a counter cannot decrease, and must not panic
	m.Handoff("sent", "ok", 10)
	m.Handoff("sent", "failed", 2)
	m.Handoff("received", "ok", -3) // ignored
	m.Backup("sent", "ok", 4)
	m.Backup("restored", "ok", 1)
	m.Overage("tokens", 20)
	m.Overage("tokens", 5)
	m.Decision("tokens", peer.ReasonSettled, peer.PathLocal)
	m.HotKeys([]peer.HotKey{
		{Key: peer.Key{Tenant: "acme", Subject: "alice", Policy: "api"}, Rate: 12.5},
		{Key: peer.Key{Tenant: "acme", Subject: "bob", Policy: "api"}, Rate: 3},
	})

	tests := []struct {
		name    string
		labels  map[string]string
		want    float64
		wantSum float64 // histograms only
		absent  bool
	}{
		{name: "ringlimit_decisions_total", labels: map[string]string{"policy": "api", "reason": "admitted", "path": "local"}, want: 2},
		{name: "ringlimit_decisions_total", labels: map[string]string{"policy": "api", "reason": "over_limit", "path": "forwarded"}, want: 1},
		{name: "ringlimit_decisions_total", labels: map[string]string{"policy": "api", "reason": "unavailable", "path": "local"}, want: 1},
		{name: "ringlimit_decisions_total", labels: map[string]string{"policy": "bulk", "reason": "shadow", "path": "remote"}, want: 1},
		{name: "ringlimit_forwards_total", labels: map[string]string{"peer": "n1", "outcome": "ok"}, want: 2},
		{name: "ringlimit_forwards_total", labels: map[string]string{"peer": "n1", "outcome": "error"}, want: 1},
		{name: "ringlimit_forwards_total", labels: map[string]string{"peer": "n2", "outcome": "not_owner"}, want: 1},
		{name: "ringlimit_forwards_total", labels: map[string]string{"peer": "n2", "outcome": "resent"}, want: 1},
		{name: "ringlimit_forward_duration_seconds", labels: map[string]string{"peer": "n1"}, want: 3, wantSum: 2.0005},
		{name: "ringlimit_forward_duration_seconds", labels: map[string]string{"peer": "n2"}, want: 1, wantSum: 0.001},
		{name: "ringlimit_batch_size", labels: map[string]string{"peer": "n1"}, want: 2, wantSum: 301},
		{name: "ringlimit_ring_version", want: 7},
		{name: "ringlimit_members", want: 3},
		{name: "ringlimit_keys", want: 42},
		{name: "ringlimit_bytes", want: 4096},
		{name: "ringlimit_evicted_keys_total", want: 5},
		{name: "ringlimit_handoff_keys_total", labels: map[string]string{"direction": "sent", "outcome": "ok"}, want: 10},
		{name: "ringlimit_handoff_keys_total", labels: map[string]string{"direction": "sent", "outcome": "failed"}, want: 2},
		{name: "ringlimit_handoff_keys_total", labels: map[string]string{"direction": "received"}, absent: true},
		{name: "ringlimit_backup_keys_total", labels: map[string]string{"direction": "sent", "outcome": "ok"}, want: 4},
		{name: "ringlimit_backup_keys_total", labels: map[string]string{"direction": "restored", "outcome": "ok"}, want: 1},
		{name: "ringlimit_overage_units_total", labels: map[string]string{"policy": "tokens"}, want: 25},
		{name: "ringlimit_decisions_total", labels: map[string]string{"policy": "tokens", "reason": "settled", "path": "local"}, want: 1},
		{name: "ringlimit_hot_key_rate", labels: map[string]string{"rank": "1", "policy": "api"}, want: 12.5},
		{name: "ringlimit_hot_key_rate", labels: map[string]string{"rank": "2", "policy": "api"}, want: 3},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.name, tc.labels), func(t *testing.T) {
			got, sum, ok := promSample(t, reg, tc.name, tc.labels)
			if tc.absent {
				if ok {
					t.Errorf("%s%v = %v, want no series", tc.name, tc.labels, got)
				}
				return
			}
			if !ok {
				t.Fatalf("%s%v: no series", tc.name, tc.labels)
			}
			if got != tc.want {
				t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
			}
			if d := sum - tc.wantSum; d > 1e-9 || d < -1e-9 {
				t.Errorf("%s%v sum = %v, want %v", tc.name, tc.labels, sum, tc.wantSum)
			}
		})
	}

	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatalf("lint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("lint %s: %s", p.Metric, p.Text)
	}
	if n := testutil.CollectAndCount(reg); n == 0 {
		t.Errorf("CollectAndCount = 0, want series")
	}
	// No node in log mode uses m: no ringlimit_raft_* series.
	if n, err := testutil.GatherAndCount(reg, "ringlimit_raft_messages_sent_total", "ringlimit_raft_proposals_total"); err != nil || n != 0 {
		t.Errorf("raft series = %d (err %v), want none without a node", n, err)
	}
}

func TestPrometheusBuckets(t *testing.T) {
	m2, reg2 := newPromMetrics(t)
	m2.Forward("n1", "ok", time.Millisecond)
	m2.Batch("n1", 1)
	mfs, err := reg2.Gather()
	if err != nil {
		t.Fatal(err)
	}
	bounds := map[string][]float64{}
	for _, mf := range mfs {
		if h := mf.GetMetric()[0].GetHistogram(); h != nil {
			for _, b := range h.GetBucket() {
				bounds[mf.GetName()] = append(bounds[mf.GetName()], b.GetUpperBound())
			}
		}
	}
	tests := []struct {
		name        string
		first, last float64
		n           int
	}{
		{"ringlimit_forward_duration_seconds", 50e-6, 1, 14},
		{"ringlimit_batch_size", 1, 4096, 13},
	}
	for _, tc := range tests {
		b := bounds[tc.name]
		if len(b) != tc.n || b[0] != tc.first || b[len(b)-1] != tc.last {
			t.Errorf("%s buckets %v, want %d from %v to %v", tc.name, b, tc.n, tc.first, tc.last)
		}
	}
}

func TestPrometheusRegistries(t *testing.T) {
	t.Run("nil registerer", func(t *testing.T) {
		if m, err := prommetrics.New(nil); err == nil || m != nil {
			t.Errorf("prommetrics.New(nil) = %v, %v; want an error", m, err)
		}
	})
	t.Run("two registries are independent", func(t *testing.T) {
		m1, reg1 := newPromMetrics(t)
		m2, reg2 := newPromMetrics(t)
		m1.Decision("api", peer.ReasonAdmitted, peer.PathLocal)
		m1.Keys(3, 30)
		m2.Keys(5, 50)
		lbl := map[string]string{"policy": "api", "reason": "admitted", "path": "local"}
		if v, _, _ := promSample(t, reg1, "ringlimit_decisions_total", lbl); v != 1 {
			t.Errorf("registry 1 decisions = %v, want 1", v)
		}
		if v, _, ok := promSample(t, reg2, "ringlimit_decisions_total", lbl); ok {
			t.Errorf("registry 2 decisions = %v, want no series", v)
		}
		for _, c := range []struct {
			reg  prometheus.Gatherer
			want float64
		}{{reg1, 3}, {reg2, 5}} {
			if v, _, _ := promSample(t, c.reg, "ringlimit_keys", nil); v != c.want {
				t.Errorf("keys = %v, want %v", v, c.want)
			}
		}
	})
	t.Run("second registration on one registry fails cleanly", func(t *testing.T) {
		m1, reg := newPromMetrics(t)
		m1.Keys(1, 1)
		before, err := testutil.GatherAndCount(reg)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := prommetrics.New(reg)
		var are prometheus.AlreadyRegisteredError
		if err == nil || m2 != nil || !errors.As(err, &are) {
			t.Fatalf("second prommetrics.New = %v, %v; want AlreadyRegisteredError", m2, err)
		}
		after, err := testutil.GatherAndCount(reg)
		if err != nil || after != before {
			t.Errorf("series after failed registration %d (err %v), want %d", after, err, before)
		}
		m1.Keys(2, 2) // the first instance still reports
		if v, _, _ := promSample(t, reg, "ringlimit_keys", nil); v != 2 {
			t.Errorf("keys = %v, want 2", v)
		}
	})
	t.Run("registration failure unregisters the rest", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		// Occupy a name registered late in the list.
		reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "ringlimit_backup_keys_total", Help: "squatter"}))
		if _, err := prommetrics.New(reg); err == nil {
			t.Fatal("prommetrics.New on a conflicting registry succeeded")
		}
		// Nothing it registered may remain: the gauges and the evicted
		// counter, registered before the conflict, would each show a series.
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "ringlimit_backup_keys_total" {
				t.Errorf("%s still registered after a failed prommetrics.New", mf.GetName())
			}
		}
	})
}

// TestPrometheusHotKeyNames: by default the hot-key series name a key by
// rank and policy only, no tenant or subject anywhere in the exposition
// (issue 53 item 8: other tenants' identities on /metrics); with
// Options.HotKeyNames they are labels.
func TestPrometheusHotKeyNames(t *testing.T) {
	top := []peer.HotKey{{Key: peer.Key{Tenant: "acme", Subject: "alice", Policy: "api"}, Rate: 7}}
	for _, names := range []bool{false, true} {
		reg := prometheus.NewRegistry()
		m, err := prommetrics.NewWithOptions(reg, prommetrics.Options{HotKeyNames: names})
		if err != nil {
			t.Fatal(err)
		}
		m.HotKeys(top)
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var text strings.Builder
		for _, mf := range mfs {
			if mf.GetName() == "ringlimit_hot_key_rate" {
				text.WriteString(mf.String())
			}
		}
		if got := strings.Contains(text.String(), "alice") || strings.Contains(text.String(), "acme"); got != names {
			t.Errorf("HotKeyNames %v: tenant or subject in the hot-key series = %v: %s", names, got, text.String())
		}
		if !strings.Contains(text.String(), `"api"`) {
			t.Errorf("HotKeyNames %v: no policy label: %s", names, text.String())
		}
	}
}

func TestPrometheusHotKeysBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := prommetrics.NewWithOptions(reg, prommetrics.Options{HotKeyNames: true})
	if err != nil {
		t.Fatal(err)
	}
	hk := func(subject string, rate float64) peer.HotKey {
		return peer.HotKey{Key: peer.Key{Tenant: "t", Subject: subject, Policy: "api"}, Rate: rate}
	}
	tests := []struct {
		name string
		top  []peer.HotKey
		want map[string]float64 // subject -> rate; rank is the slice order
	}{
		{"three", []peer.HotKey{hk("a", 9), hk("b", 5), hk("c", 1)}, map[string]float64{"a": 9, "b": 5, "c": 1}},
		{"cooled keys disappear", []peer.HotKey{hk("d", 20)}, map[string]float64{"d": 20}},
		{"empty", nil, map[string]float64{}},
		{"again", []peer.HotKey{hk("b", 4), hk("a", 2)}, map[string]float64{"b": 4, "a": 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m.HotKeys(tc.top)
			n, err := testutil.GatherAndCount(reg, "ringlimit_hot_key_rate")
			if err != nil || n != len(tc.top) {
				t.Errorf("hot key series = %d (err %v), want %d", n, err, len(tc.top))
			}
			for i, h := range tc.top {
				lbl := map[string]string{"rank": fmt.Sprint(i + 1), "tenant": "t", "subject": h.Key.Subject, "policy": "api"}
				if v, _, ok := promSample(t, reg, "ringlimit_hot_key_rate", lbl); !ok || v != tc.want[h.Key.Subject] {
					t.Errorf("hot key %v = %v (found %v), want %v", lbl, v, ok, tc.want[h.Key.Subject])
				}
			}
		})
	}
	// The caller keeps its slice: changing it afterwards changes nothing.
	top := []peer.HotKey{hk("x", 1)}
	m.HotKeys(top)
	top[0].Rate = 99
	if v, _, _ := promSample(t, reg, "ringlimit_hot_key_rate", map[string]string{"subject": "x"}); v != 1 {
		t.Errorf("hot key rate after caller mutation = %v, want 1", v)
	}
}

func TestPrometheusConcurrent(t *testing.T) {
	m, reg := newPromMetrics(t)
	const workers, each = 8, 500
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pol := fmt.Sprintf("p%d", w%3)
			for i := range each {
				m.Decision(pol, peer.ReasonAdmitted, peer.Path(i%3))
				m.Forward(fmt.Sprintf("n%d", w%2), "ok", time.Microsecond)
				if i%100 == 0 {
					m.HotKeys([]peer.HotKey{{Key: peer.Key{Tenant: "t", Subject: "s", Policy: pol}, Rate: float64(i)}})
					if _, err := reg.Gather(); err != nil {
						t.Errorf("gather: %v", err)
					}
				}
			}
		}()
	}
	wg.Wait()
	var total float64
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "ringlimit_decisions_total" {
			for _, s := range mf.GetMetric() {
				total += s.GetCounter().GetValue()
			}
		}
	}
	if total != workers*each {
		t.Errorf("decisions total = %v, want %d", total, workers*each)
	}
	if n, _ := testutil.GatherAndCount(reg, "ringlimit_decisions_total"); n != 9 {
		t.Errorf("decision series = %d, want 9 (3 policies x 3 paths)", n)
	}
}

func TestPrometheusNoAllocs(t *testing.T) {
	m, _ := newPromMetrics(t)
	tests := []struct {
		name string
		f    func()
	}{
		{"Decision", func() { m.Decision("api", peer.ReasonAdmitted, peer.PathLocal) }},
		{"Forward", func() { m.Forward("n1", "ok", time.Millisecond) }},
		{"Batch", func() { m.Batch("n1", 17) }},
		{"Keys", func() { m.Keys(1, 2) }},
	}
	for _, tc := range tests {
		tc.f() // first call resolves and caches the series
		if a := testing.AllocsPerRun(100, tc.f); a != 0 {
			t.Errorf("%s allocates %v times per call, want 0", tc.name, a)
		}
	}
}

// TestPrometheusNode checks the metrics a real node reports.
func TestPrometheusNode(t *testing.T) {
	m, reg := newPromMetrics(t)
	// A clock that moves only when told to (off, from t0).
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	var off atomic.Int64
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	n, err := peer.New(sctx, peer.Config{
		Clock:    func() time.Time { return t0.Add(time.Duration(off.Load())) },
		Metrics:  m,
		Policies: map[string]peer.PolicyConfig{"api": {Limit: 5, Window: time.Minute}},
	})
	if err != nil {
		t.Fatalf("peer.New: %v", err)
	}
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		if err := n.Close(cctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	ctx := context.Background()
	// Three subjects; alice sends 7 requests (5 admitted, 2 refused), bob
	// and carol one each.
	reqs := []struct {
		subject string
		count   int
	}{{"alice", 7}, {"bob", 1}, {"carol", 1}}
	for _, r := range reqs {
		for range r.count {
			if _, err := n.Allow(ctx, peer.Request{Key: peer.Key{Tenant: "acme", Subject: r.subject, Policy: "api"}}); err != nil {
				t.Fatalf("Allow %s: %v", r.subject, err)
			}
		}
	}
	if _, err := n.Allow(ctx, peer.Request{Key: peer.Key{Tenant: "acme", Subject: "x", Policy: "nope"}}); !errors.Is(err, peer.ErrUnknownPolicy) {
		t.Fatalf("Allow with unknown policy: %v, want ErrUnknownPolicy", err)
	}
	n.Sweep()

	type check struct {
		name   string
		labels map[string]string
		want   float64
	}
	checkAll := func(t *testing.T, checks []check) {
		t.Helper()
		for _, c := range checks {
			got, _, ok := promSample(t, reg, c.name, c.labels)
			if !ok || got != c.want {
				t.Errorf("%s%v = %v (found %v), want %v", c.name, c.labels, got, ok, c.want)
			}
		}
	}
	checkAll(t, []check{
		{"ringlimit_decisions_total", map[string]string{"policy": "api", "reason": "admitted", "path": "local"}, 7},
		{"ringlimit_decisions_total", map[string]string{"policy": "api", "reason": "over_limit", "path": "local"}, 2},
		{"ringlimit_keys", nil, 3},
		{"ringlimit_members", nil, 1},
		{"ringlimit_ring_version", nil, float64(n.RingVersion())},
	})
	if v, _, _ := promSample(t, reg, "ringlimit_bytes", nil); v <= 0 {
		t.Errorf("ringlimit_bytes = %v, want > 0 with 3 keys", v)
	}
	if n, err := testutil.GatherAndCount(reg, "ringlimit_decisions_total"); err != nil || n != 2 {
		t.Errorf("decision series = %d (err %v), want 2: an unknown policy is an error, not a decision", n, err)
	}
	// The node is in log mode (the default) and alone: it proposed (its
	// liveness, its grants) and applied, and sent no raft message.
	rt := n.RaftTraffic()
	if rt.Proposals == 0 || rt.Applied == 0 || rt.MessagesSent != 0 {
		t.Errorf("RaftTraffic = %+v, want proposals and applied commands, no messages", rt)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
	}{
		{"ringlimit_raft_proposals_total", map[string]string{"kind": "command"}},
		{"ringlimit_raft_applied_total", nil},
	} {
		if v, _, ok := promSample(t, reg, c.name, c.labels); !ok || v < 1 {
			t.Errorf("%s%v = %v (found %v), want at least 1", c.name, c.labels, v, ok)
		}
	}
	if v, _, ok := promSample(t, reg, "ringlimit_raft_messages_sent_total", nil); !ok || v != 0 {
		t.Errorf("ringlimit_raft_messages_sent_total = %v (found %v), want 0 for a node alone", v, ok)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatalf("lint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("lint %s: %s", p.Metric, p.Text)
	}

	// A window later every key is idle: the sweep reclaims them.
	off.Store(int64(2 * time.Minute))
	n.Sweep()
	checkAll(t, []check{
		{"ringlimit_keys", nil, 0},
		{"ringlimit_evicted_keys_total", nil, 3},
	})
}

func BenchmarkPrometheusDecision(b *testing.B) {
	reg := prometheus.NewRegistry()
	m, err := prommetrics.New(reg)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Decision("api", peer.ReasonAdmitted, peer.PathLocal)
		}
	})
}

// TestPrometheusRaftTraffic: the ringlimit_raft_* series appear once a
// node hands its RaftTraffic source, and each scrape reads the source
// then: every counter is its field.
func TestPrometheusRaftTraffic(t *testing.T) {
	m, reg := newPromMetrics(t)
	var _ peer.RaftTrafficSource = m
	if _, _, found := promSample(t, reg, "ringlimit_raft_messages_sent_total", nil); found {
		t.Fatal("ringlimit_raft_messages_sent_total before any source")
	}
	tr := peer.RaftTraffic{MessagesSent: 11, BytesSent: 1300, MessagesDropped: 2, MessagesShed: 3, Proposals: 5, ConfChanges: 7, Applied: 17,
		MessagesReceived: 19, BytesReceived: 2300}
	var scrapes atomic.Int64
	m.RaftTrafficFrom(func() peer.RaftTraffic {
		n := scrapes.Add(1)
		out := tr
		out.Applied += uint64(n) // a counter that moves between scrapes
		return out
	})
	for scrape := range 2 {
		for _, w := range []struct {
			name   string
			labels map[string]string
			want   uint64
		}{
			{"ringlimit_raft_messages_sent_total", nil, tr.MessagesSent},
			{"ringlimit_raft_bytes_sent_total", nil, tr.BytesSent},
			{"ringlimit_raft_messages_dropped_total", nil, tr.MessagesDropped},
			{"ringlimit_raft_messages_shed_total", nil, tr.MessagesShed},
			{"ringlimit_raft_proposals_total", map[string]string{"kind": "command"}, tr.Proposals},
			{"ringlimit_raft_proposals_total", map[string]string{"kind": "conf_change"}, tr.ConfChanges},
			{"ringlimit_raft_messages_received_total", nil, tr.MessagesReceived},
			{"ringlimit_raft_bytes_received_total", nil, tr.BytesReceived},
		} {
			if v, _, found := promSample(t, reg, w.name, w.labels); !found || v != float64(w.want) {
				t.Errorf("scrape %d: %s%v = %v (found %v), want %d", scrape, w.name, w.labels, v, found, w.want)
			}
		}
		// Each promSample gathers once: the applied counter read in this
		// gather is the source's value at its call.
		before := scrapes.Load()
		v, _, found := promSample(t, reg, "ringlimit_raft_applied_total", nil)
		if want := float64(tr.Applied) + float64(before+1); !found || v != want {
			t.Errorf("scrape %d: ringlimit_raft_applied_total = %v, want %v (read at the scrape)", scrape, v, want)
		}
	}
}
