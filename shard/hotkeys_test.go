package shard

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// hkT0 is the fixed epoch for hot-key time tables.
var hkT0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// hkNoDecay is the longest half-life (about 292 years): a count decays by
// less than 1e-9 relative over an offset of a few seconds.
const hkNoDecay = time.Duration(math.MaxInt64)

type hkHit struct {
	key  string
	hits int64
	at   time.Duration // offset from hkT0
}

// checkHotKeysInvariants verifies the heap, the index and the slot positions.
func checkHotKeysInvariants(t *testing.T, h *HotKeys) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.slots) > h.capacity {
		t.Fatalf("tracked %d keys, capacity %d", len(h.slots), h.capacity)
	}
	if len(h.heap) != len(h.slots) || len(h.index) != len(h.slots) {
		t.Fatalf("sizes disagree: slots %d heap %d index %d", len(h.slots), len(h.heap), len(h.index))
	}
	for p, nd := range h.heap {
		i := nd.slot
		s := h.slots[i]
		if s.pos != p {
			t.Fatalf("slot %d (%q) has pos %d, heap position %d", i, s.key, s.pos, p)
		}
		if j, ok := h.index[s.key]; !ok || j != i {
			t.Fatalf("index[%q] = %d,%v; want %d", s.key, j, ok, i)
		}
		if math.IsNaN(nd.count) || math.IsInf(nd.count, 0) || math.IsNaN(s.err) || math.IsInf(s.err, 0) {
			t.Fatalf("slot %q not finite: count %v err %v", s.key, nd.count, s.err)
		}
		if s.err < 0 || s.err > nd.count {
			t.Fatalf("slot %q: err %v outside [0, count %v]", s.key, s.err, nd.count)
		}
		if p > 0 {
			if parent := h.heap[(p-1)/2]; parent.count > nd.count {
				t.Fatalf("heap order broken at %d: parent %v > child %v", p, parent.count, nd.count)
			}
		}
	}
}

func hkRelErr(got, want float64) float64 {
	if want == 0 {
		return math.Abs(got)
	}
	return math.Abs(got-want) / math.Abs(want)
}

func hkKeys(top []HotKey) []string {
	ks := make([]string, len(top))
	for i, hk := range top {
		ks[i] = hk.Key
	}
	return ks
}

func TestHotKeysDefaults(t *testing.T) {
	tests := []struct {
		name         string
		capacity     int
		halfLife     time.Duration
		wantCapacity int
		wantHalfLife time.Duration
	}{
		{"zero", 0, 0, 64, 10 * time.Second},
		{"negative", -5, -time.Second, 64, 10 * time.Second},
		{"explicit", 3, time.Minute, 3, time.Minute},
		{"huge capacity is not preallocated", math.MaxInt, time.Second, math.MaxInt, time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHotKeys(tc.capacity, tc.halfLife)
			if h.capacity != tc.wantCapacity || h.halfLife != tc.wantHalfLife {
				t.Fatalf("NewHotKeys(%d, %v): capacity %d halfLife %v; want %d %v",
					tc.capacity, tc.halfLife, h.capacity, h.halfLife, tc.wantCapacity, tc.wantHalfLife)
			}
			if h.Len() != 0 || h.Top(10, hkT0) != nil {
				t.Fatalf("new tracker not empty: Len %d Top %v", h.Len(), h.Top(10, hkT0))
			}
		})
	}
}

