// Package ring decides which member owns a key.
//
// It owns member identity for placement (a member is a non-empty name), the
// ring parameters (Config: partition count, replication factor, load factor;
// the hasher is fixed to xxhash64), and the immutable Snapshot built from one
// complete member list: key bytes → partition → owner, the backup owner, the
// snapshot's version, and the Config fingerprint. Placement is that of
// github.com/buraksezer/consistent v1.0.0 (consistent hashing with bounded
// loads), restated in placement.go so one set of ring positions serves every
// ring New needs; the tests keep the library as the reference. ring validates
// every input first; where the library would still panic (every position of
// a member colliding, not reachable with xxhash), New returns an error.
//
// Guarantees:
//
//   - Deterministic placement: the same member set, in any order, with the
//     same Config gives the same owner (and backup) for every key on every
//     node, and the same MembersHash. Owner equals the library's LocateKey.
//   - Placement is a cluster-wide contract: Config.Fingerprint covers the
//     parameters, the pinned library version, the hasher and this package's
//     scheme. Changing any of them is a protocol change; peers compare
//     fingerprints and must not mix rings that differ.
//   - Bounded movement: one join or leave moves only a bounded share of the
//     partitions (about 1/members plus the library's load rebalancing), and
//     Backup names where a key goes when its owner leaves.
//   - A Snapshot is never mutated after New. Owner, Backup and Partition take
//     no lock and allocate nothing, so they are safe on the hot path from any
//     number of goroutines.
//
// Sizing: PartitionsFor gives the partition count for the size a cluster is
// expected to reach (16 partitions a member past 16 members), chosen when
// the cluster is founded; size.go says why, TestPartitionSpread measures
// the spread it gives.
//
// What it does not do: it keeps no membership state and never changes a
// snapshot (a change is a new snapshot from the whole list, published by the
// caller); it knows nothing of memberlist, gRPC, shard or peer; it starts no
// goroutines, does no I/O, no logging and reads no clock; and it does not
// interpret keys, which arrive already encoded as bytes.
package ring
