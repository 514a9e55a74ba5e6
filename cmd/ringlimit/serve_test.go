package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// serveProc is a `ringlimit serve` process: the test binary re-executed in
// child mode (see TestMain).
type serveProc struct {
	name                           string
	cmd                            *exec.Cmd
	httpAddr, grpcAddr, gossipAddr string
	mu                             sync.Mutex
	log                            bytes.Buffer
	exited                         chan struct{} // closed once the process has been reaped
	// stdin stays open while the test runs: the child runs with
	// --exit-on-stdin-eof, so it stops by itself if the test binary dies.
	stdin io.WriteCloser
}

const testPolicies = `policies:
  - name: api
    limit: 3
    window: 1m
  - name: shared
    limit: 10
    window: 1m
`

// writeFile writes data into a new file in dir and returns its path.
func writeFile(t *testing.T, dir, name, data string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// startServe starts a node on loopback with ephemeral ports and fast gossip,
// and waits for its "serving" line. extra are added flags; env are added
// environment variables. The process is killed at cleanup if still running.
func startServe(t *testing.T, name string, env []string, extra ...string) *serveProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"serve", "--name", name,
		"--gossip-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--log-format", "json", "--gossip-profile", "fast", "--drain-timeout", "5s", "--exit-on-stdin-eof"}, extra...)
	cmd := exec.Command(exe, args...)
	cmd.Env = append(childEnv(os.Environ()), env...)
	p := launchServe(t, name, cmd)
	for _, a := range []string{p.httpAddr, p.grpcAddr, p.gossipAddr} {
		if host, _, err := net.SplitHostPort(a); err != nil || host != "127.0.0.1" {
			t.Fatalf("%s: serving line has address %q, want 127.0.0.1:port", name, a)
		}
	}
	return p
}

// launchServe starts cmd (a serve command line, its environment set) with
// its stdin held open (--exit-on-stdin-eof), records its log, and waits
// for its "serving" line. The process is killed at cleanup if still
// running, and its log is shown if the test failed.
func launchServe(t *testing.T, name string, cmd *exec.Cmd) *serveProc {
	t.Helper()
	p := &serveProc{name: name, cmd: cmd, exited: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	serving := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.log.Write(sc.Bytes())
			p.log.WriteByte('\n')
			p.mu.Unlock()
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == "serving" {
				serving <- rec
			}
		}
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.stdin.Close()
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("log of %s:\n%s", name, p.logText())
		}
	})
	select {
	case rec := <-serving:
		p.httpAddr, _ = rec["http_addr"].(string)
		p.grpcAddr, _ = rec["grpc_addr"].(string)
		p.gossipAddr, _ = rec["gossip_addr"].(string)
	case <-p.exited:
		t.Fatalf("%s exited before serving (%v):\n%s", name, p.cmd.ProcessState, p.logText())
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not log \"serving\" within 20s:\n%s", name, p.logText())
	}
	return p
}

func (p *serveProc) logText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// terminate sends SIGTERM and returns the exit code, failing the test if
// the process does not exit within 15 s.
func (p *serveProc) terminate(t *testing.T) int {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM %s: %v", p.name, err)
	}
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(15 * time.Second):
		t.Fatalf("%s did not exit within 15s of SIGTERM", p.name)
		return -1
	}
}

// httpResult is one HTTP exchange.
type httpResult struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

