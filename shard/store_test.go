package shard

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func mustStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := NewStore(cfg)
	if err != nil {
		t.Fatalf("NewStore(%+v): %v", cfg, err)
	}
	return s
}

func testKey(i int) Key {
	return Key{Tenant: "acme", Subject: fmt.Sprintf("user-%d", i), Policy: "api"}
}

// admission is one admitted request seen from outside the store: the time
// the caller passed (raw) and the clock after the call returned (after).
// The store's clamped time for it lies in [raw, after].
type admission struct{ raw, after int64 }

// checkNoWindowOverLimit fails if some window (t − W, t] certainly holds more
// than limit admissions: admissions whose whole interval [raw, after] lies in
// it. The check is sound under clamping (it never blames the store for an
// interleaving it could not see) and tight when calls are short.
func checkNoWindowOverLimit(t *testing.T, name string, adm []admission, limit int64, window time.Duration) {
	t.Helper()
	byAfter := slices.SortedFunc(slices.Values(adm), func(a, b admission) int { return int(a.after - b.after) })
	w := int64(window)
	for j := range byAfter {
		tEnd := byAfter[j].after
		var n int64
		for i := j; i >= 0 && byAfter[i].after > tEnd-w; i-- {
			if byAfter[i].raw > tEnd-w {
				n++
			}
		}
		// Include later entries with the same after.
		for i := j + 1; i < len(byAfter) && byAfter[i].after == tEnd; i++ {
			if byAfter[i].raw > tEnd-w {
				n++
			}
		}
		if n > limit {
			t.Fatalf("%s: %d admissions certainly inside (%d − %v, %d], limit %d", name, n, tEnd, window, tEnd, limit)
		}
	}
}

// TestStoreConcurrentClock drives 8 goroutines through one key and through
// many keys with a shared, monotonic fake clock, and checks that no window
// ever holds more than L admissions.
func TestStoreConcurrentClock(t *testing.T) {
	const (
		goroutines = 8
		perG       = 3000
	)
	for _, nkeys := range []int{1, 16} {
		t.Run(fmt.Sprintf("keys=%d", nkeys), func(t *testing.T) {
			p := Policy{Limit: 10, Window: 40 * ms}
			s := mustStore(t, Config{Stripes: 4})
			var clock atomic.Int64
			clock.Store(t0.UnixNano())
			perKey := make([][][]admission, goroutines)
			var wg sync.WaitGroup
			for g := range goroutines {
				perKey[g] = make([][]admission, nkeys)
				wg.Go(func() {
					for i := range perG {
						k := (g + i) % nkeys
						// Ticks are whole milliseconds, so rounding up
						// to the resolution does not move them.
						raw := clock.Add(int64(ms) / int64(nkeys))
						raw -= raw % int64(ms)
						d, err := s.Allow(testKey(k), p, 1, time.Unix(0, raw))
						if err != nil {
							t.Errorf("Allow: %v", err)
							return
						}
						if d.Allowed {
							perKey[g][k] = append(perKey[g][k], admission{raw, clock.Load()})
						}
					}
				})
			}
			wg.Wait()
			var total int
			for k := range nkeys {
				var adm []admission
				for g := range goroutines {
					adm = append(adm, perKey[g][k]...)
				}
				total += len(adm)
				checkNoWindowOverLimit(t, fmt.Sprintf("key %d", k), adm, p.Limit, p.Window)
			}
			// The clock covers goroutines·perG ms over all keys: each key
			// sees about that many ms / nkeys, so at most L per W each.
			elapsed := (clock.Load()-t0.UnixNano())/int64(ms) + 1
			if maxAdm := int64(nkeys) * p.Limit * (elapsed/int64(p.Window/ms) + 1); int64(total) > maxAdm || total == 0 {
				t.Fatalf("admitted %d, want between 1 and %d", total, maxAdm)
			}
		})
	}
}

// TestStoreConcurrentSameInstant sends many concurrent requests at single
// instants: the number admitted is then independent of the interleaving,
// and must equal the model's prediction exactly, with each Remaining value
// handed out once.
func TestStoreConcurrentSameInstant(t *testing.T) {
	const goroutines = 8
	cases := []struct {
		name     string
		keys     int
		perKey   int // requests per key per instant
		limit    int64
		window   time.Duration
		instants []time.Duration
	}{
		{"one key 1000 at once", 1, 1000, 100, time.Minute, []time.Duration{0}},
		{"one key phases", 1, 400, 50, time.Second, []time.Duration{0, 500 * ms, 999 * ms, 1000 * ms, 1500 * ms, 2200 * ms}},
		{"many keys", 64, 40, 25, time.Second, []time.Duration{0, 10 * ms, 1000 * ms}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := Policy{Limit: tc.limit, Window: tc.window}
			s := mustStore(t, Config{})
			models := make([]*refLog, tc.keys)
			for k := range models {
				models[k] = newRefModel(p).(*refLog)
			}
			for _, at := range tc.instants {
				now := t0.Add(at)
				var (
					mu        sync.Mutex
					admitted  = make([]int64, tc.keys)
					remaining = make([]map[int64]int, tc.keys)
				)
				for k := range remaining {
					remaining[k] = map[int64]int{}
				}
				var wg sync.WaitGroup
				for g := range goroutines {
					wg.Go(func() {
						for i := g; i < tc.keys*tc.perKey; i += goroutines {
							k := i % tc.keys
							d, err := s.Allow(testKey(k), p, 1, now)
							if err != nil {
								t.Errorf("Allow: %v", err)
								return
							}
							if d.Allowed {
								mu.Lock()
								admitted[k]++
								remaining[k][d.Remaining]++
								mu.Unlock()
							}
						}
					})
				}
				wg.Wait()
				for k := range tc.keys {
					var want int64
					for range tc.perKey {
						if models[k].decide(now.UnixNano(), 1).Allowed {
							want++
						}
					}
					if admitted[k] != want {
						t.Fatalf("at %v key %d: admitted %d, model predicts %d", at, k, admitted[k], want)
					}
					for r, n := range remaining[k] {
						if n != 1 || r < 0 || r >= tc.limit {
							t.Fatalf("at %v key %d: Remaining %d handed out %d times", at, k, r, n)
						}
					}
				}
			}
		})
	}
}

