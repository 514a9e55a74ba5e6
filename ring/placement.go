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
// contributor. placement keeps one sorted slice of owners for the full ring
// and walks it for every ring New needs: x's positions drop out of a walk
// when x counts as full, and the few collided positions x owns are handed to
// their next contributor for that walk. Copies of a position left behind by
// x (owned by someone else) sit next to that owner's own copy and so cannot
// change where a walk stops. No sorting, hashing or maps per ring.
// library_test.go checks the tables against the library's over random member
// lists, with a hasher that collides as well as with xxhash. A placement is
// scratch for one New: run rewrites walk while it works, so it is not safe
// for concurrent use.
type placement struct {
	partitions int
	load       float64
	// walk holds the owner of every position in ring order, twice over, so
	// that a walk of one full circle from any start never wraps.
	walk  []uint32
	start []uint32 // partition -> index into walk where its walk begins
	// first is walk[start[p]]: nearly every partition lands on the first
	// member it meets (bench: 1.03 positions visited on average at 256
	// members), so the common case reads one table, not two.
	first  []uint32
	shared []shared // collided positions with more than one contributor
}

// shared is a position several members hash to, owned by the highest of
// them; next takes it over in the ring without owner.
type shared struct {
	i           uint32 // index into the first half of walk
	owner, next uint32
}

// full is the load that marks a member as absent: never below a capacity.
const full = math.MaxInt32

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
	n := len(vnodes)
	pl := &placement{
		partitions: cfg.PartitionCount,
		load:       cfg.Load,
		walk:       make([]uint32, 2*n),
		start:      make([]uint32, cfg.PartitionCount),
		first:      make([]uint32, cfg.PartitionCount),
	}
	pos := make([]uint64, n)
	for lo := 0; lo < n; {
		hi := lo + 1
		for hi < n && vnodes[hi].pos == vnodes[lo].pos {
			hi++
		}
		owner := vnodes[hi-1].from
		for j := lo; j < hi; j++ {
			pos[j] = vnodes[j].pos
			pl.walk[j], pl.walk[n+j] = owner, owner
		}
		for j := hi - 2; j >= lo; j-- {
			if vnodes[j].from != owner {
				for k := lo; k < hi; k++ {
					pl.shared = append(pl.shared, shared{i: uint32(k), owner: owner, next: vnodes[j].from})
				}
				break
			}
		}
		lo = hi
	}
	var buf [8]byte
	for p := range pl.start {
		binary.LittleEndian.PutUint64(buf[:], uint64(p))
		i, _ := slices.BinarySearch(pos, sum64(buf[:])) // first position >= hash
		if i == n {
			i = 0
		}
		pl.start[p] = uint32(i)
		pl.first[p] = pl.walk[i]
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
	n := len(pl.walk) / 2
	if skip != none {
		loads[skip] = full
		pl.handOver(skip, false)
		defer pl.handOver(skip, true)
	}
	for p := range out {
		if m := pl.first[p]; loads[m] < capacity {
			loads[m]++
			out[p] = m
			continue
		}
		// One full circle visits every position of the ring without skip
		// at least once, which is as far as the library walks.
		i := int(pl.start[p])
		w := pl.walk[i+1 : i+n]
		j := 0
		for j < len(w) && loads[w[j]] >= capacity {
			j++
		}
		if j == len(w) {
			return false
		}
		m := w[j]
		loads[m]++
		out[p] = m
	}
	return true
}

// handOver gives the collided positions owned by x to their next
// contributor, as the ring without x has them, or back to x when undo is set.
// first still names x for a partition whose walk starts at such a position;
// run counts x as full, and a collided position has at least two copies, so
// that walk goes on to the next copy, which names the new owner.
func (pl *placement) handOver(x uint32, undo bool) {
	n := uint32(len(pl.walk) / 2)
	for _, sh := range pl.shared {
		if sh.owner != x {
			continue
		}
		m := sh.next
		if undo {
			m = x
		}
		pl.walk[sh.i], pl.walk[n+sh.i] = m, m
	}
}