func TestHotKeysExactCounts(t *testing.T) {
	tests := []struct {
		name     string
		capacity int
		hits     []hkHit
		want     []HotKey // Key and Count; Error must be 0
	}{
		{
			name:     "single key",
			capacity: 4,
			hits:     []hkHit{{"a", 1, 0}, {"a", 2, time.Second}, {"a", 3, 4 * time.Second}},
			want:     []HotKey{{Key: "a", Count: 6}},
		},
		{
			name:     "ordering and ties by key",
			capacity: 4,
			hits: []hkHit{
				{"c", 5, 0}, {"b", 5, 0}, {"a", 1, time.Millisecond},
				{"d", 7, 2 * time.Millisecond}, {"a", 1, 3 * time.Millisecond},
			},
			want: []HotKey{{Key: "d", Count: 7}, {Key: "b", Count: 5}, {Key: "c", Count: 5}, {Key: "a", Count: 2}},
		},
		{
			name:     "exactly capacity distinct keys",
			capacity: 3,
			hits: []hkHit{
				{"x", 1, 0}, {"y", 10, 0}, {"z", 100, 0}, {"x", 1000, time.Second}, {"y", 1, time.Second},
			},
			want: []HotKey{{Key: "x", Count: 1001}, {Key: "z", Count: 100}, {Key: "y", Count: 11}},
		},
		{
			name:     "non-positive hits are ignored",
			capacity: 2,
			hits:     []hkHit{{"a", 3, 0}, {"b", 0, 0}, {"a", -4, 0}, {"c", -1, 0}},
			want:     []HotKey{{Key: "a", Count: 3}},
		},
		{
			name:     "large hit counts",
			capacity: 2,
			hits:     []hkHit{{"a", 1 << 50, 0}, {"b", 1, 0}, {"a", 1 << 50, 0}},
			want:     []HotKey{{Key: "a", Count: 1 << 51}, {Key: "b", Count: 1}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHotKeys(tc.capacity, hkNoDecay)
			var end time.Duration
			for _, x := range tc.hits {
				h.Record(x.key, x.hits, hkT0.Add(x.at))
				end = max(end, x.at)
				checkHotKeysInvariants(t, h)
			}
			got := h.Top(tc.capacity+5, hkT0.Add(end))
			if len(got) != len(tc.want) || h.Len() != len(tc.want) {
				t.Fatalf("Top = %v (Len %d); want %v", got, h.Len(), tc.want)
			}
			for i, w := range tc.want {
				g := got[i]
				if g.Key != w.Key || hkRelErr(g.Count, w.Count) > 1e-9 || g.Error != 0 {
					t.Fatalf("Top[%d] = %+v; want key %q count %v error 0 (all: %v)", i, g, w.Key, w.Count, got)
				}
			}
			// Prefixes: Top(k) is the first k of the full ranking.
			for k := 1; k <= len(tc.want); k++ {
				if p := hkKeys(h.Top(k, hkT0.Add(end))); fmt.Sprint(p) != fmt.Sprint(hkKeys(got[:k])) {
					t.Fatalf("Top(%d) = %v; want %v", k, p, hkKeys(got[:k]))
				}
			}
		})
	}
}

func TestHotKeysTopOwnership(t *testing.T) {
	h := NewHotKeys(4, hkNoDecay)
	h.Record("a", 2, hkT0)
	h.Record("b", 1, hkT0)
	tests := []struct {
		name string
		k    int
		want int
	}{
		{"k zero", 0, 0},
		{"k negative", -1, 0},
		{"k smaller", 1, 1},
		{"k larger", 100, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := h.Top(tc.k, hkT0)
			if len(got) != tc.want {
				t.Fatalf("Top(%d) returned %d entries; want %d", tc.k, len(got), tc.want)
			}
			if len(got) > 0 {
				got[0].Key, got[0].Count = "mutated", -1
				got = append(got, HotKey{Key: "appended"}) // must not write into tracker memory
				_ = got
			}
			if again := h.Top(10, hkT0); len(again) != 2 || again[0].Key != "a" || again[0].Count != 2 {
				t.Fatalf("tracker changed by caller's edit: %v", again)
			}
		})
	}
}

