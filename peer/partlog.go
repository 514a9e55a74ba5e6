package peer

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/durable"
	"github.com/ringlimit/ringlimit/peer/internal/ownlog"
	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// This file keeps the state of the partitions a node holds in its data
// directory (durable.Parts), for the policies whose Durability is disk or
// disk_async. What is written, in the form copies already use:
//
//   - each admission of such a policy, decided here as holder: the key's
//     whole state after it, as one KIND_REPLACE operation, logged under
//     the partition's log lock so that the log's order is the order of
//     the exports (a later record never holds less than an earlier one
//     of the same key). Under disk the answer waits for its fsync (group
//     commit: concurrent admissions share one); under disk_async the
//     flusher writes and fsyncs the log every diskFlushInterval;
//   - when this node becomes a partition's holder (a grant, a copy
//     installed, a takeover with its replica): the partition's whole
//     state, as a copy (SYNC_BEGIN, one chunk, SYNC_END), so that what
//     it decides next is logged on top of all it holds;
//   - when it stops holding one: Forget, so a restart does not count on
//     state that moved on;
//   - a snapshot of every partition held, every partSnapshotEvery, after
//     which the records it covers are dropped.
//
// On an empty grant (ownlog's Reset: the heir rule's grant after a
// restart of every member, or any grant of a vacancy) the node restores
// the partition's state from what its directory held when it started,
// once: restoring state this member really had only adds admissions that
// were made, so it can only refuse more (ownership rule 10).
//
// Not yet logged (issue 57): the backup's replica (replicated admissions
// and copies a backup installs), and the operations paths (refunds,
// resets, concurrency leases, reservations and grants): those states
// survive a restart of every member only as far as the holder's last
// logged admission of each key carried them.

// diskFlushInterval is how often disk_async's log is written and fsynced:
// the most a restart of every member loses under disk_async is the
// admissions of one interval.
const diskFlushInterval = 10 * time.Millisecond

// partSnapshotEvery is how often the partitions' state is snapshotted
// (and the log before it dropped), when anything was logged since.
const partSnapshotEvery = time.Minute

// partLog is the node's partition state on disk.
type partLog struct {
	env   partEnv
	parts *durable.Parts
	// locks serialise, per partition, a key's export with its record.
	locks []sync.Mutex
	// dirty: a disk_async record was logged since the last flush.
	dirty atomic.Bool
	// logged counts records since the last snapshot.
	logged atomic.Uint64
	// Tests: timedOff stops the flusher's timed flushes; a channel sent
	// on flushNow has the flusher flush at once and close it after.
	timedOff atomic.Bool
	flushNow chan chan struct{}
	// mine[p]: this node holds or backs partition p (guarded by the
	// partition's lock), for the snapshot.
	mine []bool
	// scratch[p] is partition p's reusable key states (guarded by its
	// lock): an admission is exported into it and encoded straight into
	// the log's buffer, so logging it allocates nothing (keyStates).
	scratch [][]shard.KeyState

	mu sync.Mutex // guards rec
	// rec is what the directory held at start, per partition, until the
	// partition's first empty grant restores (or drops) it.
	rec *durable.Recovery
	// wall is the instant to restore at (Recovery.At at start).
	wall time.Time
}

// partEnv is what the partition log takes from its node, set once when
// the data directory opens.
type partEnv struct {
	ctx     context.Context // the node's lifetime: the flusher stops with it
	wg      *sync.WaitGroup // the node's goroutines: the flusher joins it
	clock   func() time.Time
	started time.Time // the node's start (partRestoreWait)
	table   *policyTable
	pt      *partTable // the partitions, for the snapshot
	log     *slog.Logger
	warn    func(msg string, args ...any) // throttled node-wide
}

// openPartLog opens the partition state in the data directory, for a
// ring of partitions partitions.
func openPartLog(env partEnv, path, cluster string, partitions int) (*partLog, error) {
	parts, rec, err := durable.OpenParts(path, cluster, 0)
	if err != nil {
		return nil, err
	}
	at, back := rec.At(env.clock())
	if back > 0 {
		env.log.Warn("data directory: the wall clock is behind the newest state written before the restart; restored keys keep that instant until the clock passes it (windows count longer, never shorter)",
			"behind", back)
	}
	pc := partitions
	return &partLog{env: env, parts: parts, locks: make([]sync.Mutex, pc), mine: make([]bool, pc), scratch: make([][]shard.KeyState, pc), rec: rec, wall: at,
		flushNow: make(chan chan struct{})}, nil
}