// TestStoreCapacity checks MaxKeys: a new key past it gets ErrCapacity and
// changes nothing, existing keys keep deciding, and once their logs have
// expired a new key is accepted by reclaiming them (in its stripe; with one
// stripe that is every key).
func TestStoreCapacity(t *testing.T) {
	const n = 8
	p := Policy{Limit: 2, Window: time.Second}
	s := mustStore(t, Config{MaxKeys: n, Stripes: 1})
	for i := range n {
		if _, err := s.Allow(testKey(i), p, 1, t0); err != nil {
			t.Fatalf("key %d of %d: %v", i, n, err)
		}
	}
	bytes := s.Bytes()
	for _, at := range []time.Duration{0, 500 * ms, time.Second - 1} {
		if _, err := s.Allow(testKey(n), p, 1, t0.Add(at)); !errors.Is(err, ErrCapacity) {
			t.Fatalf("key %d at %v: err %v, want ErrCapacity", n, at, err)
		}
		if s.Len() != n || s.Bytes() != bytes {
			t.Fatalf("after ErrCapacity: Len %d Bytes %d, want %d and %d", s.Len(), s.Bytes(), n, bytes)
		}
		if _, ok := s.Export(testKey(n), t0.Add(at)); ok {
			t.Fatal("rejected key is held")
		}
	}
	// Existing keys keep deciding.
	if d, err := s.Allow(testKey(0), p, 1, t0.Add(500*ms)); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("existing key at capacity: %+v, %v", d, err)
	}
	if d, err := s.Allow(testKey(0), p, 1, t0.Add(500*ms)); err != nil || d.Allowed {
		t.Fatalf("existing full key at capacity: %+v, %v", d, err)
	}
	// At 1 s every log but key 0's has expired; insertion reclaims them.
	if d, err := s.Allow(testKey(n), p, 1, t0.Add(time.Second)); err != nil || !d.Allowed {
		t.Fatalf("new key after expiry: %+v, %v", d, err)
	}
	if s.Len() != 2 {
		t.Fatalf("Len after reclamation = %d, want 2 (key 0 and the new key)", s.Len())
	}
	// Import of a new key obeys MaxKeys too.
	full := mustStore(t, Config{MaxKeys: 1, Stripes: 1})
	if _, err := full.Allow(testKey(0), p, 1, t0); err != nil {
		t.Fatal(err)
	}
	ks := KeyState{Key: testKey(1), Runs: []Run{{Age: 0, Count: 1}}}
	if err := full.Import(ks, p, t0); !errors.Is(err, ErrCapacity) || full.Len() != 1 {
		t.Fatalf("Import past MaxKeys: %v (Len %d), want ErrCapacity", err, full.Len())
	}
	if _, ok := s.Export(testKey(0), t0.Add(time.Second)); !ok {
		t.Fatal("reclamation removed a live key")
	}
}

// TestStoreCapacityManyStripes checks ErrCapacity with the default stripes
// and that Sweep frees room for new keys.
func TestStoreCapacityManyStripes(t *testing.T) {
	const n = 100
	p := Policy{Limit: 1, Window: time.Second}
	s := mustStore(t, Config{MaxKeys: n})
	for i := range n {
		if _, err := s.Allow(testKey(i), p, 1, t0); err != nil {
			t.Fatalf("key %d: %v", i, err)
		}
	}
	if _, err := s.Allow(testKey(n), p, 1, t0); !errors.Is(err, ErrCapacity) {
		t.Fatalf("key past MaxKeys: %v, want ErrCapacity", err)
	}
	for i := range n {
		if d, err := s.Allow(testKey(i), p, 1, t0); err != nil || d.Allowed {
			t.Fatalf("existing key %d at capacity: %+v, %v (want a nil-error rejection)", i, d, err)
		}
	}
	if got := s.Sweep(t0.Add(time.Second), 0); got != n {
		t.Fatalf("Sweep removed %d, want %d", got, n)
	}
	if _, err := s.Allow(testKey(n), p, 1, t0.Add(time.Second)); err != nil {
		t.Fatalf("new key after Sweep: %v", err)
	}
}

// TestStoreSweep checks that Sweep removes exactly the idle keys (whose
// state equals a fresh one), under every algorithm.
func TestStoreSweep(t *testing.T) {
	const n = 200
	type sweep struct {
		at      time.Duration
		removed int
	}
	cases := []struct {
		p      Policy
		sweeps []sweep
	}{
		// Even keys admit 1 at 0, odd keys also 2 at 999 ms.
		{Policy{Limit: 3, Window: time.Second}, []sweep{
			{time.Second - 1, 0}, {time.Second, n / 2}, {1999*ms - 1, 0}, {1999 * ms, n / 2}}},
		// Full again at ⌈W/3⌉ for even keys and ⌈999 ms + 2W/3⌉ for odd.
		{Policy{Limit: 3, Window: time.Second, Algorithm: TokenBucket}, []sweep{
			{333_333_333, 0}, {333_333_334, n / 2}, {1_665_666_666, 0}, {1_665_666_667, n / 2}}},
		// One aligned window [0, 1 s) holds every admission.
		{Policy{Limit: 3, Window: time.Second, Algorithm: FixedWindow}, []sweep{
			{time.Second - 1, 0}, {time.Second, n}}},
	}
	for _, tc := range cases {
		t.Run(tc.p.Algorithm.String(), func(t *testing.T) {
			s := mustStore(t, Config{Stripes: 16})
			for i := range n {
				if d, err := s.Allow(testKey(i), tc.p, 1, t0); err != nil || !d.Allowed {
					t.Fatalf("key %d: %+v, %v", i, d, err)
				}
				if i%2 == 1 {
					if d, err := s.Allow(testKey(i), tc.p, 2, t0.Add(999*ms)); err != nil || !d.Allowed {
						t.Fatalf("key %d: %+v, %v", i, d, err)
					}
				}
			}
			held := n
			for _, sw := range tc.sweeps {
				if got := s.Sweep(t0.Add(sw.at), 0); got != sw.removed {
					t.Fatalf("Sweep at %v removed %d, want %d", sw.at, got, sw.removed)
				}
				held -= sw.removed
				if s.Len() != held {
					t.Fatalf("Len after Sweep at %v = %d, want %d", sw.at, s.Len(), held)
				}
			}
			if tc.p.Algorithm == SlidingLog {
				// The first removal took exactly the even keys.
				s := mustStore(t, Config{Stripes: 16})
				for i := range n {
					s.Allow(testKey(i), tc.p, 1, t0)
					if i%2 == 1 {
						s.Allow(testKey(i), tc.p, 2, t0.Add(999*ms))
					}
				}
				s.Sweep(t0.Add(time.Second), 0)
				for i := range n {
					if _, ok := s.Export(testKey(i), t0.Add(time.Second)); ok != (i%2 == 1) {
						t.Fatalf("key %d held = %v after the first Sweep", i, ok)
					}
				}
			}
		})
	}
}

