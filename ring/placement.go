package ring

import (
	"encoding/binary"
	"math"
	"slices"
)

// none marks "no member" in placement's member-index fields.
const none = math.MaxUint32

// placement is the ring library's partition placement (consistent v1.0.0,
// distributePartitions), restated over flat arrays so that one set of sorted
// ring positions serves the full ring and every ring with one member removed.
//
// The library, for a member list in the order given (New passes it sorted):
//
//   - puts virtual node r of member m at position hash("r:m") in a sorted
//     slice that keeps duplicate positions, and maps each position to a
//     member in a map, so on a collision the member added last (the highest
//     index) owns every copy of that position;
//   - caps every member at avg = ceil(PartitionCount / members * Load);
//   - for partition p = 0, 1, … in order, starts at the first position ≥
//     hash(little-endian uint64 p), wrapping to 0, and walks forward to the
//     first position whose member holds fewer than avg partitions so far; a
//     full circle without one is a panic ("not enough room").
//
// The ring without member x is the same sorted slice minus x's positions,
// and a collided position's owner becomes the highest remaining
// contributor. So placement keeps each position's contributor, its owner in
// the full ring and its owner should that one leave, and walks the one
// slice skipping x: from scratch for that member list, without sorting or
// hashing again. ring_test.go checks the tables against the library's over
// random member lists, with a hasher that collides as well as with xxhash.
type placement struct {
	partitions int
	load       float64
	pos        []uint64 // sorted positions, duplicates kept, as the library's
	ents       []entry  // parallel to pos
	start      []uint32 // partition -> index into pos where its walk begins
}

// entry describes one virtual node position.
type entry struct {
	from   uint32 // member whose virtual node this is
	owner  uint32 // member the library maps the position to: highest contributor
	second uint32 // highest contributor other than owner, or none
}

// newPlacement lays out the ring for the sorted, unique members with sum64 as
// the hash (xxhash64 outside tests). cfg must have passed Validate.
func newPlacement(cfg Config, members []string, sum64 func([]byte) uint64) *placement {
	type vnode struct {
		pos  uint64
		from uint32
	}
	vnodes := make([]vnode, 0, len(members)*cfg.ReplicationFactor)
	var key []byte
	for i, name := range members {
		for r := range cfg.ReplicationFactor {
			key = replicaKey(key[:0], name, r)
			vnodes = append(vnodes, vnode{pos: sum64(key), from: uint32(i)})
		}
	}
	// Sorting by contributor within a position puts the library's owner of a
	// collided position (the member added last) at the end of its run.
	slices.SortFunc(vnodes, func(a, b vnode) int {
		if a.pos != b.pos {
			if a.pos < b.pos {
				return -1
			}
			return 1
		}
		return int(a.from) - int(b.from)
	})
	pl := &placement{
		partitions: cfg.PartitionCount,
		load:       cfg.Load,
		pos:        make([]uint64, len(vnodes)),
		ents:       make([]entry, len(vnodes)),
		start:      make([]uint32, cfg.PartitionCount),
	}
	for lo := 0; lo < len(vnodes); {
		hi := lo + 1
		for hi < len(vnodes) && vnodes[hi].pos == vnodes[lo].pos {
			hi++
		}
		owner, second := vnodes[hi-1].from, uint32(none)
		for j := hi - 2; j >= lo; j-- {
			if vnodes[j].from != owner {
				second = vnodes[j].from
				break
			}
		}
		for j := lo; j < hi; j++ {
			pl.pos[j] = vnodes[j].pos
			pl.ents[j] = entry{from: vnodes[j].from, owner: owner, second: second}
		}
		lo = hi
	}
	var buf [8]byte
	for p := range pl.start {
		binary.LittleEndian.PutUint64(buf[:], uint64(p))
		h := sum64(buf[:])
		i, _ := slices.BinarySearch(pl.pos, h) // first position >= h
		if i == len(pl.pos) {
			i = 0
		}
		pl.start[p] = uint32(i)
	}
	return pl
}

// capacity returns the library's per-member cap for a ring of members
// members, clamped to the partition count (nobody can hold more) so that it
// fits an int32 even for a huge Load. The library compares float loads with
// load+1 <= avg; avg is a whole number, so load < capacity is the same test.
func (pl *placement) capacity(members int) int32 {
	avg := math.Ceil(float64(pl.partitions) / float64(members) * pl.load)
	if avg >= float64(pl.partitions) {
		return int32(pl.partitions)
	}
	return int32(avg)
}

// run places partitions 0 … len(out)-1, in order, on the ring of all members
// except skip (none for the full ring) with per-member cap capacity, and
// writes each partition's member to out. loads must hold zeros on entry, one
// per member. It reports false where the library would panic: a partition
// whose walk went all the way round without finding room.
func (pl *placement) run(skip uint32, capacity int32, loads []int32, out []uint32) bool {
	ents := pl.ents
	for p := range out {
		i := int(pl.start[p])
		placed := false
		// One full circle visits every position of the ring without skip
		// once, which is exactly how far the library walks.
		for range ents {
			e := &ents[i]
			if e.from != skip {
				m := e.owner
				if m == skip {
					m = e.second
				}
				if loads[m] < capacity {
					loads[m]++
					out[p] = m
					placed = true
					break
				}
			}
			if i++; i == len(ents) {
				i = 0
			}
		}
		if !placed {
			return false
		}
	}
	return true
}