// keyStates returns n of partition pid's reusable key states, their
// slices' memory kept from earlier use (ExportInto replaces their
// contents). Called with the partition's log lock held.
func (pl *partLog) keyStates(pid, n int) []shard.KeyState {
	pl.scratch[pid] = slices.Grow(pl.scratch[pid][:0], n)[:n]
	return pl.scratch[pid]
}

// emptyState makes *ks key's empty state of algorithm alg, keeping its
// slices' memory.
func emptyState(ks *shard.KeyState, key Key, alg shard.Algorithm) {
	*ks = shard.KeyState{Key: key, Algorithm: alg, Runs: ks.Runs[:0], Reservations: ks.Reservations[:0], Grants: ks.Grants[:0]}
}

// dataDir is the node's open data directory.
type dataDir struct {
	dir  *durable.Dir
	raft *ownlog.Disk
	// heir is the start id of the incarnation that last ran with the
	// directory (0 for a new directory).
	heir uint64
	// resumed: the directory held an ownership log, which the member
	// resumes.
	resumed bool
	// parts is the partitions' state (partLog).
	parts *partLog
}

// sync waits until record idx is on disk (disk durability).
func (dd *dataDir) sync(idx uint64) error {
	if err := dd.parts.parts.Sync(idx); err != nil {
		return fmt.Errorf("%w: the data directory: %w", ErrUnavailable, err)
	}
	return nil
}

// diskPolicy reports whether policy name of tab has durability disk
// (never, without a data directory).
func (dd *dataDir) diskPolicy(tab *policy.Table, name string) bool {
	if dd == nil {
		return false
	}
	e := tab.Lookup(name)
	return e != nil && e.Config.Durability == DurabilityDisk
}

// durablePolicy reports whether policy name keeps admissions on disk.
func (pl *partLog) durablePolicy(name string) bool {
	e := pl.env.table.Load().Lookup(name)
	return e != nil && e.Config.Durability != DurabilityMemory
}

// logPartition logs partition pid's whole state (the keys of policies
// kept on disk) as a copy at epoch. Called with the partition's lock
// held.
func (pl *partLog) logPartition(pid int, epoch uint64, st *shard.Store) {
	now := pl.env.clock()
	var keys []*peerpb.KeyState
	if st != nil {
		st.Range(func(k Key) bool {
			if pl.durablePolicy(k.Policy) {
				if ks, ok := st.Export(k, now); ok {
					keys = append(keys, stateToWire(ks))
				}
			}
			return true
		})
	}
	part, e := uint32(pid), max(epoch, 1)
	pl.locks[pid].Lock()
	defer pl.locks[pid].Unlock()
	wall := now.UnixNano()
	ops := []*peerpb.PartitionOp{
		{Kind: peerpb.PartitionOp_KIND_SYNC_BEGIN, Partition: part, Epoch: e},
		{Kind: peerpb.PartitionOp_KIND_SYNC_CHUNK, Partition: part, Epoch: e, Keys: keys},
		{Kind: peerpb.PartitionOp_KIND_SYNC_END, Partition: part, Epoch: e},
	}
	for _, op := range ops {
		if _, err := pl.parts.Log(wall, op); err != nil {
			pl.env.log.Error("data directory: logging a partition's state failed", "partition", pid, "err", err)
			return
		}
	}
	pl.logged.Add(3)
	pl.dirty.Store(true)
}

// forget logs that this node no longer holds partition pid. Called
// with the partition's lock held.
func (pl *partLog) forget(pid int) {
	pl.locks[pid].Lock()
	defer pl.locks[pid].Unlock()
	if _, err := pl.parts.Forget(pl.env.clock().UnixNano(), uint32(pid)); err != nil {
		pl.env.log.Error("data directory: logging a partition's release failed", "partition", pid, "err", err)
	}
	pl.dirty.Store(true)
}

