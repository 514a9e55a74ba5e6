package main

import (
	"bytes"
	"net"
	"strings"
	"testing"
	"time"
)

// opsPaths are what --ops-addr takes off --http-addr: the probes, the
// scrape, every /debug/* path and the console.
var opsPaths = []string{"/healthz", "/readyz", "/metrics", "/debug/ring", "/debug/hotkeys", "/debug/ownership", "/ui/", "/ui/api/node"}

const opsCheckBody = `{"tenant":"acme","subject":"alice","policy":"api"}`

// TestServeOpsAddr: with --ops-addr the probes, /metrics and /debug/* are
// served only on the ops listener and the decision API only on
// --http-addr (issue 53 item 8); without it everything stays on
// --http-addr and the serving line's ops_addr is empty.
func TestServeOpsAddr(t *testing.T) {
	t.Parallel()
	pols := writeFile(t, t.TempDir(), "policies.yaml", testPolicies)

	t.Run("split", func(t *testing.T) {
		t.Parallel()
		p := startServe(t, "ops", nil, "--policies", pols, "--ops-addr", "127.0.0.1:0")
		if host, _, err := net.SplitHostPort(p.opsAddr); err != nil || host != "127.0.0.1" || p.opsAddr == p.httpAddr {
			t.Fatalf("serving line: ops_addr %q, http_addr %q; want a 127.0.0.1:port of its own", p.opsAddr, p.httpAddr)
		}
		ops, api := "http://"+p.opsAddr, "http://"+p.httpAddr
		waitFor(t, 10*time.Second, "/readyz 200 on the ops port", func() bool {
			r, err := httpDo("GET", ops+"/readyz", "")
			return err == nil && r.status == 200
		})
		for _, path := range opsPaths {
			if r := doHTTP(t, "GET", ops+path, ""); r.status != 200 {
				t.Errorf("GET %s on the ops port: %d %s, want 200", path, r.status, r.raw)
			}
			if r := doHTTP(t, "GET", api+path, ""); r.status != 404 {
				t.Errorf("GET %s on the HTTP port: %d %s, want 404 (it moved to --ops-addr)", path, r.status, r.raw)
			}
		}
		if r := doHTTP(t, "GET", ops+"/metrics", ""); !strings.Contains(r.raw, "ringlimit_") {
			t.Errorf("/metrics on the ops port has no ringlimit_ metric:\n%.500s", r.raw)
		}
		if r := doHTTP(t, "POST", api+"/v1/check", opsCheckBody); r.status != 200 || r.body["allowed"] != true {
			t.Errorf("POST /v1/check on the HTTP port: %d %s, want 200 allowed", r.status, r.raw)
		}
		for _, path := range []string{"/v1/check", "/v1/peek", "/v1/refund", "/v1/acquire", "/v1/release"} {
			if r := doHTTP(t, "POST", ops+path, opsCheckBody); r.status != 404 {
				t.Errorf("POST %s on the ops port: %d %s, want 404 (the decision API is --http-addr's only)", path, r.status, r.raw)
			}
		}
		if code := p.terminate(t); code != 0 {
			t.Errorf("exit code %d after SIGTERM, want 0", code)
		}
	})

	t.Run("default", func(t *testing.T) {
		t.Parallel()
		p := startServe(t, "noops", nil, "--policies", pols)
		if p.opsAddr != "" {
			t.Fatalf("serving line: ops_addr %q without --ops-addr, want \"\"", p.opsAddr)
		}
		api := "http://" + p.httpAddr
		waitFor(t, 10*time.Second, "/readyz 200 on the HTTP port", func() bool {
			r, err := httpDo("GET", api+"/readyz", "")
			return err == nil && r.status == 200
		})
		for _, path := range opsPaths {
			if r := doHTTP(t, "GET", api+path, ""); r.status != 200 {
				t.Errorf("GET %s on the HTTP port without --ops-addr: %d %s, want 200", path, r.status, r.raw)
			}
		}
		if r := doHTTP(t, "POST", api+"/v1/check", opsCheckBody); r.status != 200 || r.body["allowed"] != true {
			t.Errorf("POST /v1/check: %d %s, want 200 allowed", r.status, r.raw)
		}
	})
}

// TestServeOpsAddrFlag: --ops-addr defaults to "" (today's single
// listener), is read from RINGLIMIT_OPS_ADDR like every flag, and may not
// name --http-addr's fixed address.
func TestServeOpsAddrFlag(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		want    string
		wantErr string
	}{
		{name: "default", args: nil, want: ""},
		{name: "set", args: []string{"--ops-addr", "0.0.0.0:9090"}, want: "0.0.0.0:9090"},
		{name: "both ephemeral", args: []string{"--http-addr", "127.0.0.1:0", "--ops-addr", "127.0.0.1:0"}, want: "127.0.0.1:0"},
		{name: "same as http", args: []string{"--http-addr", "127.0.0.1:8080", "--ops-addr", "127.0.0.1:8080"}, wantErr: "port of its own"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			f, err := parseServeFlags(tc.args, &stderr)
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("parseServeFlags(%q): err %v, want one saying %q", tc.args, err, tc.wantErr)
				}
			case err != nil:
				t.Errorf("parseServeFlags(%q): %v\n%s", tc.args, err, stderr.String())
			case f.opsAddr != tc.want:
				t.Errorf("parseServeFlags(%q): opsAddr %q, want %q", tc.args, f.opsAddr, tc.want)
			}
		})
	}
	t.Run("env", func(t *testing.T) {
		t.Setenv("RINGLIMIT_OPS_ADDR", "0.0.0.0:9091")
		f, err := parseServeFlags(nil, &bytes.Buffer{})
		if err != nil || f.opsAddr != "0.0.0.0:9091" {
			t.Errorf("RINGLIMIT_OPS_ADDR=0.0.0.0:9091: opsAddr %q, err %v", f.opsAddr, err)
		}
	})
}