func TestHotKeysHeavyHitters(t *testing.T) {
	tests := []struct {
		name     string
		seed     uint64
		capacity int
		universe uint64
		n        int
		s        float64 // Zipf exponent
	}{
		{"cap16 skewed", 1, 16, 10000, 50000, 1.3},
		{"cap64 mild", 2, 64, 100000, 100000, 1.1},
		{"cap8 steep", 3, 8, 1000, 20000, 2.0},
		{"cap32 flat-ish", 4, 32, 5000, 60000, 1.01},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(tc.seed, tc.seed^0x9e3779b97f4a7c15))
			z := rand.NewZipf(r, tc.s, 1, tc.universe-1)
			// Shuffle ranks onto names so the heavy keys are not the first keys inserted.
			perm := r.Perm(int(tc.universe))
			names := make([]string, tc.universe)
			for i := range names {
				names[i] = fmt.Sprintf("tenant/%06d", perm[i])
			}
			h := NewHotKeys(tc.capacity, hkNoDecay)
			truth := map[string]int{}
			for range tc.n {
				k := names[z.Uint64()]
				truth[k]++
				h.Record(k, 1, hkT0) // one instant: no decay, exact Space-Saving
				if h.Len() > tc.capacity {
					t.Fatalf("seed %d: Len %d > capacity %d", tc.seed, h.Len(), tc.capacity)
				}
			}
			checkHotKeysInvariants(t, h)
			top := h.Top(tc.capacity, hkT0)
			inTop := map[string]HotKey{}
			var sum float64
			for _, hk := range top {
				inTop[hk.Key] = hk
				sum += hk.Count
				tr := float64(truth[hk.Key])
				if hk.Count < tr || hk.Count-hk.Error > tr {
					t.Errorf("seed %d: %q count %v error %v does not bound true %v", tc.seed, hk.Key, hk.Count, hk.Error, tr)
				}
			}
			if sum != float64(tc.n) {
				t.Errorf("seed %d: counts sum to %v; want stream length %d", tc.seed, sum, tc.n)
			}
			threshold := float64(tc.n) / float64(tc.capacity)
			heavy := 0
			for k, c := range truth {
				if float64(c) > threshold {
					heavy++
					if _, ok := inTop[k]; !ok {
						t.Errorf("seed %d: heavy key %q (true %d > N/capacity %.1f) missing from Top", tc.seed, k, c, threshold)
					}
				}
			}
			if heavy == 0 {
				t.Fatalf("seed %d: stream has no heavy hitters; test case is vacuous", tc.seed)
			}
		})
	}
}

func TestHotKeysDecay(t *testing.T) {
	const hl = 10 * time.Second
	tests := []struct {
		name    string
		hits    []hkHit
		at      time.Duration
		wantTop []string
	}{
		{
			name:    "hot long ago drops below hot now",
			hits:    []hkHit{{"old", 1000, 0}, {"new", 10, 20 * hl}},
			at:      20 * hl,
			wantTop: []string{"new", "old"},
		},
		{
			name:    "old still ahead shortly after",
			hits:    []hkHit{{"old", 1000, 0}, {"new", 10, hl}},
			at:      hl,
			wantTop: []string{"old", "new"},
		},
		{
			name:    "crossover after about log2(ratio) half-lives",
			hits:    []hkHit{{"old", 1024, 0}, {"new", 1, 11 * hl}},
			at:      11 * hl,
			wantTop: []string{"new", "old"}, // old has decayed to 0.5
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHotKeys(4, hl)
			for _, x := range tc.hits {
				h.Record(x.key, x.hits, hkT0.Add(x.at))
			}
			if got := hkKeys(h.Top(4, hkT0.Add(tc.at))); fmt.Sprint(got) != fmt.Sprint(tc.wantTop) {
				t.Fatalf("Top at +%v = %v; want %v", tc.at, got, tc.wantTop)
			}
		})
	}
}

func TestHotKeysHalving(t *testing.T) {
	tests := []struct {
		name     string
		halfLife time.Duration
		hits     int64
		recordAt time.Duration
		idle     float64 // half-lives without hits before Top
	}{
		{"one half-life", 10 * time.Second, 1000, 0, 1},
		{"one half-life, recorded late", time.Second, 7, 37 * time.Second, 1},
		{"two half-lives", time.Minute, 1 << 20, 3 * time.Millisecond, 2},
		{"half a half-life", 250 * time.Millisecond, 64, 0, 0.5},
		{"thirty half-lives", time.Millisecond, 1 << 40, 5 * time.Millisecond, 30},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHotKeys(2, tc.halfLife)
			// Start the landmark earlier so the weight is not trivially 1.
			h.Record("other", 1, hkT0)
			at := hkT0.Add(tc.recordAt)
			h.Record("k", tc.hits, at)
			before := findHotKey(t, h.Top(2, at), "k")
			after := findHotKey(t, h.Top(2, at.Add(time.Duration(tc.idle*float64(tc.halfLife)))), "k")
			want := float64(tc.hits) * math.Exp2(-tc.idle)
			if hkRelErr(before.Count, float64(tc.hits)) > 1e-9 {
				t.Fatalf("count at record time %v; want %d", before.Count, tc.hits)
			}
			if hkRelErr(after.Count, want) > 1e-9 {
				t.Fatalf("count after %v half-lives = %v; want %v", tc.idle, after.Count, want)
			}
			wantRate := want * math.Ln2 / tc.halfLife.Seconds()
			if hkRelErr(after.Rate, wantRate) > 1e-9 {
				t.Fatalf("rate = %v; want %v", after.Rate, wantRate)
			}
		})
	}
}