// restore fills st (partition pid's new, empty store) with the
// state the data directory held for it at start, once, and logs it as the
// partition's state here. It reports whether the whole state was
// restored (a complete copy and what followed it). Called by ownlog's
// Reset with the partition's lock held.
func (pl *partLog) restore(pid int, epoch uint64, st *shard.Store) (ok bool) {
	pl.mu.Lock()
	var rp *durable.RecoveredPart
	if pl.rec != nil {
		rp = pl.rec.Part(uint32(pid))
		pl.rec.Drop(uint32(pid))
	}
	pl.mu.Unlock()
	if rp != nil {
		tab := pl.env.table.Load()
		restored, skipped, err := rp.Restore(st, func(k shard.Key) (shard.Policy, bool) {
			if e := tab.Lookup(k.Policy); e != nil {
				return e.Shard, true
			}
			return shard.Policy{}, false
		}, pl.wall)
		if err != nil {
			pl.env.log.Error("data directory: restoring a partition failed; it starts with what was restored", "partition", pid, "restored", restored, "err", err)
		} else {
			pl.env.log.Info("partition restored from the data directory", "partition", pid, "keys", restored, "skipped", skipped, "complete", rp.Complete)
		}
		ok = err == nil && rp.Complete
	}
	pl.logPartition(pid, epoch, st)
	return ok
}

// run runs until the node stops: it flushes disk_async's records every
// diskFlushInterval and snapshots the partitions held here every
// partSnapshotEvery. The node's goroutine (startDataDir).
func (pl *partLog) run() {
	defer pl.env.wg.Done()
	t := time.NewTicker(diskFlushInterval)
	defer t.Stop()
	lastSnap := time.Now()
	for {
		var done chan struct{}
		select {
		case <-pl.env.ctx.Done():
			return
		case <-t.C:
			if pl.timedOff.Load() {
				continue
			}
		case done = <-pl.flushNow:
		}
		if pl.dirty.Swap(false) {
			if err := pl.parts.Flush(); err != nil {
				pl.env.warn("data directory: flushing the partition log failed", "err", err)
			}
		}
		if done != nil {
			close(done)
			continue
		}
		if time.Since(lastSnap) >= partSnapshotEvery && pl.logged.Load() > 0 && !pl.restoring(pl.env.started) {
			lastSnap = time.Now()
			pl.snapshot()
		}
	}
}

// restoring reports whether state read back at start still waits for its
// partition's grant (the snapshot would drop the records it came from),
// for at most partRestoreWait after the node started.
func (pl *partLog) restoring(started time.Time) bool {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.rec != nil && time.Since(started) >= partRestoreWait {
		pl.rec = nil // the vacancies it was kept for have restarted elsewhere
	}
	return pl.rec != nil && len(pl.rec.Partitions()) > 0
}

// partRestoreWait is how long state read back at start is kept for its
// partition's grant; a vacancy waits for its heir much less (EmptyAfter).
const partRestoreWait = 10 * time.Minute

// snapshot writes the state of every partition held or backed here as
// the snapshot and drops the log records it covers.
func (pl *partLog) snapshot() {
	covers := pl.parts.Next() // before the exports: see durable.Parts.Snapshot
	pl.logged.Store(0)
	now := pl.env.clock()
	var ops []*peerpb.PartitionOp
	for pid := range pl.env.pt.parts {
		pt := &pl.env.pt.parts[pid]
		pt.Mu.RLock()
		if pl.mine[pid] && pt.Store != nil {
			var keys []*peerpb.KeyState
			pt.Store.Range(func(k Key) bool {
				if pl.durablePolicy(k.Policy) {
					if ks, ok := pt.Store.Export(k, now); ok {
						keys = append(keys, stateToWire(ks))
					}
				}
				return true
			})
			ops = append(ops, &peerpb.PartitionOp{Kind: peerpb.PartitionOp_KIND_SYNC_CHUNK, Partition: uint32(pid), Epoch: max(pt.Epoch, 1), Keys: keys})
		}
		pt.Mu.RUnlock()
	}
	if err := pl.parts.Snapshot(now.UnixNano(), covers, ops); err != nil {
		pl.env.log.Error("data directory: snapshot of the partitions failed", "err", err)
	}
}

