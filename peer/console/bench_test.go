package console_test

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/peer/console"
)

// BenchmarkNodeJSON is one api/node answer of a node with a full traffic
// history: the work a page's refresh asks of each member.
func BenchmarkNodeJSON(b *testing.B) {
	rec := console.NewRecorder(nil)
	t := &testing.T{}
	n := startNode(t, rec)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = n.Close(ctx)
	}()
	c, err := console.New(n, console.Config{Recorder: rec})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	now := time.Now()
	for i := range 900 {
		for _, p := range []string{"api", "login", "search"} {
			rec.Decision(p, peer.ReasonAdmitted, peer.PathLocal)
			rec.Decision(p, peer.ReasonOverLimit, peer.PathLocal)
		}
		rec.Tick(now.Add(time.Duration(i-900) * time.Second))
	}
	for _, full := range []string{"", "?full=1"} {
		b.Run("full="+map[string]string{"": "0", "?full=1": "1"}[full], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				c.ServeHTTP(w, httptest.NewRequest("GET", "/ui/api/node"+full, nil))
				if w.Code != 200 {
					b.Fatal(w.Code)
				}
				b.SetBytes(int64(w.Body.Len()))
			}
		})
	}
}
