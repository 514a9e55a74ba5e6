package main

// End-to-end tests of issue 10's public surface: multi-policy checks,
// batches, peek, refund and the token-guarded reset, over real HTTP and
// gRPC against a two-process serve cluster, and the check command on top.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// opsPolicies: "probe" finds holders (waitSettled); small, big and day are
// long-window quotas the functional cases use up; l1 and l2 are the
// concurrency test's short windows.
const opsPolicies = `policies:
  - name: probe
    limit: 1000000000
    window: 1h
  - name: small
    limit: 3
    window: 1h
  - name: big
    limit: 5
    window: 1h
  - name: day
    limit: 1000
    window: 24h
  - name: l1
    limit: 5
    window: 2s
  - name: l2
    limit: 8
    window: 10s
  - name: conc
    limit: 2
    window: 1h
    algorithm: concurrency
domains:
  - domain: ops
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 3}
`

const (
	opsToken       = "s3cret-admin-token"
	opsRefundToken = "refund-only-token"
)

// opsCluster starts two serve processes with the admin and refund tokens
// (a by flag, b through RINGLIMIT_ADMIN_TOKEN_FILE and
// RINGLIMIT_REFUND_TOKEN_FILE) and waits until both see both and keys
// have settled on their holders. It returns the nodes and the admin token
// file.
func opsCluster(t *testing.T) ([]*serveProc, string) {
	t.Helper()
	dir := t.TempDir()
	pols := writeFile(t, dir, "policies.yaml", opsPolicies)
	tok := writeFile(t, dir, "admin-token", opsToken+"\n")
	rtok := writeFile(t, dir, "refund-token", opsRefundToken)
	a := startServe(t, "ops-a", nil, "--policies", pols, "--admin-token-file", tok, "--refund-token-file", rtok)
	b := startServe(t, "ops-b", []string{"RINGLIMIT_ADMIN_TOKEN_FILE=" + tok, "RINGLIMIT_REFUND_TOKEN_FILE=" + rtok}, "--policies", pols, "--join", a.gossipAddr)
	nodes := []*serveProc{a, b}
	waitMembers(t, nodes, 2)
	waitSettled(t, nodes)
	return nodes, tok
}

