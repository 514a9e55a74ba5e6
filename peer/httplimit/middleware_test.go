package httplimit_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/peer/httplimit"
	"github.com/ringlimit/ringlimit/shard"
)

// The node and the routed client are what a middleware takes: both
// decide, take leases and reserve.
var (
	_ httplimit.Limiter  = (*peer.Node)(nil)
	_ httplimit.Leaser   = (*peer.Node)(nil)
	_ httplimit.Reserver = (*peer.Node)(nil)
	_ httplimit.Leaser   = (*peer.Client)(nil)
	_ httplimit.Reserver = (*peer.Client)(nil)
)

// mwT0 is the fixed epoch of the middleware and metrics tests.
var mwT0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// mwClock is a fake clock that only moves when told to.
type mwClock struct {
	mu  sync.Mutex
	now time.Time
}

func newMWClock() *mwClock { return &mwClock{now: mwT0} }

func (c *mwClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to mwT0+off.
func (c *mwClock) Set(off time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = mwT0.Add(off)
}

// startMWNode starts one node on loopback with ephemeral ports and closes it
// when the test ends.
func startMWNode(t *testing.T, cfg peer.Config) *peer.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := peer.New(ctx, cfg)
	if err != nil {
		t.Fatalf("peer.New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := n.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return n
}

// The test KeyFunc takes the subject from X-Test-User. It stands in for an
// authentication layer: real code must derive the key from verified
// identity, never from a header alone.
func mwTestKey(r *http.Request) (peer.Key, bool) {
	u := r.Header.Get("X-Test-User")
	if u == "" {
		return peer.Key{}, false
	}
	pol := r.Header.Get("X-Test-Policy")
	if pol == "" {
		pol = "api"
	}
	return peer.Key{Tenant: "acme", Subject: u, Policy: pol}, true
}

func mwTestHits(r *http.Request) int64 {
	if s := r.Header.Get("X-Test-Cost"); s != "" {
		n, _ := strconv.ParseInt(s, 10, 64)
		return n
	}
	return 1
}

// mwNext is the protected handler: it counts calls and answers 200 "ok".
type mwNext struct {
	mu    sync.Mutex
	calls int
}

func (h *mwNext) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.calls++
	h.mu.Unlock()
	_, _ = w.Write([]byte("ok"))
}

func (h *mwNext) Calls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls
}

// mwStep is one request of a middleware test sequence and its expected
// answer. A want header of "" means the header must be absent.
type mwStep struct {
	name     string
	at       time.Duration // clock offset from mwT0 when the request is made
	user     string        // X-Test-User; "" means KeyFunc returns ok == false
	policy   string        // X-Test-Policy; "" means "api"
	cost     string        // X-Test-Cost
	status   int
	headers  map[string]string
	body     map[string]any // expected JSON fields, when set
	nextCall bool
}

func runMWSteps(t *testing.T, srv *httptest.Server, next *mwNext, clock *mwClock, steps []mwStep) {
	t.Helper()
	for i, st := range steps {
		if clock != nil {
			clock.Set(st.at)
		}
		req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range map[string]string{"X-Test-User": st.user, "X-Test-Policy": st.policy, "X-Test-Cost": st.cost} {
			if v != "" {
				req.Header.Set(k, v)
			}
		}
		before := next.Calls()
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatalf("step %d %s: %v", i, st.name, err)
		}
		var body map[string]any
		if st.body != nil {
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Errorf("step %d %s: decode body: %v", i, st.name, err)
			}
		}
		resp.Body.Close()
		if resp.StatusCode != st.status {
			t.Errorf("step %d %s (at +%v): status %d, want %d", i, st.name, st.at, resp.StatusCode, st.status)
		}
		for k, want := range st.headers {
			if got := resp.Header.Get(k); got != want {
				t.Errorf("step %d %s (at +%v): header %s = %q, want %q", i, st.name, st.at, k, got, want)
			}
		}
		for k, want := range st.body {
			if got := body[k]; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("step %d %s: body[%q] = %v, want %v (body %v)", i, st.name, k, got, want, body)
			}
		}
		if called := next.Calls() > before; called != st.nextCall {
			t.Errorf("step %d %s: next called = %v, want %v", i, st.name, called, st.nextCall)
		}
	}
}

