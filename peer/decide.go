package peer

import (
	"context"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/shard"
)

// Deciding here: the node's side of internal/partition. The node gives
// the partition's decisions their collaborators (partEnv: the ownership
// lease, the replication links, the data directory, the monotonic clock)
// and stamps each Result into a Decision with who decided and in which
// ring version.

// newPartEnv is the env the node decides with; the lease (the ownership
// log's runner) and the disk are set once they exist (newLogOwner).
func (n *Node) newPartEnv() partition.Env {
	return partition.Env{
		Repl:     replicas{n},
		Now:      n.now,
		Mono:     n.mono,
		Capacity: n.failure.capacityReached,
		Pause:    &n.hooks.decide,
	}
}

// decideHere decides r on this node if it holds partition pt and may
// decide: a Decision in *d, or an error for the caller (partition.Env's
// Decide says when it waits or names another holder). pk is r's key
// placed. *d is written only for a decision.
func (n *Node) decideHere(ctx context.Context, v *view, pt *part, r *opReq, pk shard.Placed, d *Decision) (partition.Status, <-chan struct{}, error) {
	var res partition.Result
	st, ch, err := n.part.Decide(ctx, pt, r, pk, len(v.alive) <= 1, &res)
	if st != partition.Decided || err != nil {
		return st, ch, err
	}
	stampDecision(d, &res, n.name, v.snap.Version())
	// Hot keys are sampled: one decision in hotSample records hotSample
	// times the hits, which keeps the tracker's lock off most decisions.
	if res.Counted && hotSampled(res.Mono, pk.Hash()) {
		n.hot.RecordBytes(pk.Encoded(), r.Hits*hotSample, res.DecidedAt)
	}
	return st, nil, nil
}

// stampDecision writes res into *d, decided by owner at ring version. Field by
// field: a composite literal is built aside and then copied in, and the
// copy stalls on the bytes just written.
func stampDecision(d *Decision, res *partition.Result, owner string, version uint64) {
	d.Allowed, d.Limit, d.Remaining = res.Allowed, res.Limit, res.Remaining
	d.RetryAfter, d.ResetAfter, d.Reason = res.RetryAfter, res.ResetAfter, Reason(res.Reason)
	d.Owner, d.RingVersion, d.DecidedAt = owner, version, res.DecidedAt
	d.Limits, d.RefusedBy = res.Limits, res.RefusedBy
}

const hotSample = 1 << hotSampleBits

const hotSampleBits = 3

// hotSampled draws whether a decision is one of the 1 in hotSample whose
// hits the hot-key tracker records. It scrambles the decision's monotonic
// clock reading and its key's placement hash with a multiplicative
// (Fibonacci) hash and keeps the top bits: successive readings spread
// evenly over the outcomes, and different keys decided at the same reading
// get different ones. A random number cost as much as the rest of the
// sampling. On a clock coarser than the decisions (some platforms tick
// every millisecond or more) one key's decisions within a tick share their
// outcome: the estimate stays unbiased, only noisier.
func hotSampled(mono int64, placementHash uint64) bool {
	return (uint64(mono)^placementHash)*0x9e3779b97f4a7c15>>(64-hotSampleBits) == 0
}

// replicas is the node's replication links as the decisions use them
// (partition.Replicator): copies queued for a partition's backup.
type replicas struct{ n *Node }

func (rp replicas) Admission(to string, pid int, epoch uint64, key Key, alg shard.Algorithm, run shard.Run, at time.Time, wait bool) (partition.Copy, error) {
	it, err := rp.n.links.replicateAdmissionItem(to, pid, epoch, key, alg, run, at, wait)
	if it == nil {
		return nil, err
	}
	return it, nil
}

func (rp replicas) State(to string, pid int, epoch uint64, st shard.KeyState, at time.Time, wait bool) (partition.Copy, error) {
	it, err := rp.n.links.replicateState(to, pid, epoch, st, at, wait)
	if it == nil {
		return nil, err
	}
	return it, nil
}

// diskLog is the data directory as the decisions use it (partition.Disk).
type diskLog struct{ dd *dataDir }

func (dl diskLog) Log(pid int, epoch uint64, st *shard.Store, key Key, dur Durability, now time.Time) (uint64, error) {
	return dl.dd.parts.keyOrGone(pid, epoch, st, key, dur, now)
}

func (dl diskLog) Sync(idx uint64) error { return dl.dd.sync(idx) }
