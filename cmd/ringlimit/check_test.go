package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// TestCheck runs the check command in-process against a serve process, over
// gRPC and HTTP, and checks its exit codes: 0 allowed, 2 refused, 3
// unavailable (the server answered so), 4 unreachable (nothing answered), 1
// other errors.
func TestCheck(t *testing.T) {
	t.Parallel()
	pols := writeFile(t, t.TempDir(), "policies.yaml", testPolicies)
	p := startServe(t, "chk", nil, "--policies", pols)
	// An address where nothing listens: bind a port, then release it.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	lis.Close()
	// A server that answers, but only 503: an outage the server reports.
	outage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"allowed":false,"reason":"unavailable","error":"rate limiter unavailable: node is shutting down"}`))
	}))
	defer outage.Close()
	outageAddr := strings.TrimPrefix(outage.URL, "http://")

	key := []string{"--tenant", "acme", "--subject", "dave", "--policy", "api"}
	grpcArgs := append([]string{"--addr", p.grpcAddr}, key...)
	httpArgs := append([]string{"--addr", p.httpAddr, "--http"}, key...)
	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		wantOut  []string       // substrings of stdout+stderr
		wantJSON map[string]any // fields of the --json output
	}{
		// limit 3 on this key: three admissions, then refusals.
		{name: "grpc allowed", args: grpcArgs, wantCode: 0, wantOut: []string{"ALLOWED", "remaining    2", "owner        chk"}},
		{name: "grpc json allowed", args: append(grpcArgs, "--json"), wantCode: 0,
			wantJSON: map[string]any{"allowed": true, "remaining": 1.0, "limit": 3.0, "reason": "admitted", "owner": "chk"}},
		{name: "http json allowed", args: append(httpArgs, "--json"), wantCode: 0,
			wantJSON: map[string]any{"allowed": true, "remaining": 0.0, "reason": "admitted", "owner": "chk"}},
		{name: "grpc refused", args: grpcArgs, wantCode: 2, wantOut: []string{"REFUSED (over limit)", "over_limit"}},
		{name: "http json refused", args: append(httpArgs, "--json"), wantCode: 2,
			wantJSON: map[string]any{"allowed": false, "reason": "over_limit"}},
		// The unknown policy is named, over gRPC as over HTTP; the node's
		// policies are not listed (issue 53 item 8).
		{name: "grpc unknown policy", args: []string{"--addr", p.grpcAddr, "--tenant", "a", "--subject", "b", "--policy", "nope"}, wantCode: 1,
			wantOut: []string{`ringlimit: check: unknown policy "nope": not in this node's policy table`}},
		{name: "grpc multi unknown policy", args: []string{"--addr", p.grpcAddr, "--tenant", "a", "--subject", "b", "--policies", "api,nope"}, wantCode: 1,
			wantOut: []string{`ringlimit: check: unknown policy "nope": not in this node's policy table`}},
		{name: "http unknown policy", args: []string{"--addr", p.httpAddr, "--http", "--tenant", "a", "--subject", "b", "--policy", "nope"}, wantCode: 1,
			wantOut: []string{"HTTP 400", `unknown policy "nope": not in this node's policy table`}},
		{name: "http invalid hits", args: append(httpArgs, "--hits", "99"), wantCode: 1, wantOut: []string{"invalid hits"}},
		{name: "grpc invalid key", args: []string{"--addr", p.grpcAddr, "--tenant", "a b", "--subject", "b", "--policy", "api"}, wantCode: 1,
			wantOut: []string{"ringlimit: check: invalid key: tenant has byte 0x20 at 1 outside visible ASCII; --tenant, --subject and --policy must each be"}},
		// A UTF-8 subject: how to percent-encode it, as the HTTP API says.
		{name: "http invalid key utf-8", args: []string{"--addr", p.httpAddr, "--http", "--tenant", "a", "--subject", "josé", "--policy", "api"}, wantCode: 1,
			wantOut: []string{"subject has byte 0xc3 at 3 outside visible ASCII", `percent-encode it as shard.KeyPart does`, `"josé" is "jos%C3%A9"`}},
		{name: "grpc invalid hits", args: append(grpcArgs, "--hits", "99"), wantCode: 1,
			wantOut: []string{"check: the node rejected the request: peer: invalid hits: hits 99 must be between 1 and the limit 3"}},
		{name: "grpc unreachable", args: []string{"--addr", dead, "--tenant", "a", "--subject", "b", "--policy", "api", "--timeout", "2s"}, wantCode: 4,
			wantOut: []string{"UNREACHABLE", "could not reach the node at " + dead, "connection refused"}},
		{name: "http unreachable json", args: []string{"--addr", dead, "--http", "--json", "--tenant", "a", "--subject", "b", "--policy", "api"}, wantCode: 4,
			wantJSON: map[string]any{"allowed": false, "reason": "unreachable"}},
		{name: "http answered 503", args: []string{"--addr", outageAddr, "--http", "--tenant", "a", "--subject", "b", "--policy", "api"}, wantCode: 3,
			wantOut: []string{"UNAVAILABLE", "node is shutting down"}},
		{name: "missing key part", args: []string{"--addr", p.grpcAddr, "--tenant", "a"}, wantCode: 1, wantOut: []string{"--tenant, --subject and --policy (or --policies) are required"}},
	} {
		// Sequential: the cases share one key's quota.
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), append([]string{"check"}, tc.args...), &out, &errOut)
			code := exitCode(err, &errOut)
			all := out.String() + errOut.String()
			if code != tc.wantCode {
				t.Errorf("check %q: exit code %d, want %d\n%s", tc.args, code, tc.wantCode, all)
			}
			for _, w := range tc.wantOut {
				if !strings.Contains(all, w) {
					t.Errorf("check %q output lacks %q:\n%s", tc.args, w, all)
				}
			}
			if strings.Contains(all, "invalid key: shard:") || strings.Contains(all, "invalid key: peer:") {
				t.Errorf("check %q output stacks error prefixes:\n%s", tc.args, all)
			}
			if tc.wantJSON != nil {
				var got map[string]any
				if err := json.Unmarshal(out.Bytes(), &got); err != nil {
					t.Fatalf("check %q: stdout is not JSON: %v\n%s", tc.args, err, all)
				}
				for k, v := range tc.wantJSON {
					if got[k] != v {
						t.Errorf("check %q: %s = %v, want %v\n%s", tc.args, k, got[k], v, out.String())
					}
				}
			}
		})
	}

	t.Run("bench against the node", func(t *testing.T) {
		var out, errOut bytes.Buffer
		err := run(context.Background(), []string{"bench", "--addr", p.grpcAddr, "--policy", "shared", "--duration", "200ms", "--workers", "2", "--requests", "500"}, &out, &errOut)
		if err != nil || !strings.Contains(out.String(), "throughput") || !strings.Contains(out.String(), "gRPC RateLimiter at "+p.grpcAddr) {
			t.Errorf("bench --addr: %v\n%s%s", err, out.String(), errOut.String())
		}
	})
}