// TestMiddlewareNode drives the middleware against a real single node whose
// clock the test steps. Policy api is 3 per minute.
func TestMiddlewareNode(t *testing.T) {
	clock := newMWClock()
	n := startMWNode(t, peer.Config{
		Clock: clock.Now,
		Policies: map[string]peer.PolicyConfig{
			"api":  {Limit: 3, Window: time.Minute},
			"bulk": {Limit: 10, Window: 1500 * time.Millisecond},
			"ten":  {Limit: 1, Window: 10 * time.Second},
		},
	})
	next := &mwNext{}
	srv := httptest.NewServer(httplimit.Middleware(httplimit.MiddlewareConfig{Limiter: n, Key: mwTestKey, Hits: mwTestHits}, next))
	defer srv.Close()

	const pol = `"api";q=3;w=60`
	steps := []mwStep{
		{name: "first", at: 0, user: "alice", status: 200, nextCall: true,
			headers: map[string]string{"RateLimit-Policy": pol, "RateLimit": `"api";r=2;t=60`, "Retry-After": "", "RateLimit-Reason": ""}},
		{name: "second", at: time.Second, user: "alice", status: 200, nextCall: true,
			headers: map[string]string{"RateLimit-Policy": pol, "RateLimit": `"api";r=1;t=60`}},
		{name: "third, last unit", at: 1500 * time.Millisecond, user: "alice", status: 200, nextCall: true,
			headers: map[string]string{"RateLimit-Policy": pol, "RateLimit": `"api";r=0;t=60`}},
		// The first admission (at 0) frees its unit at 60 s: 49.75 s from
		// now, which rounds UP to 50.
		{name: "fourth refused", at: 10250 * time.Millisecond, user: "alice", status: 429, nextCall: false,
			headers: map[string]string{"Retry-After": "50", "RateLimit-Policy": pol, "RateLimit": `"api";r=0;t=50`, "Content-Type": "application/json", "RateLimit-Reason": ""},
			body:    map[string]any{"error": "rate limit exceeded", "policy": "api", "reason": "over_limit", "retry_after_seconds": 50, "limit": 3}},
		{name: "another subject is independent", at: 10250 * time.Millisecond, user: "bob", status: 200, nextCall: true,
			headers: map[string]string{"RateLimit": `"api";r=2;t=60`}},
		{name: "not limited by this middleware", at: 10250 * time.Millisecond, user: "", status: 200, nextCall: true,
			headers: map[string]string{"RateLimit-Policy": "", "RateLimit": "", "Retry-After": ""}},
		{name: "one ns before the unit frees", at: time.Minute - time.Nanosecond, user: "alice", status: 429,
			headers: map[string]string{"Retry-After": "1", "RateLimit": `"api";r=0;t=1`}},
		// The admission at 0 is exactly one window old: expired.
		{name: "after the window", at: time.Minute, user: "alice", status: 200, nextCall: true,
			headers: map[string]string{"RateLimit": `"api";r=0;t=60`, "Retry-After": ""}},
		{name: "cost of two refused while one unit is free", at: 61 * time.Second, user: "alice", cost: "2", status: 429,
			headers: map[string]string{"Retry-After": "1", "RateLimit": `"api";r=1;t=1`}},
		{name: "cost of two admitted", at: 61500 * time.Millisecond, user: "alice", cost: "2", status: 200, nextCall: true,
			headers: map[string]string{"RateLimit": `"api";r=0;t=60`}},
		{name: "sub-second window rounds up", at: 62 * time.Second, user: "carol", policy: "bulk", status: 200, nextCall: true,
			headers: map[string]string{"RateLimit-Policy": `"bulk";q=10;w=2`, "RateLimit": `"bulk";r=9;t=2`}},
		{name: "cost above the limit is a server bug", at: 62 * time.Second, user: "dave", cost: "4", status: 500,
			headers: map[string]string{"RateLimit": "", "Retry-After": ""}, body: map[string]any{"error": "internal error"}},
		{name: "unknown policy is a server misconfiguration", at: 62 * time.Second, user: "dave", policy: "nope", status: 500,
			body: map[string]any{"error": "internal error"}},
		{name: "invalid key is a bad request naming the part", at: 62 * time.Second, user: "josé", status: 400,
			headers: map[string]string{"RateLimit": "", "Retry-After": "", "Content-Type": "application/json"},
			body:    map[string]any{"error": "invalid rate limit key: subject has byte 0xc3 at 3 outside visible ASCII", "reason": "invalid_key"}},
		// The owner rounds the admission at +70.0005 s up to +70.001 s, so the
		// key's state lasts 10.0005 s: t and Retry-After still say 10, the
		// window, not 11.
		{name: "reset of a full 10 s window is 10", at: 70*time.Second + 500*time.Microsecond, user: "erin", policy: "ten", status: 200, nextCall: true,
			headers: map[string]string{"RateLimit-Policy": `"ten";q=1;w=10`, "RateLimit": `"ten";r=0;t=10`}},
		{name: "retry within a full 10 s window is 10", at: 70*time.Second + 500*time.Microsecond, user: "erin", policy: "ten", status: 429,
			headers: map[string]string{"RateLimit": `"ten";r=0;t=10`, "Retry-After": "10"},
			body:    map[string]any{"retry_after_seconds": 10}},
		{name: "sub-second remainder rounds up", at: 70*time.Second + 900*time.Millisecond, user: "erin", policy: "ten", status: 429,
			headers: map[string]string{"RateLimit": `"ten";r=0;t=10`, "Retry-After": "10"}},
	}
	runMWSteps(t, srv, next, clock, steps)
}

