package peer

import (
	"encoding/binary"
	"reflect"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/peer/internal/wire"
	"github.com/ringlimit/ringlimit/shard"
)

// TestWindowsCodec packs a sender's windows and reads them back; every
// truncation, a zero window, one beyond shard.MaxWindow and trailing
// bytes are rejected. importPolicy takes the longer window, for
// sliding_log and fixed_window only, and only of the same policy.
func TestWindowsCodec(t *testing.T) {
	tab := policy.New(map[string]PolicyConfig{
		"a": {Limit: 5, Window: time.Hour},
		"b": {Limit: 5, Window: time.Second},
	})
	names := func(ns ...string) func(func(string) bool) {
		return func(yield func(string) bool) {
			for _, n := range ns {
				if !yield(n) {
					return
				}
			}
		}
	}
	b := packWindows(tab, names("a", "missing", "b", "a"))
	got, err := decodeWindows(b)
	want := []senderWindow{{"a", time.Hour}, {"b", time.Second}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("decodeWindows = %v, %v; want %v", got, err, want)
	}
	if b := packWindows(tab, names("missing")); b != nil {
		t.Errorf("packWindows of unknown policies = %x, want nil", b)
	}
	for n := 1; n < len(b); n++ {
		if _, err := decodeWindows(b[:n]); err == nil {
			t.Errorf("decodeWindows of the first %d of %d bytes succeeded", n, len(b))
		}
	}
	bad := map[string][]byte{
		"zero window":     binary.AppendUvarint(wire.AppendString([]byte{1}, "a"), 0),
		"beyond maximum":  binary.AppendUvarint(wire.AppendString([]byte{1}, "a"), uint64(shard.MaxWindow)+1),
		"trailing bytes":  append(binary.AppendUvarint(wire.AppendString([]byte{1}, "a"), 5), 0),
		"count too large": binary.AppendUvarint(wire.AppendString([]byte{3}, "a"), 5),
	}
	for name, b := range bad {
		if _, err := decodeWindows(b); err == nil {
			t.Errorf("%s: decodeWindows succeeded", name)
		}
	}

	sw := []senderWindow{{"p", time.Hour}, {"q", 2 * time.Hour}}
	for _, tc := range []struct {
		alg  Algorithm
		own  time.Duration
		want time.Duration
	}{
		{SlidingLog, time.Minute, time.Hour},
		{FixedWindow, time.Minute, time.Hour},
		{SlidingLog, 3 * time.Hour, 3 * time.Hour}, // shorter: keeps its own
		{TokenBucket, time.Minute, time.Minute},    // a rate, not a retention
	} {
		p := policy.New(map[string]PolicyConfig{"p": {Limit: 5, Window: tc.own, Algorithm: tc.alg}}).Lookup("p")
		if got := importPolicy(p, senderTable{windows: sw}).Window; got != tc.want {
			t.Errorf("%v with own window %v: import window %v, want %v", tc.alg, tc.own, got, tc.want)
		}
		// A sender whose table differs and whose windows are unknown:
		// sliding_log and fixed_window keep everything they are sent.
		want := shard.MaxWindow
		if tc.alg == TokenBucket {
			want = tc.own
		}
		if got := importPolicy(p, senderTable{unknown: true}).Window; got != want {
			t.Errorf("%v with own window %v, sender's unknown: import window %v, want %v", tc.alg, tc.own, got, want)
		}
	}
}
