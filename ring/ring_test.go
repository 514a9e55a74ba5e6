package ring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/buraksezer/consistent"
	"github.com/cespare/xxhash/v2"
)

// seed drives every random choice in these tests; it is printed on failure
// through the helpers' messages so a failing run can be replayed.
const seed = 20240611

// names returns n member names "node-0" … "node-(n-1)".
func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("node-%d", i)
	}
	return out
}

// without returns members minus name, as a new slice.
func without(members []string, name string) []string {
	return slices.DeleteFunc(slices.Clone(members), func(m string) bool { return m == name })
}

// testKeys returns n deterministic keys of mixed shape: random bytes of
// varying length and structured, length-prefixed-looking keys.
func testKeys(n int) [][]byte {
	r := rand.New(rand.NewPCG(seed, 1))
	keys := make([][]byte, n)
	for i := range keys {
		if i%2 == 0 {
			k := make([]byte, 1+r.IntN(48))
			for j := range k {
				k[j] = byte(r.Uint32())
			}
			keys[i] = k
		} else {
			keys[i] = fmt.Appendf(nil, "\x06tenant\x07user-%d\x05login", i)
		}
	}
	return keys
}

func mustNew(t testing.TB, cfg Config, members []string, version uint64) *Snapshot {
	t.Helper()
	s, err := New(cfg, members, version)
	if err != nil {
		t.Fatalf("New(%+v, %d members %v, %d) = %v, want nil error", cfg, len(members), members, version, err)
	}
	return s
}

// libraryRing builds the ring library's own view of members, the reference
// Owner must match.
func libraryRing(cfg Config, members []string) *consistent.Consistent {
	return newConsistent(cfg.WithDefaults(), members, libraryHasher(xxhash.Sum64))
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name     string
		cfg      Config
		problems int // 0 means valid
	}{
		{name: "zero takes defaults", cfg: Config{}},
		{name: "explicit defaults", cfg: Config{PartitionCount: 271, ReplicationFactor: 20, Load: 1.25}},
		{name: "smallest", cfg: Config{PartitionCount: 1, ReplicationFactor: 1, Load: 1}},
		{name: "largest", cfg: Config{PartitionCount: MaxPartitionCount, ReplicationFactor: MaxReplicationFactor, Load: math.MaxFloat64}},
		{name: "negative partitions", cfg: Config{PartitionCount: -1}, problems: 1},
		{name: "too many partitions", cfg: Config{PartitionCount: MaxPartitionCount + 1}, problems: 1},
		{name: "min int partitions", cfg: Config{PartitionCount: math.MinInt}, problems: 1},
		{name: "negative replication", cfg: Config{ReplicationFactor: -3}, problems: 1},
		{name: "too much replication", cfg: Config{ReplicationFactor: MaxReplicationFactor + 1}, problems: 1},
		{name: "load below one", cfg: Config{Load: 0.99}, problems: 1},
		{name: "negative load", cfg: Config{Load: -1.25}, problems: 1},
		{name: "NaN load", cfg: Config{Load: math.NaN()}, problems: 1},
		{name: "+Inf load", cfg: Config{Load: math.Inf(1)}, problems: 1},
		{name: "-Inf load", cfg: Config{Load: math.Inf(-1)}, problems: 1},
		{name: "all bad at once", cfg: Config{PartitionCount: -1, ReplicationFactor: -1, Load: 0.5}, problems: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.problems == 0 {
				if err != nil {
					t.Fatalf("Validate(%+v) = %v, want nil", tt.cfg, err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate(%+v) = %v, want error wrapping ErrInvalidConfig", tt.cfg, err)
			}
			joined, ok := err.(interface{ Unwrap() []error })
			if !ok || len(joined.Unwrap()) != tt.problems {
				t.Fatalf("Validate(%+v) = %q, want %d joined problems", tt.cfg, err, tt.problems)
			}
			for _, e := range joined.Unwrap() {
				if !errors.Is(e, ErrInvalidConfig) {
					t.Errorf("problem %q does not wrap ErrInvalidConfig", e)
				}
			}
			// New must refuse the same config, before the library sees it.
			if _, err := New(tt.cfg, names(3), 1); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("New(%+v) = %v, want ErrInvalidConfig", tt.cfg, err)
			}
		})
	}
}

