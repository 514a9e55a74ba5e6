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

// TestTakeoversSummedWhenQuiet: takeovers from one holder are summed
// into one line once none has come for the quiet time (or at once when
// the node closes), and each is summed once.
func TestTakeoversSummedWhenQuiet(t *testing.T) {
	var tk takeovers
	tk.tally("n1", 3, 10)
	tk.tally("n1", 4, 20)
	tk.tally("n2", 1, 25)
	if due := tk.due(29, 10, false); len(due) != 0 {
		t.Fatalf("due at 29 (quiet 10): %v; want none yet", due)
	}
	due := tk.due(30, 10, false)
	if want := (takeoverTally{partitions: 2, keys: 7, first: 10, last: 20}); len(due) != 1 || due["n1"] != want {
		t.Fatalf("due at 30: %v; want n1 alone, %+v", due, want)
	}
	if due := tk.due(30, 10, true); len(due) != 1 || due["n2"].partitions != 1 {
		t.Fatalf("due with all: %v; want n2's one partition (n1's already summed)", due)
	}
	if due := tk.due(1000, 10, true); len(due) != 0 {
		t.Fatalf("due after everything was summed: %v", due)
	}
}
