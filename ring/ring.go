package ring

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// Defaults applied by Config.WithDefaults to zero fields. They are the
// defaults of the pinned ring library, so a zero Config places keys exactly
// as the library's own defaults would.
const (
	DefaultPartitionCount    = 271
	DefaultReplicationFactor = 20
	DefaultLoad              = 1.25
)

// Upper bounds enforced by Config.Validate. They keep a mistyped parameter
// from turning New into an unbounded allocation; real clusters sit far below
// them (the build cost of New grows with both, see New).
const (
	MaxPartitionCount    = 1 << 16
	MaxReplicationFactor = 1 << 10
)

// Placement identity fed into Config.Fingerprint. Changing the ring library
// version, the hasher, or how this package derives partitions and backups
// from the library changes placement, so each is part of the fingerprint:
// peers that disagree on any of them must not share a ring.
const (
	// scheme names this package's use of the library: partition =
	// xxhash64(key) mod PartitionCount, owner from the library's partition
	// table, backup = owner in the ring without the primary owner.
	scheme = "ringlimit/ring/v1"
	// library is the pinned ring library whose placement this package
	// reproduces. New no longer calls it (placement.go restates its
	// algorithm), but the tables are bit-identical to what it gives for
	// the same member list — the tests compare them over random lists — so
	// the placement function, and with it the fingerprint, is unchanged.
	// If the restatement ever departs from the library, change this (or
	// scheme) so peers of different builds do not mix. Keep it in step
	// with go.mod, where the library stays as the tests' reference.
	library = "github.com/buraksezer/consistent@v1.0.0"
	// hasherName names the hash used for keys and ring positions.
	hasherName = "xxhash64"
)

// noBackup marks a partition without a backup (a single-member ring).
const noBackup = math.MaxUint32

// Config holds the ring parameters. Every node of a cluster must use the same
// values (compare Fingerprint); they are a protocol constant, not a tuning
// knob that may differ between peers. The hasher is fixed to xxhash64.
type Config struct {
	// PartitionCount is the number of partitions keys are hashed into; a
	// partition is the unit of ownership and of movement on membership
	// change. Zero means 271. At most MaxPartitionCount. It should be well
	// above the member count, or some members own nothing: PartitionsFor
	// gives a count for the size a cluster is expected to reach. It is
	// fixed for the cluster's life (keys would change partitions).
	PartitionCount int
	// ReplicationFactor is the number of virtual nodes per member on the
	// hash circle. Zero means 20. At most MaxReplicationFactor.
	ReplicationFactor int
	// Load is the bounded-load factor: no member owns more than
	// ceil(PartitionCount/members*Load) partitions. Zero means 1.25. Must be
	// at least 1 and finite.
	Load float64
}

// WithDefaults returns a copy of c with every zero field set to its default.
// Negative or otherwise invalid values are kept so that Validate reports them.
func (c Config) WithDefaults() Config {
	if c.PartitionCount == 0 {
		c.PartitionCount = DefaultPartitionCount
	}
	if c.ReplicationFactor == 0 {
		c.ReplicationFactor = DefaultReplicationFactor
	}
	if c.Load == 0 {
		c.Load = DefaultLoad
	}
	return c
}

// Validate reports every out-of-range parameter of c after defaults, joined;
// each wraps ErrInvalidConfig. It returns nil for a usable Config.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	if c.PartitionCount < 1 || c.PartitionCount > MaxPartitionCount {
		errs = append(errs, fmt.Errorf("%w: partition count %d outside [1, %d]",
			ErrInvalidConfig, c.PartitionCount, MaxPartitionCount))
	}
	if c.ReplicationFactor < 1 || c.ReplicationFactor > MaxReplicationFactor {
		errs = append(errs, fmt.Errorf("%w: replication factor %d outside [1, %d]",
			ErrInvalidConfig, c.ReplicationFactor, MaxReplicationFactor))
	}
	// A load below 1 leaves less room than there are partitions and makes
	// the library panic; the negated comparison also catches NaN.
	if !(c.Load >= 1) || math.IsInf(c.Load, 0) {
		errs = append(errs, fmt.Errorf("%w: load %v must be finite and >= 1",
			ErrInvalidConfig, c.Load))
	}
	return errors.Join(errs...)
}

// Fingerprint identifies the placement function defined by c: a hash of the
// defaulted parameters together with the pinned ring library version, the
// hasher and this package's placement scheme. Two nodes with equal
// fingerprints place every key identically for the same member list; any
// parameter change changes it. It is meant to be gossiped and compared.
func (c Config) Fingerprint() uint64 {
	c = c.WithDefaults()
	d := xxhash.New()
	var buf [8]byte
	writeString := func(s string) {
		binary.LittleEndian.PutUint64(buf[:], uint64(len(s)))
		_, _ = d.Write(buf[:])
		_, _ = d.WriteString(s)
	}
	writeUint := func(v uint64) {
		binary.LittleEndian.PutUint64(buf[:], v)
		_, _ = d.Write(buf[:])
	}
	writeString(scheme)
	writeString(library)
	writeString(hasherName)
	writeUint(uint64(c.PartitionCount))
	writeUint(uint64(c.ReplicationFactor))
	writeUint(math.Float64bits(c.Load))
	return d.Sum64()
}

