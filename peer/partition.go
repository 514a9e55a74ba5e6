package peer

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/shard"
)

// Ownership: partitions with epochs, a replica and a lease.
//
// The rule behind every step: a partition has at most one holder at a time,
// and only the holder decides for its keys. Nothing is inferred from ring
// history or timers; the holder changes only by an explicit step that
// carries an epoch, and epochs only grow.
//
//   - Placement. A key belongs to the ring partition of its (tenant,
//     subject) — never of the policy — so one holder has every policy of a
//     subject. Keys never move alone: a partition's keys live in their own
//     store and move together.
//   - Target vs holder. The ring names each partition's target. The holder
//     changes only by a transfer (transfer.go): the holder makes the target
//     its backup with a complete copy, fences the partition (stops
//     deciding, waits for decisions in progress), and asks the target to
//     take it over (Promote). The target becomes holder at epoch + 1. The
//     old holder keeps a forwarding record (partition → holder, epoch),
//     never evicted, and redirects. A target that is not the holder never
//     decides from empty: its requests wait for the transfer or go to the
//     holder it knows of.
//   - Founding. A node started without Join founds the cluster: it holds
//     every partition at epoch 1. A node that joins holds nothing until
//     partitions are transferred to it.
//   - Replica. The holder copies admissions to the partition's backup (the
//     target while the holder is not the target, else the ring's owner
//     without the holder), synchronously for ReplicateSync policies
//     (replicate.go). A backup keeps one copy per partition, replaced only
//     by a full copy at a newer or equal epoch. A holder begins every copy
//     at an epoch above every copy it began before (copyEpoch): the answer
//     to a copy's last request can be lost with the copy complete on its
//     receiver, and two members must never keep complete copies at one
//     epoch. After such an unknown outcome the holder copies again to its
//     backup at a newer epoch (afterUncertainCopy), or else has no lease
//     until a new copy succeeds (copyUncertain), so the lost copy never
//     lacks a confirmed admission while it is the newest.
//   - Lease. The holder decides only while it holds a lease from its
//     backup. Every answer of the backup to a complete copy, an admission
//     or a heartbeat grants LeaseDuration from when the backup received
//     it; the holder counts 9/10 of it from when it sent the request, on
//     its monotonic clock. So the holder's lease ends before the backup's
//     record of it, provided the two clocks' rates differ by less than
//     10 % (offsets do not matter). A paused or cut-off holder cannot renew
//     and stops deciding; its synchronous admissions fail at the backup
//     too, once the backup has taken over (its epoch is stale).
//   - Takeover. A backup takes a partition over only when its holder has
//     failed in the backup's view, the lease it granted has expired on its
//     own clock, and it sees a majority of the cluster (quorum, below).
//     It continues from its copy at epoch + 1: a crash loses nothing that
//     was replicated synchronously. It yields instead to a newer epoch
//     anywhere, to a live member holding the partition at its copy's
//     epoch (a tie never goes to the copy of a holder that is gone), and
//     to one holding it above the epoch the copy's holder held it at when
//     the copy began (a copy's epoch runs ahead of its holder's, and a
//     member that took over from that holder may decide below it). Two
//     complete copies at one epoch from different holdings, both holders
//     gone (a holder that stalled mid-copy completed it after it was
//     taken over, and the copy's release was lost), are ordered by the
//     epoch each holder held the partition at when it began its copy,
//     kept with the copy and told by Probe, then by names: only the
//     keeper of the first takes over; the other waits (copyClaim). A
//     member that does not tell that epoch (an older version) comes
//     first, so this one never takes over beside it. A
//     member that is leaving takes over too (its copy may be the only
//     one) and hands the partition on with the rest of its drain, which
//     waits for such takeovers while it sees a majority. It keeps the copy
//     of a holder gossip still lists until that holder answers that it has
//     moved on, to an epoch newer than the copy's: one that crashed before
//     copying elsewhere may be declared failed only after two leases, and
//     one restarted since knows nothing of the partition.
//   - A holder whose lease has ended may have been taken over while it
//     paused or was cut off. Before it copies the partition to any member
//     (the backup that granted the lease too: one restarted since its last
//     grant remembers no takeover, and a holder that paused or was cut
//     off may not have heard of the restart), and again when such a copy
//     completes, it asks every live member (stillHolder, confirmHolding; a
//     member marked unreachable is asked too, and, silent, again through
//     every member that answered, since its port may be unreachable from
//     this node only while it decides; only the silence of one no relay
//     reaches either is borne), and learns a newer holding rather than
//     take a lease from a member that has not heard of it. A copy refused
//     as stale teaches it the newer holding too.
//   - A transfer whose Promote got no answer may have taken effect: the
//     old holder stays fenced while the target lives, then waits out the
//     Promote's timeout and the lease it gave the target before it takes
//     the partition back, above every epoch the target may hold it at
//     (settleFenced). The target takes a lease from a Promote only when
//     it arrives within 9/10 of its timeout of the copy's completion on
//     the target's own clock (the sender sent it after that), so a
//     Promote held in the network, whose gRPC deadline would count from
//     when the target's server reads it, leaves the target holding with
//     no lease until its backup, the old holder, grants one or answers
//     stale (server.promote). Its lease is the shorter of its own
//     LeaseDuration and the sender's, which the Promote carries: the
//     sender records a lease of its own length (members may differ while
//     a change rolls out). A takeover gives up if the old holder probed the
//     taking-over member, or renewed its lease, between the takeover's
//     probe and its commit.
//   - Replication keeps each backup's copy in the holder's order: within
//     a message, admissions queued after a refund, reset or lease state
//     (a whole-state replace) are applied after it.
//   - Quorum. A node counts the live members and those that failed (not
//     left) less than FailedMemberTimeout ago; it grants leases, takes
//     over and claims orphans only while it sees a strict majority. One
//     node cut off from the others therefore stays passive, and when a
//     holder's backup failed, the holder keeps deciding only on the
//     majority side. A holder that sees no other member lets its backup
//     go only while it sees a majority (the others left): cut off, it
//     keeps it, so it still needs the lease it can no longer renew, and
//     does not decide from its old state once the cut heals. A member
//     that failed counts as failed from the first view without it.
//   - Two faults at once (holder and backup both failed) lose the
//     partition's state: the partition's target finds, by asking every
//     live member (Probe), that nobody holds it or has a copy, and
//     restarts it empty at a newer epoch. It is logged at Error and
//     counted (Metrics.Handoff "lost").
//
// What this does not do: it is not consensus. A node that is wrongly
// believed failed by a majority while it still holds a lease from a backup
// on the minority side cannot exist (the backup refuses leases without a
// majority); but a majority that loses both a holder and its backup to a
// network split (not a crash) restarts the partition while the pair on the
// minority side stops deciding only when the backup notices it lost the
// majority, about one failure-detection time later, and the majority
// waits for that plus two leases before it restarts anything.
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
	// roleFenced: the node holds the partition but is moving it or its
	// copy; it does not decide until the move ends.
	roleFenced
	// roleMoved: a forwarding record; holder and epoch say where it went.
	roleMoved
	// roleHint: holder and epoch were learned from a peer; routing only.
	roleHint
)