func findHotKey(t *testing.T, top []HotKey, key string) HotKey {
	t.Helper()
	for _, hk := range top {
		if hk.Key == key {
			return hk
		}
	}
	t.Fatalf("key %q not in %v", key, top)
	return HotKey{}
}

func TestHotKeysSteadyRate(t *testing.T) {
	tests := []struct {
		name     string
		halfLife time.Duration
		every    time.Duration
		hits     int64
		wantRate float64
	}{
		{"100/s in 1 s half-life", time.Second, 10 * time.Millisecond, 1, 100},
		{"5000/s batched", 10 * time.Second, 20 * time.Millisecond, 100, 5000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHotKeys(4, tc.halfLife)
			var now time.Time
			for at := time.Duration(0); at < 30*tc.halfLife; at += tc.every {
				now = hkT0.Add(at)
				h.Record("steady", tc.hits, now)
			}
			got := findHotKey(t, h.Top(1, now), "steady")
			// Discrete arrivals sampled right after a hit read up to about
			// one interval's worth high; 2% covers both cases.
			if hkRelErr(got.Rate, tc.wantRate) > 0.02 {
				t.Fatalf("steady-state rate %v; want about %v", got.Rate, tc.wantRate)
			}
		})
	}
}

func TestHotKeysRenormalisation(t *testing.T) {
	const hl = time.Second
	tests := []struct {
		name  string
		step  time.Duration // time between rounds
		total time.Duration
	}{
		{"fine steps over 1000 half-lives", hl / 4, 1000 * hl},
		{"coarse steps over 1000 half-lives", 7 * hl, 1000 * hl},
		{"steps longer than the renormalisation bound", 50 * hl, 1000 * hl},
		{"steps beyond float64 range", 2000 * hl, 20000 * hl},
	}
	keys := []string{"a", "b", "c", "d", "e"}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHotKeys(len(keys), hl)
			round := 0
			for at := time.Duration(0); at <= tc.total; at += tc.step {
				now := hkT0.Add(at)
				// The hot key rotates every 100 half-lives; background keys
				// get a steady trickle.
				hot := keys[int(at/(100*hl))%len(keys)]
				for _, k := range keys {
					h.Record(k, 1, now)
				}
				h.Record(hot, 1000, now)
				top := h.Top(len(keys), now)
				for _, hk := range top {
					for _, v := range []float64{hk.Count, hk.Rate, hk.Error} {
						if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
							t.Fatalf("round %d at +%v: non-finite or negative value in %+v", round, at, hk)
						}
					}
				}
				if len(top) != len(keys) || top[0].Count < 1000 {
					t.Fatalf("round %d at +%v: Top = %+v; want %d keys, the first with count >= 1000", round, at, top, len(keys))
				}
				// A newly hot key overtakes the previous one once the old
				// count has decayed for a few half-lives.
				settled := at%(100*hl) >= 20*hl || tc.step >= 20*hl
				if settled && top[0].Key != hot {
					t.Fatalf("round %d at +%v: Top = %+v; want %q first with count >= 1000", round, at, top, hot)
				}
				round++
			}
			checkHotKeysInvariants(t, h)
			h.mu.Lock()
			moved, scale := h.landmark.After(hkT0), h.scale
			h.mu.Unlock()
			if !moved {
				t.Fatalf("landmark never moved over %v of half-life %v", tc.total, hl)
			}
			if scale > math.Exp2(hotKeysRenormExp) {
				t.Fatalf("scale %v above the renormalisation bound", scale)
			}
		})
	}
}

