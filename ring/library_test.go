package ring

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

// The ring library is the reference for placement: New restates its
// algorithm (placement.go) and these tests hold the restatement to it.

// member adapts a name to the ring library's Member interface.
type member string

func (m member) String() string { return string(m) }

// libraryHasher adapts a hash func to the ring library's Hasher.
type libraryHasher func([]byte) uint64

func (h libraryHasher) Sum64(b []byte) uint64 { return h(b) }

// newConsistent builds the library ring for members, in the order given,
// under cfg (defaults applied).
func newConsistent(cfg Config, members []string, h consistent.Hasher) *consistent.Consistent {
	list := make([]consistent.Member, len(members))
	for i, name := range members {
		list[i] = member(name)
	}
	return consistent.New(list, consistent.Config{
		Hasher:            h,
		PartitionCount:    cfg.PartitionCount,
		ReplicationFactor: cfg.ReplicationFactor,
		Load:              cfg.Load,
	})
}

// libraryOwners returns the library's owner of every partition as an index
// into members, building the ring from scratch for members (in that order),
// or ok == false if the library panics for lack of room.
func libraryOwners(cfg Config, members []string, sum64 func([]byte) uint64, all []string) (owners []uint32, ok bool) {
	defer func() {
		if recover() != nil {
			owners, ok = nil, false
		}
	}()
	c := newConsistent(cfg, members, libraryHasher(sum64))
	owners = make([]uint32, cfg.PartitionCount)
	for p := range owners {
		i, found := slices.BinarySearch(all, c.GetPartitionOwner(p).String())
		if !found {
			panic(fmt.Sprintf("partition %d owned by a stranger", p))
		}
		owners[p] = uint32(i)
	}
	return owners, true
}

// checkAgainstLibrary builds the tables of the sorted, unique members with
// sum64 and compares them with the library built from scratch: the owner of
// every partition, and the backup of every partition owned by a member for
// which checkBackups is true, against the owner in the library ring built
// from members minus that member. Where the library panics, buildTables must
// return an error instead.
func checkAgainstLibrary(t *testing.T, cfg Config, members []string, sum64 func([]byte) uint64, checkBackups func(i int) bool) {
	t.Helper()
	s := &Snapshot{
		cfg:     cfg,
		members: members,
		owner:   make([]uint32, cfg.PartitionCount),
		backup:  make([]uint32, cfg.PartitionCount),
		owned:   make([]int, len(members)),
	}
	err := s.buildTables(sum64)
	desc := fmt.Sprintf("%+v, %d members %q", cfg, len(members), members)
	if len(members) > 8 {
		desc = fmt.Sprintf("%+v, %d members %q…", cfg, len(members), members[:8])
	}
	want, ok := libraryOwners(cfg, members, sum64, members)
	if !ok {
		if err == nil {
			t.Fatalf("%s: library panics, buildTables = nil error", desc)
		}
		return
	}
	owned := make([]int, len(members))
	for _, o := range want {
		owned[o]++
	}
	if err == nil {
		for p := range want {
			if s.owner[p] != want[p] {
				t.Fatalf("%s: owner of partition %d = %q, library says %q", desc, p, members[s.owner[p]], members[want[p]])
			}
		}
		if !slices.Equal(s.owned, owned) {
			t.Fatalf("%s: owned = %v, library gives %v", desc, s.owned, owned)
		}
	}
	// New fails exactly when the library panics on the full ring or on the
	// ring without a member that owns something; after an error, look at
	// every such ring for the panic that excuses it.
	libFailed := false
	for x := range members {
		if owned[x] == 0 || len(members) == 1 || err == nil && !checkBackups(x) {
			continue
		}
		rest := slices.Delete(slices.Clone(members), x, x+1)
		wantRest, ok := libraryOwners(cfg, rest, sum64, members)
		if !ok {
			libFailed = true
			if err == nil {
				t.Fatalf("%s: library panics without %q, buildTables = nil error", desc, members[x])
			}
			continue
		}
		if err != nil {
			continue
		}
		for p, o := range s.owner {
			if o == uint32(x) && s.backup[p] != wantRest[p] {
				t.Fatalf("%s: partition %d owned by %q: backup %q, library without it says %q",
					desc, p, members[x], members[s.backup[p]], members[wantRest[p]])
			}
		}
	}
	if err != nil {
		if !libFailed {
			t.Fatalf("%s: buildTables = %v, library places every ring", desc, err)
		}
		return
	}
	for p, b := range s.backup {
		if len(members) == 1 {
			if b != noBackup {
				t.Fatalf("%s: single member has backup %d for partition %d", desc, b, p)
			}
		} else if b == s.owner[p] || b >= uint32(len(members)) {
			t.Fatalf("%s: partition %d: backup %d, owner %d", desc, p, b, s.owner[p])
		}
	}
}