var roleNames = [...]string{"none", "holder", "fenced", "moved", "hint"}

func (r role) String() string { return roleNames[r] }

// part is one partition as this node sees it. mu is the partition's gate:
// a local decision holds it in read mode from the role check to the end of
// the store decision; every role change takes it in write mode, so no
// decision lands on a store that has just been fenced or given away.
type part struct {
	id int
	mu sync.RWMutex

	role   role
	epoch  uint64 // holder's epoch: ours when holding, else the best known
	holder string // the holder: this node when holding, else where to go
	store  *shard.Store
	// backup is the member that has a complete copy of our partition at
	// epoch (holder side), "" when no member has one.
	backup string
	// leaseUntil is the holder's lease, node monotonic ns (atomic: renewals
	// race with decisions that only read it).
	leaseUntil atomic.Int64
	// backupDown is set when the backup refused or lost our copy; a new
	// complete copy is needed before replicating again.
	needSync bool
	// changed is closed and replaced at every role change, so requests
	// waiting for a transfer wake up.
	changed chan struct{}
	// since is when the current holder knowledge was set (wall clock of the
	// node, for the orphan grace).
	since time.Time
	// probedAt is when this node, the partition's target, last asked every
	// member whether anyone holds it (node monotonic ns; 0: never).
	probedAt int64
	// copyFailingSince is when copies of the partition to another member
	// began to fail (node monotonic ns; 0: the last copy succeeded).
	copyFailingSince int64
	// copiedEpoch is the newest epoch this node has begun a copy of the
	// partition at. A copy's epoch is never reused: a copy whose answer
	// was lost may be complete on its receiver, and a second copy at the
	// same epoch elsewhere would leave two members with equal claims.
	copiedEpoch uint64
	// promotedAt is when this node last sent a Promote of the partition
	// (node monotonic ns; 0: never). A promote whose answer is lost may
	// have taken effect: its receiver then decides under a lease counted
	// from when it applied it, which it takes only within 9/10 of the
	// promote's timeout of the copy's completion on its clock, so the
	// lease ends before promotedAt plus the promote's timeout
	// (rpcTimeout) plus LeaseDuration on this node's clock, however long
	// the request was held on its way.
	promotedAt int64

	// Replica side: our copy of another holder's partition, and the next
	// copy while one is being made (it replaces rep only when complete, so
	// a copy that fails half-way never costs the complete one).
	rep  replica
	next replica
	// holderProbes counts the probes of the partition from the holder of
	// our complete copy (rep.holder), taken under mu (in read mode: the
	// count is atomic). A takeover reads it before its own probe and gives
	// up if it moved before its commit: that holder is alive and may have
	// just been told we keep only its copy, so it would use a new copy's
	// lease (confirmHolding, stillHolder) while we took over.
	holderProbes atomic.Uint64
	// released records the newest RELEASE received without a matching
	// copy (it can overtake the promote answer that installs the copy):
	// a copy from that holder at that epoch or older is not installed.
	releasedBy    string
	releasedEpoch uint64
}

