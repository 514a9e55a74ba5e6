package peer

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// recordHandler keeps the messages of the records it handles.
type recordHandler struct {
	mu   *sync.Mutex
	msgs *[]string
	node string // the "node" attribute added by WithAttrs
}

func (h recordHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.msgs = append(*h.msgs, h.node+" "+r.Level.String()+" "+r.Message)
	return nil
}

func (h recordHandler) WithAttrs(as []slog.Attr) slog.Handler {
	for _, a := range as {
		if a.Key == "node" {
			h.node = a.Value.String()
		}
	}
	return h
}

func (h recordHandler) WithGroup(string) slog.Handler { return h }

// TestLoggerDefault: a Config without a Logger logs through slog.Default,
// so an embedder sees the open-peer-RPC warning without having set one.
func TestLoggerDefault(t *testing.T) {
	var mu sync.Mutex
	var msgs []string
	prev := slog.Default()
	slog.SetDefault(slog.New(recordHandler{mu: &mu, msgs: &msgs}))
	t.Cleanup(func() { slog.SetDefault(prev) })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nd, err := New(ctx, Config{
		Name:     "default-logger",
		Policies: map[string]PolicyConfig{"a": {Limit: 1, Window: time.Minute}},
		Gossip:   fastGossip,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nd.Close(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, m := range msgs {
		if strings.HasPrefix(m, "default-logger WARN peer RPCs are not authenticated") {
			return
		}
	}
	t.Fatalf("no open-peer-RPC warning through slog.Default for a node without Logger; slog.Default got:\n%s", strings.Join(msgs, "\n"))
}