// mwFake is a Limiter answering a fixed decision or error.
type mwFake struct {
	d   peer.Decision
	err error
}

func (f mwFake) Allow(context.Context, peer.Request) (peer.Decision, error) { return f.d, f.err }
func (f mwFake) Policies() map[string]peer.PolicyConfig {
	return map[string]peer.PolicyConfig{"api": {Limit: 3, Window: time.Minute}}
}

func TestMiddlewareOutcomes(t *testing.T) {
	unavailable := fmt.Errorf("%w: %w", peer.ErrUnavailable, context.DeadlineExceeded)
	// A 503 carries what a 429 carries: when to retry and which quota.
	unavailableHeaders := map[string]string{"Retry-After": "1", "RateLimit-Policy": `"api";q=3;w=60`, "RateLimit": "",
		"RateLimit-Reason": "unavailable", "Content-Type": "application/json"}
	tests := []struct {
		name string
		lim  httplimit.Limiter
		step mwStep
	}{
		{"unavailable is 503, never 429", mwFake{err: unavailable},
			mwStep{status: 503, headers: unavailableHeaders,
				body: map[string]any{"error": "rate limiter unavailable", "reason": "unavailable", "policy": "api", "limit": 3, "retry_after_seconds": 1}}},
		{"closed is 503", mwFake{err: peer.ErrClosed},
			mwStep{status: 503, headers: unavailableHeaders,
				body: map[string]any{"reason": "unavailable", "policy": "api", "limit": 3, "retry_after_seconds": 1}}},
		{"closed with an unknown policy still says when to retry", mwFake{err: peer.ErrClosed},
			mwStep{policy: "nope", status: 503, headers: map[string]string{"Retry-After": "1", "RateLimit-Policy": ""},
				body: map[string]any{"reason": "unavailable", "retry_after_seconds": 1}}},
		{"invalid key from the limiter is 400 without its text", mwFake{err: fmt.Errorf("%w: 10.0.0.7:8081: subject is empty", peer.ErrInvalidKey)},
			mwStep{status: 400, body: map[string]any{"error": "invalid rate limit key", "reason": "invalid_key"}}},
		{"invalid key from the key func is 400 naming the part", mwFake{d: peer.Decision{Allowed: true}},
			mwStep{user: "[::1]:8080 x", status: 400, headers: map[string]string{"RateLimit": "", "Retry-After": ""},
				body: map[string]any{"error": "invalid rate limit key: subject has byte 0x20 at 10 outside visible ASCII", "reason": "invalid_key"}}},
		{"KeyPart makes that identity a valid key", mwFake{d: peer.Decision{Allowed: true, Limit: 3, Reason: peer.ReasonAdmitted}},
			mwStep{user: shard.KeyPart("[::1]:8080 x"), status: 200, nextCall: true}},
		{"invalid hits is 500", mwFake{err: peer.ErrInvalidHits}, mwStep{status: 500}},
		{"unknown policy is 500", mwFake{err: peer.ErrUnknownPolicy}, mwStep{status: 500}},
		{"other error is 500", mwFake{err: errors.New("boom")}, mwStep{status: 500}},
		{"failed open passes with a reason", mwFake{d: peer.Decision{Allowed: true, Limit: 3, Reason: peer.ReasonFailedOpen}},
			mwStep{status: 200, nextCall: true, headers: map[string]string{
				"RateLimit-Reason": "failed_open", "RateLimit-Policy": `"api";q=3;w=60`, "RateLimit": ""}}},
		{"fallback admitted passes with a reason", mwFake{d: peer.Decision{Allowed: true, Limit: 1, Remaining: 0, ResetAfter: 30 * time.Second, Reason: peer.ReasonFallback}},
			mwStep{status: 200, nextCall: true, headers: map[string]string{
				"RateLimit-Reason": "fallback", "RateLimit-Policy": `"api";q=1;w=60`, "RateLimit": `"api";r=0;t=30`}}},
		{"fallback refused is 429 with a reason", mwFake{d: peer.Decision{Allowed: false, Limit: 1, RetryAfter: 2500 * time.Millisecond, Reason: peer.ReasonFallback}},
			mwStep{status: 429, headers: map[string]string{
				"RateLimit-Reason": "fallback", "Retry-After": "3", "RateLimit": `"api";r=0;t=3`},
				body: map[string]any{"reason": "fallback", "retry_after_seconds": 3}}},
		{"shadow passes with a reason", mwFake{d: peer.Decision{Allowed: true, Limit: 3, ResetAfter: time.Second, Reason: peer.ReasonShadow}},
			mwStep{status: 200, nextCall: true, headers: map[string]string{
				"RateLimit-Reason": "shadow", "RateLimit": `"api";r=0;t=1`}}},
		{"refused with zero retry still says wait one second", mwFake{d: peer.Decision{Allowed: false, Limit: 3, Reason: peer.ReasonOverLimit}},
			mwStep{status: 429, headers: map[string]string{"Retry-After": "1", "RateLimit": `"api";r=0;t=1`}}},
		{"nil limiter is a config error", nil,
			mwStep{status: 500, body: map[string]any{"error": "internal error"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			next := &mwNext{}
			srv := httptest.NewServer(httplimit.Middleware(httplimit.MiddlewareConfig{Limiter: tc.lim, Key: mwTestKey}, next))
			defer srv.Close()
			st := tc.step
			st.name = tc.name
			if st.user == "" {
				st.user = "alice"
			}
			runMWSteps(t, srv, next, nil, []mwStep{st})
		})
	}
}

func TestMiddlewareOnError(t *testing.T) {
	var got error
	h := httplimit.Middleware(httplimit.MiddlewareConfig{
		Limiter: mwFake{err: fmt.Errorf("%w: owner gone", peer.ErrUnavailable)},
		Key:     mwTestKey,
		OnError: func(w http.ResponseWriter, r *http.Request, err error) {
			got = err
			w.WriteHeader(http.StatusTeapot)
		},
	}, &mwNext{})
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set("X-Test-User", "alice")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusTeapot || !errors.Is(got, peer.ErrUnavailable) {
		t.Errorf("custom OnError: status %d, err %v; want 418 and an error wrapping ErrUnavailable", rec.Code, got)
	}
	if ra, rp := rec.Header().Get("Retry-After"), rec.Header().Get("RateLimit-Policy"); ra != "1" || rp != `"api";q=3;w=60` {
		t.Errorf("custom OnError on unavailable: Retry-After %q, RateLimit-Policy %q; want them set before OnError", ra, rp)
	}

	// Without a KeyFunc the handler reports ErrInvalidConfig rather than
	// panicking.
	got = nil
	h = httplimit.Middleware(httplimit.MiddlewareConfig{
		Limiter: mwFake{},
		OnError: func(w http.ResponseWriter, r *http.Request, err error) { got = err },
	}, &mwNext{})
	h.ServeHTTP(httptest.NewRecorder(), req)
	if !errors.Is(got, peer.ErrInvalidConfig) {
		t.Errorf("nil KeyFunc: err %v, want ErrInvalidConfig", got)
	}
}

func TestMiddlewareRetryAfterSeconds(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want int64
	}{
		{-time.Second, 0},
		{0, 0},
		{time.Nanosecond, 1},
		{999 * time.Millisecond, 1},
		{time.Second, 1},
		{time.Second + time.Nanosecond, 2},
		{49750 * time.Millisecond, 50},
		{time.Minute, 60},
	}
	for _, tc := range tests {
		if got := httplimit.RetryAfterSeconds(tc.d); got != tc.want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}

func TestMiddlewareRateLimitHeaders(t *testing.T) {
	tests := []struct {
		name             string
		policy           string
		pc               peer.PolicyConfig
		d                peer.Decision
		wantPolicy, want string
		wantRetry        string // Retry-After; "" means absent
	}{
		{"admitted", "api", peer.PolicyConfig{Limit: 100, Window: time.Minute},
			peer.Decision{Allowed: true, Limit: 100, Remaining: 99, ResetAfter: 59500 * time.Millisecond, Reason: peer.ReasonAdmitted},
			`"api";q=100;w=60`, `"api";r=99;t=60`, ""},
		{"refused uses retry after, not reset", "api", peer.PolicyConfig{Limit: 100, Window: time.Minute},
			peer.Decision{Limit: 100, RetryAfter: 1100 * time.Millisecond, ResetAfter: 59 * time.Second, Reason: peer.ReasonOverLimit},
			`"api";q=100;w=60`, `"api";r=0;t=2`, "2"},
		{"exactly the window is the window", "ten", peer.PolicyConfig{Limit: 5, Window: 10 * time.Second},
			peer.Decision{Allowed: true, Limit: 5, Remaining: 4, ResetAfter: 10 * time.Second, Reason: peer.ReasonAdmitted},
			`"ten";q=5;w=10`, `"ten";r=4;t=10`, ""},
		{"a resolution step past the window is still the window", "ten", peer.PolicyConfig{Limit: 5, Window: 10 * time.Second},
			peer.Decision{Allowed: true, Limit: 5, Remaining: 4, ResetAfter: 10*time.Second + 400*time.Microsecond, Reason: peer.ReasonAdmitted},
			`"ten";q=5;w=10`, `"ten";r=4;t=10`, ""},
		{"sub-second remainder rounds up", "ten", peer.PolicyConfig{Limit: 5, Window: 10 * time.Second},
			peer.Decision{Allowed: true, Limit: 5, Remaining: 4, ResetAfter: 9200 * time.Millisecond, Reason: peer.ReasonAdmitted},
			`"ten";q=5;w=10`, `"ten";r=4;t=10`, ""},
		{"refused a resolution step past the window", "ten", peer.PolicyConfig{Limit: 1, Window: 10 * time.Second},
			peer.Decision{Limit: 1, RetryAfter: 10*time.Second + 400*time.Microsecond, ResetAfter: 10*time.Second + 400*time.Microsecond, Reason: peer.ReasonOverLimit},
			`"ten";q=1;w=10`, `"ten";r=0;t=10`, "10"},
		{"quote and backslash escaped", `a"b\c`, peer.PolicyConfig{Limit: 1, Window: time.Second},
			peer.Decision{Allowed: true, Limit: 1, Reason: peer.ReasonAdmitted},
			`"a\"b\\c";q=1;w=1`, `"a\"b\\c";r=0;t=0`, ""},
		{"no window, limit from table", "api", peer.PolicyConfig{Limit: 7},
			peer.Decision{Allowed: true, Remaining: 6, Reason: peer.ReasonAdmitted},
			`"api";q=7`, `"api";r=6;t=0`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			h.Set("RateLimit-Reason", "stale")
			httplimit.RateLimitHeaders(h, tc.policy, tc.pc, tc.d)
			if got := h.Get("RateLimit-Policy"); got != tc.wantPolicy {
				t.Errorf("RateLimit-Policy = %q, want %q", got, tc.wantPolicy)
			}
			if got := h.Get("RateLimit"); got != tc.want {
				t.Errorf("RateLimit = %q, want %q", got, tc.want)
			}
			if got := h.Get("RateLimit-Reason"); got != "" {
				t.Errorf("RateLimit-Reason = %q, want none", got)
			}
			if got := h.Get("Retry-After"); got != tc.wantRetry {
				t.Errorf("Retry-After = %q, want %q", got, tc.wantRetry)
			}
		})
	}
}