// TestCheckLeases takes and ends leases of a concurrency policy with
// check --acquire and --release, over gRPC and HTTP, and checks the exit
// codes: 0 granted or done, 2 at the cap, 1 bad flags or the wrong kind of
// policy.
func TestCheckLeases(t *testing.T) {
	t.Parallel()
	pols := writeFile(t, t.TempDir(), "policies.yaml", `policies:
  - name: jobs
    algorithm: concurrency
    limit: 2
    window: 1m
  - name: api
    limit: 5
    window: 1m
`)
	p := startServe(t, "lease", nil, "--policies", pols)
	key := []string{"--tenant", "acme", "--subject", "worker", "--policy", "jobs"}
	grpcArgs := append([]string{"--addr", p.grpcAddr}, key...)
	httpArgs := append([]string{"--addr", p.httpAddr, "--http"}, key...)
	check := func(args ...string) (int, string, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{"check"}, args...), &out, &errOut)
		return exitCode(err, &errOut), out.String(), out.String() + errOut.String()
	}
	leaseOf := func(args ...string) string {
		t.Helper()
		code, out, all := check(append(args, "--acquire", "--json")...)
		var got struct {
			Allowed bool   `json:"allowed"`
			LeaseID string `json:"lease_id"`
			TTL     int64  `json:"lease_ttl_ms"`
		}
		if err := json.Unmarshal([]byte(out), &got); err != nil || code != 0 || !got.Allowed || got.LeaseID == "" || got.TTL != 60000 {
			t.Fatalf("check %q --acquire: exit %d, %+v, %v\n%s", args, code, got, err, all)
		}
		return got.LeaseID
	}
	first := leaseOf(grpcArgs...)
	leaseOf(httpArgs...)
	if code, _, all := check(grpcArgs...); code != 1 || !strings.Contains(all, "the node rejected the request") {
		t.Errorf("a plain check of a concurrency policy: exit %d, want 1\n%s", code, all)
	}
	if code, _, all := check(append(grpcArgs, "--acquire")...); code != 2 || !strings.Contains(all, "REFUSED (at the cap") {
		t.Errorf("a third lease of 2: exit %d, want 2\n%s", code, all)
	}
	if code, _, all := check(append(httpArgs, "--release", first)...); code != 0 || !strings.Contains(all, "RELEASED") {
		t.Errorf("--release %s over HTTP: exit %d, want 0\n%s", first, code, all)
	}
	if code, _, all := check(append(grpcArgs, "--release", first)...); code != 0 || !strings.Contains(all, "NOTHING TO RELEASE") {
		t.Errorf("--release %s again: exit %d, want 0 and nothing to release\n%s", first, code, all)
	}
	if code, _, all := check(append(grpcArgs, "--acquire")...); code != 0 || !strings.Contains(all, "GRANTED") || !strings.Contains(all, "lease_id") {
		t.Errorf("--acquire after a release: exit %d, want 0\n%s", code, all)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(grpcArgs, "--release", "abc"), `--release "abc": give the lease_id --acquire printed`},
		{append(grpcArgs, "--release", first, "--hits", "2"), "--release takes no --hits"},
		{append(grpcArgs, "--acquire", "--peek"), "go alone"},
		{[]string{"--addr", p.grpcAddr, "--tenant", "acme", "--subject", "worker", "--policies", "jobs,api", "--acquire"}, "--acquire works on one --policy"},
		{[]string{"--addr", p.httpAddr, "--http", "--tenant", "acme", "--subject", "worker", "--policy", "api", "--acquire"}, "HTTP 400"},
	} {
		if code, _, all := check(tc.args...); code != 1 || !strings.Contains(all, tc.want) {
			t.Errorf("check %q: exit %d, want 1 and %q\n%s", tc.args, code, tc.want, all)
		}
	}
}