// post sends a JSON body to path on p with extra header fields; safe on
// any goroutine.
func post(p *serveProc, path, body string, hdr ...string) (httpResult, error) {
	req, err := http.NewRequest("POST", "http://"+p.httpAddr+path, strings.NewReader(body))
	if err != nil {
		return httpResult{}, err
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return httpResult{}, fmt.Errorf("POST %s%s: %w", p.name, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := httpResult{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	_ = json.Unmarshal(raw, &r.body)
	return r, nil
}

// mustPost is post on the test's goroutine, failing the test on a
// transport error.
func mustPost(t *testing.T, p *serveProc, path, body string, hdr ...string) httpResult {
	t.Helper()
	r, err := post(p, path, body, hdr...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func keyBody(subject, policy string, hits int) string {
	if hits == 0 {
		return fmt.Sprintf(`{"tenant":"acme","subject":%q,"policy":%q}`, subject, policy)
	}
	return fmt.Sprintf(`{"tenant":"acme","subject":%q,"policy":%q,"hits":%d}`, subject, policy, hits)
}

func multiBody(subject string, policies ...string) string {
	ps, _ := json.Marshal(policies)
	return fmt.Sprintf(`{"tenant":"acme","subject":%q,"policies":%s}`, subject, ps)
}

// limitOf returns the limits entry for policy in a decision body.
func limitOf(body map[string]any, policy string) map[string]any {
	ls, _ := body["limits"].([]any)
	for _, l := range ls {
		if m, _ := l.(map[string]any); m["policy"] == policy {
			return m
		}
	}
	return nil
}

// want compares fields of a decoded body with the wanted values.
func want(t *testing.T, what string, r httpResult, status int, fields map[string]any) {
	t.Helper()
	if r.status != status {
		t.Errorf("%s: status %d, want %d: %s", what, r.status, status, r.raw)
		return
	}
	for k, v := range fields {
		if r.body[k] != v {
			t.Errorf("%s: %s = %v, want %v: %s", what, k, r.body[k], v, r.raw)
		}
	}
}

// TestServeOperations runs beside other tests: no check in it has a bound
// tighter than a second.
func TestServeOperations(t *testing.T) {
	t.Parallel()
	nodes, tokFile := opsCluster(t)
	a, b := nodes[0], nodes[1]

	t.Run("single check adds decided_at only", func(t *testing.T) {
		before := time.Now()
		r := mustPost(t, a, "/v1/check", keyBody("single", "small", 0))
		want(t, "check", r, 200, map[string]any{"allowed": true, "remaining": 2.0, "reason": "admitted"})
		var raw map[string]json.RawMessage
		_ = json.Unmarshal([]byte(r.raw), &raw)
		var ns int64
		if err := json.Unmarshal(raw["decided_at_unix_ns"], &ns); err != nil || ns < before.Add(-time.Second).UnixNano() || ns > time.Now().Add(time.Second).UnixNano() {
			t.Errorf("decided_at_unix_ns = %s, want the owner's clock now: %s", raw["decided_at_unix_ns"], r.raw)
		}
		for _, k := range []string{"limits", "refused_by"} {
			if _, ok := raw[k]; ok {
				t.Errorf("single-policy body has %q: %s", k, r.raw)
			}
		}
	})

	t.Run("acquire and release a concurrency lease", func(t *testing.T) {
		body := keyBody("leaser", "conc", 0)
		r1 := mustPost(t, a, "/v1/acquire", body)
		want(t, "acquire 1", r1, 200, map[string]any{"allowed": true, "remaining": 1.0, "reason": "admitted", "lease_ttl_ms": 3600000.0})
		id, _ := r1.body["lease_id"].(string)
		if id == "" {
			t.Fatalf("acquire answered no lease_id: %s", r1.raw)
		}
		want(t, "acquire 2", mustPost(t, b, "/v1/acquire", body), 200, map[string]any{"allowed": true, "remaining": 0.0})
		r3 := mustPost(t, b, "/v1/acquire", body)
		want(t, "acquire 3", r3, 429, map[string]any{"allowed": false, "reason": "over_limit"})
		if _, ok := r3.body["lease_id"]; ok || r3.header.Get("Retry-After") == "" {
			t.Errorf("refused acquire: lease_id %v, Retry-After %q; want none and a wait: %s", r3.body["lease_id"], r3.header.Get("Retry-After"), r3.raw)
		}
		rel := fmt.Sprintf(`{"tenant":"acme","subject":"leaser","policy":"conc","lease_id":%q}`, id)
		want(t, "release", mustPost(t, b, "/v1/release", rel), 200, map[string]any{"allowed": true, "reason": "released", "remaining": 1.0})
		want(t, "release again", mustPost(t, a, "/v1/release", rel), 200, map[string]any{"allowed": false, "reason": "released", "remaining": 1.0})
		want(t, "acquire after release", mustPost(t, a, "/v1/acquire", body), 200, map[string]any{"allowed": true, "remaining": 0.0})
		for _, tc := range []struct{ path, body, wantIn string }{
			{"/v1/check", body, "use /v1/acquire"},
			{"/v1/acquire", keyBody("leaser", "small", 0), "need a concurrency policy"},
			{"/v1/release", body, "/v1/release needs"},
			{"/v1/release", `{"tenant":"acme","subject":"leaser","policy":"conc","lease_id":"x"}`, "decimal string"},
		} {
			r := mustPost(t, a, tc.path, tc.body)
			if r.status != 400 || !strings.Contains(r.raw, tc.wantIn) {
				t.Errorf("%s %s: %d %s, want 400 mentioning %q", tc.path, tc.body, r.status, r.raw, tc.wantIn)
			}
		}
	})

	t.Run("multi admitted lists every policy", func(t *testing.T) {
		r := mustPost(t, b, "/v1/check", multiBody("multi-ok", "big", "day"))
		want(t, "multi check", r, 200, map[string]any{"allowed": true, "reason": "admitted", "remaining": 4.0, "limit": 5.0})
		if l := limitOf(r.body, "big"); l == nil || l["allowed"] != true || l["remaining"] != 4.0 || l["limit"] != 5.0 {
			t.Errorf("limits[big] = %v: %s", l, r.raw)
		}
		if l := limitOf(r.body, "day"); l == nil || l["allowed"] != true || l["remaining"] != 999.0 || l["limit"] != 1000.0 {
			t.Errorf("limits[day] = %v: %s", l, r.raw)
		}
		for h, w := range map[string]string{
			"RateLimit-Policy": `"big";q=5;w=3600, "day";q=1000;w=86400`,
			"RateLimit":        `"big";r=4;t=3600, "day";r=999;t=86400`,
			"Retry-After":      "",
		} {
			if got := r.header.Get(h); got != w {
				t.Errorf("header %s = %q, want %q", h, got, w)
			}
		}
	})

	t.Run("multi refused by the second policy records nothing in the first", func(t *testing.T) {
		for i := range 3 {
			want(t, fmt.Sprint("fill small ", i), mustPost(t, a, "/v1/check", keyBody("multi-no", "small", 0)), 200, nil)
		}
		r := mustPost(t, b, "/v1/check", multiBody("multi-no", "big", "small"))
		want(t, "multi check", r, 429, map[string]any{"allowed": false, "reason": "over_limit", "refused_by": "small", "remaining": 0.0, "limit": 3.0})
		if l := limitOf(r.body, "small"); l == nil || l["allowed"] != false || l["remaining"] != 0.0 {
			t.Errorf("limits[small] = %v: %s", l, r.raw)
		}
		// big's entry is what a peek says (4: the hit counted as taken, as
		// an admitted check's and a peek's are), though nothing was recorded.
		if l := limitOf(r.body, "big"); l == nil || l["allowed"] != true || l["remaining"] != 4.0 {
			t.Errorf("limits[big] = %v (big alone would admit, leaving 4 as a peek says): %s", l, r.raw)
		}
		if got := r.header.Get("RateLimit-Policy"); got != `"big";q=5;w=3600, "small";q=3;w=3600` {
			t.Errorf("RateLimit-Policy = %q", got)
		}
		if got := r.header.Get("RateLimit"); !strings.HasPrefix(got, `"big";r=`) || !strings.Contains(got, `, "small";r=0;t=`) {
			t.Errorf("RateLimit = %q, want both policies", got)
		}
		if got, ra := r.header.Get("Retry-After"), r.body["retry_after_ms"].(float64); got == "" || ra <= 0 {
			t.Errorf("Retry-After = %q, retry_after_ms = %v: want small's wait", got, ra)
		}
		// big alone: nothing was recorded, through either node.
		for _, p := range nodes {
			want(t, "peek big via "+p.name, mustPost(t, p, "/v1/peek", keyBody("multi-no", "big", 0)), 200,
				map[string]any{"allowed": true, "reason": "peek", "remaining": 4.0})
		}
		pr := mustPost(t, a, "/v1/peek", multiBody("multi-no", "big", "small"))
		want(t, "multi peek", pr, 200, map[string]any{"allowed": false, "reason": "peek", "refused_by": "small"})
		if lp, lc := limitOf(pr.body, "big"), limitOf(r.body, "big"); lp == nil || lc == nil || lp["remaining"] != lc["remaining"] {
			t.Errorf("limits[big]: multi peek %v, refused multi check %v; want the same remaining", lp, lc)
		}
		if pr.header.Get("Retry-After") != "" {
			t.Errorf("a peek carries Retry-After %q", pr.header.Get("Retry-After"))
		}
	})

	t.Run("peek consumes nothing", func(t *testing.T) {
		for i := range 5 {
			want(t, fmt.Sprint("peek ", i), mustPost(t, nodes[i%2], "/v1/peek", keyBody("peeker", "small", 0)), 200,
				map[string]any{"allowed": true, "reason": "peek", "remaining": 2.0})
		}
		want(t, "check after peeks", mustPost(t, a, "/v1/check", keyBody("peeker", "small", 0)), 200, map[string]any{"remaining": 2.0})
		want(t, "peek 3 of 2 left", mustPost(t, b, "/v1/peek", keyBody("peeker", "small", 3)), 200,
			map[string]any{"allowed": false, "reason": "peek", "remaining": 2.0})
		want(t, "check after", mustPost(t, b, "/v1/check", keyBody("peeker", "small", 2)), 200, map[string]any{"remaining": 0.0})
	})

	t.Run("refund gives back newest first, never below empty", func(t *testing.T) {
		// Refunds need a token here: the refund token (or the admin one).
		refund := []string{"Authorization", "Bearer " + opsRefundToken}
		const subj = "refunder"
		first := mustPost(t, a, "/v1/check", keyBody(subj, "big", 2))
		want(t, "check 2", first, 200, map[string]any{"remaining": 3.0})
		tA := int64(first.body["decided_at_unix_ns"].(float64))
		// The second admission must be at least 20 ms later on the owner's
		// clock, so that which one a refund removes shows in reset_after.
		waitFor(t, 5*time.Second, "the owner's clock to pass the first admission by 20ms", func() bool {
			r, err := post(b, "/v1/peek", keyBody(subj, "big", 0))
			return err == nil && int64(r.body["decided_at_unix_ns"].(float64)) > tA+int64(20*time.Millisecond)
		})
		second := mustPost(t, b, "/v1/check", keyBody(subj, "big", 1))
		want(t, "check 1", second, 200, map[string]any{"remaining": 2.0})
		tB := int64(second.body["decided_at_unix_ns"].(float64))

		r := mustPost(t, a, "/v1/refund", keyBody(subj, "big", 1), refund...)
		want(t, "refund 1", r, 200, map[string]any{"allowed": true, "reason": "refunded", "remaining": 3.0})
		// What is left is the first admission: the state empties one hour
		// after it, not after the second.
		tR := int64(r.body["decided_at_unix_ns"].(float64))
		ra := int64(r.body["reset_after_ms"].(float64))
		ifA := (tA + int64(time.Hour) - tR + int64(time.Millisecond) - 1) / int64(time.Millisecond)
		ifB := (tB + int64(time.Hour) - tR) / int64(time.Millisecond)
		if ra > ifA+1 || ra >= ifB {
			t.Errorf("after refunding 1: reset_after_ms %d, want about %d (the older admission left), not %d (the newer)", ra, ifA, ifB)
		}
		want(t, "refund the limit", mustPost(t, b, "/v1/refund", keyBody(subj, "big", 5), refund...), 200,
			map[string]any{"allowed": true, "reason": "refunded", "remaining": 5.0, "reset_after_ms": 0.0})
		want(t, "refund on empty", mustPost(t, a, "/v1/refund", keyBody(subj, "big", 0), "Authorization", "Bearer "+opsToken), 200,
			map[string]any{"allowed": false, "reason": "nothing_to_refund", "remaining": 5.0})
		want(t, "check", mustPost(t, a, "/v1/check", keyBody(subj, "big", 0)), 200, map[string]any{"remaining": 4.0})
		want(t, "refund, hits absent means 1", mustPost(t, b, "/v1/refund", keyBody(subj, "big", 0), refund...), 200,
			map[string]any{"allowed": true, "remaining": 5.0})
		for _, tc := range []struct{ name, body, errPart string }{
			{"policies", multiBody(subj, "big", "day"), `/v1/refund takes one "policy"`},
			{"hits 0", `{"tenant":"acme","subject":"x","policy":"big","hits":0}`, "invalid hits 0"},
			{"hits past the limit", keyBody(subj, "big", 6), "invalid hits 6: must be between 1 and the policy's limit 5"},
		} {
			r := mustPost(t, a, "/v1/refund", tc.body, refund...)
			if msg, _ := r.body["error"].(string); r.status != 400 || !strings.Contains(msg, tc.errPart) {
				t.Errorf("refund %s: %d %s, want 400 with %q", tc.name, r.status, r.raw, tc.errPart)
			}
		}
	})

	t.Run("refund needs a token and the limit", func(t *testing.T) {
		// Issue 53: after 5 admitted and a refusal, a refund of 2^63-1
		// with no credentials answered 200 and undid all five.
		const subj = "refund-victim"
		for i := range 6 {
			r := mustPost(t, nodes[i%2], "/v1/check", keyBody(subj, "big", 0))
			if wantStatus := map[bool]int{true: 200, false: 429}[i < 5]; r.status != wantStatus {
				t.Fatalf("check %d: %d %s, want %d", i+1, r.status, r.raw, wantStatus)
			}
		}
		huge := `{"tenant":"acme","subject":"` + subj + `","policy":"big","hits":9223372036854775807}`
		for _, tc := range []struct {
			name   string
			body   string
			hdr    []string
			status int
		}{
			{"no token", huge, nil, 401},
			{"wrong token", keyBody(subj, "big", 1), []string{"Authorization", "Bearer nope"}, 401},
			{"huge hits with the token", huge, []string{"Authorization", "Bearer " + opsRefundToken}, 400},
		} {
			for _, p := range nodes {
				r := mustPost(t, p, "/v1/refund", tc.body, tc.hdr...)
				if r.status != tc.status {
					t.Errorf("refund %s on %s: %d %s, want %d", tc.name, p.name, r.status, r.raw, tc.status)
				}
			}
		}
		want(t, "check after the refused refunds", mustPost(t, b, "/v1/check", keyBody(subj, "big", 0)), 429, nil)
		// The refund token opens refunds only.
		if r := mustPost(t, a, "/v1/reset", keyBody(subj, "big", 0), "Authorization", "Bearer "+opsRefundToken); r.status != 401 {
			t.Errorf("reset with the refund token: %d %s, want 401", r.status, r.raw)
		}
		want(t, "refund with the refund token", mustPost(t, a, "/v1/refund", keyBody(subj, "big", 2), "Authorization", "Bearer "+opsRefundToken), 200,
			map[string]any{"allowed": true, "reason": "refunded", "remaining": 2.0})
		if !strings.Contains(a.logText(), "refund refused: missing or wrong refund or admin token") {
			t.Errorf("a logged no refused refund:\n%s", a.logText())
		}
	})

	t.Run("reset needs the token", func(t *testing.T) {
		const subj = "resettable-subject"
		for range 3 {
			mustPost(t, a, "/v1/check", keyBody(subj, "small", 0))
		}
		want(t, "4th check", mustPost(t, a, "/v1/check", keyBody(subj, "small", 0)), 429, nil)
		body := keyBody(subj, "small", 0)
		for _, tc := range []struct {
			name string
			hdr  []string
		}{
			{"no token", nil},
			{"wrong token", []string{"Authorization", "Bearer nope"}},
			{"token prefix", []string{"Authorization", "Bearer " + opsToken[:5]}},
			{"basic scheme", []string{"Authorization", "Basic " + opsToken}},
		} {
			r := mustPost(t, b, "/v1/reset", body, tc.hdr...)
			if r.status != 401 || !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("reset with %s: %d %q %s, want 401 with WWW-Authenticate: Bearer", tc.name, r.status, r.header.Get("WWW-Authenticate"), r.raw)
			}
		}
		want(t, "still refused", mustPost(t, a, "/v1/check", keyBody(subj, "small", 0)), 429, nil)
		auth := []string{"Authorization", "Bearer " + opsToken}
		for _, tc := range []struct{ name, body, errPart string }{
			{"policies", multiBody(subj, "small", "big"), `/v1/reset takes one "policy"`},
			{"hits", keyBody(subj, "small", 2), `/v1/reset takes no "hits"`},
			{"unknown policy", keyBody(subj, "nope", 0), `unknown policy "nope"`},
		} {
			r := mustPost(t, a, "/v1/reset", tc.body, auth...)
			if msg, _ := r.body["error"].(string); r.status != 400 || !strings.Contains(msg, tc.errPart) {
				t.Errorf("reset %s: %d %s, want 400 with %q", tc.name, r.status, r.raw, tc.errPart)
			}
		}
		// b has its token from the environment.
		want(t, "reset", mustPost(t, b, "/v1/reset", body, "Authorization", "bearer "+opsToken), 200,
			map[string]any{"allowed": true, "reason": "reset", "remaining": 3.0})
		want(t, "check after reset", mustPost(t, a, "/v1/check", keyBody(subj, "small", 0)), 200, map[string]any{"remaining": 2.0})
		// Who asked is logged at Info, without the subject.
		var line map[string]any
		for _, l := range strings.Split(b.logText(), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == "reset" {
				line = rec
			}
		}
		if line == nil || line["level"] != "INFO" || line["tenant"] != "acme" || line["policy"] != "small" || line["remote_addr"] == nil {
			t.Errorf("reset log line = %v, want level INFO with remote_addr, tenant and policy", line)
		}
		if strings.Contains(b.logText(), subj) {
			t.Errorf("b's Info log holds the raw subject %q:\n%s", subj, b.logText())
		}
	})

	t.Run("batch", func(t *testing.T) {
		reqs := []string{
			keyBody("batch", "small", 0),
			`{"tenant":"acme","subject":"batch","policy":"small","hits":0}`,
			keyBody("batch", "nope", 0),
			multiBody("batch", "big", "day"),
			`{"tenant":"ac me","subject":"batch","policy":"small"}`,
			keyBody("batch", "small", 3),
			`{"tenant":"acme","subject":"batch","policy":"small","extra":1}`,
			keyBody("batch", "small", 0),
		}
		r := mustPost(t, a, "/v1/checks", `{"requests":[`+strings.Join(reqs, ",")+`]}`)
		res, _ := r.body["results"].([]any)
		if r.status != 200 || len(res) != len(reqs) {
			t.Fatalf("batch: %d with %d results, want 200 with %d: %s", r.status, len(res), len(reqs), r.raw)
		}
		item := func(i int) map[string]any { m, _ := res[i].(map[string]any); return m }
		for i, w := range map[int]string{1: "invalid hits 0", 2: `unknown policy "nope"`, 4: "invalid key: tenant has byte 0x20", 5: "", 6: `unknown field "extra"`} {
			if w == "" {
				continue
			}
			if msg, _ := item(i)["error"].(string); item(i)["status"] != 400.0 || !strings.Contains(msg, w) {
				t.Errorf("result %d = %v, want status 400 and an error with %q", i, item(i), w)
			}
		}
		// 0 and 7 are independent checks of one key: one admitted with 2
		// left, the other with 1 or 0 left (they run concurrently, with 5
		// between them refused or admitted first).
		admitted := 0
		for _, i := range []int{0, 5, 7} {
			if item(i)["allowed"] == true {
				admitted += map[int]int{0: 1, 5: 3, 7: 1}[i]
			} else if item(i)["reason"] != "over_limit" {
				t.Errorf("result %d = %v, want a decision", i, item(i))
			}
		}
		if admitted < 2 || admitted > 3 {
			t.Errorf("results 0, 5, 7 admitted %d units of small, want 2 or 3: %s", admitted, r.raw)
		}
		if l := limitOf(item(3), "day"); l == nil || item(3)["allowed"] != true {
			t.Errorf("result 3 = %v, want an admitted multi decision", item(3))
		}
		for _, tc := range []struct{ name, body, errPart string }{
			{"1001 requests", `{"requests":[` + strings.TrimSuffix(strings.Repeat(keyBody("batch-big", "probe", 0)+",", 1001), ",") + `]}`, "more than 1000 requests"},
			{"not an envelope", `[` + reqs[0] + `]`, "must be a JSON object"},
			{"broken JSON", `{"requests":[{"tenant"]}`, "bad JSON body"},
		} {
			r := mustPost(t, b, "/v1/checks", tc.body)
			if msg, _ := r.body["error"].(string); r.status != 400 || !strings.Contains(msg, tc.errPart) {
				t.Errorf("batch %s: %d %.200s, want 400 with %q", tc.name, r.status, r.raw, tc.errPart)
			}
		}
		// The full 1000 in one request, through the other node.
		r = mustPost(t, b, "/v1/checks", `{"requests":[`+strings.TrimSuffix(strings.Repeat(keyBody("batch-big", "probe", 0)+",", 1000), ",")+`]}`)
		if res, _ := r.body["results"].([]any); r.status != 200 || len(res) != 1000 {
			t.Fatalf("batch of 1000: %d with %d results", r.status, len(res))
		}
		want(t, "peek after 1000", mustPost(t, a, "/v1/peek", keyBody("batch-big", "probe", 0)), 200, map[string]any{"remaining": float64(1000000000 - 1001)})
	})

	t.Run("grpc", func(t *testing.T) {
		conn, err := grpc.NewClient(b.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		rl := peerpb.NewRateLimiterClient(conn)
		key := func(policy string) *peerpb.Key { return &peerpb.Key{Tenant: "acme", Subject: "grpc", Policy: policy} }
		for range 3 {
			if _, err := rl.Allow(ctx, &peerpb.AllowRequest{Key: key("small")}); err != nil {
				t.Fatal(err)
			}
		}
		resp, err := rl.Allow(ctx, &peerpb.AllowRequest{Key: key(""), Policies: []string{"big", "small"}})
		if err != nil || resp.GetAllowed() || resp.GetRefusedBy() != "small" || len(resp.GetLimits()) != 2 || resp.GetDecidedAtUnixNs() == 0 {
			t.Errorf("multi Allow: %v, %v; want refused by small with two limits and decided_at", resp, err)
		}
		if resp, err := rl.Peek(ctx, &peerpb.AllowRequest{Key: key("big")}); err != nil || resp.GetRemaining() != 4 || resp.GetReason() != peerpb.Reason_REASON_PEEK {
			t.Errorf("Peek big: %v, %v; want remaining 4 (nothing recorded), reason peek", resp, err)
		}
		batch, err := rl.AllowBatch(ctx, &peerpb.AllowBatchRequest{Requests: []*peerpb.AllowRequest{
			{Key: key("big")}, {Key: key("nope")}, {Key: key("big"), Hits: 99}, {Key: key("big")},
		}})
		if err != nil || len(batch.GetResults()) != 4 {
			t.Fatalf("AllowBatch: %v, %v", batch, err)
		}
		rs := batch.GetResults()
		if rs[0].GetResponse() == nil || rs[3].GetResponse() == nil || codes.Code(rs[1].GetCode()) != codes.NotFound || codes.Code(rs[2].GetCode()) != codes.InvalidArgument {
			t.Errorf("AllowBatch results: %v", rs)
		}
		// Refund: the token guards it on gRPC too, and hits past the
		// limit are refused whoever asks.
		for _, tc := range []struct {
			name string
			auth string
			hits int64
			code codes.Code
		}{
			{"no token", "", 1, codes.Unauthenticated},
			{"wrong token", "Bearer nope", 1, codes.Unauthenticated},
			{"huge hits", "Bearer " + opsRefundToken, 1<<63 - 1, codes.InvalidArgument},
		} {
			rctx := ctx
			if tc.auth != "" {
				rctx = metadata.AppendToOutgoingContext(ctx, "authorization", tc.auth)
			}
			if resp, err := rl.Refund(rctx, &peerpb.AllowRequest{Key: key("big"), Hits: tc.hits}); status.Code(err) != tc.code {
				t.Errorf("Refund with %s: %v, %v; want %v", tc.name, resp, err, tc.code)
			}
		}
		if resp, err := rl.Refund(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+opsToken), &peerpb.AllowRequest{Key: key("big"), Hits: 1}); err != nil || resp.GetRemaining() != 4 || !resp.GetAllowed() {
			t.Errorf("Refund with the admin token: %v, %v; want remaining 4", resp, err)
		}
		// Envoy's negative hits are refunds: the same guard.
		rls := rlsv3.NewRateLimitServiceClient(conn)
		user := func(negative bool) *rlsv3.RateLimitRequest {
			return &rlsv3.RateLimitRequest{Domain: "ops", Descriptors: []*ratelimitv3.RateLimitDescriptor{
				{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u"}}, IsNegativeHits: negative}}}
		}
		if _, err := rls.ShouldRateLimit(ctx, user(false)); err != nil {
			t.Errorf("Envoy check: %v", err)
		}
		if _, err := rls.ShouldRateLimit(ctx, user(true)); status.Code(err) != codes.Unauthenticated {
			t.Errorf("Envoy refund without a token: %v, want Unauthenticated", err)
		}
		r, err := rls.ShouldRateLimit(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+opsRefundToken), user(true))
		if err != nil || r.GetStatuses()[0].GetLimitRemaining() != 3 {
			t.Errorf("Envoy refund with the refund token: %v, %v; want 3 remaining", r, err)
		}
		// The admin token guards gRPC Reset too (it reset the key for
		// a caller with no credentials at all).
		for _, auth := range []string{"", "Bearer nope"} {
			rctx := ctx
			if auth != "" {
				rctx = metadata.AppendToOutgoingContext(ctx, "authorization", auth)
			}
			if resp, err := rl.Reset(rctx, &peerpb.AllowRequest{Key: key("small")}); status.Code(err) != codes.Unauthenticated {
				t.Errorf("Reset with authorization %q: %v, %v; want Unauthenticated", auth, resp, err)
			}
		}
		if resp, err := rl.Peek(ctx, &peerpb.AllowRequest{Key: key("small")}); err != nil || resp.GetRemaining() != 0 {
			t.Errorf("Peek after refused Resets: %v, %v; want remaining 0 (nothing reset)", resp, err)
		}
		if resp, err := rl.Reset(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+opsToken), &peerpb.AllowRequest{Key: key("small")}); err != nil || resp.GetRemaining() != 3 {
			t.Errorf("Reset with the admin token: %v, %v; want remaining 3", resp, err)
		}
		refusedLog := func() (lines int, counted string) {
			for _, l := range strings.Split(b.logText(), "\n") {
				var rec map[string]any
				if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == "reset refused: missing or wrong admin token" && rec["transport"] == "grpc" {
					lines++
				}
			}
			r := doHTTP(t, "GET", "http://"+b.httpAddr+"/metrics", "")
			for _, l := range strings.Split(r.raw, "\n") {
				if strings.HasPrefix(l, `ringlimit_reset_refused_total{transport="grpc"}`) {
					counted = strings.TrimSpace(strings.TrimPrefix(l, `ringlimit_reset_refused_total{transport="grpc"}`))
				}
			}
			return lines, counted
		}
		if lines, counted := refusedLog(); lines != 1 || counted != "2" {
			t.Errorf("two refused gRPC Resets: %d Warn lines (want 1: throttled), counter %q (want 2)", lines, counted)
		}
		if resp, err := rl.Allow(ctx, &peerpb.AllowRequest{Key: key("small")}); err != nil || !resp.GetAllowed() || resp.GetRemaining() != 2 {
			t.Errorf("Allow after Reset: %v, %v", resp, err)
		}
	})

	t.Run("check command", func(t *testing.T) {
		badTok := writeFile(t, t.TempDir(), "wrong", "nope")
		key := []string{"--tenant", "acme", "--subject", "cli"}
		g := append([]string{"--addr", a.grpcAddr}, key...)
		h := append([]string{"--addr", b.httpAddr, "--http"}, key...)
		for _, tc := range []struct {
			name     string
			args     []string
			wantCode int
			wantOut  []string
			wantJSON map[string]any
		}{
			{"grpc multi", append(g, "--policies", "big,small"), 0, []string{"ALLOWED", "limits:", "big", "small", "decided_at"}, nil},
			{"http multi json", append(h, "--policies", "big,small", "--json"), 0, nil, map[string]any{"allowed": true, "remaining": 1.0}},
			{"grpc peek", append(g, "--policy", "small", "--peek"), 0, []string{"WOULD BE ALLOWED", "remaining    0"}, nil},
			{"http peek hits 2", append(h, "--policy", "small", "--peek", "--hits", "2"), 2, []string{"WOULD BE REFUSED"}, nil},
			{"grpc multi refused", append(g, "--policies", "big,small", "--hits", "2"), 2, []string{"REFUSED", "refused_by   small"}, nil},
			{"http refund without token", append(h, "--policy", "small", "--refund", "1"), 1, []string{"HTTP 401", "refused the refund: give --admin-token-file"}, nil},
			{"grpc refund without token", append(g, "--policy", "small", "--refund", "1"), 1, []string{"the node refused the refund: give --admin-token-file"}, nil},
			{"http refund", append(h, "--policy", "small", "--refund", "1", "--json", "--admin-token-file", tokFile), 0, nil, map[string]any{"reason": "refunded", "remaining": 2.0}},
			{"grpc refund past the limit", append(g, "--policy", "small", "--refund", "4", "--admin-token-file", tokFile), 1, []string{"hits 4 must be between 1 and the limit 3"}, nil},
			{"grpc refund", append(g, "--policy", "small", "--refund", "3", "--admin-token-file", tokFile), 0, []string{"REFUNDED", "remaining    3"}, nil},
			{"grpc refund nothing", append(g, "--policy", "small", "--refund", "1", "--admin-token-file", tokFile), 0, []string{"NOTHING TO REFUND", "reason       nothing_to_refund"}, nil},
			{"http refund nothing json", append(h, "--policy", "small", "--refund", "1", "--json", "--admin-token-file", tokFile), 0, nil, map[string]any{"allowed": false, "reason": "nothing_to_refund", "remaining": 3.0}},
			{"grpc reset without token", append(g, "--policy", "big", "--reset"), 1, []string{"the node refused the reset: give --admin-token-file"}, nil},
			{"grpc reset wrong token", append(g, "--policy", "big", "--reset", "--admin-token-file", badTok), 1, []string{"the node refused the admin token in " + badTok}, nil},
			{"grpc reset", append(g, "--policy", "big", "--reset", "--admin-token-file", tokFile), 0, []string{"RESET", "remaining    5"}, nil},
			{"http reset", append(h, "--policy", "big", "--reset", "--admin-token-file", tokFile), 0, []string{"RESET"}, nil},
			{"http reset wrong token", append(h, "--policy", "big", "--reset", "--admin-token-file", badTok), 1, []string{"HTTP 401", "refused the admin token"}, nil},
			{"http reset without token", append(h, "--policy", "big", "--reset"), 1, []string{"needs --admin-token-file"}, nil},
			{"http reset missing file", append(h, "--policy", "big", "--reset", "--admin-token-file", filepath.Join(t.TempDir(), "none")), 1, []string{"admin token"}, nil},
			{"policy and policies", append(g, "--policy", "big", "--policies", "big,small"), 1, []string{"--policy or --policies, not both"}, nil},
			{"two operations", append(g, "--policy", "big", "--peek", "--reset"), 1, []string{"go alone"}, nil},
			{"refund zero", append(g, "--policy", "big", "--refund", "0"), 1, []string{"at least 1 unit"}, nil},
			{"refund policies", append(g, "--policies", "big,small", "--refund", "1"), 1, []string{"--refund works on one --policy"}, nil},
			{"grpc multi unknown", append(g, "--policies", "big,nope"), 1, []string{`unknown policy "nope"`}, nil},
		} {
			// Sequential: the cases share the key's quota.
			t.Run(tc.name, func(t *testing.T) {
				var out, errOut bytes.Buffer
				code := exitCode(run(context.Background(), append([]string{"check"}, tc.args...), &out, &errOut), &errOut)
				all := out.String() + errOut.String()
				if code != tc.wantCode {
					t.Errorf("check %q: exit code %d, want %d\n%s", tc.args, code, tc.wantCode, all)
				}
				for _, w := range tc.wantOut {
					if !strings.Contains(all, w) {
						t.Errorf("check %q output lacks %q:\n%s", tc.args, w, all)
					}
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
	})

	t.Run("concurrent multi-limit", func(t *testing.T) { concurrentMultiLimit(t, nodes) })
}

// multiOutcome is one multi-policy check of the concurrency test.
type multiOutcome struct {
	status    int
	decidedAt time.Time
	refusedBy string
	allowedBy map[string]bool // the limits entries' allowed
}

// concurrentMultiLimit drives two subjects with checks of [l1 (5 per 2s),
// l2 (8 per 10s)] from four goroutines each, two through each node, for
// 3.5 s, and checks with the owner's decision times: no window (t-W, t] of
// either policy ever holds more than its limit; every admission was
// admitted by both policies and every refusal names a refusing policy;
// l2 admits exactly 8 (the run outlasts l1's window but not l2's); and the
// quotas the holder kept afterwards are exactly the admissions (nothing
// was recorded for a refused request).
func concurrentMultiLimit(t *testing.T, nodes []*serveProc) {
	pols := []struct {
		name  string
		limit int
		w     time.Duration
	}{{"l1", 5, 2 * time.Second}, {"l2", 8, 10 * time.Second}}
	subjects := []string{"conc-0", "conc-1"}
	var mu sync.Mutex
	outs := map[string][]multiOutcome{}
	var wg sync.WaitGroup
	stop := time.Now().Add(3500 * time.Millisecond)
	for _, subj := range subjects {
		for g := range 4 {
			p := nodes[g%2]
			wg.Go(func() {
				tick := time.NewTicker(15 * time.Millisecond)
				defer tick.Stop()
				for time.Now().Before(stop) {
					r, err := post(p, "/v1/check", multiBody(subj, "l1", "l2"))
					if err != nil {
						t.Error(err)
						return
					}
					o := multiOutcome{status: r.status, allowedBy: map[string]bool{}}
					if ns, ok := r.body["decided_at_unix_ns"].(float64); ok {
						// float64 keeps the nanoseconds to within 256 ns;
						// the windows' edges are checked with that slack.
						o.decidedAt = time.Unix(0, int64(ns))
					}
					o.refusedBy, _ = r.body["refused_by"].(string)
					for _, pl := range pols {
						if l := limitOf(r.body, pl.name); l != nil {
							o.allowedBy[pl.name], _ = l["allowed"].(bool)
						}
					}
					if r.status != 200 && r.status != 429 {
						t.Errorf("check via %s: %d %s (the cluster is stable: every check should be decided)", p.name, r.status, r.raw)
					}
					mu.Lock()
					outs[subj] = append(outs[subj], o)
					mu.Unlock()
					<-tick.C
				}
			})
		}
	}
	wg.Wait()
	for _, subj := range subjects {
		var adm []time.Time
		refusers := map[string]int{}
		for _, o := range outs[subj] {
			switch o.status {
			case 200:
				adm = append(adm, o.decidedAt)
				if !o.allowedBy["l1"] || !o.allowedBy["l2"] {
					t.Errorf("%s: admitted, but limits say l1 %v, l2 %v", subj, o.allowedBy["l1"], o.allowedBy["l2"])
				}
			case 429:
				refusers[o.refusedBy]++
				if o.refusedBy == "" || o.allowedBy[o.refusedBy] {
					t.Errorf("%s: refused by %q, whose limits entry says allowed %v", subj, o.refusedBy, o.allowedBy[o.refusedBy])
				}
			}
		}
		sort.Slice(adm, func(i, j int) bool { return adm[i].Before(adm[j]) })
		t.Logf("%s: %d checks, %d admitted, refused by %v", subj, len(outs[subj]), len(adm), refusers)
		const slack = 256 * time.Nanosecond // float64 rounding of decided_at
		for _, pl := range pols {
			for i, ti := range adm {
				n := 0
				for _, tj := range adm[:i+1] {
					if tj.After(ti.Add(-pl.w + slack)) {
						n++
					}
				}
				if n > pl.limit {
					t.Errorf("%s: %d admissions in %s's window (%v, %v], limit %d", subj, n, pl.name, ti.Add(-pl.w), ti, pl.limit)
				}
			}
		}
		if len(adm) != 8 || refusers["l1"] == 0 || refusers["l2"] == 0 {
			t.Errorf("%s: %d admitted, refusals %v; want exactly l2's 8, and refusals by both", subj, len(adm), refusers)
		}
		// What the holder kept: a multi peek right after the load.
		r := mustPost(t, nodes[0], "/v1/peek", multiBody(subj, "l1", "l2"))
		peekAt := time.Unix(0, int64(r.body["decided_at_unix_ns"].(float64)))
		for _, pl := range pols {
			l := limitOf(r.body, pl.name)
			if l == nil {
				t.Fatalf("%s: peek has no %s entry: %s", subj, pl.name, r.raw)
			}
			used := pl.limit - int(l["remaining"].(float64))
			if l["allowed"] == true {
				used-- // a peek's remaining counts its own hit
			}
			// Admissions certainly in the window at peekAt, and those within
			// 1 ms (the log's resolution, times rounded up) plus the
			// float slack of its edge, which the log may still count.
			certain, edge := 0, 0
			for _, ta := range adm {
				switch {
				case ta.After(peekAt.Add(-pl.w + slack)):
					certain++
				case ta.After(peekAt.Add(-pl.w - time.Millisecond - slack)):
					edge++
				}
			}
			if used < certain || used > certain+edge {
				t.Errorf("%s: the holder counts %d units of %s in its window at the peek, but %d admissions are in it (%d more at its edge): a refused check was recorded, or an admission lost",
					subj, used, pl.name, certain, edge)
			}
		}
	}
}