func TestConfigWithDefaults(t *testing.T) {
	tests := []struct {
		name string
		in   Config
		want Config
	}{
		{name: "zero", in: Config{}, want: Config{PartitionCount: 271, ReplicationFactor: 20, Load: 1.25}},
		{name: "set kept", in: Config{PartitionCount: 7, ReplicationFactor: 3, Load: 2}, want: Config{PartitionCount: 7, ReplicationFactor: 3, Load: 2}},
		{name: "invalid kept for Validate", in: Config{PartitionCount: -1, Load: 0.5}, want: Config{PartitionCount: -1, ReplicationFactor: 20, Load: 0.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.in.WithDefaults(); got != tt.want {
				t.Fatalf("%+v.WithDefaults() = %+v, want %+v", tt.in, got, tt.want)
			}
		})
	}
}

func TestNewErrors(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		members []string
		want    []error // every sentinel the error must wrap
		notWant []error
	}{
		{name: "nil list", members: nil, want: []error{ErrNoMembers}, notWant: []error{ErrInvalidMember, ErrInvalidConfig}},
		{name: "empty list", members: []string{}, want: []error{ErrNoMembers}, notWant: []error{ErrInvalidMember}},
		{name: "duplicate", members: []string{"a", "b", "a"}, want: []error{ErrInvalidMember}, notWant: []error{ErrNoMembers}},
		{name: "duplicate only", members: []string{"a", "a"}, want: []error{ErrInvalidMember}},
		{name: "empty name", members: []string{"a", ""}, want: []error{ErrInvalidMember}},
		{name: "only empty names", members: []string{"", ""}, want: []error{ErrInvalidMember}, notWant: []error{ErrNoMembers}},
		{name: "bad config and no members", cfg: Config{Load: 0.5}, members: nil, want: []error{ErrInvalidConfig, ErrNoMembers}},
		{name: "bad config and bad member", cfg: Config{PartitionCount: -5}, members: []string{"x", "x"}, want: []error{ErrInvalidConfig, ErrInvalidMember}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.cfg, tt.members, 1)
			if err == nil || s != nil {
				t.Fatalf("New(%+v, %q) = %v, %v; want nil snapshot and an error", tt.cfg, tt.members, s, err)
			}
			for _, w := range tt.want {
				if !errors.Is(err, w) {
					t.Errorf("New(%+v, %q) = %q, want it to wrap %q", tt.cfg, tt.members, err, w)
				}
			}
			for _, nw := range tt.notWant {
				if errors.Is(err, nw) {
					t.Errorf("New(%+v, %q) = %q, must not wrap %q", tt.cfg, tt.members, err, nw)
				}
			}
		})
	}
}

func TestNewErrorNamesDuplicate(t *testing.T) {
	_, err := New(Config{}, []string{"b", "a", "b", "c", "a", "a"}, 1)
	msg := fmt.Sprint(err)
	for _, want := range []string{`duplicate name "a"`, `duplicate name "b"`} {
		if strings.Count(msg, want) != 1 {
			t.Errorf("New error %q: want %s exactly once", msg, want)
		}
	}
}

// TestNewShapes builds rings at the edges of the valid parameter space,
// including fewer partitions than members, and checks the library did not
// panic (New would have turned that into an error) and that every partition
// has an owner within the load bound.
func TestNewShapes(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		members int
	}{
		{name: "one member", cfg: Config{}, members: 1},
		{name: "one partition many members", cfg: Config{PartitionCount: 1}, members: 10},
		{name: "fewer partitions than members", cfg: Config{PartitionCount: 7}, members: 40},
		{name: "replication one load one", cfg: Config{PartitionCount: 271, ReplicationFactor: 1, Load: 1}, members: 9},
		{name: "load one prime", cfg: Config{PartitionCount: 1021, Load: 1}, members: 13},
		{name: "divisible partitions load one", cfg: Config{PartitionCount: 240, Load: 1}, members: 16},
		{name: "huge load", cfg: Config{Load: math.MaxFloat64}, members: 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			members := names(tt.members)
			s := mustNew(t, tt.cfg, members, 1)
			cfg := tt.cfg.WithDefaults()
			limit := math.Ceil(float64(cfg.PartitionCount) / float64(tt.members) * cfg.Load)
			total := 0
			for _, m := range members {
				n := s.PartitionsOwned(m)
				if float64(n) > limit {
					t.Errorf("%s owns %d partitions, above the load bound %v", m, n, limit)
				}
				total += n
			}
			if total != cfg.PartitionCount {
				t.Errorf("partitions owned sum to %d, want %d", total, cfg.PartitionCount)
			}
			for p := range cfg.PartitionCount {
				if !s.Has(s.members[s.owner[p]]) {
					t.Fatalf("partition %d has no member owner", p)
				}
			}
		})
	}
}