// unavailableLimiter answers every RateLimiter call with Unavailable: a node
// that spoke gRPC and said it could not decide.
type unavailableLimiter struct {
	peerpb.UnimplementedRateLimiterServer
}

func (unavailableLimiter) Allow(context.Context, *peerpb.AllowRequest) (*peerpb.AllowResponse, error) {
	return nil, status.Error(codes.Unavailable, "peer: limiter unavailable: no owner")
}

// TestCheckSetupMistakes points check at the wrong port, the wrong
// protocol and the wrong TLS set-up, and checks that each is exit 4
// (unreachable: no usable connection) with a hint naming the flag to fix,
// while a node that answered "unavailable" in gRPC is still exit 3.
func TestCheckSetupMistakes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pols := writeFile(t, dir, "policies.yaml", testPolicies)
	plain := startServe(t, "setup-plain", nil, "--policies", pols)
	// A certificate with a DNS SAN only: dialing 127.0.0.1 needs
	// --tls-server-name.
	ca, cert, key := writeTestPKIFor(t, dir, nil, []string{"ringlimit.internal"})
	otherCA, _, _ := writeTestPKI(t, t.TempDir())
	tlsNode := startServe(t, "setup-tls", nil, "--policies", pols,
		"--tls-ca", ca, "--tls-cert", cert, "--tls-key", key, "--tls-server-name", "ringlimit.internal")

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	peerpb.RegisterRateLimiterServer(srv, unavailableLimiter{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)

	key3 := []string{"--tenant", "acme", "--subject", "dave", "--policy", "api", "--timeout", "5s"}
	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
	}{
		{"grpc at the HTTP port", []string{"--addr", plain.httpAddr}, exitUnreachable, "this looks like the node's HTTP port (--http-addr): add --http"},
		{"http at the gRPC port", []string{"--addr", plain.grpcAddr, "--http"}, exitUnreachable, "this looks like the node's gRPC port (--grpc-addr): leave out --http"},
		{"http at the TLS gRPC port", []string{"--addr", tlsNode.grpcAddr, "--http"}, exitUnreachable, "is --addr its --http-addr?"},
		{"plaintext at a TLS port", []string{"--addr", tlsNode.grpcAddr}, exitUnreachable, "if it serves mutual TLS, give --tls-ca, --tls-cert and --tls-key"},
		{"TLS at a plaintext gRPC port", []string{"--addr", plain.grpcAddr, "--tls-ca", ca}, exitUnreachable, "if it serves plaintext gRPC, leave out --tls-*"},
		{"TLS at the HTTP port", []string{"--addr", plain.httpAddr, "--tls-ca", ca}, exitUnreachable, "add --http"},
		{"certificate without an IP SAN", []string{"--addr", tlsNode.grpcAddr, "--tls-ca", ca, "--tls-cert", cert, "--tls-key", key},
			exitUnreachable, "give --tls-server-name with a name from its SANs"},
		{"untrusted node certificate", []string{"--addr", tlsNode.grpcAddr, "--tls-ca", otherCA, "--tls-server-name", "ringlimit.internal"},
			exitUnreachable, "--tls-ca does not trust the node's certificate"},
		{"no client certificate", []string{"--addr", tlsNode.grpcAddr, "--tls-ca", ca, "--tls-server-name", "ringlimit.internal"},
			exitUnreachable, "it wants a client certificate its CA signed: give --tls-cert and --tls-key"},
		{"mutual TLS set up right", []string{"--addr", tlsNode.grpcAddr, "--tls-ca", ca, "--tls-cert", cert, "--tls-key", key, "--tls-server-name", "ringlimit.internal"},
			exitOK, "ALLOWED"},
		{"the node answered unavailable", []string{"--addr", lis.Addr().String()}, exitUnavailable, "UNAVAILABLE (the limiter could not decide"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := append(append([]string{"check"}, tc.args...), key3...)
			code := exitCode(run(context.Background(), args, &out, &errOut), &errOut)
			all := out.String() + errOut.String()
			if code != tc.wantCode || !strings.Contains(all, tc.wantOut) {
				t.Errorf("check %q: exit %d, want %d and %q in:\n%s", tc.args, code, tc.wantCode, tc.wantOut, all)
			}
			if code == exitUnreachable && !strings.Contains(all, "UNREACHABLE") {
				t.Errorf("check %q: exit 4 without UNREACHABLE:\n%s", tc.args, all)
			}
		})
	}
}

