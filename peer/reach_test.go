package peer

import (
	"io"
	"log/slog"
	"testing"
)

// TestReachabilityProbesStaleMarks: a marked member stays marked; once
// its mark is older than the hold, asking about it starts a probe (each
// ask, the probe's own slot keeps one in flight); an answer clears it.
func TestReachabilityProbesStaleMarks(t *testing.T) {
	var probed []string
	r := newReachability(100, func(m string) { probed = append(probed, m) }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if r.is("a", 0) {
		t.Fatal("a marked before any mark")
	}
	r.mark("a", 10)
	if !r.is("a", 110) || len(probed) != 0 {
		t.Fatalf("at the hold's end: marked %v, probes %v; want marked, none", r.is("a", 110), probed)
	}
	if !r.is("a", 111) || len(probed) != 1 || probed[0] != "a" {
		t.Fatalf("past the hold: probes %v; want one of a, still marked", probed)
	}
	if r.is("b", 111) || len(probed) != 1 {
		t.Fatalf("b, never marked: probes %v", probed)
	}
	if !r.claim("a") || r.claim("a") {
		t.Fatal("a second probe of a claimed while one is in flight")
	}
	r.done("a")
	if !r.claim("a") {
		t.Fatal("a's probe slot not given back")
	}
	r.clear("a")
	if r.is("a", 1000) || r.marked.Load() != 0 {
		t.Fatal("a still marked after it answered")
	}
}