func TestSameMembersAnyOrder(t *testing.T) {
	keys := testKeys(10_000)
	r := rand.New(rand.NewPCG(seed, 2))
	for _, n := range []int{1, 2, 5, 16} {
		t.Run(fmt.Sprintf("members=%d", n), func(t *testing.T) {
			ref := mustNew(t, Config{}, names(n), 1)
			for trial := range 5 {
				shuffled := names(n)
				r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
				s := mustNew(t, Config{}, shuffled, 1)
				if s.MembersHash() != ref.MembersHash() {
					t.Fatalf("trial %d order %q: MembersHash %x, want %x", trial, shuffled, s.MembersHash(), ref.MembersHash())
				}
				for _, k := range keys {
					if got, want := s.Owner(k), ref.Owner(k); got != want {
						t.Fatalf("trial %d order %q: Owner(%q) = %q, sorted order gives %q", trial, shuffled, k, got, want)
					}
					if got, want := s.Backup(k), ref.Backup(k); got != want {
						t.Fatalf("trial %d order %q: Backup(%q) = %q, sorted order gives %q", trial, shuffled, k, got, want)
					}
				}
			}
		})
	}
}

// TestIndependentSnapshotsAgree builds the same ring concurrently, as two
// nodes would, and compares every lookup.
func TestIndependentSnapshotsAgree(t *testing.T) {
	members := []string{"10.0.0.7:7946", "10.0.0.3:7946", "10.0.0.5:7946", "10.0.0.11:7946"}
	var (
		wg   sync.WaitGroup
		snap [2]*Snapshot
		errs [2]error
	)
	for i := range snap {
		wg.Go(func() {
			m := slices.Clone(members)
			if i == 1 {
				slices.Reverse(m)
			}
			snap[i], errs[i] = New(Config{PartitionCount: 1021}, m, 9)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("build %d: New = %v", i, err)
		}
	}
	a, b := snap[0], snap[1]
	if a.MembersHash() != b.MembersHash() || a.Version() != b.Version() || a.Config().Fingerprint() != b.Config().Fingerprint() {
		t.Fatalf("snapshots differ: hash %x/%x version %d/%d", a.MembersHash(), b.MembersHash(), a.Version(), b.Version())
	}
	for _, k := range testKeys(10_000) {
		if a.Owner(k) != b.Owner(k) || a.Backup(k) != b.Backup(k) || a.Partition(k) != b.Partition(k) {
			t.Fatalf("key %q: owner %q/%q backup %q/%q partition %d/%d",
				k, a.Owner(k), b.Owner(k), a.Backup(k), b.Backup(k), a.Partition(k), b.Partition(k))
		}
	}
	for _, m := range members {
		if a.PartitionsOwned(m) != b.PartitionsOwned(m) {
			t.Errorf("PartitionsOwned(%q) = %d/%d", m, a.PartitionsOwned(m), b.PartitionsOwned(m))
		}
	}
}

func TestOwnerMatchesLibrary(t *testing.T) {
	keys := testKeys(10_000)
	tests := []struct {
		name    string
		cfg     Config
		members int
	}{
		{name: "defaults/members=1", cfg: Config{}, members: 1},
		{name: "defaults/members=3", cfg: Config{}, members: 3},
		{name: "defaults/members=10", cfg: Config{}, members: 10},
		{name: "partitions=7/members=40", cfg: Config{PartitionCount: 7}, members: 40},
		{name: "partitions=1021/replication=50/load=1", cfg: Config{PartitionCount: 1021, ReplicationFactor: 50, Load: 1}, members: 17},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			members := names(tt.members)
			s := mustNew(t, tt.cfg, members, 1)
			lib := libraryRing(tt.cfg, members)
			for _, k := range keys {
				want := lib.LocateKey(k).String()
				if got := s.Owner(k); got != want {
					t.Fatalf("Owner(%q) = %q, library LocateKey = %q", k, got, want)
				}
				if got, want := s.Partition(k), lib.FindPartitionID(k); got != want {
					t.Fatalf("Partition(%q) = %d, library FindPartitionID = %d", k, got, want)
				}
				if got, want := s.PartitionOfHash(xxhash.Sum64(k)), lib.FindPartitionID(k); got != want {
					t.Fatalf("PartitionOfHash(xxhash(%q)) = %d, library FindPartitionID = %d", k, got, want)
				}
			}
		})
	}
}