// randomMembers returns n unique random names, sorted as New sorts them.
// The alphabet includes ':' and digits so names look like the library's
// "i:name" replica keys.
func randomMembers(r *rand.Rand, n int) []string {
	const alphabet = "abcxyz0123456789:.-"
	seen := make(map[string]bool, n)
	out := make([]string, 0, n)
	for len(out) < n {
		b := make([]byte, 1+r.IntN(16))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		if name := string(b); !seen[name] {
			seen[name] = true
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// randomConfig returns a valid Config, defaults applied, biased towards the
// edges: load 1, fewer partitions than members, one virtual node.
func randomConfig(r *rand.Rand) Config {
	cfg := Config{
		PartitionCount:    []int{1, 7, 271, 1021, 1 + r.IntN(3000)}[r.IntN(5)],
		ReplicationFactor: []int{1, 2, 20, 1 + r.IntN(40)}[r.IntN(4)],
		Load:              []float64{1, 1.01, 1.25, 2, 1 + 3*r.Float64()}[r.IntN(5)],
	}
	return cfg.WithDefaults()
}

// TestTablesMatchLibrary compares owners and backups with the library over
// random member lists of 1 to 300 members and random parameters. Rebuilding
// the library ring is slow (it sorts once per added member, seconds under
// -race at 300 members), so above 24 members the replication factor stays
// at most 20 and backups are checked for two random members per list.
func TestTablesMatchLibrary(t *testing.T) {
	r := rand.New(rand.NewPCG(seed, 3))
	sizes := []int{1, 2, 3, 300}
	for range 40 {
		sizes = append(sizes, 1+r.IntN(24))
	}
	for range 4 {
		sizes = append(sizes, 25+r.IntN(276))
	}
	for i, n := range sizes {
		cfg := randomConfig(r)
		if i == 0 {
			cfg = Config{}.WithDefaults()
		}
		members := randomMembers(r, n)
		picked := make([]bool, n)
		for j := range picked {
			picked[j] = n <= 24
		}
		if n > 24 {
			cfg.ReplicationFactor = min(cfg.ReplicationFactor, 20)
			picked[r.IntN(n)], picked[r.IntN(n)] = true, true
		}
		t.Run(fmt.Sprintf("case=%d/members=%d", i, n), func(t *testing.T) {
			checkAgainstLibrary(t, cfg, members, xxhash.Sum64, func(x int) bool { return picked[x] })
		})
	}
}

// TestTablesMatchLibraryWithCollisions repeats the comparison with a hash of
// a few bits, so virtual nodes share positions (the library then maps a
// position to the member added last) and some rings have no room at all
// (the library panics; New must return an error instead). xxhash makes such
// rings unreachable in production; this pins the behaviour anyway.
func TestTablesMatchLibraryWithCollisions(t *testing.T) {
	r := rand.New(rand.NewPCG(seed, 4))
	for i := range 60 {
		bits := 2 + r.IntN(8)
		sum64 := func(b []byte) uint64 { return xxhash.Sum64(b) >> (64 - bits) << (64 - bits) }
		cfg := randomConfig(r)
		members := randomMembers(r, 1+r.IntN(20))
		t.Run(fmt.Sprintf("case=%d/bits=%d/members=%d", i, bits, len(members)), func(t *testing.T) {
			checkAgainstLibrary(t, cfg, members, sum64, func(int) bool { return true })
		})
	}
}
