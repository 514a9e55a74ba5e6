package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

func TestServeHTTPAndGRPC(t *testing.T) {
	t.Parallel()
	pols := writeFile(t, t.TempDir(), "policies.yaml", testPolicies)
	// The policy file comes from the environment: RINGLIMIT_POLICIES.
	p := startServe(t, "solo", []string{"RINGLIMIT_POLICIES=" + pols})
	base := "http://" + p.httpAddr
	check := base + "/v1/check"
	good := `{"tenant":"acme","subject":"alice","policy":"api"}`

	t.Run("admitted with headers", func(t *testing.T) {
		r := doHTTP(t, "POST", check, good)
		if r.status != 200 || r.body["allowed"] != true || r.body["reason"] != "admitted" || r.body["remaining"] != 2.0 ||
			r.body["limit"] != 3.0 || r.body["owner"] != "solo" {
			t.Fatalf("first check: %d %s", r.status, r.raw)
		}
		for h, want := range map[string]string{
			"RateLimit-Policy": `"api";q=3;w=60`,
			"RateLimit":        `"api";r=2;t=`, // t is 60 or 61: the log rounds times up to 1 ms
			"Content-Type":     "application/json",
		} {
			if got := r.header.Get(h); !strings.HasPrefix(got, want) {
				t.Errorf("header %s = %q, want prefix %q", h, got, want)
			}
		}
	})
	t.Run("429 over limit", func(t *testing.T) {
		for i := range 2 {
			if r := doHTTP(t, "POST", check, good); r.status != 200 {
				t.Fatalf("check %d: %d %s", i+2, r.status, r.raw)
			}
		}
		r := doHTTP(t, "POST", check, good)
		if r.status != 429 || r.body["allowed"] != false || r.body["reason"] != "over_limit" || r.body["remaining"] != 0.0 {
			t.Fatalf("4th check: %d %s", r.status, r.raw)
		}
		// The log rounds admission times up to 1 ms (never earlier than
		// the decision), so the oldest can leave the window up to 1 ms
		// after W from now.
		if ra, _ := r.body["retry_after_ms"].(float64); ra <= 0 || ra > 60001 {
			t.Errorf("retry_after_ms = %v, want in (0, 60001]", r.body["retry_after_ms"])
		}
		if got := r.header.Get("Retry-After"); got != "60" {
			t.Errorf("Retry-After = %q, want 60", got)
		}
	})
	for _, tc := range []struct {
		name, body string
		status     int
		errPart    string
	}{
		{"bad JSON", `{"tenant":`, 400, "bad JSON"},
		{"unknown field", `{"tenant":"a","subject":"b","policy":"api","limit":1000}`, 400, `unknown field "limit"`},
		{"two objects", good + good, 400, "trailing data"},
		{"unknown policy", `{"tenant":"a","subject":"b","policy":"nope"}`, 400, "unknown policy"},
		{"empty tenant", `{"subject":"b","policy":"api"}`, 400, "invalid key: tenant is empty;"},
		{"UTF-8 subject", `{"tenant":"a","subject":"josé","policy":"api"}`, 400, "invalid key: subject has byte 0xc3 at 3 outside visible ASCII;"},
		{"hits above the limit", `{"tenant":"a","subject":"b","policy":"api","hits":4}`, 400, "invalid hits"},
		{"negative hits", `{"tenant":"a","subject":"b","policy":"api","hits":-1}`, 400, "invalid hits"},
		{"oversized body", `{"tenant":"` + strings.Repeat("a", 70<<10) + `"}`, 413, "larger than 65536"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := doHTTP(t, "POST", check, tc.body)
			msg, _ := r.body["error"].(string)
			if r.status != tc.status || !strings.Contains(msg, tc.errPart) {
				t.Errorf("POST %.60q: %d %s, want %d with error containing %q", tc.body, r.status, r.raw, tc.status, tc.errPart)
			}
			if strings.Contains(msg, "peer:") || strings.Contains(msg, "shard:") {
				t.Errorf("POST %.60q: error %q carries a package prefix", tc.body, msg)
			}
		})
	}
	t.Run("reset without --admin-token-file is 404", func(t *testing.T) {
		r := doHTTP(t, "POST", base+"/v1/reset", good)
		if msg, _ := r.body["error"].(string); r.status != http.StatusNotFound || !strings.Contains(msg, "--admin-token-file") {
			t.Errorf("POST /v1/reset: %d %s, want 404 naming --admin-token-file", r.status, r.raw)
		}
	})
	t.Run("wrong method", func(t *testing.T) {
		if r := doHTTP(t, "GET", check, ""); r.status != http.StatusMethodNotAllowed {
			t.Errorf("GET /v1/check: %d, want 405", r.status)
		}
	})
	t.Run("metrics", func(t *testing.T) {
		r := doHTTP(t, "GET", base+"/metrics", "")
		for _, want := range []string{
			`ringlimit_decisions_total{path="local",policy="api",reason="admitted"} 3`,
			`ringlimit_decisions_total{path="local",policy="api",reason="over_limit"} 1`,
			"go_goroutines ",
			"ringlimit_members 1",
		} {
			if !strings.Contains(r.raw, want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
		if t.Failed() {
			t.Logf("/metrics:\n%s", r.raw)
		}
	})
	t.Run("health and debug", func(t *testing.T) {
		if r := doHTTP(t, "GET", base+"/healthz", ""); r.status != 200 {
			t.Errorf("/healthz: %d %s", r.status, r.raw)
		}
		if r := doHTTP(t, "GET", base+"/readyz", ""); r.status != 200 || r.body["members"] != 1.0 {
			t.Errorf("/readyz: %d %s", r.status, r.raw)
		}
		r := doHTTP(t, "GET", base+"/debug/ring", "")
		if r.status != 200 || r.body["node"] != "solo" || r.body["partitions_owned"] != r.body["partitions"] ||
			fmt.Sprint(r.body["members"]) != "[solo]" || r.body["ring_version"] == 0.0 {
			t.Errorf("/debug/ring: %d %s", r.status, r.raw)
		}
		r = doHTTP(t, "GET", base+"/debug/hotkeys", "")
		_, spreadOK := r.body["spread_keys"].([]any)
		if _, ok := r.body["hot_keys"].([]any); r.status != 200 || !ok || !spreadOK {
			t.Errorf("/debug/hotkeys: %d %s", r.status, r.raw)
		}
	})
	t.Run("grpc", func(t *testing.T) {
		conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		hr, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health check: %v, %v", hr, err)
		}
		rl := peerpb.NewRateLimiterClient(conn)
		key := &peerpb.Key{Tenant: "acme", Subject: "bob", Policy: "api"}
		for i := range 4 {
			resp, err := rl.Allow(ctx, &peerpb.AllowRequest{Key: key})
			if err != nil {
				t.Fatalf("Allow %d: %v", i, err)
			}
			if want := i < 3; resp.GetAllowed() != want || resp.GetOwner() != "solo" {
				t.Errorf("Allow %d: allowed %v owner %q, want %v from solo", i, resp.GetAllowed(), resp.GetOwner(), want)
			}
		}
		// Without --admin-token-file gRPC Reset is off, as /v1/reset is
		// (issue 53 item 7: it reset the key for a caller with no
		// credential), and the start-up log says so.
		if resp, err := rl.Reset(ctx, &peerpb.AllowRequest{Key: key}); status.Code(err) != codes.Unauthenticated || !strings.Contains(status.Convert(err).Message(), "--admin-token-file") {
			t.Errorf("Reset with no credential and no admin token: %v, %v; want Unauthenticated naming --admin-token-file", resp, err)
		}
		if resp, err := rl.Peek(ctx, &peerpb.AllowRequest{Key: key}); err != nil || resp.GetRemaining() != 0 {
			t.Errorf("Peek after the refused Reset: %v, %v; want remaining 0 (nothing reset)", resp, err)
		}
		if !strings.Contains(p.logText(), `"msg":"reset: off (no --admin-token-file): gRPC Reset is refused, POST /v1/reset answers 404"`) {
			t.Errorf("start-up log does not say that reset is off")
		}
	})
	t.Run("SIGTERM drains and exits 0", func(t *testing.T) {
		if code := p.terminate(t); code != 0 {
			t.Errorf("exit code %d after SIGTERM, want 0", code)
		}
		if !strings.Contains(p.logText(), `"msg":"stopped"`) {
			t.Errorf("log lacks the stopped line")
		}
	})
}