func TestHotKeysTimeBackwards(t *testing.T) {
	const hl = 10 * time.Second
	tests := []struct {
		name      string
		hits      []hkHit
		topAt     time.Duration
		wantCount map[string]float64
	}{
		{
			name:      "backward record counts at latest time",
			hits:      []hkHit{{"a", 8, hl}, {"a", 8, 0}},
			topAt:     hl,
			wantCount: map[string]float64{"a": 16},
		},
		{
			name:      "backward new key",
			hits:      []hkHit{{"a", 8, 2 * hl}, {"b", 4, 0}},
			topAt:     3 * hl,
			wantCount: map[string]float64{"a": 4, "b": 2},
		},
		{
			name:      "backward Top reads at latest time",
			hits:      []hkHit{{"a", 8, 0}, {"a", 8, hl}},
			topAt:     -hl,
			wantCount: map[string]float64{"a": 12},
		},
		{
			name:      "far backward after renormalisation",
			hits:      []hkHit{{"a", 1, 0}, {"a", 2, 100 * hl}, {"a", 2, -1000 * hl}},
			topAt:     100 * hl,
			wantCount: map[string]float64{"a": 4 + math.Exp2(-100)},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHotKeys(4, hl)
			for _, x := range tc.hits {
				h.Record(x.key, x.hits, hkT0.Add(x.at))
				checkHotKeysInvariants(t, h)
			}
			top := h.Top(4, hkT0.Add(tc.topAt))
			if len(top) != len(tc.wantCount) {
				t.Fatalf("Top = %v; want keys %v", top, tc.wantCount)
			}
			for k, want := range tc.wantCount {
				if got := findHotKey(t, top, k); hkRelErr(got.Count, want) > 1e-9 {
					t.Fatalf("%q count %v; want %v", k, got.Count, want)
				}
			}
		})
	}
}

func TestHotKeysBoundedMemory(t *testing.T) {
	tests := []struct {
		name     string
		capacity int
		distinct int
		halfLife time.Duration
	}{
		{"cap1", 1, 500, time.Second},
		{"cap7", 7, 5000, time.Millisecond},
		{"cap64", 64, 20000, hkNoDecay},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHotKeys(tc.capacity, tc.halfLife)
			r := rand.New(rand.NewPCG(7, uint64(tc.capacity)))
			for i := range tc.distinct {
				h.Record(fmt.Sprintf("k%d", i), 1+r.Int64N(10), hkT0.Add(time.Duration(i)*time.Microsecond))
				if n := h.Len(); n > tc.capacity {
					t.Fatalf("after %d keys Len = %d > capacity %d", i+1, n, tc.capacity)
				}
			}
			checkHotKeysInvariants(t, h)
			if h.Len() != tc.capacity {
				t.Fatalf("Len = %d; want full capacity %d", h.Len(), tc.capacity)
			}
			h.mu.Lock()
			nMap := len(h.index)
			h.mu.Unlock()
			if nMap != tc.capacity {
				t.Fatalf("index holds %d keys; want %d", nMap, tc.capacity)
			}
		})
	}
}

func TestHotKeysConcurrent(t *testing.T) {
	const (
		workers  = 8
		perG     = 2000
		capacity = 16
	)
	tests := []struct {
		name     string
		keys     int
		moveTime bool
	}{
		{"tracked keys, one instant", 8, false},
		{"churning keys, one instant", 64, false},
		{"churning keys, racing clocks", 64, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHotKeys(capacity, time.Second)
			names := make([]string, tc.keys)
			for i := range names {
				names[i] = fmt.Sprintf("key-%d", i)
			}
			var wg sync.WaitGroup
			for g := range workers {
				wg.Go(func() {
					for i := range perG {
						now := hkT0
						if tc.moveTime {
							// Each worker's clock runs at its own pace, so
							// arrivals interleave out of order.
							now = hkT0.Add(time.Duration(i*(g+1)) * time.Millisecond)
						}
						h.Record(names[(i*7+g)%tc.keys], 1, now)
						if i%128 == 0 {
							_ = h.Top(4, now)
							if n := h.Len(); n > capacity {
								t.Errorf("Len %d > capacity %d", n, capacity)
								return
							}
						}
					}
				})
			}
			wg.Wait()
			checkHotKeysInvariants(t, h)
			if tc.moveTime {
				return
			}
			var sum float64
			for _, hk := range h.Top(capacity, hkT0) {
				sum += hk.Count
			}
			if sum != workers*perG {
				t.Fatalf("counts sum to %v; want %d hits recorded", sum, workers*perG)
			}
		})
	}
}