// TestStoreSweepLimit checks that Sweep with a limit examines about that
// many keys, and that repeated sweeps make round-robin progress.
func TestStoreSweepLimit(t *testing.T) {
	const n, stripes, limit = 4096, 64, 100
	p := Policy{Limit: 1, Window: time.Second}
	s := mustStore(t, Config{Stripes: stripes})
	for i := range n {
		if _, err := s.Allow(testKey(i), p, 1, t0); err != nil {
			t.Fatal(err)
		}
	}
	maxStripe := 0
	for i := range s.stripes {
		maxStripe = max(maxStripe, len(s.stripes[i].m))
	}
	later := t0.Add(time.Minute)
	for sweeps := 1; s.Len() > 0; sweeps++ {
		before := s.Len()
		got := s.Sweep(later, limit)
		if got <= 0 || got > limit+maxStripe || s.Len() != before-got {
			t.Fatalf("sweep %d removed %d of %d (limit %d, largest stripe %d), Len now %d", sweeps, got, before, limit, maxStripe, s.Len())
		}
		if sweeps > stripes {
			t.Fatalf("%d sweeps did not empty the store (Len %d)", sweeps, s.Len())
		}
	}
	if s.Bytes() != 0 {
		t.Fatalf("Bytes after removing every key = %d, want 0", s.Bytes())
	}
}