// TestMovementBounded checks that one join or one leave among 5..10 members
// changes the owner of a bounded share of partitions. Plain consistent
// hashing moves about 1/N; bounded loads add some rebalancing on top. With
// the default parameters the worst case measured over these member lists is
// about 1.75/N (N = the larger member count), so 2/N is the bound: it fails
// if placement ever degrades towards rehashing everything.
func TestMovementBounded(t *testing.T) {
	configs := []Config{{}, {PartitionCount: 1021}}
	for _, cfg := range configs {
		for n := 5; n <= 10; n++ {
			t.Run(fmt.Sprintf("partitions=%d/members=%d", cfg.WithDefaults().PartitionCount, n), func(t *testing.T) {
				members := names(n)
				base := mustNew(t, cfg, members, 1)
				// Leave: each member in turn.
				for _, gone := range members {
					after := mustNew(t, cfg, without(members, gone), 2)
					checkMoved(t, "leave "+gone, base, after, n)
					// Everything the leaver owned must move, and only to
					// where Backup said it would.
					for p := range base.owner {
						if base.members[base.owner[p]] == gone && after.members[after.owner[p]] != base.members[base.backup[p]] {
							t.Fatalf("leave %s: partition %d went to %q, Backup said %q",
								gone, p, after.members[after.owner[p]], base.members[base.backup[p]])
						}
					}
				}
				// Join: several different newcomers.
				for j := range 8 {
					joiner := fmt.Sprintf("joiner-%d", j)
					after := mustNew(t, cfg, append(slices.Clone(members), joiner), 2)
					checkMoved(t, "join "+joiner, base, after, n+1)
				}
			})
		}
	}
}

func checkMoved(t *testing.T, change string, before, after *Snapshot, larger int) {
	t.Helper()
	moved := 0
	for p := range before.owner {
		if before.members[before.owner[p]] != after.members[after.owner[p]] {
			moved++
		}
	}
	limit := 2 * len(before.owner) / larger
	if moved > limit {
		t.Errorf("%s: %d of %d partitions changed owner, want <= %d (2/N, N=%d)",
			change, moved, len(before.owner), limit, larger)
	}
}

func TestBackup(t *testing.T) {
	keys := testKeys(2_000)
	tests := []struct {
		name    string
		cfg     Config
		members int
	}{
		{name: "defaults/members=2", cfg: Config{}, members: 2},
		{name: "defaults/members=5", cfg: Config{}, members: 5},
		{name: "defaults/members=12", cfg: Config{}, members: 12},
		{name: "partitions=7/members=20", cfg: Config{PartitionCount: 7}, members: 20},
		{name: "partitions=1021/load=1", cfg: Config{PartitionCount: 1021, Load: 1}, members: 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			members := names(tt.members)
			s := mustNew(t, tt.cfg, members, 1)
			minus := map[string]*Snapshot{}
			for _, k := range keys {
				owner, backup := s.Owner(k), s.Backup(k)
				if backup == "" || backup == owner {
					t.Fatalf("key %q: Backup = %q, Owner = %q; want a different member", k, backup, owner)
				}
				r, ok := minus[owner]
				if !ok {
					r = mustNew(t, tt.cfg, without(members, owner), 2)
					minus[owner] = r
				}
				if want := r.Owner(k); backup != want {
					t.Fatalf("key %q: Backup = %q, owner without %q is %q", k, backup, owner, want)
				}
			}
		})
	}
	t.Run("single member has none", func(t *testing.T) {
		s := mustNew(t, Config{}, []string{"solo"}, 1)
		for _, k := range keys[:100] {
			if got := s.Backup(k); got != "" {
				t.Fatalf("Backup(%q) = %q on a single-member ring, want \"\"", k, got)
			}
		}
	})
}

// recordingHasher records every input the library hashes.
type recordingHasher struct{ seen map[string]bool }

func (h recordingHasher) Sum64(b []byte) uint64 {
	h.seen[string(b)] = true
	return xxhash.Sum64(b)
}

