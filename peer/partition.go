package peer

import (
	"sync"

	"github.com/ringlimit/ringlimit/shard"
)

// Partitions. A key belongs to the ring partition of its (tenant,
// subject) — never of the policy — so one holder has every policy of a
// subject, and keys move only with their partition (each partition's keys
// live in a store of their own).
//
// Who holds a partition is the ownership log's business (logown.go drives
// it; the rules are stated once in package internal/ownership): a holder
// decides only while the log's table names it at its current liveness
// epoch and its liveness lease holds on its own clock. The ring names
// each partition's target, which the log's leader moves holders toward.
// partTable mirrors, per partition, what the table says, under the
// partition's lock, so that routing, replication and the decision path
// read memory only: the role, holder, epoch and backup published by the
// log, the store, and on a backup its copy of the holder's keys.
type partTable struct {
	parts []part
}

// role is what a node is for one partition.
type role uint8

const (
	// roleNone: the node knows nothing of the partition's holder.
	roleNone role = iota
	// roleHolder: the node holds the partition and decides while it may.
	roleHolder
	// roleFenced: the table names this node holder, but it may not decide
	// now (its liveness lapsed, or the partition is moving or raising
	// its copy).
	roleFenced
	// roleHint: the table names another member holder; routing only.
	roleHint
)

var roleNames = [...]string{"none", "holder", "fenced", "hint"}

func (r role) String() string { return roleNames[r] }

// part is one partition as this node sees it. mu is the partition's gate:
// a local decision holds it in read mode from the role check to the end of
// the store decision; every role change takes it in write mode, so no
// decision lands on a store that has just been fenced or given away.
type part struct {
	id int
	mu sync.RWMutex

	role   role
	epoch  uint64 // the partition epoch the table names
	holder string // the holder: this node when holding, else where to go
	// store is the partition's keys: as holder, the deciding store; as
	// backup, the copy replication adds to.
	store *shard.Store
	// backup is the member the table names backup ("" for none).
	backup string
	// changed is closed and replaced at every role change, so requests
	// waiting for a transfer wake up.
	changed chan struct{}

	// Backup side: the copy being received from the holder; it becomes
	// the store only when complete, so a copy that fails half-way never
	// costs the one before it. rep is the complete copy's header.
	rep  replica
	next replica
}

// replica is a copy of a partition from its holder.
type replica struct {
	holder string
	epoch  uint64
	// copySeq is the copy's sequence in the log's machine (carried in
	// SYNC_BEGIN's, chunks' and SYNC_END's HolderEpoch): chunks and the
	// end of another copy are refused.
	copySeq uint64
	// seq is the newest replication message (ReplicateRequest.Seq) from
	// holder whose ADMIT or REPLACE this copy applied; older ones are not
	// applied (they arrived late).
	seq      uint64
	complete bool // a full copy arrived (SYNC_END)
	// store receives the copy under way (next); once complete it becomes
	// the partition's store.
	store *shard.Store
}

// setRoleLocked changes the partition's role and wakes its waiters. Called
// with p.mu held for writing.
func (p *part) setRoleLocked(r role, holder string, epoch uint64) {
	p.role, p.holder, p.epoch = r, holder, epoch
	close(p.changed)
	p.changed = make(chan struct{})
}

func newPartTable(n int) *partTable {
	t := &partTable{parts: make([]part, n)}
	for i := range t.parts {
		t.parts[i].id = i
		t.parts[i].changed = make(chan struct{})
	}
	return t
}

// placementScheme names how keys map to partitions; it is part of the
// cluster fingerprint.
const placementScheme = "tenant-subject/v1"

// placement returns the bytes of ek (a key's canonical encoding) that place
// it: the encoded tenant and subject, without the policy.
func placement(ek []byte) []byte {
	n := 1 + int(ek[0])
	n += 1 + int(ek[n])
	return ek[:n]
}