// doHTTP makes one request and fails the test if it cannot; call it on the
// test's goroutine only.
func doHTTP(t *testing.T, method, url, body string) httpResult {
	t.Helper()
	r, err := httpDo(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// httpDo makes one request; safe on any goroutine.
func httpDo(method, url, body string) (httpResult, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return httpResult{}, err
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return httpResult{}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := httpResult{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	_ = json.Unmarshal(raw, &r.body)
	return r, nil
}

// waitFor polls cond every 20 ms until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		<-tick.C
	}
}

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
		if _, ok := r.body["hot_keys"].([]any); r.status != 200 || !ok {
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
	waitFor(t, 15*time.Second, "ua to see 2 members", func() bool {
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

// TestServeMutualTLS runs two nodes with mutual TLS on gRPC and an
// encrypted gossip key, forwards between them, and checks that a client
// without a certificate is refused. One node uses gRPC streams to its
// peer (--peer-pipes grpc), the other framed pipes over TLS: both kinds
// meet in one cluster.
func TestServeMutualTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, cert, key := writeTestPKI(t, dir)
	gossipKey := writeFile(t, dir, "gossip.key", base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))+"\n")
	flags := []string{"--tls-ca", ca, "--tls-cert", cert, "--tls-key", key, "--gossip-key", gossipKey}
	a := startServe(t, "tls-a", nil, flags...)
	b := startServe(t, "tls-b", nil, append(flags, "--join", a.gossipAddr, "--peer-pipes", "grpc")...)
	waitFor(t, 15*time.Second, "both nodes to see 2 members", func() bool {
		for _, p := range []*serveProc{a, b} {
			r := doHTTP(t, "GET", "http://"+p.httpAddr+"/readyz", "")
			if r.status != 200 || r.body["members"] != 2.0 {
				return false
			}
		}
		return true
	})
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := loadCAPool(ca)
	if err != nil {
		t.Fatal(err)
	}
	creds := credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}})
	conn, err := grpc.NewClient(a.grpcAddr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	owners := map[string]bool{}
	for i := range 40 {
		resp, err := peerpb.NewRateLimiterClient(conn).Allow(ctx, &peerpb.AllowRequest{
			Key: &peerpb.Key{Tenant: "acme", Subject: fmt.Sprintf("u%d", i), Policy: "default"},
		})
		if err != nil {
			t.Fatalf("Allow over mutual TLS: %v", err)
		}
		owners[resp.GetOwner()] = true
	}
	if !owners["tls-a"] || !owners["tls-b"] {
		t.Errorf("owners %v: want decisions from both nodes (forwarding over mutual TLS)", owners)
	}
	// The check command with and without a client certificate.
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"with client certificate", []string{"--tls-ca", ca, "--tls-cert", cert, "--tls-key", key}, exitOK},
		// Set-up mistakes: the node never answered in gRPC (exit 4, not
		// 3, which is the node's own "could not decide").
		{"without client certificate", []string{"--tls-ca", ca}, exitUnreachable},
		{"plaintext", nil, exitUnreachable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"check", "--addr", a.grpcAddr, "--tenant", "t", "--subject", "s", "--policy", "default", "--timeout", "3s"}, tc.args...)
			var out bytes.Buffer
			if code := exitCode(run(context.Background(), args, &out, &out), &out); code != tc.want {
				t.Errorf("check %s: exit code %d, want %d\n%s", tc.name, code, tc.want, out.String())
			}
		})
	}
}

// writeTestPKI writes a CA and one certificate for 127.0.0.1, usable as
// both server and client, and returns the three PEM paths.
func writeTestPKI(t *testing.T, dir string) (caPath, certPath, keyPath string) {
	t.Helper()
	return writeTestPKIFor(t, dir, []net.IP{net.ParseIP("127.0.0.1")}, nil)
}

// writeTestPKIFor is writeTestPKI with the leaf's SANs given: ips and
// dnsNames.
func writeTestPKIFor(t *testing.T, dir string, ips []net.IP, dnsNames []string) (caPath, certPath, keyPath string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ringlimit test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "ringlimit node"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IPAddresses: ips, DNSNames: dnsNames,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(leafKey)
	if err != nil {
		t.Fatal(err)
	}
	pemOf := func(typ string, der []byte) string {
		return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
	}
	return writeFile(t, dir, "ca.pem", pemOf("CERTIFICATE", caDER)),
		writeFile(t, dir, "node.pem", pemOf("CERTIFICATE", leafDER)),
		writeFile(t, dir, "node.key", pemOf("EC PRIVATE KEY", keyDER))
}

func TestServeConfigErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	shortKey := writeFile(t, dir, "short.key", "too short")
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"missing policy file", []string{"--policies", filepath.Join(dir, "nope.yaml")}, "nope.yaml"},
		{"bad log format", []string{"--log-format", "xml"}, `log format "xml"`},
		{"bad log level", []string{"--log-level", "loud"}, `log level "loud"`},
		{"half of TLS", []string{"--tls-cert", "x.pem"}, "go together"},
		{"bad gossip key", []string{"--gossip-key", shortKey}, "want 16, 24 or 32"},
		{"bad gossip profile", []string{"--gossip-profile", "moon"}, "gossip profile"},
		{"bad peer pipes", []string{"--peer-pipes", "smoke"}, `peer pipes "smoke": want framed, grpc or unary`},
		{"bad ownership", []string{"--ownership", "raft"}, `ownership "raft": want gossip or log`},
		{"stray argument", []string{"now"}, `unexpected argument "now"`},
		{"bad address", []string{"--gossip-addr", "nowhere", "--grpc-addr", "127.0.0.1:0", "--http-addr", ""}, "gossip address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(context.Background(), append([]string{"serve"}, tc.args...), &out, &out)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("serve %q: error %v, want one containing %q", tc.args, err, tc.wantErr)
			}
			if code := exitCode(err, io.Discard); code != 1 {
				t.Errorf("serve %q: exit code %d, want 1", tc.args, code)
			}
		})
	}
}

func TestApplyEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		args     []string
		env      map[string]string
		wantAddr string
		wantJoin string
		wantErr  string
	}{
		{"defaults", nil, nil, "127.0.0.1:7946", "", ""},
		{"from env", nil, map[string]string{"RINGLIMIT_GOSSIP_ADDR": "127.0.0.1:9", "RINGLIMIT_JOIN": "x:1,y:2"}, "127.0.0.1:9", "x:1,y:2", ""},
		{"flag wins", []string{"--gossip-addr", "127.0.0.1:5"}, map[string]string{"RINGLIMIT_GOSSIP_ADDR": "127.0.0.1:9"}, "127.0.0.1:5", "", ""},
		{"bad env value", nil, map[string]string{"RINGLIMIT_DRAIN_TIMEOUT": "soon"}, "", "", "RINGLIMIT_DRAIN_TIMEOUT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			addr := fs.String("gossip-addr", "127.0.0.1:7946", "")
			join := fs.String("join", "", "")
			fs.Duration("drain-timeout", time.Second, "")
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := applyEnv(fs, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("applyEnv error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || *addr != tc.wantAddr || *join != tc.wantJoin {
				t.Errorf("applyEnv: addr %q join %q err %v; want %q %q", *addr, *join, err, tc.wantAddr, tc.wantJoin)
			}
		})
	}
	if got := envName("tls-server-name"); got != "RINGLIMIT_TLS_SERVER_NAME" {
		t.Errorf("envName = %q", got)
	}
}

func TestLoadGossipKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	k24 := bytes.Repeat([]byte{1}, 24)
	for _, tc := range []struct {
		name    string
		content []byte
		want    []byte
	}{
		{"raw 16", bytes.Repeat([]byte{0xfe}, 16), bytes.Repeat([]byte{0xfe}, 16)},
		{"raw 32", bytes.Repeat([]byte{0x00}, 32), bytes.Repeat([]byte{0x00}, 32)},
		// The base64 of a 24-byte key is 32 bytes long: it must be decoded,
		// not taken as a raw 32-byte key.
		{"base64 of 24", []byte(base64.StdEncoding.EncodeToString(k24)), k24},
		{"base64 with newline", []byte(base64.StdEncoding.EncodeToString(k24) + "\n"), k24},
		{"wrong length", []byte("0123456789"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, dir, strings.ReplaceAll(tc.name, " ", "_"), string(tc.content))
			got, err := loadGossipKey(path)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("loadGossipKey(%q) = %x, want an error", tc.content, got)
				}
				return
			}
			if err != nil || !bytes.Equal(got, tc.want) {
				t.Errorf("loadGossipKey(%q) = %x, %v; want %x", tc.content, got, err, tc.want)
			}
		})
	}
	if _, err := loadGossipKey(filepath.Join(dir, "missing")); err == nil {
		t.Error("loadGossipKey(missing) returned no error")
	}
}

// staticPolicies is a fixed policy table for httpAPI tests without a node.
type staticPolicies map[string]peer.PolicyConfig

func (s staticPolicies) Policy(name string) (peer.PolicyConfig, bool) {
	pc, ok := s[name]
	return pc, ok
}

func (s staticPolicies) Policies() map[string]peer.PolicyConfig { return s }