// replica is the copy of a partition this node keeps as its backup.
type replica struct {
	holder string
	epoch  uint64
	// holderEpoch is the epoch holder held the partition at when the copy
	// was begun: below epoch for a copy holder sent (SYNC_BEGIN's
	// HolderEpoch), equal to it for the copy an old holder keeps of the
	// member it promoted. Two complete copies at one epoch, of different
	// holdings, are ordered by it (copyClaim.above), so that only one is
	// taken over.
	holderEpoch uint64
	// seq is the newest replication message (ReplicateRequest.Seq) from
	// holder whose ADMIT or REPLACE this copy applied; older ones are not
	// applied (they arrived late).
	seq      uint64
	complete bool // a full copy arrived (SYNC_END)
	store    *shard.Store
	// leaseEnd is when the lease this node granted ends, node monotonic ns.
	leaseEnd int64
	// made is when the copy was begun (node monotonic ns): a restart of the
	// holder after it means the process that made it is gone.
	made int64
	// completed is when the copy's last request completed it here (node
	// monotonic ns; 0: not completed by a copy): a promote of it was sent
	// after that, which bounds the promote's age on this node's clock.
	completed int64
}

// setRoleLocked changes the partition's role and wakes its waiters. Called
// with p.mu held for writing.
func (p *part) setRoleLocked(r role, holder string, epoch uint64, now time.Time) {
	// since is on the real clock: orphan detection must not be fooled by
	// a test's fake node clock.
	_ = now
	p.role, p.holder, p.epoch, p.since = r, holder, epoch, time.Now()
	close(p.changed)
	p.changed = make(chan struct{})
}

// learnLocked records that holder holds the partition at epoch, if that is
// newer than what the node knows and the node does not hold it itself.
// Returns whether anything changed. Called with p.mu held for writing.
func (p *part) learnLocked(holder string, epoch uint64, now time.Time) bool {
	if holder == "" || epoch <= p.epoch && p.role != roleNone {
		return false
	}
	if p.role == roleHolder || p.role == roleFenced {
		if epoch <= p.epoch {
			return false
		}
		// Someone holds it at a newer epoch: ours is stale. The caller
		// drops the store (it stopped being authoritative when the newer
		// epoch began).
		p.store = nil
		p.backup = ""
		p.leaseUntil.Store(0)
		p.setRoleLocked(roleMoved, holder, epoch, now)
		return true
	}
	r := roleHint
	if p.role == roleMoved {
		r = roleMoved
	}
	p.setRoleLocked(r, holder, epoch, now)
	return true
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