// TestStoreBytesMatchesHeap compares Store.Bytes with the heap the store
// really holds for 100 000 keys with a few admissions each.
func TestStoreBytesMatchesHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates about 30 MB")
	}
	const n = 100_000
	p := Policy{Limit: 10, Window: time.Second}
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = testKey(i)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := mustStore(t, Config{})
	for i, k := range keys {
		for j := range 3 {
			if _, err := s.Allow(k, p, 1, t0.Add(time.Duration(i%7+j)*ms)); err != nil {
				t.Fatal(err)
			}
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := float64(after.HeapAlloc) - float64(before.HeapAlloc)
	ratio := float64(s.Bytes()) / heap
	t.Logf("keys %d: Bytes %d (%.0f/key), heap delta %.0f (%.0f/key), ratio %.3f",
		n, s.Bytes(), float64(s.Bytes())/n, heap, heap/n, ratio)
	if ratio < 0.8 || ratio > 1.25 {
		t.Fatalf("Bytes/heap = %.3f, want within [0.8, 1.25]", ratio)
	}
	if got := s.Sweep(t0.Add(time.Minute), 0); got != n || s.Len() != 0 {
		t.Fatalf("Sweep removed %d (Len %d), want %d (0)", got, s.Len(), n)
	}
	if s.Bytes() != 0 {
		t.Fatalf("Bytes after sweeping everything = %d, want 0", s.Bytes())
	}
	runtime.KeepAlive(keys)
}

// TestStoreBytesTracksLog checks that Bytes follows one key's log buffer.
func TestStoreBytesTracksLog(t *testing.T) {
	s := mustStore(t, Config{})
	p := Policy{Limit: 1000, Window: time.Second}
	key := testKey(1)
	if _, err := s.Allow(key, p, 1, t0); err != nil {
		t.Fatal(err)
	}
	small := s.Bytes()
	for i := range 500 {
		if _, err := s.Allow(key, p, 1, t0.Add(time.Duration(i)*ms)); err != nil {
			t.Fatal(err)
		}
	}
	// 500 runs of 16 bytes in a buffer of 512.
	if got, want := s.Bytes()-small, int64(512-2)*16; got != want {
		t.Fatalf("Bytes grew by %d for 500 runs, want %d", got, want)
	}
	if !s.Delete(key) || s.Bytes() != 0 || s.Len() != 0 {
		t.Fatalf("after Delete: Bytes %d Len %d", s.Bytes(), s.Len())
	}
	if s.Delete(key) {
		t.Fatal("Delete of an absent key reported true")
	}
}

// historyStep is one request in an export/import script, at an offset from
// t0 on the sender's clock.
type historyStep struct {
	at   time.Duration
	hits int64
}

// TestExportImportRoundTrip exports a key at the sender's now and imports
// it on a receiver whose clock is offset: the receiver then decides exactly
// as the sender would have, had the key stayed. With behind > 0 the export
// reads a clock behind the key's (a clock stepped back): ages must still be
// relative to that reading, or the receiver's admissions would expire
// early by behind.
func TestExportImportRoundTrip(t *testing.T) {
	history := []historyStep{
		{1000 * ms, 2}, {3000*ms + 500*time.Microsecond, 1}, {3000*ms + 500*time.Microsecond, 1},
		{8000 * ms, 1}, {8500 * ms, 1}, {9000 * ms, 2}, {9499 * ms, 1},
	}
	exportAt := 9500 * ms
	var script []historyStep
	for at, i := exportAt, 0; at < 30*time.Second; at, i = at+137*ms+time.Duration(i%3), i+1 {
		script = append(script, historyStep{at, int64(1 + i%2)})
	}
	// Hit the exact expiries of the history too.
	for _, h := range history {
		script = append(script, historyStep{h.at + 10*time.Second - 1, 1}, historyStep{h.at + 10*time.Second, 1})
	}
	slices.SortStableFunc(script, func(a, b historyStep) int { return int(a.at - b.at) })

	policies := []Policy{
		{Limit: 5, Window: 10 * time.Second},
		{Limit: 5, Window: 10 * time.Second, Resolution: 7 * ms},
		{Limit: 5, Window: 10 * time.Second, Algorithm: TokenBucket},
		{Limit: 5, Window: 60 * time.Second, Algorithm: FixedWindow},
	}
	for _, p := range policies {
		for _, c := range []struct{ offset, behind time.Duration }{{0, 0}, {5 * time.Second, 0}, {-5 * time.Second, 0}, {0, 2 * time.Second}, {5 * time.Second, 2 * time.Second}} {
			offset, behind := c.offset, c.behind
			if res := p.resolution(); offset%time.Duration(res) != 0 {
				// The receiver rounds on its own grid: exactness needs an
				// offset that is a whole number of resolution steps.
				offset -= offset % time.Duration(res)
			}
			t.Run(fmt.Sprintf("alg=%v/res=%v/offset=%v/behind=%v", p.Algorithm, p.Resolution, offset, behind), func(t *testing.T) {
				key := testKey(7)
				sender, receiver := mustStore(t, Config{}), mustStore(t, Config{})
				for _, h := range history {
					if _, err := sender.Allow(key, p, h.hits, t0.Add(h.at)); err != nil {
						t.Fatal(err)
					}
				}
				ks, ok := sender.Export(key, t0.Add(exportAt-behind))
				if !ok {
					t.Fatal("Export: key not held")
				}
				if err := ks.Validate(); err != nil {
					t.Fatalf("exported state invalid: %v", err)
				}
				if err := receiver.Import(ks, p, t0.Add(exportAt-behind+offset)); err != nil {
					t.Fatalf("Import: %v", err)
				}
				for i, st := range script {
					want, err := sender.Allow(key, p, st.hits, t0.Add(st.at))
					if err != nil {
						t.Fatal(err)
					}
					got, err := receiver.Allow(key, p, st.hits, t0.Add(st.at+offset))
					if err != nil {
						t.Fatal(err)
					}
					if got != want {
						t.Fatalf("step %d at %v hits %d: receiver %+v, sender %+v", i, st.at, st.hits, got, want)
					}
					if i%10 == 0 {
						a, _ := sender.Export(key, t0.Add(st.at))
						b, _ := receiver.Export(key, t0.Add(st.at+offset))
						if !slices.Equal(a.Runs, b.Runs) {
							t.Fatalf("step %d: receiver runs %v, sender runs %v", i, b.Runs, a.Runs)
						}
					}
				}
			})
		}
	}
}

// TestImportFixedWindowOffsetKeepsQuota is the handoff of a full fixed
// window to a receiver whose clock is 5 s ahead or behind: the quota must
// not reset because the receiver's aligned windows differ.
func TestImportFixedWindowOffsetKeepsQuota(t *testing.T) {
	p := Policy{Limit: 10, Window: 60 * time.Second, Algorithm: FixedWindow}
	key := testKey(3)
	for _, offset := range []time.Duration{5 * time.Second, -5 * time.Second} {
		sender, receiver := mustStore(t, Config{}), mustStore(t, Config{})
		if d, err := sender.Allow(key, p, 10, t0.Add(10*time.Second)); err != nil || !d.Allowed {
			t.Fatalf("sender: %+v, %v", d, err)
		}
		ks, _ := sender.Take(key, t0.Add(10*time.Second))
		if err := receiver.Import(ks, p, t0.Add(10*time.Second+offset)); err != nil {
			t.Fatal(err)
		}
		// The sender's window has 50 s left, which the receiver must honour.
		got, err := receiver.Allow(key, p, 1, t0.Add(10*time.Second+offset))
		if want := *rejectedD(10, 0, 50*time.Second, 50*time.Second); err != nil || got != want {
			t.Fatalf("offset %v: receiver decided %+v, %v; want %+v", offset, got, err, want)
		}
		got, err = receiver.Allow(key, p, 1, t0.Add(60*time.Second+offset-1))
		if err != nil || got.Allowed {
			t.Fatalf("offset %v: receiver admitted before the sender's window ended: %+v, %v", offset, got, err)
		}
		got, err = receiver.Allow(key, p, 1, t0.Add(60*time.Second+offset))
		if err != nil || !got.Allowed {
			t.Fatalf("offset %v: receiver refused after the sender's window ended: %+v, %v", offset, got, err)
		}
	}
}

// TestImportMerge imports a state into a key that already has admissions
// here: both are kept, so the receiver decides as on the union.
func TestImportMerge(t *testing.T) {
	p := Policy{Limit: 6, Window: 10 * time.Second}
	key := testKey(5)
	sender, receiver := mustStore(t, Config{}), mustStore(t, Config{})
	model := newRefModel(p).(*refLog)
	const offset = 5 * time.Second // receiver clock ahead
	// Sender: 2 at 1 s, 1 at 4 s. Receiver: 1 at 2 s, 1 at 4 s (its time
	// rebased to the sender's).
	for _, h := range []historyStep{{1 * time.Second, 2}, {4 * time.Second, 1}} {
		if _, err := sender.Allow(key, p, h.hits, t0.Add(h.at)); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range []historyStep{{2 * time.Second, 1}, {4 * time.Second, 1}} {
		if _, err := receiver.Allow(key, p, h.hits, t0.Add(h.at+offset)); err != nil {
			t.Fatal(err)
		}
	}
	for _, at := range []time.Duration{time.Second, time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second} {
		model.units = append(model.units, t0.Add(at+offset).UnixNano())
	}
	ks, _ := sender.Export(key, t0.Add(5*time.Second))
	if err := receiver.Import(ks, p, t0.Add(5*time.Second+offset)); err != nil {
		t.Fatal(err)
	}
	got, _ := receiver.Export(key, t0.Add(5*time.Second+offset))
	wantRuns := []Run{{Age: 4 * time.Second, Count: 2}, {Age: 3 * time.Second, Count: 1}, {Age: time.Second, Count: 2}}
	if !slices.Equal(got.Runs, wantRuns) {
		t.Fatalf("merged runs %v, want %v", got.Runs, wantRuns)
	}
	for i, st := range []historyStep{{5 * time.Second, 1}, {5 * time.Second, 1}, {10 * time.Second, 2}, {11 * time.Second, 3}, {11 * time.Second, 1}, {12 * time.Second, 2}, {14 * time.Second, 4}} {
		now := t0.Add(st.at + offset)
		got, err := receiver.Allow(key, p, st.hits, now)
		if want := model.decide(now.UnixNano(), st.hits); err != nil || got != want {
			t.Fatalf("step %d at %v hits %d: got %+v, %v; want %+v", i, st.at, st.hits, got, err, want)
		}
	}
}

// TestImportMergeBucketAndWindow imports into keys that already have state
// under TokenBucket and FixedWindow: the sender's and receiver's admissions
// add up, as Import documents.
func TestImportMergeBucketAndWindow(t *testing.T) {
	key := testKey(4)
	t.Run("token bucket", func(t *testing.T) {
		// Each unit costs 1 s.
		p := Policy{Limit: 10, Window: 10 * time.Second, Algorithm: TokenBucket}
		sender, receiver := mustStore(t, Config{}), mustStore(t, Config{})
		if _, err := sender.Allow(key, p, 6, t0); err != nil {
			t.Fatal(err)
		}
		if _, err := receiver.Allow(key, p, 3, t0.Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		ks, _ := sender.Take(key, t0.Add(time.Second))
		if err := receiver.Import(ks, p, t0.Add(6*time.Second)); err != nil {
			t.Fatal(err)
		}
		// Receiver debt 2 s (3 units at 5 s, 1 s refilled) plus the
		// sender's 5 s (6 units at 0, 1 s refilled): 7 used, 3 left.
		got, err := receiver.Allow(key, p, 3, t0.Add(6*time.Second))
		if want := *allowedD(10, 0, 10*time.Second); err != nil || got != want {
			t.Fatalf("merged bucket: %+v, %v; want %+v", got, err, want)
		}
		got, err = receiver.Allow(key, p, 1, t0.Add(6*time.Second))
		if want := *rejectedD(10, 0, time.Second, 10*time.Second); err != nil || got != want {
			t.Fatalf("merged bucket over limit: %+v, %v; want %+v", got, err, want)
		}
	})
	t.Run("fixed window", func(t *testing.T) {
		p := Policy{Limit: 10, Window: 60 * time.Second, Algorithm: FixedWindow}
		sender, receiver := mustStore(t, Config{}), mustStore(t, Config{})
		if _, err := sender.Allow(key, p, 4, t0.Add(10*time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := receiver.Allow(key, p, 3, t0.Add(20*time.Second)); err != nil {
			t.Fatal(err)
		}
		// The receiver's clock is 10 s ahead: the sender's window [0, 60 s)
		// is [10 s, 70 s) here, and the receiver's own is [0, 60 s).
		ks, _ := sender.Take(key, t0.Add(10*time.Second))
		if err := receiver.Import(ks, p, t0.Add(20*time.Second)); err != nil {
			t.Fatal(err)
		}
		got, err := receiver.Allow(key, p, 3, t0.Add(20*time.Second))
		if want := *allowedD(10, 0, 50*time.Second); err != nil || got != want {
			t.Fatalf("merged window: %+v, %v; want %+v", got, err, want)
		}
		for _, at := range []time.Duration{20 * time.Second, 60 * time.Second, 70*time.Second - 1} {
			if got, err := receiver.Allow(key, p, 1, t0.Add(at)); err != nil || got.Allowed {
				t.Fatalf("merged window at %v: %+v, %v; want rejected until the later window ends", at, got, err)
			}
		}
		if got, err := receiver.Allow(key, p, 10, t0.Add(70*time.Second)); err != nil || !got.Allowed {
			t.Fatalf("after the merged window: %+v, %v", got, err)
		}
		// A window that has already ended adds nothing.
		old := KeyState{Key: key, Algorithm: FixedWindow, Runs: []Run{{Age: 61 * time.Second, Count: 10}}}
		other := testKey(5)
		if err := receiver.Import(old, p, t0.Add(70*time.Second)); err != nil {
			t.Fatal(err)
		}
		if err := receiver.Import(KeyState{Key: other, Algorithm: FixedWindow, Runs: old.Runs}, p, t0.Add(70*time.Second)); err != nil {
			t.Fatal(err)
		}
		if got, err := receiver.Allow(other, p, 10, t0.Add(70*time.Second)); err != nil || !got.Allowed {
			t.Fatalf("ended window imported: %+v, %v; want a fresh window", got, err)
		}
	})
}

// TestImportInvalid checks that malformed states and policies are refused
// with the right sentinel and change nothing.
func TestImportInvalid(t *testing.T) {
	p := Policy{Limit: 5, Window: 10 * time.Second}
	key := testKey(1)
	good := KeyState{Key: key, Runs: []Run{{Age: 3 * time.Second, Count: 2}, {Age: time.Second, Count: 1}}}
	cases := []struct {
		name   string
		ks     KeyState
		p      Policy
		target error
	}{
		{"empty tenant", KeyState{Key: Key{Subject: "s", Policy: "p"}, Runs: good.Runs}, p, ErrInvalidState},
		{"space in subject", KeyState{Key: Key{Tenant: "t", Subject: "a b", Policy: "p"}, Runs: good.Runs}, p, ErrInvalidState},
		{"unsorted runs", KeyState{Key: key, Runs: []Run{{Age: time.Second, Count: 1}, {Age: 3 * time.Second, Count: 1}}}, p, ErrInvalidState},
		{"zero count", KeyState{Key: key, Runs: []Run{{Age: 3 * time.Second, Count: 1}, {Age: time.Second, Count: 0}}}, p, ErrInvalidState},
		{"negative count", KeyState{Key: key, Runs: []Run{{Age: 3 * time.Second, Count: -1}}}, p, ErrInvalidState},
		{"unknown algorithm", KeyState{Key: key, Algorithm: 9, Runs: good.Runs}, p, ErrInvalidState},
		{"algorithm differs from policy", KeyState{Key: key, Algorithm: TokenBucket, Runs: []Run{{Age: 0, Count: 0}}}, p, ErrInvalidState},
		{"token bucket with two runs", KeyState{Key: key, Algorithm: TokenBucket, Runs: []Run{{Age: 2, Count: 0}, {Age: 1, Count: 0}}}, Policy{Limit: 5, Window: time.Second, Algorithm: TokenBucket}, ErrInvalidState},
		{"fixed window negative count", KeyState{Key: key, Algorithm: FixedWindow, Runs: []Run{{Age: 2, Count: -3}}}, Policy{Limit: 5, Window: time.Second, Algorithm: FixedWindow}, ErrInvalidState},
		{"invalid policy", good, Policy{Limit: 0, Window: time.Second}, ErrInvalidPolicy},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := mustStore(t, Config{})
			other := testKey(2)
			if _, err := s.Allow(key, p, 2, t0); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Allow(other, p, 1, t0); err != nil {
				t.Fatal(err)
			}
			before, _ := s.Export(key, t0.Add(time.Second))
			lenBefore, bytesBefore := s.Len(), s.Bytes()
			err := s.Import(tc.ks, tc.p, t0.Add(time.Second))
			if !errors.Is(err, tc.target) {
				t.Fatalf("Import: %v, want %v", err, tc.target)
			}
			after, _ := s.Export(key, t0.Add(time.Second))
			if s.Len() != lenBefore || s.Bytes() != bytesBefore || !slices.Equal(before.Runs, after.Runs) || after.Algorithm != before.Algorithm {
				t.Fatalf("failed Import changed the store: Len %d→%d Bytes %d→%d runs %v→%v",
					lenBefore, s.Len(), bytesBefore, s.Bytes(), before.Runs, after.Runs)
			}
		})
	}
}

// TestTake checks that Take hands the state out and forgets the key.
func TestTake(t *testing.T) {
	p := Policy{Limit: 3, Window: time.Second}
	s, r := mustStore(t, Config{}), mustStore(t, Config{})
	key := testKey(9)
	for range 3 {
		if _, err := s.Allow(key, p, 1, t0); err != nil {
			t.Fatal(err)
		}
	}
	exp, _ := s.Export(key, t0.Add(100*ms))
	ks, ok := s.Take(key, t0.Add(100*ms))
	if !ok || ks.Key != key || !slices.Equal(ks.Runs, exp.Runs) {
		t.Fatalf("Take = %+v, %v; want %+v", ks, ok, exp)
	}
	if s.Len() != 0 || s.Bytes() != 0 {
		t.Fatalf("after Take: Len %d Bytes %d", s.Len(), s.Bytes())
	}
	if _, ok := s.Take(key, t0.Add(100*ms)); ok {
		t.Fatal("second Take found the key")
	}
	if _, ok := s.Export(Key{}, t0); ok {
		t.Fatal("Export of an invalid key reported it held")
	}
	if err := r.Import(ks, p, t0.Add(100*ms)); err != nil {
		t.Fatal(err)
	}
	if d, err := r.Allow(key, p, 1, t0.Add(999*ms)); err != nil || d.Allowed {
		t.Fatalf("receiver after Take/Import: %+v, %v (want rejected)", d, err)
	}
	if d, err := r.Allow(key, p, 3, t0.Add(time.Second)); err != nil || !d.Allowed {
		t.Fatalf("receiver one window later: %+v, %v (want admitted)", d, err)
	}
}

// TestStoreRange checks that Range visits each key once and stops early.
func TestStoreRange(t *testing.T) {
	s := mustStore(t, Config{Stripes: 8})
	p := Policy{Limit: 1, Window: time.Second}
	const n = 100
	for i := range n {
		if _, err := s.Allow(testKey(i), p, 1, t0); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[Key]int{}
	s.Range(func(k Key) bool { seen[k]++; return true })
	if len(seen) != n {
		t.Fatalf("Range saw %d keys, want %d", len(seen), n)
	}
	for k, c := range seen {
		if c != 1 {
			t.Fatalf("Range saw %v %d times", k, c)
		}
	}
	calls := 0
	s.Range(func(Key) bool { calls++; return calls < 3 })
	if calls != 3 {
		t.Fatalf("Range continued after false: %d calls", calls)
	}
}

// TestStoreErrorsChangeNothing checks every argument error of Store.Allow.
func TestStoreErrorsChangeNothing(t *testing.T) {
	p := Policy{Limit: 2, Window: time.Second}
	s := mustStore(t, Config{})
	key := testKey(1)
	if _, err := s.Allow(key, p, 1, t0); err != nil {
		t.Fatal(err)
	}
	before, _ := s.Export(key, t0)
	cases := []struct {
		name   string
		key    Key
		p      Policy
		hits   int64
		target error
	}{
		{"invalid key", Key{Tenant: "t", Subject: "", Policy: "p"}, p, 1, ErrInvalidKey},
		{"invalid policy", key, Policy{Limit: 2}, 1, ErrInvalidPolicy},
		{"negative resolution", key, Policy{Limit: 2, Window: time.Second, Resolution: -1}, 1, ErrInvalidPolicy},
		{"zero hits", key, p, 0, ErrInvalidHits},
		{"hits over limit", key, p, 3, ErrInvalidHits},
		{"new key zero hits", testKey(2), p, 0, ErrInvalidHits},
		{"new key bad policy", testKey(2), Policy{Limit: -1, Window: time.Second}, 1, ErrInvalidPolicy},
	}
	for _, tc := range cases {
		if d, err := s.Allow(tc.key, tc.p, tc.hits, t0.Add(time.Hour)); !errors.Is(err, tc.target) || d != (Decision{}) {
			t.Fatalf("%s: %+v, %v; want %v", tc.name, d, err, tc.target)
		}
	}
	after, _ := s.Export(key, t0)
	if s.Len() != 1 || !slices.Equal(before.Runs, after.Runs) {
		t.Fatalf("errors changed the store: Len %d, runs %v → %v", s.Len(), before.Runs, after.Runs)
	}
	// The failed calls at t0+1h did not move the key's clock either.
	if d, err := s.Allow(key, p, 1, t0.Add(999*ms)); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("after errors: %+v, %v", d, err)
	}
	if _, err := NewStore(Config{Stripes: -1}); err == nil {
		t.Fatal("NewStore accepted negative stripes")
	}
	if _, err := NewStore(Config{MaxKeys: -1}); err == nil {
		t.Fatal("NewStore accepted negative MaxKeys")
	}
	// A huge stripe count is an error, not a panic or an unbounded
	// allocation.
	for _, n := range []int{MaxStripes + 1, 1 << 40, 1<<63 - 1} {
		if _, err := NewStore(Config{Stripes: n}); err == nil {
			t.Fatalf("NewStore accepted %d stripes", n)
		}
	}
	if s, err := NewStore(Config{Stripes: MaxStripes}); err != nil || len(s.stripes) != MaxStripes {
		t.Fatalf("NewStore(MaxStripes): %v", err)
	}
	if s, err := NewStore(Config{Stripes: 3}); err != nil || len(s.stripes) != 4 {
		t.Fatalf("NewStore(3 stripes) has %d stripes, %v; want 4", len(s.stripes), err)
	}
}

// TestStoreAlgorithmChange checks that a key whose policy changes algorithm
// starts fresh under the new one, and that each algorithm is independent.
func TestStoreAlgorithmChange(t *testing.T) {
	s := mustStore(t, Config{})
	key := testKey(1)
	log := Policy{Limit: 2, Window: time.Second}
	bucket := Policy{Limit: 2, Window: time.Second, Algorithm: TokenBucket}
	for range 2 {
		if d, _ := s.Allow(key, log, 1, t0); !d.Allowed {
			t.Fatal("sliding log refused a fresh burst")
		}
	}
	if d, _ := s.Allow(key, log, 1, t0); d.Allowed {
		t.Fatal("sliding log admitted over its limit")
	}
	if d, err := s.Allow(key, bucket, 2, t0); err != nil || !d.Allowed {
		t.Fatalf("token bucket after switch: %+v, %v", d, err)
	}
	ks, _ := s.Export(key, t0)
	if ks.Algorithm != TokenBucket || len(ks.Runs) != 1 {
		t.Fatalf("exported state after switch: %+v", ks)
	}
	if d, _ := s.Allow(key, log, 2, t0); !d.Allowed {
		t.Fatal("switch back to sliding log did not start fresh")
	}
}

// TestResolutionChangeRetryAfter: a policy's resolution can change for a
// key; a later admission rounded to an earlier time must not break the log's
// order, or RetryAfter promises a time at which the request is still refused.
func TestResolutionChangeRetryAfter(t *testing.T) {
	s := mustStore(t, Config{})
	key := testKey(1)
	coarse := Policy{Limit: 2, Window: time.Second, Resolution: 10 * ms}
	fine := Policy{Limit: 2, Window: time.Second}
	if _, err := s.Allow(key, coarse, 1, t0.Add(1*ms)); err != nil { // recorded at 10 ms
		t.Fatal(err)
	}
	if _, err := s.Allow(key, fine, 1, t0.Add(2*ms)); err != nil { // would be 2 ms
		t.Fatal(err)
	}
	d, err := s.Allow(key, fine, 2, t0.Add(3*ms))
	if err != nil || d.Allowed {
		t.Fatalf("over limit: %+v, %v", d, err)
	}
	retry := t0.Add(3*ms + d.RetryAfter)
	if got, err := s.Allow(key, fine, 2, retry); err != nil || !got.Allowed {
		t.Fatalf("retry after RetryAfter %v refused: %+v, %v", d.RetryAfter, got, err)
	}
}

// TestAllocs checks that deciding for an existing key does not allocate.
func TestAllocs(t *testing.T) {
	for _, alg := range []Algorithm{SlidingLog, TokenBucket, FixedWindow} {
		p := Policy{Limit: 1000, Window: time.Second, Algorithm: alg}
		s := mustStore(t, Config{})
		lim, err := NewLimiter(p)
		if err != nil {
			t.Fatal(err)
		}
		key := testKey(42)
		now := t0
		step := func() {
			now = now.Add(100 * time.Microsecond)
			if _, err := s.Allow(key, p, 1, now); err != nil {
				t.Fatal(err)
			}
			if _, err := lim.Allow(now, 1); err != nil {
				t.Fatal(err)
			}
		}
		// Warm up past one window so the log buffer has its final size.
		for range 30_000 {
			step()
		}
		if a := testing.AllocsPerRun(2000, func() {
			now = now.Add(100 * time.Microsecond)
			sinkTestDecision, _ = s.Allow(key, p, 1, now)
		}); a != 0 {
			t.Errorf("%v: Store.Allow allocates %.2f per call", alg, a)
		}
		if a := testing.AllocsPerRun(2000, func() {
			now = now.Add(100 * time.Microsecond)
			sinkTestDecision, _ = lim.Allow(now, 1)
		}); a != 0 {
			t.Errorf("%v: Limiter.Allow allocates %.2f per call", alg, a)
		}
	}
}

var sinkTestDecision Decision

// TestKeyValidate checks the key's length and character rules.
func TestKeyValidate(t *testing.T) {
	long := strings.Repeat("x", MaxKeyPartLen)
	cases := []struct {
		name string
		key  Key
		ok   bool
	}{
		{"simple", Key{"acme", "user-1", "api"}, true},
		{"longest parts", Key{long, long, long}, true},
		{"edge characters", Key{"!", "~", "a/b:c"}, true},
		{"empty tenant", Key{"", "s", "p"}, false},
		{"empty subject", Key{"t", "", "p"}, false},
		{"empty policy", Key{"t", "s", ""}, false},
		{"too long", Key{"t", long + "x", "p"}, false},
		{"space", Key{"t", "a b", "p"}, false},
		{"tab", Key{"t", "s", "p\t"}, false},
		{"newline", Key{"t\n", "s", "p"}, false},
		{"nul", Key{"t", "s\x00", "p"}, false},
		{"del", Key{"t", "s\x7f", "p"}, false},
		{"non-ASCII", Key{"t", "é", "p"}, false},
		{"high byte", Key{"t", "s", "\xff"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.key.Validate()
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrInvalidKey)) {
				t.Fatalf("Validate(%q) = %v, want ok %v", tc.key.String(), err, tc.ok)
			}
			enc, ok := tc.key.AppendEncoded([]byte("prefix"))
			if ok != tc.ok {
				t.Fatalf("AppendEncoded ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				if string(enc) != "prefix" {
					t.Fatalf("AppendEncoded changed dst on failure: %q", enc)
				}
				return
			}
			got, err := DecodeKey(string(enc[len("prefix"):]))
			if err != nil || got != tc.key {
				t.Fatalf("DecodeKey(AppendEncoded(%v)) = %v, %v", tc.key, got, err)
			}
		})
	}
}

// TestKeyEncodingInjective checks that different keys never share an
// encoding, including keys whose concatenated parts are equal.
func TestKeyEncodingInjective(t *testing.T) {
	pairs := [][2]Key{
		{{"a", "bc", "d"}, {"ab", "c", "d"}},
		{{"a", "b", "cd"}, {"a", "bc", "d"}},
		{{"ab", "c", "d"}, {"a", "b", "cd"}},
		{{"a/b", "c", "d"}, {"a", "b/c", "d"}},
	}
	for _, pr := range pairs {
		a, _ := pr[0].AppendEncoded(nil)
		b, _ := pr[1].AppendEncoded(nil)
		if string(a) == string(b) {
			t.Fatalf("%v and %v both encode to %q", pr[0], pr[1], a)
		}
	}
	// Every key over a small alphabet, lengths 1..3 per part: the
	// encodings are pairwise distinct.
	var parts []string
	for _, n := range []int{1, 2, 3} {
		var gen func(prefix string)
		gen = func(prefix string) {
			if len(prefix) == n {
				parts = append(parts, prefix)
				return
			}
			for _, c := range "ab" {
				gen(prefix + string(c))
			}
		}
		gen("")
	}
	seen := map[string]Key{}
	for _, a := range parts {
		for _, b := range parts {
			for _, c := range parts {
				k := Key{a, b, c}
				enc, ok := k.AppendEncoded(nil)
				if !ok {
					t.Fatalf("AppendEncoded(%v) failed", k)
				}
				if prev, dup := seen[string(enc)]; dup {
					t.Fatalf("%v and %v both encode to %q", prev, k, enc)
				}
				seen[string(enc)] = k
			}
		}
	}
}

// TestDecodeKeyGarbage checks that DecodeKey refuses anything AppendEncoded
// cannot produce.
func TestDecodeKeyGarbage(t *testing.T) {
	cases := map[string]string{
		"empty":          "",
		"truncated part": "\x03ab",
		"missing parts":  "\x01a\x01b",
		"trailing bytes": "\x01a\x01b\x01cX",
		"empty part":     "\x00\x01b\x01c",
		"space":          "\x01a\x03b c\x01d",
		"control":        "\x01a\x01\n\x01d",
		"too long":       "\xc8" + strings.Repeat("a", 200) + "\x01b\x01c",
	}
	for name, enc := range cases {
		if k, err := DecodeKey(enc); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("%s: DecodeKey(%q) = %v, %v; want ErrInvalidKey", name, enc, k, err)
		}
	}
	// Random bytes never decode to a key that encodes differently.
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20_000 {
		b := make([]byte, rng.IntN(12))
		for i := range b {
			b[i] = byte(rng.IntN(8))
			if rng.IntN(2) == 0 {
				b[i] = byte('a' + rng.IntN(3))
			}
		}
		k, err := DecodeKey(string(b))
		if err != nil {
			continue
		}
		if enc, ok := k.AppendEncoded(nil); !ok || string(enc) != string(b) {
			t.Fatalf("DecodeKey(%q) = %v, which encodes to %q", b, k, enc)
		}
	}
}

