package ring

import "fmt"

// Sizing the ring for a cluster. The partition count is fixed when a
// cluster is founded: partition = xxhash64(key) mod PartitionCount, so a
// different count puts nearly every key in another partition, and it is
// part of Config.Fingerprint, so members with different counts never share
// a ring. Choose it for the largest size the cluster is expected to reach.
//
// Why a count per member: a partition is the unit of ownership, so a member
// owns whole partitions. With bounded loads no member owns more than
// ceil(PartitionCount/members × Load), but nothing stops the walk from
// leaving a member with few or none: the default 271 partitions over 1 024
// members leave about three members in four with nothing to decide while
// the rest hold one. TestPartitionSpread measures the spread at 32, 256 and
// 1 024 members: at PartitionsPerMember (16) per member no member is empty,
// the least loaded holds at least 2, the median 16 and the most 21 (the
// cap at Load 1.25).
//
// Why not more: every partition is a row of the ownership table, a
// unit moved (copied, fenced, committed) when its holder changes, and a
// slot in a routed client's placement table; a member restarting moves
// about its own share, so the cost of a rolling deploy per member stays
// flat at a fixed count per member. Building a Snapshot grows with the
// count (about 20 ms and 1.1 MB for 1 024 members and 16 411 partitions,
// BenchmarkRingNew in bench/).

// PartitionsPerMember is how many partitions PartitionsFor plans for each
// expected member.
const PartitionsPerMember = 16

// MaxExpectedMembers is the largest member count PartitionsFor takes: its
// partition count stays within MaxPartitionCount.
const MaxExpectedMembers = 4000

// PartitionsFor returns the partition count for a cluster expected to
// grow to members members: DefaultPartitionCount up to 16 members (so a
// small cluster places keys as one with a zero Config), beyond that the
// smallest prime at least PartitionsPerMember × members (1 024 members:
// 16 411). A count outside [1, MaxExpectedMembers] is an error wrapping
// ErrInvalidConfig. Every member of a cluster must be given the same
// count (it is part of the fingerprint); a member that is not is left out
// of the others' rings and says so.
func PartitionsFor(members int) (int, error) {
	if members < 1 || members > MaxExpectedMembers {
		return 0, fmt.Errorf("%w: expected members %d outside [1, %d]", ErrInvalidConfig, members, MaxExpectedMembers)
	}
	p := PartitionsPerMember * members
	if p <= DefaultPartitionCount {
		return DefaultPartitionCount, nil
	}
	for !prime(p) {
		p++
	}
	return p, nil
}

// prime reports whether n (at least 2) is prime; n stays below
// MaxPartitionCount, so trial division is cheap.
func prime(n int) bool {
	for d := 2; d*d <= n; d++ {
		if n%d == 0 {
			return false
		}
	}
	return n >= 2
}
