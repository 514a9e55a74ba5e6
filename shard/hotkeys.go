package shard

import (
	"bytes"
	"cmp"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"
)

const (
	// defaultHotKeysCapacity is used when NewHotKeys is given capacity <= 0.
	defaultHotKeysCapacity = 64
	// defaultHotKeysHalfLife is used when NewHotKeys is given halfLife <= 0.
	defaultHotKeysHalfLife = 10 * time.Second
	// hotKeysRenormExp bounds the forward-decay scale factor at 2^40. Past it
	// every counter is rescaled and the landmark moves to the current time, so
	// scaled counters stay far from float64 overflow (2^1024) while keeping
	// the full 53-bit mantissa for the increments.
	hotKeysRenormExp = 40
	// hotKeysPrealloc caps what NewHotKeys allocates up front, so a huge
	// capacity from a caller costs memory only as keys actually arrive.
	hotKeysPrealloc = 4096
)

// HotKey is one entry reported by HotKeys.Top. All values are decayed to the
// time passed to Top.
type HotKey struct {
	// Key is the canonical key string given to Record.
	Key string
	// Rate estimates the key's hit rate in hits per second: Count·ln2/halfLife,
	// which equals the true rate for a key hit at a steady rate for many
	// half-lives.
	Rate float64
	// Count is the exponentially decayed hit count (a hit h half-lives ago
	// weighs 2^-h). It never underestimates the key's true decayed count.
	Count float64
	// Error bounds the overestimate: the true decayed count lies in
	// [Count-Error, Count]. It is zero for keys tracked since their first hit.
	Error float64
}

// hotSlot is one tracked key. Its storage index is stable while the key is
// tracked; pos is its position in the min-heap.
type hotSlot struct {
	// key is the tracked key, a string over buf: a key that takes over
	// the slot is copied into buf when it fits, so a tracker full of
	// short-lived keys does not allocate for each (buf is written only
	// while key is out of the index, and Top copies the keys it returns).
	key string
	buf []byte
	err float64 // forward-decay scaled Space-Saving error
	pos int
}

// hotNode is one min-heap element. The count lives in the heap itself so a
// sift compares adjacent memory instead of chasing slot indices.
type hotNode struct {
	count float64 // forward-decay scaled count (relative to the landmark)
	slot  int
}

// HotKeys tracks the heaviest keys by exponentially decayed hit count in
// bounded memory, using the Space-Saving (stream-summary) algorithm: at most
// capacity keys are tracked; when a new key arrives and the tracker is full,
// it takes over the lightest entry, inheriting that entry's count as its
// error bound.
//
// What Space-Saving guarantees, for decayed counts at any one time and for
// exactly the hits given to Record (a caller that records only a sample of
// its traffic gets these bounds for the sample, not for the traffic):
//
//   - Let min be the smallest Count in the tracker (0 while it is not
//     full); min is at most total/capacity, where total is the decayed sum
//     of all recorded hits. A key that is not tracked has a true decayed
//     count of at most min. So a key whose true decayed count exceeds
//     total/capacity is always tracked; lighter keys may or may not be.
//   - A tracked key's Count over-estimates its true decayed count by at
//     most its Error, and Error is at most min. Count never
//     under-estimates.
//
// Nothing more is promised: ranks among keys whose counts differ by less
// than min may be wrong, and a tracked light key may be displaced at any
// time.
//
// Decay uses forward decay: a hit at time t is stored with weight
// 2^((t-landmark)/halfLife), so Record touches only one entry; counters are
// rescaled and the landmark moved when the weight would exceed 2^40.
//
// Time never moves backward inside a tracker: a now earlier than the latest
// time given to Record is treated as that latest time.
//
// HotKeys is safe for concurrent use; one mutex guards it. Record is
// O(log capacity) and does not allocate once the tracker is full and its
// slots have room for the keys that take them over.
// The zero value is not usable; call NewHotKeys.
type HotKeys struct {
	mu       sync.Mutex
	capacity int
	halfLife time.Duration
	perSec   float64 // ln2 / halfLife in seconds: converts Count into Rate

	started  bool
	landmark time.Time // forward-decay reference time
	last     time.Time // latest time seen by Record
	scale    float64   // 2^((last-landmark)/halfLife), cached for bursts at one time

	slots []hotSlot      // tracked keys, stable indices
	heap  []hotNode      // min-heap ordered by count
	index map[string]int // key -> slot index
}

// NewHotKeys returns a tracker of at most capacity distinct keys whose counts
// halve every halfLife without hits. capacity <= 0 means 64; halfLife <= 0
// means 10 s.
func NewHotKeys(capacity int, halfLife time.Duration) *HotKeys {
	if capacity <= 0 {
		capacity = defaultHotKeysCapacity
	}
	if halfLife <= 0 {
		halfLife = defaultHotKeysHalfLife
	}
	pre := min(capacity, hotKeysPrealloc)
	return &HotKeys{
		capacity: capacity,
		halfLife: halfLife,
		perSec:   math.Ln2 / halfLife.Seconds(),
		scale:    1,
		slots:    make([]hotSlot, 0, pre),
		heap:     make([]hotNode, 0, pre),
		index:    make(map[string]int, pre),
	}
}

// Record adds hits for key at time now. key is an opaque, already-encoded
// canonical key; the tracker keeps its own copy. hits <= 0 is ignored. A now
// earlier than the latest recorded time counts as that latest time.
func (h *HotKeys) Record(key string, hits int64, now time.Time) {
	// The bytes are only read, and copied before they are kept.
	h.RecordBytes(unsafe.Slice(unsafe.StringData(key), len(key)), hits, now)
}