// transition logs partition pid's state when this node starts
// holding it without having had it (a grant, a copy it holds at once), and
// forgets it when it neither holds nor backs it any more (had: it held or
// backed it before). A backup's state is logged when its copy is
// installed (copied). Called by Publish with the partition's lock
// held.
func (pl *partLog) transition(pid int, had, holds, backs bool, epoch uint64, st *shard.Store) {
	pl.mine[pid] = holds || backs
	switch {
	case holds && !had:
		pl.logPartition(pid, epoch, st)
	case had && !holds && !backs:
		pl.forget(pid)
	}
}

// copied logs a copy this backup installed as partition pid's state
// here, and waits until it is on disk when a policy of the table keeps
// admissions on disk. Called with the partition's lock held.
func (pl *partLog) copied(pid int, epoch uint64, st *shard.Store) error {
	pl.logPartition(pid, epoch, st)
	if pl.anyDiskPolicy() {
		return pl.parts.Sync(pl.parts.Next() - 1)
	}
	return nil
}

// anyDiskPolicy reports whether a policy of the table has durability
// disk.
func (pl *partLog) anyDiskPolicy() bool {
	for _, c := range pl.env.table.Load().Configs() {
		if c.Durability == DurabilityDisk {
			return true
		}
	}
	return false
}

// replica logs, on a backup, the state of the replicated keys
// whose policy keeps admissions on disk, as applied to st (partition pid
// at epoch); the index returned is to Sync before answering when one of
// them has durability disk. Called with the partition's lock held.
func (dd *dataDir) replica(pid int, epoch uint64, st *shard.Store, keys []packedAdmit, now time.Time) (uint64, error) {
	if dd == nil {
		return 0, nil
	}
	pl := dd.parts
	tab := pl.env.table.Load()
	wait := false
	pl.locks[pid].Lock()
	defer pl.locks[pid].Unlock()
	states := pl.keyStates(pid, len(keys))
	m := 0
	for _, k := range keys {
		e := tab.Lookup(k.st.Key.Policy)
		if e == nil || e.Config.Durability == DurabilityMemory {
			continue
		}
		wait = wait || e.Config.Durability == DurabilityDisk
		if !st.ExportInto(k.st.Key, now, &states[m]) {
			emptyState(&states[m], k.st.Key, k.st.Algorithm)
		}
		m++
	}
	if m == 0 {
		return 0, nil
	}
	idx := pl.parts.LogKeys(now.UnixNano(), uint32(pid), max(epoch, 1), states[:m])
	pl.logged.Add(1)
	if !wait {
		pl.dirty.Store(true)
		return 0, nil
	}
	return idx, nil
}

// keyOrGone logs key's state in partition pid (this node holds it
// at epoch) after an operation at now, an empty state for a key the
// operation removed (a reset, the last lease released); the index to
// Sync is returned for disk (0: nothing to wait for). Called with the
// partition's lock held.
func (pl *partLog) keyOrGone(pid int, epoch uint64, st *shard.Store, key Key, dur Durability, now time.Time) (uint64, error) {
	pl.locks[pid].Lock()
	ks := pl.keyStates(pid, 1)
	if !st.ExportInto(key, now, &ks[0]) {
		emptyState(&ks[0], key, 0)
	}
	idx := pl.parts.LogKeys(now.UnixNano(), uint32(pid), max(epoch, 1), ks)
	pl.locks[pid].Unlock()
	pl.logged.Add(1)
	if dur == DurabilityDiskAsync {
		pl.dirty.Store(true)
		return 0, nil
	}
	return idx, nil
}

// await waits until the record a batch's decision left in r.DurIdx
// (deferWait, durability disk) is on disk, and clears it. The receiver
// calls it for each such item after deciding the whole batch: the first
// call's fsync covers every item logged before it (group commit), so a
// batch costs one fsync, not one per item. An item that waits for a
// backup too calls it once the backup has answered (partition.Disk's
// Sync says why): by then the fsyncs this node ran as a backup have
// usually taken the record with them, and await returns without one.
func (dd *dataDir) await(r *opReq) error {
	idx := r.DurIdx
	if idx == 0 {
		return nil
	}
	r.DurIdx = 0
	return dd.sync(idx)
}