// TestCheckReservations: check reserves an estimate and settles it, over
// gRPC and HTTP, against a real serve process: the exit codes, the
// reservation id, the overage, a repeated settle, and the flag mistakes.
func TestCheckReservations(t *testing.T) {
	t.Parallel()
	pols := writeFile(t, t.TempDir(), "policies.yaml", `policies:
  - name: tokens
    limit: 100
    window: 1m
  - name: jobs
    algorithm: concurrency
    limit: 2
    window: 1m
`)
	p := startServe(t, "reserve", nil, "--policies", pols)
	key := []string{"--tenant", "acme", "--subject", "llm-user", "--policy", "tokens"}
	grpcArgs := append([]string{"--addr", p.grpcAddr}, key...)
	httpArgs := append([]string{"--addr", p.httpAddr, "--http"}, key...)
	check := func(args ...string) (int, string, string) {
		t.Helper()
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{"check"}, args...), &out, &errOut)
		return exitCode(err, &errOut), out.String(), out.String() + errOut.String()
	}
	type answer struct {
		Allowed       bool   `json:"allowed"`
		Reason        string `json:"reason"`
		Remaining     int64  `json:"remaining"`
		ReservationID string `json:"reservation_id"`
		TTL           int64  `json:"reservation_ttl_ms"`
		Estimate      *int64 `json:"estimate"`
		Overage       *int64 `json:"overage"`
	}
	ask := func(args ...string) (int, answer) {
		t.Helper()
		code, out, all := check(append(args, "--json")...)
		var a answer
		if err := json.Unmarshal([]byte(out), &a); err != nil {
			t.Fatalf("check %q: %v\n%s", args, err, all)
		}
		return code, a
	}
	for _, via := range [][]string{grpcArgs, httpArgs} {
		code, r := ask(append(via, "--reserve", "--hits", "30")...)
		if code != 0 || !r.Allowed || r.ReservationID == "" || r.TTL != 60000 {
			t.Fatalf("check %q --reserve --hits 30: exit %d, %+v", via, code, r)
		}
		code, s := ask(append(via, "--settle", r.ReservationID, "--actual", "45")...)
		if code != 0 || !s.Allowed || s.Reason != "settled" || s.Estimate == nil || *s.Estimate != 30 || s.Overage == nil || *s.Overage != 15 {
			t.Fatalf("check %q --settle --actual 45: exit %d, %+v", via, code, s)
		}
		code, again := ask(append(via, "--settle", r.ReservationID, "--actual", "0")...)
		if code != 0 || again.Allowed || again.Reason != "not_pending" || again.Remaining != s.Remaining {
			t.Fatalf("check %q --settle again: exit %d, %+v; want not_pending, nothing changed (%d left)", via, code, again, s.Remaining)
		}
	}
	// 90 of 100 spent: a reservation of 11 is refused (exit 2).
	if code, _, all := check(append(grpcArgs, "--reserve", "--hits", "11")...); code != 2 || !strings.Contains(all, "REFUSED") {
		t.Errorf("--reserve 11 with 10 left: exit %d, want 2\n%s", code, all)
	}
	if code, _, all := check(append(httpArgs, "--reserve", "--hits", "10")...); code != 0 || !strings.Contains(all, "RESERVED") || !strings.Contains(all, "reservation_id") {
		t.Errorf("--reserve 10 over HTTP: exit %d, want 0\n%s", code, all)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(grpcArgs, "--settle", "abc", "--actual", "1"), `--settle "abc": give the reservation_id --reserve printed`},
		{append(grpcArgs, "--settle", "12"), "--settle ID needs --actual"},
		{append(grpcArgs, "--settle", "12", "--actual", "-3"), "the cost is 0 or more"},
		{append(grpcArgs, "--settle", "12", "--actual", "3", "--hits", "2"), "--settle takes --actual, not --hits"},
		{append(grpcArgs, "--actual", "3"), "--actual is for --settle"},
		{append(grpcArgs, "--reserve", "--peek"), "go alone"},
		{[]string{"--addr", p.grpcAddr, "--tenant", "acme", "--subject", "w", "--policy", "jobs", "--reserve"}, "sliding_log"},
		{[]string{"--addr", p.httpAddr, "--http", "--tenant", "acme", "--subject", "w", "--policy", "jobs", "--reserve"}, "sliding_log"},
	} {
		if code, _, all := check(tc.args...); code != 1 || !strings.Contains(all, tc.want) {
			t.Errorf("check %q: exit %d, want 1 and %q\n%s", tc.args, code, tc.want, all)
		}
	}
}
