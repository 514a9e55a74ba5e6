package peer

import (
	"context"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// readyMetrics records Ready calls.
type readyMetrics struct {
	nopMetrics
	ch chan string // "ready" or the reason code
}

func (m *readyMetrics) Ready(ready bool, reason string) {
	if ready {
		reason = "ready"
	}
	select {
	case m.ch <- reason:
	default:
	}
}

func healthStatus(t *testing.T, nd *Node) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(dialTest(t, nd.RPCAddr())).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("health check on %s: %v", nd.Name(), err)
	}
	return r.GetStatus()
}

// TestReadyIgnoredMember joins a member with another placement: gossip
// knows it but the ring leaves it out, so the cluster's nodes are not ready
// (with the member named in the reason, NOT_SERVING health and the metric)
// until it leaves. The membership log calls it ignored, not joined.
func TestReadyIgnoredMember(t *testing.T) {
	pols := map[string]PolicyConfig{"p": {Limit: 5, Window: time.Minute}}
	tap, log := newLogTap(t)
	m := &readyMetrics{ch: make(chan string, 16)}
	c := startClusterWith(t, 2, Config{Policies: pols}, func(i int, cfg *Config) {
		if i == 0 {
			cfg.Logger, cfg.Metrics = log, m
		}
	})
	n0 := c.nodes[0]
	waitFor(t, 10*time.Second, "n0 in a healthy, settled cluster to be ready and SERVING", func() bool {
		ok, _ := n0.Ready()
		return ok && healthStatus(t, n0) == healthpb.HealthCheckResponse_SERVING
	})
	notReady := tap.on("readiness changed", func(a map[string]string) bool { return a["ready"] == "false" })
	ignoredEv := tap.on("gossip membership", func(a map[string]string) bool { return a["member"] == "odd" })
	odd := c.addWith("odd", func(cfg *Config) { cfg.Ring.PartitionCount = 97 })
	waitLog(t, notReady, 10*time.Second, "n0 to become not ready")
	if ev := waitLog(t, ignoredEv, time.Second, "n0's membership line about odd"); ev["event"] != "ignored" {
		t.Errorf("membership line about odd has event=%s, want ignored", ev["event"])
	}
	ok, reason := n0.Ready()
	if ok || !strings.Contains(reason, "odd") || !strings.Contains(reason, "fingerprint") {
		t.Fatalf("n0 with an ignored member: Ready = %v, %q; want not ready naming odd and the fingerprint", ok, reason)
	}
	if st := healthStatus(t, n0); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("n0 health with an ignored member = %v, want NOT_SERVING", st)
	}
	ready := tap.on("readiness changed", func(a map[string]string) bool { return a["ready"] == "true" })
	if err := odd.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitLog(t, ready, 10*time.Second, "n0 to become ready once odd left")
	if st := healthStatus(t, n0); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("n0 health after odd left = %v, want SERVING", st)
	}
	var got []string
	for len(m.ch) > 0 {
		r := <-m.ch
		if r == ReadyReasonMoving || len(got) > 0 && got[len(got)-1] == r {
			continue // partitions moving while the cluster forms: not this test's subject
		}
		got = append(got, r)
	}
	if strings.Join(got, ",") != "ready,ignored_members,ready" {
		t.Fatalf("Metrics.Ready reports = %v, want ready, ignored_members, ready", got)
	}
}

// TestReadyClosing checks that Close turns readiness off first.
func TestReadyClosing(t *testing.T) {
	nd, err := New(context.Background(), Config{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if ok, reason := nd.Ready(); !ok || reason != "" {
		t.Fatalf("single node: Ready = %v, %q; want true, \"\"", ok, reason)
	}
	_ = nd.Close(context.Background())
	if ok, reason := nd.Ready(); ok || !strings.Contains(reason, "closing") {
		t.Fatalf("closed node: Ready = %v, %q; want not ready, closing", ok, reason)
	}
}