// TestMiddlewareLogs checks that every error answer is logged once, at the
// level its cause deserves, and that an invalid key's value is not logged.
func TestMiddlewareLogs(t *testing.T) {
	for _, tc := range []struct {
		name      string
		lim       httplimit.Limiter
		user      string
		policy    string
		status    int
		wantLevel string
		wantText  []string
	}{
		{"invalid key is a warning naming the part", mwFake{}, "josé", "", 400, "WARN",
			[]string{`msg="invalid rate limit key"`, `problem="subject has byte 0xc3 at 3 outside visible ASCII"`, `with shard.KeyPart`}},
		{"unknown policy is an error", mwFake{err: fmt.Errorf("%w: %q", peer.ErrUnknownPolicy, "nope")}, "alice", "nope", 500, "ERROR",
			[]string{`msg="unknown rate limit policy"`, "policy=nope"}},
		{"invalid hits is an error", mwFake{err: peer.ErrInvalidHits}, "alice", "", 500, "ERROR",
			[]string{`msg="rate limit check failed"`, "policy=api"}},
		{"unavailable is debug: the node logs the cause", mwFake{err: peer.ErrUnavailable}, "alice", "", 503, "DEBUG",
			[]string{`msg="rate limiter unavailable"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
			h := httplimit.Middleware(httplimit.MiddlewareConfig{Limiter: tc.lim, Key: mwTestKey, Logger: log}, &mwNext{})
			req := httptest.NewRequest(http.MethodGet, "/search", nil)
			req.Header.Set("X-Test-User", tc.user)
			if tc.policy != "" {
				req.Header.Set("X-Test-Policy", tc.policy)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			out := buf.String()
			if rec.Code != tc.status {
				t.Errorf("status %d, want %d", rec.Code, tc.status)
			}
			if n := strings.Count(out, "\n"); n != 1 || !strings.Contains(out, "level="+tc.wantLevel) {
				t.Errorf("log has %d lines, want one at %s:\n%s", n, tc.wantLevel, out)
			}
			for _, w := range tc.wantText {
				if !strings.Contains(out, w) {
					t.Errorf("log lacks %s:\n%s", w, out)
				}
			}
			if strings.Contains(out, tc.user) {
				t.Errorf("log holds the raw subject %q:\n%s", tc.user, out)
			}
		})
	}
}

// TestMiddlewareConcurrency: a concurrency policy takes a lease before the
// handler and releases it when the handler returns, or panics; a request
// over the cap is 429 and never reaches the handler.
func TestMiddlewareConcurrency(t *testing.T) {
	clk := newMWClock()
	nd := startMWNode(t, peer.Config{Name: "mw", Clock: clk.Now, Policies: map[string]peer.PolicyConfig{
		"inflight": {Limit: 2, Window: time.Minute, Algorithm: peer.Concurrency},
	}})
	key := peer.Key{Tenant: "t", Subject: "s", Policy: "inflight"}
	entered := make(chan struct{})
	proceed := make(chan struct{})
	h := httplimit.Middleware(httplimit.MiddlewareConfig{
		Limiter: nd,
		Key:     func(*http.Request) (peer.Key, bool) { return key, true },
	}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/panic" {
			panic(http.ErrAbortHandler)
		}
		entered <- struct{}{}
		<-proceed
	}))
	serve := func(path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		func() {
			defer func() { _ = recover() }()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		}()
		return rec
	}
	free := func() int64 {
		t.Helper()
		d, err := nd.Peek(context.Background(), peer.Request{Key: key})
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed {
			return d.Remaining
		}
		return d.Remaining + 1 // what would be left after one more
	}
	done := make(chan *httptest.ResponseRecorder, 2)
	for range 2 {
		go func() { done <- serve("/") }()
		<-entered
	}
	if got := free(); got != 0 {
		t.Fatalf("two requests in progress: %d units free, want 0", got)
	}
	if rec := serve("/"); rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), "concurrency limit exceeded") {
		t.Fatalf("third concurrent request: %d %s, want 429", rec.Code, rec.Body)
	}
	close(proceed)
	for range 2 {
		if rec := <-done; rec.Code != http.StatusOK {
			t.Fatalf("admitted request: %d %s", rec.Code, rec.Body)
		}
	}
	if got := free(); got != 2 {
		t.Fatalf("after the handlers returned: %d units free, want 2 (leases released)", got)
	}
	serve("/panic")
	if got := free(); got != 2 {
		t.Fatalf("after a panicking handler: %d units free, want 2 (lease released)", got)
	}
}

// TestMiddlewareSettleAfter: with SettleAfter the middleware reserves the
// estimate before the handler and settles with the cost the handler
// reported; a handler that reports nothing is charged the estimate; an
// estimate that does not fit is a 429 and the handler never runs.
func TestMiddlewareSettleAfter(t *testing.T) {
	clk := newMWClock()
	nd := startMWNode(t, peer.Config{Name: "mw", Clock: clk.Now, Policies: map[string]peer.PolicyConfig{
		"tokens": {Limit: 100, Window: time.Minute},
	}})
	key := peer.Key{Tenant: "t", Subject: "s", Policy: "tokens"}
	served := 0
	h := httplimit.Middleware(httplimit.MiddlewareConfig{
		Limiter:     nd,
		Key:         func(*http.Request) (peer.Key, bool) { return key, true },
		Hits:        func(*http.Request) int64 { return 30 }, // the estimate
		SettleAfter: true,
	}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served++
		if c := r.URL.Query().Get("cost"); c != "" {
			n, _ := strconv.ParseInt(c, 10, 64)
			httplimit.ReportCost(r.Context(), n)
		}
	}))
	serve := func(path string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code
	}
	used := func() int64 {
		t.Helper()
		d, err := nd.Peek(context.Background(), peer.Request{Key: key})
		if err != nil {
			t.Fatal(err)
		}
		return 100 - d.Remaining - 1
	}
	if code := serve("/?cost=12"); code != 200 || used() != 12 {
		t.Fatalf("estimate 30, reported 12: %d, %d units used; want 200 and 12", code, used())
	}
	if code := serve("/"); code != 200 || used() != 42 {
		t.Fatalf("estimate 30, nothing reported: %d, %d used; want the estimate charged (42)", code, used())
	}
	if code := serve("/?cost=50"); code != 200 || used() != 92 {
		t.Fatalf("estimate 30, reported 50: %d, %d used; want 92 (20 of overage)", code, used())
	}
	before := served
	if code := serve("/?cost=1"); code != http.StatusTooManyRequests || served != before {
		t.Fatalf("estimate 30 with 8 left: %d, handler ran %d times; want 429 and not served", code, served-before)
	}
	httplimit.ReportCost(context.Background(), 5) // outside the middleware: nothing
}