func TestHotKeysRecordAllocs(t *testing.T) {
	tests := []struct {
		name string
		step time.Duration
	}{
		{"same instant", 0},
		{"advancing clock", time.Millisecond},
		{"advancing past renormalisation", 41 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHotKeys(8, time.Second)
			keys := []string{"a", "b", "c", "d"}
			for _, k := range keys {
				h.Record(k, 1, hkT0)
			}
			now, i := hkT0, 0
			allocs := testing.AllocsPerRun(1000, func() {
				now = now.Add(tc.step)
				h.Record(keys[i&3], 3, now)
				i++
			})
			if allocs != 0 {
				t.Fatalf("Record of a tracked key: %v allocs/op; want 0", allocs)
			}
		})
	}
}

// TestHotKeysEvictionReusesMemory records a stream of keys the tracker
// cannot hold (each takes over the minimum's slot): once the slots have
// room for the keys it allocates nothing, and the keys Top returned
// earlier, and the keys tracked now, are unchanged by the slots' reuse.
func TestHotKeysEvictionReusesMemory(t *testing.T) {
	h := NewHotKeys(4, time.Second)
	keys := make([][]byte, 64)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "tenant/subject-%04d/policy", i)
	}
	for _, k := range keys {
		h.RecordBytes(k, 1, hkT0)
	}
	before := h.Top(4, hkT0)
	saved := make([]string, len(before))
	for i, hk := range before {
		saved[i] = strings.Clone(hk.Key)
	}
	i := 0
	allocs := testing.AllocsPerRun(1000, func() {
		h.RecordBytes(keys[i%len(keys)], 1, hkT0)
		i++
	})
	if allocs != 0 {
		t.Errorf("Record of an untracked key into a full tracker: %v allocs/op; want 0", allocs)
	}
	for i, hk := range before {
		if hk.Key != saved[i] {
			t.Fatalf("a key Top returned changed from %q to %q when its slot was reused", saved[i], hk.Key)
		}
	}
	// Every tracked key is intact (one of the keys recorded), and is
	// found again (a lookup, not a takeover) when recorded once more.
	valid := map[string]bool{}
	for _, k := range keys {
		valid[string(k)] = true
	}
	top := h.Top(4, hkT0)
	for _, hk := range top {
		if !valid[hk.Key] {
			t.Fatalf("Top returned %q, which was never recorded", hk.Key)
		}
	}
	want := keySet(top)
	for k := range want {
		h.RecordBytes([]byte(k), 1, hkT0)
	}
	if again := h.Top(4, hkT0); !reflect.DeepEqual(keySet(again), want) {
		t.Fatalf("after recording the tracked keys again Top = %v, want %v", again, want)
	}
}

func keySet(hks []HotKey) map[string]bool {
	m := map[string]bool{}
	for _, hk := range hks {
		m[hk.Key] = true
	}
	return m
}

func BenchmarkHotKeysRecord(b *testing.B) {
	const poolSize = 1024 // power of two
	pool := make([]string, poolSize)
	for i := range pool {
		pool[i] = fmt.Sprintf("tenant-%03d/subject-%05d/policy-api", i%97, i)
	}
	for _, capacity := range []int{1024, 64} {
		// capacity=1024 keeps every pool key tracked (the zero-allocation
		// path); capacity=64 evicts on almost every call (the key is copied into
		// the slot it takes over).
		b.Run(fmt.Sprintf("capacity=%d/mode=serial", capacity), func(b *testing.B) {
			b.ReportAllocs()
			h := NewHotKeys(capacity, 10*time.Second)
			for _, k := range pool {
				h.Record(k, 1, hkT0)
			}
			now, i := hkT0, 0
			for b.Loop() {
				now = now.Add(time.Microsecond)
				h.Record(pool[i&(poolSize-1)], 1, now)
				i++
			}
		})
		b.Run(fmt.Sprintf("capacity=%d/mode=parallel", capacity), func(b *testing.B) {
			b.ReportAllocs()
			h := NewHotKeys(capacity, 10*time.Second)
			for _, k := range pool {
				h.Record(k, 1, hkT0)
			}
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				now, i := hkT0, 0
				for pb.Next() {
					now = now.Add(time.Microsecond)
					h.Record(pool[i&(poolSize-1)], 1, now)
					i++
				}
			})
		})
	}
}