// TestServeAllowErrors checks how serve answers each error Node.Allow can
// return: bad input in the client's terms with no package prefixes, and a
// 503 that carries what a 429 carries and claims a timeout only after one.
func TestServeAllowErrors(t *testing.T) {
	t.Parallel()
	api := &httpAPI{pols: staticPolicies{
		"api": {Limit: 3, Window: time.Minute}, "shared": {Limit: 10, Window: time.Minute},
		"inflight": {Algorithm: peer.Concurrency, Limit: 2, Window: time.Minute},
	}, log: slog.New(slog.DiscardHandler)}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	good := peer.Key{Tenant: "a", Subject: "b", Policy: "api"}
	for _, tc := range []struct {
		name     string
		key      peer.Key
		policies []string // instead of key.Policy
		hits     int64
		err      error
		status   int
		headers  map[string]string // "" means absent
		body     map[string]any
		errPart  string
		errNotIn string
	}{
		{name: "connection refused", key: good, status: 503,
			err:     fmt.Errorf("%w: forward to ub: %w", peer.ErrUnavailable, refused),
			headers: map[string]string{"Retry-After": "1", "RateLimit-Policy": `"api";q=3;w=60`, "RateLimit-Reason": "unavailable", "RateLimit": ""},
			body:    map[string]any{"retry_after_ms": 1000.0, "limit": 3.0, "reason": "unavailable", "allowed": false},
			errPart: "could not get a decision from the key's owner", errNotIn: "in time"},
		{name: "deadline", key: good, status: 503,
			err:     fmt.Errorf("%w: %w", peer.ErrUnavailable, context.DeadlineExceeded),
			headers: map[string]string{"Retry-After": "1", "RateLimit-Policy": `"api";q=3;w=60`},
			body:    map[string]any{"retry_after_ms": 1000.0, "limit": 3.0},
			errPart: "could not decide in time"},
		{name: "closed", key: good, err: peer.ErrClosed, status: 503,
			headers: map[string]string{"Retry-After": "1", "RateLimit-Policy": `"api";q=3;w=60`},
			body:    map[string]any{"retry_after_ms": 1000.0, "limit": 3.0}, errPart: "shutting down"},
		{name: "closed before the policy was looked up", key: peer.Key{Tenant: "a", Subject: "b", Policy: "nope"}, err: peer.ErrClosed, status: 503,
			headers: map[string]string{"Retry-After": "1", "RateLimit-Policy": ""},
			body:    map[string]any{"retry_after_ms": 1000.0}, errPart: "shutting down"},
		{name: "invalid key", key: peer.Key{Tenant: "a", Subject: "josé", Policy: "api"}, status: 400,
			err:     fmt.Errorf("%w: %w", peer.ErrInvalidKey, peer.Key{Tenant: "a", Subject: "josé", Policy: "api"}.Validate()),
			errPart: "invalid key: subject has byte 0xc3 at 3 outside visible ASCII; tenant, subject and policy must each be 1 to 128 bytes", errNotIn: "invalid key: shard"},
		{name: "non-ASCII subject gets the encoding", key: peer.Key{Tenant: "a", Subject: "josé", Policy: "api"}, status: 400,
			err:     fmt.Errorf("%w: %w", peer.ErrInvalidKey, peer.Key{Tenant: "a", Subject: "josé", Policy: "api"}.Validate()),
			errPart: `percent-encode it as shard.KeyPart does: keep A-Z a-z 0-9 . _ @ - and write every other byte as %XX in uppercase hex ("josé" is "jos%C3%A9")`},
		{name: "a long subject gets no encoding hint", key: peer.Key{Tenant: "a", Subject: strings.Repeat("x", 129), Policy: "api"}, status: 400,
			err:     fmt.Errorf("%w: too long", peer.ErrInvalidKey),
			errPart: "1 to 128 bytes of visible ASCII", errNotIn: "percent-encode"},
		{name: "unknown policy", key: peer.Key{Tenant: "a", Subject: "b", Policy: "nope"}, status: 400,
			err: fmt.Errorf("%w: %q", peer.ErrUnknownPolicy, "nope"), errPart: `unknown policy "nope": this node's policies are api, inflight, shared`},
		{name: "invalid hits", key: good, hits: 4, status: 400,
			err: fmt.Errorf("%w: hits 4 must be between 1 and the limit 3", peer.ErrInvalidHits), errPart: "invalid hits 4: must be between 1 and the policy's limit 3 (leave hits out to mean 1)", errNotIn: "0 means 1"},
		{name: "anything else", key: good, err: errors.New("boom"), status: 500, errPart: "internal error", errNotIn: "boom"},
		{name: "multi unavailable", key: peer.Key{Tenant: "a", Subject: "b"}, policies: []string{"api", "shared"}, status: 503,
			err:     fmt.Errorf("%w: %w", peer.ErrUnavailable, refused),
			headers: map[string]string{"Retry-After": "1", "RateLimit-Policy": `"api";q=3;w=60, "shared";q=10;w=60`, "RateLimit-Reason": "unavailable", "RateLimit": ""},
			body:    map[string]any{"retry_after_ms": 1000.0, "reason": "unavailable"}, errPart: "could not get a decision"},
		{name: "multi unknown policy", key: peer.Key{Tenant: "a", Subject: "b"}, policies: []string{"api", "nope"}, status: 400,
			err: fmt.Errorf("%w: %q", peer.ErrUnknownPolicy, "nope"), errPart: `unknown policy "nope": this node's policies are api, inflight, shared`},
		{name: "multi invalid hits", key: peer.Key{Tenant: "a", Subject: "b"}, policies: []string{"shared", "api"}, hits: 5, status: 400,
			err: fmt.Errorf("%w: hits 5 exceed policy %q's limit 3", peer.ErrInvalidHits, "api"), errPart: `invalid hits 5: above policy "api"'s limit 3; a multi-policy check must fit every policy`},
		{name: "multi with a concurrency policy", key: peer.Key{Tenant: "a", Subject: "b"}, policies: []string{"api", "inflight"}, status: 400,
			err:     fmt.Errorf("%w: policy %q is a concurrency policy", peer.ErrWrongAlgorithm, "inflight"),
			errPart: `policy "inflight" is a concurrency policy: it cannot be part of a multi-policy check; take its lease with /v1/acquire`},
		{name: "check of a concurrency policy", key: peer.Key{Tenant: "a", Subject: "b", Policy: "inflight"}, status: 400,
			err: fmt.Errorf("%w: policy %q is a concurrency policy", peer.ErrWrongAlgorithm, "inflight"), errPart: `policy "inflight" is a concurrency policy: use /v1/acquire and /v1/release`},
		{name: "acquire of a sliding log", key: good, status: 400,
			err: fmt.Errorf("%w: policy %q is sliding_log", peer.ErrWrongAlgorithm, "api"), errPart: `policy "api" is sliding_log: /v1/acquire and /v1/release need a concurrency policy`},
		{name: "multi invalid key", key: peer.Key{Tenant: "a", Subject: "b"}, policies: []string{"api", "sh ared"}, status: 400,
			err: fmt.Errorf("%w: bad", peer.ErrInvalidKey), errPart: "invalid key: policy has byte 0x20 at 2 outside visible ASCII;"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			b := checkBody{Tenant: tc.key.Tenant, Subject: tc.key.Subject, Policy: tc.key.Policy, Policies: tc.policies, Hits: tc.hits}
			status, out := api.allowError(rec.Header(), b, tc.err)
			writeJSON(rec, status, out)
			var body map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q is not JSON: %v", rec.Body.String(), err)
			}
			msg, _ := body["error"].(string)
			if rec.Code != tc.status || !strings.Contains(msg, tc.errPart) {
				t.Errorf("error %v: %d %q, want %d with error containing %q", tc.err, rec.Code, msg, tc.status, tc.errPart)
			}
			if strings.Contains(msg, "peer:") || strings.Contains(msg, "shard:") || (tc.errNotIn != "" && strings.Contains(msg, tc.errNotIn)) {
				t.Errorf("error %v: message %q has a package prefix or %q", tc.err, msg, tc.errNotIn)
			}
			for k, want := range tc.headers {
				if got := rec.Header().Get(k); got != want {
					t.Errorf("error %v: header %s = %q, want %q", tc.err, k, got, want)
				}
			}
			for k, want := range tc.body {
				if body[k] != want {
					t.Errorf("error %v: body %s = %v, want %v (%s)", tc.err, k, body[k], want, rec.Body.String())
				}
			}
		})
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

// TestSetPeerPipes pins what --peer-pipes sets in the node's Config.
func TestSetPeerPipes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode                string
		noFramed, noStreams bool
	}{
		{"framed", false, false},
		{"grpc", true, false},
		{"unary", true, true},
	} {
		cfg := peer.Config{DisableFramedPipes: !tc.noFramed, DisableStreams: !tc.noStreams}
		if err := setPeerPipes(tc.mode, &cfg); err != nil || cfg.DisableFramedPipes != tc.noFramed || cfg.DisableStreams != tc.noStreams {
			t.Errorf("--peer-pipes %s: DisableFramedPipes %v, DisableStreams %v, err %v; want %v, %v", tc.mode, cfg.DisableFramedPipes, cfg.DisableStreams, err, tc.noFramed, tc.noStreams)
		}
	}
}