// TestServeTwoNodes drives one key through two joined serve processes: the
// pair never admits more than the limit.
func TestServeTwoNodes(t *testing.T) {
	t.Parallel()
	pols := writeFile(t, t.TempDir(), "policies.yaml", testPolicies)
	a := startServe(t, "a", nil, "--policies", pols)
	b := startServe(t, "b", nil, "--policies", pols, "--join", a.gossipAddr)
	for _, p := range []*serveProc{a, b} {
		waitFor(t, 15*time.Second, p.name+" to see 2 members", func() bool {
			r := doHTTP(t, "GET", "http://"+p.httpAddr+"/debug/ring", "")
			m, _ := r.body["members"].([]any)
			return len(m) == 2
		})
		// Ready: every partition is on its target with its backup, so no
		// request waits for a transfer (a 503 on a loaded machine).
		waitFor(t, 30*time.Second, p.name+" to be ready", func() bool {
			return doHTTP(t, "GET", "http://"+p.httpAddr+"/readyz", "").status == 200
		})
	}
	// Two clients, one per node, at the same time.
	const perNode = 15
	var mu sync.Mutex
	admitted, owners := 0, map[string]int{}
	var wg sync.WaitGroup
	for _, p := range []*serveProc{a, b} {
		wg.Go(func() {
			for range perNode {
				r, err := httpDo("POST", "http://"+p.httpAddr+"/v1/check", `{"tenant":"acme","subject":"carol","policy":"shared"}`)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if r.status == 200 {
					admitted++
				}
				if r.status == 200 || r.status == 429 {
					owners[r.body["owner"].(string)]++
				} else {
					t.Errorf("check via %s: %d %s", p.name, r.status, r.raw)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if admitted != 10 {
		t.Errorf("admitted %d of %d through two nodes, want exactly the limit 10", admitted, 2*perNode)
	}
	if len(owners) != 1 {
		t.Errorf("decisions came from %v, want one owner", owners)
	}
	// b leaves first, handing its keys to a; then a, alone.
	for _, p := range []*serveProc{b, a} {
		if code := p.terminate(t); code != 0 {
			t.Errorf("%s exit code %d after SIGTERM, want 0", p.name, code)
		}
	}
}

// TestServeReadyzOtherTable joins a node with another policy table: that
// is a rolling change, not a mismatch, so both stay in each other's ring,
// stay ready, and /debug/ring shows each member's table version.
// (Placement mismatches are covered by peer's TestReadyIgnoredMember.)
func TestServeReadyzOtherTable(t *testing.T) {
	t.Parallel()
	pols := writeFile(t, t.TempDir(), "policies.yaml", testPolicies)
	a := startServe(t, "ready-a", nil, "--policies", pols)
	b := startServe(t, "ready-b", nil, "--join", a.gossipAddr) // default policies
	var ring httpResult
	waitFor(t, 15*time.Second, "a's /debug/ring to list both members and their table versions", func() bool {
		ring = doHTTP(t, "GET", "http://"+a.httpAddr+"/debug/ring", "")
		vs, _ := ring.body["member_policy_versions"].(map[string]any)
		members, _ := ring.body["members"].([]any)
		return len(members) == 2 && vs["ready-b"] != nil && vs["ready-b"] != 0.0
	})
	vs := ring.body["member_policy_versions"].(map[string]any)
	if vs["ready-a"] == vs["ready-b"] || vs["ready-a"] != ring.body["policy_version"] {
		t.Fatalf("/debug/ring = %s; want distinct versions for distinct tables, ready-a's its own", ring.raw)
	}
	// Ready once the partitions have moved (another table is no reason to
	// ignore a member).
	for _, p := range []*serveProc{a, b} {
		waitFor(t, 15*time.Second, p.name+" /readyz to answer 200", func() bool {
			return doHTTP(t, "GET", "http://"+p.httpAddr+"/readyz", "").status == 200
		})
	}
}

// TestServeUnavailable kills the owner of a key with SIGKILL: the other
// node answers 503 "unavailable" (never 429) until its ring drops the dead
// member, then decides again.
func TestServeUnavailable(t *testing.T) {
	t.Parallel()
	pols := writeFile(t, t.TempDir(), "policies.yaml", testPolicies)
	a := startServe(t, "ua", nil, "--policies", pols)
	b := startServe(t, "ub", nil, "--policies", pols, "--join", a.gossipAddr)
	// Readiness needs the partitions settled: generous, it returns once true.
	waitFor(t, 60*time.Second, "ua to see 2 members", func() bool {
		r := doHTTP(t, "GET", "http://"+a.httpAddr+"/readyz", "")
		return r.status == 200 && r.body["members"] == 2.0
	})
	// A key that ub owns, found through ua's answers.
	body := ""
	for i := 0; body == "" && i < 200; i++ {
		try := fmt.Sprintf(`{"tenant":"acme","subject":"erin-%d","policy":"api"}`, i)
		if r := doHTTP(t, "POST", "http://"+a.httpAddr+"/v1/check", try); r.body["owner"] == "ub" {
			body = try
		}
	}
	if body == "" {
		t.Fatal("no key owned by ub in 200 tries")
	}
	if err := b.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-b.exited
	r := doHTTP(t, "POST", "http://"+a.httpAddr+"/v1/check", body)
	if r.status != http.StatusServiceUnavailable || r.body["reason"] != "unavailable" || r.body["allowed"] != false ||
		r.body["error"] == nil || r.header.Get("Retry-After") != "1" || r.body["retry_after_ms"] != 1000.0 ||
		r.body["limit"] != 3.0 || r.header.Get("RateLimit-Policy") != `"api";q=3;w=60` {
		t.Errorf("check right after the owner died: %d %v %s, want 503 reason unavailable with an error, "+
			"Retry-After 1 and retry_after_ms 1000, RateLimit-Policy and the policy's limit", r.status, r.header, r.raw)
	}
	waitFor(t, 15*time.Second, "ua to decide again once its ring drops ub", func() bool {
		r := doHTTP(t, "POST", "http://"+a.httpAddr+"/v1/check", body)
		if r.status == http.StatusTooManyRequests {
			t.Errorf("check reported over limit while recovering: %s", r.raw)
		}
		return r.status == http.StatusOK && r.body["owner"] == "ua"
	})
	m := doHTTP(t, "GET", "http://"+a.httpAddr+"/metrics", "").raw
	if !strings.Contains(m, `reason="unavailable"`) {
		t.Errorf("/metrics lacks decisions with reason=\"unavailable\"")
	}
	if code := a.terminate(t); code != 0 {
		t.Errorf("ua exit code %d after SIGTERM, want 0", code)
	}
}

// TestServeJoinTimeout starts serve with a seed that never comes up: it
// must keep retrying for --join-timeout, logging each try, then fail naming
// the seed (it used to exit after the first refused try).
func TestServeJoinTimeout(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	seed := l.Addr().String()
	_ = l.Close()
	var stderr bytes.Buffer
	start := time.Now()
	err = runServe(context.Background(), []string{"--gossip-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--http-addr", "",
		"--gossip-profile", "fast", "--join", seed, "--join-timeout", "500ms"}, io.Discard, &stderr)
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), seed) {
		t.Fatalf("serve with an absent seed = %v; want an error naming %s", err, seed)
	}
	if took < 500*time.Millisecond {
		t.Fatalf("serve gave up after %v, before --join-timeout 500ms", took)
	}
	if !strings.Contains(stderr.String(), "join failed, retrying") || !strings.Contains(stderr.String(), "attempt=2") {
		t.Fatalf("serve log lacks the retried join attempts:\n%s", stderr.String())
	}
}
