package peer

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// logTap is a slog handler that lets a test wait for a log line (an
// event the node reports) instead of sleeping. Lines also go to the test
// logger (RINGLIMIT_TEST_LOG).
type logTap struct {
	mu      sync.Mutex
	waiters []*logWaiter
	next    slog.Handler
}

type logWaiter struct {
	msg   string
	match func(attrs map[string]string) bool
	ch    chan map[string]string // buffered 1; receives the first match
}

func newLogTap(t testing.TB) (*logTap, *slog.Logger) {
	w := &logTap{next: testLogger(t).Handler()}
	return w, slog.New(&logTapHandler{w: w})
}

// on returns a channel that receives the attributes of the first line
// logged from now on with message msg whose attributes satisfy match (nil
// matches any).
func (w *logTap) on(msg string, match func(map[string]string) bool) <-chan map[string]string {
	lw := &logWaiter{msg: msg, match: match, ch: make(chan map[string]string, 1)}
	w.mu.Lock()
	w.waiters = append(w.waiters, lw)
	w.mu.Unlock()
	return lw.ch
}

// wait receives from ch or fails after d naming what did not happen.
func waitLog(t testing.TB, ch <-chan map[string]string, d time.Duration, what string) map[string]string {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(d):
		t.Fatalf("timed out after %v waiting for log line: %s", d, what)
		return nil
	}
}

type logTapHandler struct {
	w     *logTap
	attrs []slog.Attr
	next  slog.Handler
}

func (h *logTapHandler) handler() slog.Handler {
	if h.next != nil {
		return h.next
	}
	return h.w.next
}

func (h *logTapHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *logTapHandler) Handle(ctx context.Context, r slog.Record) error {
	attrs := make(map[string]string)
	for _, a := range h.attrs {
		attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		attrs[a.Key] = a.Value.String()
		return true
	})
	h.w.mu.Lock()
	keep := h.w.waiters[:0]
	for _, lw := range h.w.waiters {
		if lw.msg == r.Message && (lw.match == nil || lw.match(attrs)) {
			lw.ch <- attrs
			continue
		}
		keep = append(keep, lw)
	}
	h.w.waiters = keep
	h.w.mu.Unlock()
	if nh := h.handler(); nh.Enabled(ctx, r.Level) {
		return nh.Handle(ctx, r)
	}
	return nil
}

func (h *logTapHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &logTapHandler{w: h.w, attrs: append(append([]slog.Attr(nil), h.attrs...), as...), next: h.handler().WithAttrs(as)}
}

func (h *logTapHandler) WithGroup(name string) slog.Handler {
	return &logTapHandler{w: h.w, attrs: h.attrs, next: h.handler().WithGroup(name)}
}