// RecordBytes is Record for a key held in a byte slice (such as a stack
// buffer). The tracker copies the bytes when it starts tracking a key and
// never retains key; it allocates only while it fills, or for a key longer
// than the slot it takes over has held.
func (h *HotKeys) RecordBytes(key []byte, hits int64, now time.Time) {
	if hits <= 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	w := float64(hits) * h.advanceLocked(now)

	if i, ok := h.index[string(key)]; ok {
		p := h.slots[i].pos
		h.heap[p].count += w
		h.downLocked(p)
		return
	}

	if len(h.slots) < h.capacity {
		i := len(h.slots)
		// Clone so the tracker never pins a caller's larger buffer (or a
		// string built over mutable bytes); the slot keeps the copy for
		// the keys that take it over later.
		buf := bytes.Clone(key)
		k := unsafe.String(unsafe.SliceData(buf), len(buf))
		h.slots = append(h.slots, hotSlot{key: k, buf: buf, pos: len(h.heap)})
		h.heap = append(h.heap, hotNode{count: w, slot: i})
		h.index[k] = i
		h.upLocked(len(h.heap) - 1)
		return
	}

	// Space-Saving replacement: the new key takes over the minimum entry.
	// Its true count is at most min + w, so min is its error bound.
	root := &h.heap[0]
	i := root.slot
	s := &h.slots[i]
	delete(h.index, s.key)
	if cap(s.buf) < len(key) {
		s.buf = make([]byte, 0, len(key))
	}
	s.buf = append(s.buf[:0], key...)
	k := unsafe.String(unsafe.SliceData(s.buf), len(s.buf))
	s.key = k
	s.err = root.count
	root.count += w
	h.index[k] = i
	h.downLocked(0)
}

// advanceLocked moves the tracker's clock to now (never backward) and returns
// the forward-decay weight of one hit at that time. Callers hold h.mu.
func (h *HotKeys) advanceLocked(now time.Time) float64 {
	if !h.started {
		h.started = true
		h.landmark, h.last, h.scale = now, now, 1
		return 1
	}
	if !now.After(h.last) {
		// Equal or earlier time: reuse the weight at last. Clamping keeps
		// every stored weight a non-decreasing function of arrival order, so
		// a backward clock cannot inflate or corrupt old counters.
		return h.scale
	}
	h.last = now
	// now.Sub saturates at about 292 years, so x is finite; a huge x simply
	// renormalises every old counter to zero below.
	x := float64(now.Sub(h.landmark)) / float64(h.halfLife)
	if x > hotKeysRenormExp {
		h.renormLocked(x)
		h.landmark = now
		x = 0
	}
	h.scale = math.Exp2(x)
	return h.scale
}

// renormLocked rescales every counter by 2^-x, the decay between the old
// landmark and the new one. Scaling by a positive factor keeps the heap order
// (underflow to zero only creates ties). Callers hold h.mu.
func (h *HotKeys) renormLocked(x float64) {
	f := math.Exp2(-x)
	for i := range h.heap {
		h.heap[i].count *= f
	}
	for i := range h.slots {
		h.slots[i].err *= f
	}
}

// Top returns at most k tracked keys, heaviest first, with counts decayed to
// now (or to the latest recorded time, if now is earlier). Equal counts are
// ordered by key. It returns nil when k <= 0 or nothing is tracked. The caller
// owns the returned slice. Top does not change the tracker's state.
func (h *HotKeys) Top(k int, now time.Time) []HotKey {
	if k <= 0 {
		return nil
	}
	h.mu.Lock()
	n := len(h.slots)
	if n == 0 {
		h.mu.Unlock()
		return nil
	}
	if now.Before(h.last) {
		now = h.last
	}
	x := float64(now.Sub(h.landmark)) / float64(h.halfLife)
	out := make([]HotKey, n)
	for i, nd := range h.heap {
		s := &h.slots[nd.slot]
		out[i] = HotKey{Key: strings.Clone(s.key), Count: nd.count, Error: s.err}
	}
	h.mu.Unlock()

	// Sort on the scaled counts: the order is the same as the decayed one,
	// and it survives even when decaying underflows to zero.
	slices.SortFunc(out, func(a, b HotKey) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	out = out[:min(k, n):min(k, n)]
	f := math.Exp2(-x)
	for i := range out {
		out[i].Count *= f
		out[i].Error *= f
		out[i].Rate = out[i].Count * h.perSec
	}
	return out
}

// Len returns the number of tracked keys, never more than the capacity.
func (h *HotKeys) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.slots)
}

// lessLocked orders heap positions a and b by count. Callers hold h.mu.
func (h *HotKeys) lessLocked(a, b int) bool {
	return h.heap[a].count < h.heap[b].count
}

// swapLocked swaps heap positions a and b and keeps each slot's pos in step.
// Callers hold h.mu.
func (h *HotKeys) swapLocked(a, b int) {
	h.heap[a], h.heap[b] = h.heap[b], h.heap[a]
	h.slots[h.heap[a].slot].pos = a
	h.slots[h.heap[b].slot].pos = b
}

// upLocked restores the heap after the entry at position j got lighter than
// (or was added below) its parent. Callers hold h.mu.
func (h *HotKeys) upLocked(j int) {
	for j > 0 {
		p := (j - 1) / 2
		if !h.lessLocked(j, p) {
			return
		}
		h.swapLocked(j, p)
		j = p
	}
}

// downLocked restores the heap after the entry at position j got heavier.
// Callers hold h.mu.
func (h *HotKeys) downLocked(j int) {
	n := len(h.heap)
	for {
		l := 2*j + 1
		if l >= n {
			return
		}
		c := l
		if r := l + 1; r < n && h.lessLocked(r, l) {
			c = r
		}
		if !h.lessLocked(c, j) {
			return
		}
		h.swapLocked(j, c)
		j = c
	}
}
