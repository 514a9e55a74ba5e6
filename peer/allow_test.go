package peer

import (
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestHotSampledRate checks that hotSampled picks one decision in
// hotSample, within 10 %, for decisions of one key or many arriving at
// steady spacings on the monotonic clock (a tight loop, a busy server, a
// millisecond ticker), and for many keys decided at the same reading.
func TestHotSampledRate(t *testing.T) {
	const n = 200_000
	keys := make([]uint64, 1024)
	for i := range keys {
		keys[i] = xxhash.Sum64String("tenant/subject-" + string(rune('a'+i%26)) + string(rune('a'+i/26)))
	}
	tests := []struct {
		name string
		mono func(i int) int64
		key  func(i int) uint64
	}{
		{"one key/step=1ns", func(i int) int64 { return int64(i) }, func(int) uint64 { return keys[0] }},
		{"one key/step=37ns", func(i int) int64 { return 37 * int64(i) }, func(int) uint64 { return keys[0] }},
		{"one key/step=400ns", func(i int) int64 { return 1e9 + 400*int64(i) }, func(int) uint64 { return keys[1] }},
		{"one key/step=1ms", func(i int) int64 { return 1e6 * int64(i) }, func(int) uint64 { return keys[2] }},
		{"many keys/step=100ns", func(i int) int64 { return 100 * int64(i) }, func(i int) uint64 { return keys[i%len(keys)] }},
		{"many keys/same reading", func(int) int64 { return 123_456_789 }, func(i int) uint64 { return xxhash.Sum64String(string(rune(i))) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := 0
			for i := range n {
				if hotSampled(tt.mono(i), tt.key(i)) {
					got++
				}
			}
			if want := n / hotSample; got < want*9/10 || got > want*11/10 {
				t.Fatalf("hotSampled chose %d of %d decisions, want %d ± 10%%", got, n, want)
			}
		})
	}
}