// TestPolicyValidate checks that Validate reports every problem, joined.
func TestPolicyValidate(t *testing.T) {
	cases := []struct {
		name string
		p    Policy
		errs int
	}{
		{"valid", Policy{Limit: 1, Window: time.Nanosecond}, 0},
		{"valid resolution equal to window", Policy{Limit: 1, Window: ms, Resolution: ms}, 0},
		{"valid token bucket", Policy{Limit: 10, Window: time.Second, Algorithm: TokenBucket}, 0},
		{"zero limit", Policy{Window: time.Second}, 1},
		{"negative window", Policy{Limit: 1, Window: -1}, 1},
		{"unknown algorithm", Policy{Limit: 1, Window: time.Second, Algorithm: numAlgorithms}, 1},
		{"negative resolution", Policy{Limit: 1, Window: time.Second, Resolution: -ms}, 1},
		{"resolution above window", Policy{Limit: 1, Window: ms, Resolution: 2 * ms}, 1},
		{"zero value", Policy{}, 2},
		{"everything wrong", Policy{Limit: -1, Window: -1, Algorithm: 200, Resolution: -1}, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Validate()
			if tc.errs == 0 {
				if err != nil {
					t.Fatalf("Validate(%+v) = %v, want nil", tc.p, err)
				}
				if _, err := NewLimiter(tc.p); err != nil {
					t.Fatalf("NewLimiter(%+v) = %v", tc.p, err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidPolicy) {
				t.Fatalf("Validate(%+v) = %v, want ErrInvalidPolicy", tc.p, err)
			}
			joined, ok := err.(interface{ Unwrap() []error })
			if !ok || len(joined.Unwrap()) != tc.errs {
				t.Fatalf("Validate(%+v) = %q, want %d joined errors", tc.p, err, tc.errs)
			}
			for _, e := range joined.Unwrap() {
				if !errors.Is(e, ErrInvalidPolicy) {
					t.Fatalf("joined error %q does not wrap ErrInvalidPolicy", e)
				}
			}
			if l, err := NewLimiter(tc.p); l != nil || !errors.Is(err, ErrInvalidPolicy) {
				t.Fatalf("NewLimiter(%+v) = %v, %v", tc.p, l, err)
			}
		})
	}
}

// TestParseAlgorithm checks the names round trip and unknown names fail.
func TestParseAlgorithm(t *testing.T) {
	for _, a := range []Algorithm{SlidingLog, TokenBucket, FixedWindow} {
		got, err := ParseAlgorithm(a.String())
		if err != nil || got != a {
			t.Fatalf("ParseAlgorithm(%q) = %v, %v; want %v", a.String(), got, err, a)
		}
	}
	cases := map[string]struct {
		want Algorithm
		ok   bool
	}{
		"":              {SlidingLog, true},
		"sliding_log":   {SlidingLog, true},
		"token_bucket":  {TokenBucket, true},
		"fixed_window":  {FixedWindow, true},
		"Sliding_Log":   {0, false},
		"gcra":          {0, false},
		"fixed_window ": {0, false},
	}
	for name, tc := range cases {
		got, err := ParseAlgorithm(name)
		if tc.ok != (err == nil) || (tc.ok && got != tc.want) || (!tc.ok && !errors.Is(err, ErrInvalidPolicy)) {
			t.Fatalf("ParseAlgorithm(%q) = %v, %v; want %v ok=%v", name, got, err, tc.want, tc.ok)
		}
	}
	if got := Algorithm(7).String(); got != "algorithm(7)" {
		t.Fatalf("Algorithm(7).String() = %q", got)
	}
}

// TestImportKeepsUnitsAboveLimit: a receiver whose policy has a lower
// limit than the sender's (a policy change rolling out) keeps every unit
// the sender counted, whether they come as one state or one admission at
// a time (replication). Once the receiver's limit is raised to the
// sender's, it admits only what the sender had left; trimmed to its old
// limit it would admit the difference again.
func TestImportKeepsUnitsAboveLimit(t *testing.T) {
	key := Key{Tenant: "t", Subject: "s", Policy: "p"}
	for _, alg := range []Algorithm{SlidingLog, FixedWindow} {
		for _, oneByOne := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/one-by-one=%v", alg, oneByOne), func(t *testing.T) {
				oldP := Policy{Limit: 5, Window: time.Minute, Algorithm: alg}
				newP := Policy{Limit: 10, Window: time.Minute, Algorithm: alg}
				sender := mustStore(t, Config{})
				receiver := mustStore(t, Config{})
				for i := range 8 {
					at := t0.Add(time.Duration(i) * time.Second)
					d, err := sender.Allow(key, newP, 1, at)
					if err != nil || !d.Allowed {
						t.Fatalf("sender admission %d: %+v, %v", i+1, d, err)
					}
					if oneByOne {
						ks := KeyState{Key: key, Algorithm: alg, Runs: []Run{{Age: 0, Count: 1}}}
						if err := receiver.Import(ks, oldP, at); err != nil {
							t.Fatal(err)
						}
					}
				}
				now := t0.Add(10 * time.Second)
				if !oneByOne {
					ks, _ := sender.Export(key, now)
					if err := receiver.Import(ks, oldP, now); err != nil {
						t.Fatal(err)
					}
				}
				if d, _ := receiver.Peek(key, oldP, 1, now); d.Allowed || d.Remaining != 0 {
					t.Fatalf("under its old limit 5 with 8 units: %+v, want refused", d)
				}
				admitted := 0
				for range 10 {
					if d, _ := receiver.Allow(key, newP, 1, now); d.Allowed {
						admitted++
					}
				}
				if admitted != 2 {
					t.Fatalf("under the new limit 10 with the sender's 8 units the receiver admitted %d, want 2", admitted)
				}
			})
		}
	}
}
