package membership

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// Log bridges memberlist's standard logger into slog: each line's
// bracketed level becomes the slog level, with component=memberlist.
// memberlist's "[ERR]" (a failed probe, push/pull or send) is degraded
// service, so it becomes Warn: Error is kept for lost state. A send on a
// connection closed by our own shutdown is Debug.
//
// A starved or cut-off node repeats the same warning every probe (a failed
// ping, a refuted suspicion) and would bury everything else; so each kind
// of warning (its text up to the first ':' or '(') is logged at most once
// per WarnEvery, the next one saying how many were held back
// (repeated=N), and the ones in between go to Debug.
type Log struct {
	log  *slog.Logger
	now  func() time.Time
	mu   sync.Mutex
	off  bool
	seen map[string]*warnKind
}

// WarnEvery is how often one kind of memberlist warning is
// logged at Warn.
const WarnEvery = 10 * time.Second

// warnKind is when a kind of warning was last logged at Warn and how many
// were held back since.
type warnKind struct {
	at   time.Time
	held int
}

func NewLog(l *slog.Logger) *Log {
	return &Log{log: l.With("component", "memberlist"), now: time.Now, seen: map[string]*warnKind{}}
}

// Write logs one of memberlist's lines.
func (w *Log) Write(p []byte) (int, error) {
	line := bytes.TrimSpace(p)
	level := slog.LevelInfo
	for _, l := range []struct {
		tag   string
		level slog.Level
	}{{"[DEBUG]", slog.LevelDebug}, {"[INFO]", slog.LevelInfo}, {"[WARN]", slog.LevelWarn}, {"[ERR]", slog.LevelWarn}, {"[ERROR]", slog.LevelWarn}} {
		if bytes.HasPrefix(line, []byte(l.tag)) {
			level = l.level
			line = bytes.TrimSpace(line[len(l.tag):])
			break
		}
	}
	line = bytes.TrimPrefix(line, []byte("memberlist: "))
	if bytes.Contains(line, []byte("use of closed network connection")) {
		// memberlist's own goroutines racing its shutdown: not news.
		level = slog.LevelDebug
	}
	w.mu.Lock()
	if w.off {
		w.mu.Unlock()
		return len(p), nil
	}
	held := 0
	if level == slog.LevelWarn {
		kind := string(line)
		if i := strings.IndexAny(kind, ":("); i > 0 {
			kind = kind[:i]
		}
		now := w.now()
		switch k := w.seen[kind]; {
		case k == nil:
			if len(w.seen) >= 64 {
				clear(w.seen) // kinds are few; a flood of new ones starts afresh
			}
			w.seen[kind] = &warnKind{at: now}
		case now.Sub(k.at) < WarnEvery:
			k.held++
			level = slog.LevelDebug
		default:
			held, k.at, k.held = k.held, now, 0
		}
	}
	w.mu.Unlock()
	if held > 0 {
		w.log.Log(context.Background(), level, string(line), "repeated", held)
	} else {
		w.log.Log(context.Background(), level, string(line))
	}
	return len(p), nil
}

// Close silences the bridge: memberlist may still log from its last
// goroutines after Shutdown returns.
func (w *Log) Close() {
	w.mu.Lock()
	w.off = true
	w.mu.Unlock()
}
