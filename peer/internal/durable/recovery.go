package durable

import (
	"fmt"
	"slices"
	"time"

	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// Recovery is the partition state read back from disk: per partition, the
// copy it was last given (epoch, sequence, whether it was complete) and
// the operations since, in order, ready to be applied to fresh stores.
type Recovery struct {
	parts  map[uint32]*RecoveredPart
	newest int64
}

// RecoveredPart is one partition's state as read back.
type RecoveredPart struct {
	// Epoch and Seq are the partition epoch and copy sequence of the
	// copy the state began from (KIND_SYNC_BEGIN's Epoch and
	// HolderEpoch); Epoch is raised by the operations replicated since.
	Epoch, Seq uint64
	// Complete: the copy's KIND_SYNC_END was logged (a copy cut short
	// by the crash is not the partition's state).
	Complete bool
	ops      []Op
}

func newRecovery() *Recovery { return &Recovery{parts: map[uint32]*RecoveredPart{}} }

func (r *Recovery) add(o Op) {
	r.newest = max(r.newest, o.Wall)
	op := o.Op
	p := op.GetPartition()
	rp := r.parts[p]
	if op.GetKind() == peerpb.PartitionOp_KIND_SYNC_BEGIN && op.GetEpoch() == 0 {
		delete(r.parts, p) // Parts.Forget: no longer held or backed here
		return
	}
	if op.GetKind() == peerpb.PartitionOp_KIND_SYNC_BEGIN {
		// A copy replaces the partition's state: what came before it no
		// longer counts (and need not be kept in memory).
		r.parts[p] = &RecoveredPart{Epoch: op.GetEpoch(), Seq: op.GetHolderEpoch()}
		return
	}
	if rp == nil {
		// Operations on a partition whose copy began before the oldest
		// record kept: the snapshot would have carried it, so they come
		// from a log whose snapshot is gone. Counted as incomplete.
		rp = &RecoveredPart{Epoch: op.GetEpoch()}
		r.parts[p] = rp
	}
	if op.GetKind() == peerpb.PartitionOp_KIND_SYNC_END {
		rp.Complete = true
		return
	}
	rp.Epoch = max(rp.Epoch, op.GetEpoch())
	rp.ops = append(rp.ops, o)
}

// Partitions returns the partitions with state on disk, in order.
func (r *Recovery) Partitions() []uint32 {
	out := make([]uint32, 0, len(r.parts))
	for p := range r.parts {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// Part returns partition p's recovered state (nil: none on disk).
func (r *Recovery) Part(p uint32) *RecoveredPart { return r.parts[p] }

// At returns the instant to restore at, given the restarted clock's now:
// the later of now and the newest wall time on disk. A wall clock that
// moved backwards across the restart (back > 0) is not trusted to place
// admissions: each key is restored at the newest instant it was written
// at, and the store's per-key clamp (time never moves backward for a key,
// DESIGN §1) then holds its time there until the clock passes it. Windows
// are counted longer by up to back, never shorter; a calendar period is
// never taken for an earlier one.
func (r *Recovery) At(now time.Time) (at time.Time, back time.Duration) {
	if n := now.UnixNano(); r.newest > n {
		return time.Unix(0, r.newest), time.Duration(r.newest - n)
	}
	return now, 0
}

// Restore applies the partition's recovered operations to st (an empty
// store), rebasing every age on at (Recovery.At): an age written at wall
// w becomes age + (at − w). policy returns each key's policy from the
// member's table; a key whose policy is gone or has another algorithm
// is skipped and counted, as a copy's receiver skips it. It returns the
// keys restored and skipped.
func (rp *RecoveredPart) Restore(st *shard.Store, policy func(shard.Key) (shard.Policy, bool), at time.Time) (restored, skipped int, err error) {
	t := at.UnixNano()
	for _, o := range rp.ops {
		shift := time.Duration(t - o.Wall)
		if shift < 0 {
			return restored, skipped, fmt.Errorf("durable: restore at %v, before an operation written at %v (use Recovery.At)", at, time.Unix(0, o.Wall))
		}
		replace := o.Op.GetKind() == peerpb.PartitionOp_KIND_REPLACE
		for _, wk := range o.Op.GetKeys() {
			ks, err := keyFromWire(wk, shift)
			if err != nil {
				return restored, skipped, err
			}
			if replace {
				st.Delete(ks.Key)
				if len(ks.Runs) == 0 && len(ks.Reservations) == 0 && len(ks.Grants) == 0 {
					continue
				}
			}
			p, ok := policy(ks.Key)
			if !ok || p.Algorithm != ks.Algorithm {
				skipped++
				continue
			}
			if err := st.Import(ks, p, at); err != nil {
				return restored, skipped, err
			}
			restored++
		}
	}
	return restored, skipped, nil
}

// keyFromWire converts a key's state from its wire form, adding shift to
// every age (a calendar's single run holds an instant, not an age).
func keyFromWire(ks *peerpb.KeyState, shift time.Duration) (shard.KeyState, error) {
	if a := ks.GetAlgorithm(); a < 0 || a > 255 {
		return shard.KeyState{}, fmt.Errorf("%w: algorithm %d", shard.ErrInvalidState, a)
	}
	st := shard.KeyState{
		Key:       shard.Key{Tenant: ks.GetKey().GetTenant(), Subject: ks.GetKey().GetSubject(), Policy: ks.GetKey().GetPolicy()},
		Algorithm: shard.Algorithm(ks.GetAlgorithm()),
	}
	if st.Algorithm == shard.Calendar {
		shift = 0
	}
	runs := func(in []*peerpb.Run) []shard.Run {
		if len(in) == 0 {
			return nil
		}
		out := make([]shard.Run, len(in))
		for i, r := range in {
			out[i] = shard.Run{Age: time.Duration(r.GetAgeNs()) + shift, Count: r.GetCount(), ID: r.GetLeaseId()}
		}
		return out
	}
	st.Runs, st.Reservations, st.Grants = runs(ks.GetRuns()), runs(ks.GetReservations()), runs(ks.GetGrants())
	return st, nil
}

// KeyToWire converts a key's exported state (ages relative to the wall
// time it will be logged with) to the form Parts logs.
func KeyToWire(st shard.KeyState) *peerpb.KeyState {
	runs := func(in []shard.Run) []*peerpb.Run {
		if len(in) == 0 {
			return nil
		}
		out := make([]*peerpb.Run, len(in))
		for i, r := range in {
			out[i] = &peerpb.Run{AgeNs: int64(r.Age), Count: r.Count, LeaseId: r.ID}
		}
		return out
	}
	return &peerpb.KeyState{
		Key:       &peerpb.Key{Tenant: st.Key.Tenant, Subject: st.Key.Subject, Policy: st.Key.Policy},
		Algorithm: int32(st.Algorithm),
		Runs:      runs(st.Runs), Reservations: runs(st.Reservations), Grants: runs(st.Grants),
	}
}

// Drop forgets partition p's recovered state (restored, or no longer
// wanted).
func (r *Recovery) Drop(p uint32) { delete(r.parts, p) }