// Snapshot is the immutable placement of keys for one complete member list.
// It is never modified after New returns, so it is safe for concurrent use by
// any number of goroutines without locking; publish it through an atomic
// pointer. The zero Snapshot has no members: lookups return "" and -1.
type Snapshot struct {
	cfg         Config
	version     uint64
	members     []string // sorted, unique
	owner       []uint32 // partition -> index into members
	backup      []uint32 // partition -> index into members, or noBackup
	owned       []int    // index into members -> partitions owned
	membersHash uint64
}

// New builds the snapshot for the complete member list members under cfg and
// tags it with version (an opaque number chosen by the caller, typically
// incremented on every rebuild). Member order does not matter: the same set
// yields the same placement on every node. New does not retain members.
//
// Errors: ErrNoMembers for an empty list; ErrInvalidMember for an empty or
// duplicated name; ErrInvalidConfig for a bad cfg. Problems are joined.
//
// Cost: one placement pass for the owners and one per owning member for the
// backups (see buildTables), with no maps and a few allocations of
// O(members × ReplicationFactor + PartitionCount). See BenchmarkRingNew in
// bench/ for figures. Call it on membership change, not per request, and
// coalesce bursts of changes into one rebuild.
func New(cfg Config, members []string, version uint64) (*Snapshot, error) {
	cfg = cfg.WithDefaults()
	var errs []error
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	sorted := slices.Clone(members)
	slices.Sort(sorted)
	if len(sorted) == 0 {
		errs = append(errs, ErrNoMembers)
	}
	for i, name := range sorted {
		if name == "" {
			if i == 0 { // sorted: all empty names are at the front
				errs = append(errs, fmt.Errorf("%w: empty name", ErrInvalidMember))
			}
			continue
		}
		if i > 0 && sorted[i-1] == name && (i == 1 || sorted[i-2] != name) {
			errs = append(errs, fmt.Errorf("%w: duplicate name %q", ErrInvalidMember, name))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	s := &Snapshot{
		cfg:         cfg,
		version:     version,
		members:     sorted,
		owner:       make([]uint32, cfg.PartitionCount),
		backup:      make([]uint32, cfg.PartitionCount),
		owned:       make([]int, len(sorted)),
		membersHash: membersHash(sorted),
	}
	if err := s.buildTables(xxhash.Sum64); err != nil {
		return nil, err
	}
	return s, nil
}

// buildTables fills s.owner, s.owned and s.backup, hashing ring positions
// with sum64 (xxhash64; tests pass a colliding hash to exercise collisions).
//
// The backup of a partition is its owner in the ring without the partition's
// primary owner: exactly where the key goes if that owner leaves, so a replica
// kept there is already in place when the primary is gone. That is one
// placement per member that owns anything, each from scratch: with bounded
// loads the cap changes with the member count and every partition placed
// after the first moved one can shift, so re-placing only the leaver's
// partitions would not be exact. placement makes each pass cheap
// (no sorting, hashing or maps), and a pass stops at the member's last
// partition.
func (s *Snapshot) buildTables(sum64 func([]byte) uint64) error {
	pl := newPlacement(s.cfg, s.members, sum64)
	n := len(s.members)
	loads := make([]int32, n)
	if !pl.run(none, pl.capacity(n), loads, s.owner) {
		return errNoRoom(n)
	}
	for _, m := range s.owner {
		s.owned[m]++
	}
	if n == 1 {
		for p := range s.backup {
			s.backup[p] = noBackup
		}
		return nil
	}
	// byOwner lists each member's partitions in order, from at[m] to
	// at[m+1], so a pass reads back only the partitions it is for.
	at := make([]int, n+1)
	for _, m := range s.owner {
		at[m+1]++
	}
	for m := range n {
		at[m+1] += at[m]
	}
	byOwner := make([]uint32, len(s.owner))
	next := slices.Clone(at[:n])
	for p, m := range s.owner {
		byOwner[next[m]] = uint32(p)
		next[m]++
	}
	scratch := make([]uint32, len(s.owner))
	capacity := pl.capacity(n - 1)
	for x := range uint32(n) {
		mine := byOwner[at[x]:at[x+1]]
		if len(mine) == 0 {
			continue // owns nothing, so it is nobody's primary
		}
		clear(loads)
		// Partitions after x's last cannot change those before it.
		out := scratch[:mine[len(mine)-1]+1]
		if !pl.run(x, capacity, loads, out) {
			return errNoRoom(n - 1)
		}
		for _, p := range mine {
			s.backup[p] = out[p]
		}
	}
	return nil
}

// errNoRoom reports a ring on which the library would panic for lack of
// room. Validate rules out every parameter that can cause that; what remains
// is a member whose ring positions all collide with others' (not reachable
// with xxhash and realistic names).
func errNoRoom(members int) error {
	return fmt.Errorf("%w: cannot place partitions on a ring of %d members", ErrInvalidMember, members)
}

// replicaKey appends the bytes the library hashes for virtual node i of name
// ("i:name", consistent v1.0.0) to dst.
func replicaKey(dst []byte, name string, i int) []byte {
	dst = strconv.AppendInt(dst, int64(i), 10)
	dst = append(dst, ':')
	return append(dst, name...)
}

// membersHash hashes the sorted names, each prefixed by its length so that
// different lists never produce the same byte stream.
func membersHash(sorted []string) uint64 {
	d := xxhash.New()
	var buf [8]byte
	for _, name := range sorted {
		binary.LittleEndian.PutUint64(buf[:], uint64(len(name)))
		_, _ = d.Write(buf[:])
		_, _ = d.WriteString(name)
	}
	return d.Sum64()
}

// Partition returns the partition of key, in [0, PartitionCount), computed as
// the ring library does: xxhash64(key) mod PartitionCount. It returns -1 on
// the zero Snapshot. It does not allocate.
func (s *Snapshot) Partition(key []byte) int {
	if len(s.owner) == 0 {
		return -1
	}
	return int(xxhash.Sum64(key) % uint64(len(s.owner)))
}

// PartitionOfHash is Partition for a key whose xxhash64 is h, for a caller
// that hashed the key already (shard.Placed.Hash): Partition(key) ==
// PartitionOfHash(xxhash64(key)). It returns -1 on the zero Snapshot.
func (s *Snapshot) PartitionOfHash(h uint64) int {
	if len(s.owner) == 0 {
		return -1
	}
	return int(h % uint64(len(s.owner)))
}

// Owner returns the member that owns key: the same member the ring library's
// LocateKey returns for this member list and Config. It takes no lock and
// does not allocate. key is not retained.
func (s *Snapshot) Owner(key []byte) string {
	if len(s.owner) == 0 {
		return ""
	}
	return s.members[s.owner[xxhash.Sum64(key)%uint64(len(s.owner))]]
}

// Backup returns the member that would own key if Owner(key) left: the owner
// of key in the snapshot built from the same members minus Owner(key). It
// never equals Owner(key), and it is "" when there is only one member. It
// takes no lock and does not allocate.
func (s *Snapshot) Backup(key []byte) string {
	if len(s.backup) == 0 {
		return ""
	}
	b := s.backup[xxhash.Sum64(key)%uint64(len(s.backup))]
	if b == noBackup {
		return ""
	}
	return s.members[b]
}

// Members returns the member names in ascending order. The slice is a fresh
// copy owned by the caller.
func (s *Snapshot) Members() []string { return slices.Clone(s.members) }

// Len returns the number of members.
func (s *Snapshot) Len() int { return len(s.members) }

// Has reports whether name is a member.
func (s *Snapshot) Has(name string) bool {
	_, ok := slices.BinarySearch(s.members, name)
	return ok
}

// Version returns the version passed to New.
func (s *Snapshot) Version() uint64 { return s.version }

// MembersHash returns a hash of the member set (names sorted, each length
// prefixed, xxhash64). Nodes that see the same membership get the same value
// regardless of the order they learned it in, so it is a cheap way to check
// that two snapshots describe the same list.
func (s *Snapshot) MembersHash() uint64 { return s.membersHash }

// PartitionsOwned returns the number of partitions name owns; 0 for a
// non-member or a member that owns none.
func (s *Snapshot) PartitionsOwned(name string) int {
	i, ok := slices.BinarySearch(s.members, name)
	if !ok {
		return 0
	}
	return s.owned[i]
}

// Config returns the Config the snapshot was built with, defaults applied.
func (s *Snapshot) Config() Config { return s.cfg }

// PartitionCount returns the number of partitions; 0 on the zero Snapshot.
func (s *Snapshot) PartitionCount() int { return len(s.owner) }

// PartitionOwner returns the member that owns partition p, or "" when p is
// out of range. It takes no lock and does not allocate.
func (s *Snapshot) PartitionOwner(p int) string {
	if p < 0 || p >= len(s.owner) {
		return ""
	}
	return s.members[s.owner[p]]
}

// PartitionBackup returns the member that would own partition p if its
// owner left; "" with one member or when p is out of range. It takes no lock
// and does not allocate.
func (s *Snapshot) PartitionBackup(p int) string {
	if p < 0 || p >= len(s.backup) || s.backup[p] == noBackup {
		return ""
	}
	return s.members[s.backup[p]]
}
