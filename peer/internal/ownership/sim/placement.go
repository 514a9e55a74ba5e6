package sim

import (
	"slices"
	"strconv"
)

// This file is gossip's placement of partitions on the members a view
// lists (View.Target and View.Second): for each partition, the two
// incarnations with the highest hash(p, id). Computed directly it costs
// members × partitions hashes for every member's view at every gossip
// round, which at 1 024 members is a billion hashes a round; so each
// partition keeps its few highest incarnations ever seen (topK), a view
// walks them, and only a view that lists fewer than two of them scans
// its members. Identical views (every member's, at rest) share one
// answer, which the machine only reads. The answer is the direct
// computation's, hash ties aside (64-bit hashes).

// topK is how many incarnations each partition keeps in its ranking.
const topK = 8

// ranked is one incarnation in a partition's ranking.
type ranked struct {
	h  uint64
	ix int32
}

// placed is one view's placement.
type placed struct {
	view           []string
	target, second []string
}

type placement struct {
	parts int
	ix    map[string]int32 // incarnation ID → index in ids
	ids   []string
	top   [][]ranked // per partition, the highest incarnations first
	in    []bool     // scratch: incarnations the view being placed lists
	cache []placed   // the views placed lately, newest last
	buf   []byte
}

func newPlacement(parts int) *placement {
	return &placement{parts: parts, ix: map[string]int32{}, top: make([][]ranked, parts)}
}

// add ranks a new incarnation in every partition.
func (pl *placement) add(id string) {
	if _, ok := pl.ix[id]; ok {
		return
	}
	ix := int32(len(pl.ids))
	pl.ix[id] = ix
	pl.ids = append(pl.ids, id)
	pl.in = append(pl.in, false)
	for p := range pl.parts {
		h := pl.hash(p, id)
		t := pl.top[p]
		if len(t) == topK && h <= t[topK-1].h {
			continue
		}
		i := len(t)
		for i > 0 && t[i-1].h < h {
			i--
		}
		t = slices.Insert(t, i, ranked{h, ix})
		if len(t) > topK {
			t = t[:topK]
		}
		pl.top[p] = t
	}
}

// place returns view's targets and seconds (shared: read only).
func (pl *placement) place(view []string) (target, second []string) {
	for i := len(pl.cache) - 1; i >= 0; i-- {
		if c := pl.cache[i]; slices.Equal(c.view, view) {
			return c.target, c.second
		}
	}
	for _, id := range view {
		pl.in[pl.ix[id]] = true
	}
	target, second = make([]string, pl.parts), make([]string, pl.parts)
	for p := range pl.parts {
		t := pl.top[p]
		found := 0
		for _, r := range t {
			if !pl.in[r.ix] {
				continue
			}
			if found == 0 {
				target[p] = pl.ids[r.ix]
			} else {
				second[p] = pl.ids[r.ix]
			}
			if found++; found == 2 {
				break
			}
		}
		if found < 2 && len(t) == topK && len(view) > found {
			target[p], second[p] = pl.scan(p, view)
		}
	}
	for _, id := range view {
		pl.in[pl.ix[id]] = false
	}
	if len(pl.cache) == 8 {
		pl.cache = slices.Delete(pl.cache, 0, 1)
	}
	pl.cache = append(pl.cache, placed{view, target, second})
	return target, second
}

// scan is the direct computation for one partition.
func (pl *placement) scan(p int, view []string) (best, second string) {
	var bh, sh uint64
	for _, id := range view {
		h := pl.hash(p, id)
		switch {
		case best == "" || h > bh:
			second, sh = best, bh
			best, bh = id, h
		case second == "" || h > sh:
			second, sh = id, h
		}
	}
	return best, second
}

// hash is FNV-1a (64 bits) of "p/id", as hash in sim.go.
func (pl *placement) hash(p int, id string) uint64 {
	pl.buf = strconv.AppendInt(pl.buf[:0], int64(p), 10)
	pl.buf = append(pl.buf, '/')
	pl.buf = append(pl.buf, id...)
	return fnv64a(pl.buf)
}

func fnv64a(b []byte) uint64 {
	const (
		offset = 14695981039346656037
		prime  = 1099511628211
	)
	h := uint64(offset)
	for _, c := range b {
		h ^= uint64(c)
		h *= prime
	}
	return h
}