// TestReplicaKeyMatchesLibrary pins replicaKey to the bytes the library
// hashes for virtual nodes; placement is only exact if they agree.
func TestReplicaKeyMatchesLibrary(t *testing.T) {
	const partitions, replication = 5, 4
	members := []string{"a", "node-11", "1:x"}
	h := recordingHasher{seen: map[string]bool{}}
	list := make([]consistent.Member, len(members))
	for i, m := range members {
		list[i] = member(m)
	}
	consistent.New(list, consistent.Config{Hasher: h, PartitionCount: partitions, ReplicationFactor: replication, Load: 1.25})
	for p := range partitions { // partition positions: little-endian ids
		delete(h.seen, string(binary.LittleEndian.AppendUint64(nil, uint64(p))))
	}
	want := map[string]bool{}
	for _, m := range members {
		for i := range replication {
			want[string(replicaKey(nil, m, i))] = true
		}
	}
	if len(h.seen) != len(want) {
		t.Fatalf("library hashed %d ring keys %q, replicaKey gives %d %q", len(h.seen), slices.Sorted(maps.Keys(h.seen)), len(want), slices.Sorted(maps.Keys(want)))
	}
	for k := range want {
		if !h.seen[k] {
			t.Errorf("replicaKey produced %q, which the library never hashed (it hashed %q)", k, slices.Sorted(maps.Keys(h.seen)))
		}
	}
}

func TestFingerprint(t *testing.T) {
	base := Config{}
	stable := []struct {
		name string
		cfg  Config
	}{
		{name: "zero again", cfg: Config{}},
		{name: "explicit defaults", cfg: Config{PartitionCount: 271, ReplicationFactor: 20, Load: 1.25}},
		{name: "partial defaults", cfg: Config{ReplicationFactor: 20}},
	}
	for _, tt := range stable {
		t.Run("stable/"+tt.name, func(t *testing.T) {
			if got, want := tt.cfg.Fingerprint(), base.Fingerprint(); got != want {
				t.Fatalf("%+v.Fingerprint() = %x, want %x (same placement as %+v)", tt.cfg, got, want, base)
			}
		})
	}
	changed := []struct {
		name string
		cfg  Config
	}{
		{name: "partitions+1", cfg: Config{PartitionCount: 272}},
		{name: "partitions=1", cfg: Config{PartitionCount: 1}},
		{name: "replication+1", cfg: Config{ReplicationFactor: 21}},
		{name: "replication=1", cfg: Config{ReplicationFactor: 1}},
		{name: "load next float", cfg: Config{Load: math.Nextafter(1.25, 2)}},
		{name: "load=1", cfg: Config{Load: 1}},
		{name: "swap partitions and replication", cfg: Config{PartitionCount: 20, ReplicationFactor: 271}},
	}
	seen := map[uint64]string{base.Fingerprint(): "base"}
	for _, tt := range changed {
		t.Run("changed/"+tt.name, func(t *testing.T) {
			fp := tt.cfg.Fingerprint()
			if prev, dup := seen[fp]; dup {
				t.Fatalf("%+v.Fingerprint() = %x, same as %s", tt.cfg, fp, prev)
			}
			seen[fp] = tt.name
			if again := tt.cfg.Fingerprint(); again != fp {
				t.Fatalf("%+v.Fingerprint() not stable: %x then %x", tt.cfg, fp, again)
			}
		})
	}
}

// TestPlacementGolden pins the placement of a fixed member list and the
// default fingerprint. Placement is a cluster-wide contract: if this fails
// after a dependency bump or a code change, nodes of different builds would
// disagree on owners. Change the scheme or library constant (so the
// fingerprint changes and mixed clusters are detected), then the goldens.
func TestPlacementGolden(t *testing.T) {
	const (
		wantFingerprint = 0x9c695d958c6c66f4
		wantPlacement   = 0x3a67907821f2bb34
	)
	s := mustNew(t, Config{}, []string{"alpha", "bravo", "charlie", "delta"}, 1)
	d := xxhash.New()
	for p := range s.owner {
		_, _ = d.WriteString(s.members[s.owner[p]] + "/" + s.members[s.backup[p]] + "\n")
	}
	if got := (Config{}).Fingerprint(); got != wantFingerprint {
		t.Errorf("default Fingerprint = %#x, want %#x", got, uint64(wantFingerprint))
	}
	if got := d.Sum64(); got != wantPlacement {
		t.Errorf("placement hash = %#x, want %#x", got, uint64(wantPlacement))
	}
}

