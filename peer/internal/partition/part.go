package partition

import (
	"sync"

	"github.com/ringlimit/ringlimit/shard"
)

// Role is what a node is for one partition.
type Role uint8

const (
	// RoleNone: the node knows nothing of the partition's holder.
	RoleNone Role = iota
	// RoleHolder: the node holds the partition and decides while it may.
	RoleHolder
	// RoleFenced: the table names this node holder, but it may not decide
	// now (its liveness lapsed, or the partition is moving or raising its
	// copy).
	RoleFenced
	// RoleHint: the table names another member holder; routing only.
	RoleHint
)

var roleNames = [...]string{"none", "holder", "fenced", "hint"}

func (r Role) String() string { return roleNames[r] }

// Part is one partition as this node sees it. Mu is the partition's gate:
// a decision holds it from the role check to the end of the store update
// (in read mode, or in write mode for an exclusive operation); every role
// change takes it in write mode, so no decision lands on a store that has
// just been fenced or given away. The fields below Mu are guarded by it.
type Part struct {
	ID int
	Mu sync.RWMutex

	Role   Role
	Epoch  uint64 // the partition epoch the table names
	Holder string // the holder: this node when holding, else where to go
	// Store is the partition's keys: as holder, the deciding store; as
	// backup, the copy replication adds to.
	Store *shard.Store
	// Backup is the member the table names backup ("" for none).
	Backup string
	// Changed is closed and replaced at every role change, so requests
	// waiting for a transfer wake up.
	Changed chan struct{}

	// The backup's side: the copy being received from the holder (Next);
	// it becomes the store only when complete, so a copy that fails
	// half-way never costs the one before it. Rep is the complete copy's
	// header.
	Rep  Replica
	Next Replica
}

// Replica is a copy of a partition from its holder.
type Replica struct {
	Holder string
	Epoch  uint64
	// CopySeq is the copy's sequence in the log's machine (carried in
	// SYNC_BEGIN's, chunks' and SYNC_END's HolderEpoch): chunks and the
	// end of another copy are refused.
	CopySeq uint64
	// Seq is the newest replication message (ReplicateRequest.Seq) from
	// Holder whose ADMIT or REPLACE this copy applied; older ones are not
	// applied (they arrived late).
	Seq      uint64
	Complete bool // a full copy arrived (SYNC_END)
	// Store receives the copy under way (Next); once complete it becomes
	// the partition's store.
	Store *shard.Store
}

// SetRoleLocked changes the partition's role and wakes its waiters. Called
// with p.Mu held for writing.
func (p *Part) SetRoleLocked(r Role, holder string, epoch uint64) {
	p.Role, p.Holder, p.Epoch = r, holder, epoch
	close(p.Changed)
	p.Changed = make(chan struct{})
}

// NewParts returns n partitions that know nothing yet (RoleNone).
func NewParts(n int) []Part {
	parts := make([]Part, n)
	for i := range parts {
		parts[i].ID = i
		parts[i].Changed = make(chan struct{})
	}
	return parts
}
