package httplimit_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/peer/httplimit"
)

// lockedBuffer is a bytes.Buffer safe for concurrent writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the lines that contain every one of subs.
func (l *lockedBuffer) lines(subs ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
next:
	for _, line := range strings.Split(l.b.String(), "\n") {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		out = append(out, line)
	}
	return out
}

// TestMiddlewareLogsByDefault: with no Logger, a mistyped policy's 500 is
// logged through slog.Default (as a node without a Logger logs), not
// dropped. Not parallel: it replaces the process's default logger.
func TestMiddlewareLogsByDefault(t *testing.T) {
	var buf lockedBuffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })

	nd := startMWNode(t, peer.Config{Name: "mw-default-log", Logger: slog.New(slog.DiscardHandler),
		Policies: map[string]peer.PolicyConfig{"search": {Limit: 5, Window: time.Minute}}})
	h := httplimit.Middleware(httplimit.MiddlewareConfig{
		Limiter: nd,
		Key: func(*http.Request) (peer.Key, bool) {
			return peer.Key{Tenant: "acme", Subject: "alice", Policy: "serach"}, true // the typo
		},
	}, &mwNext{})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/search", nil))
	if rec.Code != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500 for an unknown policy", rec.Code)
	}
	if got := buf.lines(`level=ERROR`, `msg="unknown rate limit policy"`, "policy=serach", "path=/search"); len(got) != 1 {
		t.Fatalf("slog.Default got %d lines about the unknown policy, want 1:\n%s", len(got), strings.Join(buf.lines(), "\n"))
	}
}

// TestMiddlewareLogThrottled: a failure repeated on every request logs
// one line a second per kind, the next one saying how many were held
// back; another kind in the same second still logs.
func TestMiddlewareLogThrottled(t *testing.T) {
	t.Parallel()
	var buf lockedBuffer
	clk := newMWClock()
	h := httplimit.Middleware(httplimit.MiddlewareConfig{
		Limiter: mwFake{err: peer.ErrUnknownPolicy},
		Key:     mwTestKey,
		Logger:  slog.New(slog.NewTextHandler(&buf, nil)),
	}, &mwNext{})
	httplimit.SetLogClockForTest(h, clk.Now)
	serve := func(user string) {
		t.Helper()
		req := httptest.NewRequest(http.MethodGet, "/search", nil)
		req.Header.Set("X-Test-User", user)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
	}
	unknown := `msg="unknown rate limit policy"`
	for range 100 {
		serve("alice")
	}
	if got := buf.lines(unknown); len(got) != 1 || strings.Contains(got[0], "suppressed") {
		t.Fatalf("100 failures in one instant logged %d lines, want 1 without suppressed:\n%s", len(got), strings.Join(got, "\n"))
	}
	serve("josé") // an invalid key: another kind, logged at once
	if got := buf.lines(`msg="invalid rate limit key"`); len(got) != 1 {
		t.Fatalf("an invalid key after the burst logged %d lines, want 1", len(got))
	}
	clk.Set(999 * time.Millisecond)
	serve("alice")
	if got := buf.lines(unknown); len(got) != 1 {
		t.Fatalf("a failure 999 ms later logged (%d lines), want it held back", len(got))
	}
	clk.Set(time.Second)
	serve("alice")
	got := buf.lines(unknown)
	if len(got) != 2 || !strings.Contains(got[1], "suppressed=100") {
		t.Fatalf("a second later: %d lines, want 2, the second with suppressed=100:\n%s", len(got), strings.Join(got, "\n"))
	}
}