func TestAccessors(t *testing.T) {
	in := []string{"c", "a", "b"}
	s := mustNew(t, Config{PartitionCount: 101}, in, 42)
	in[0] = "mutated" // New must not retain the caller's slice
	if got, want := s.Members(), []string{"a", "b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("Members() = %q, want %q", got, want)
	}
	m := s.Members()
	m[0] = "zzz" // the caller owns the copy
	if got := s.Members()[0]; got != "a" {
		t.Fatalf("Members()[0] = %q after caller mutation, want \"a\"", got)
	}
	if s.Len() != 3 || s.Version() != 42 {
		t.Fatalf("Len, Version = %d, %d; want 3, 42", s.Len(), s.Version())
	}
	if want := (Config{PartitionCount: 101, ReplicationFactor: 20, Load: 1.25}); s.Config() != want {
		t.Fatalf("Config() = %+v, want %+v", s.Config(), want)
	}
	tests := []struct {
		name  string
		has   bool
		owned bool
	}{
		{name: "a", has: true, owned: true},
		{name: "b", has: true, owned: true},
		{name: "c", has: true, owned: true},
		{name: "mutated", has: false},
		{name: "", has: false},
		{name: "d", has: false},
	}
	total := 0
	for _, tt := range tests {
		if got := s.Has(tt.name); got != tt.has {
			t.Errorf("Has(%q) = %v, want %v", tt.name, got, tt.has)
		}
		n := s.PartitionsOwned(tt.name)
		if (n > 0) != tt.owned {
			t.Errorf("PartitionsOwned(%q) = %d, want owned=%v", tt.name, n, tt.owned)
		}
		total += n
	}
	if total != 101 {
		t.Errorf("PartitionsOwned sums to %d, want 101", total)
	}
	for _, k := range testKeys(100) {
		if p := s.Partition(k); p < 0 || p >= 101 {
			t.Fatalf("Partition(%q) = %d, want in [0, 101)", k, p)
		}
	}
	other := mustNew(t, Config{}, []string{"a", "b", "c", "d"}, 42)
	if other.MembersHash() == s.MembersHash() {
		t.Errorf("MembersHash equal for different member lists")
	}
	// Length prefixes keep ["ab","c"] and ["a","bc"] apart.
	x, y := mustNew(t, Config{}, []string{"ab", "c"}, 1), mustNew(t, Config{}, []string{"a", "bc"}, 1)
	if x.MembersHash() == y.MembersHash() {
		t.Errorf("MembersHash(%q) == MembersHash(%q)", x.Members(), y.Members())
	}
}

func TestZeroSnapshot(t *testing.T) {
	var s Snapshot
	k := []byte("key")
	if s.Owner(k) != "" || s.Backup(k) != "" || s.Partition(k) != -1 || s.PartitionOfHash(1) != -1 || s.Len() != 0 || s.Has("a") ||
		s.PartitionsOwned("a") != 0 || len(s.Members()) != 0 {
		t.Fatalf("zero Snapshot lookups: owner %q backup %q partition %d len %d", s.Owner(k), s.Backup(k), s.Partition(k), s.Len())
	}
}

func TestLookupsDoNotAllocate(t *testing.T) {
	s := mustNew(t, Config{}, names(16), 1)
	keys := testKeys(64)
	var sink string
	var sinkInt int
	i := 0
	tests := []struct {
		name string
		fn   func()
	}{
		{name: "Owner", fn: func() { sink = s.Owner(keys[i%len(keys)]); i++ }},
		{name: "Backup", fn: func() { sink = s.Backup(keys[i%len(keys)]); i++ }},
		{name: "Partition", fn: func() { sinkInt = s.Partition(keys[i%len(keys)]); i++ }},
		{name: "Has", fn: func() { sinkInt++; _ = s.Has("node-7") }},
		{name: "PartitionsOwned", fn: func() { sinkInt = s.PartitionsOwned("node-7") }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if n := testing.AllocsPerRun(1000, tt.fn); n != 0 {
				t.Fatalf("%s allocates %.1f times per call, want 0", tt.name, n)
			}
		})
	}
	_, _ = sink, sinkInt
}
