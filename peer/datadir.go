package peer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/ringlimit/ringlimit/peer/internal/durable"
	"github.com/ringlimit/ringlimit/peer/internal/ownlog"
)

// This file gives a node its data directory (Config.DataDir): the
// ownership log (ownlog.Disk: raft's hard state, entries and snapshots),
// the partitions' state (partlog.go) and the directory's identity:
//
//   - the cluster id (the founder's random one, or the one a joiner
//     adopted) is the directory's cluster (durable.OpenDir), read back
//     before anything starts: a member restarted with its directory
//     belongs to that cluster, and a directory of another cluster, a
//     damaged one or one of a newer format is refused, unchanged;
//   - the raft ID is the directory's first start (durable.Dir.Start), kept
//     across restarts, so that a member restarted with its directory
//     resumes its log as the same raft member; each process is still a new
//     ownership incarnation (name@start, with a new random start), as
//     ownlog's Disk requires;
//   - lastStartFile names the incarnation that last ran with the
//     directory: this process gossips it as its Heir, and the ownership
//     machine's heir rule gives this incarnation the vacancies the log
//     kept for that one.
//
// A joiner whose directory is new does not know its cluster until gossip
// has told it: it joins gossip first (its RPC port bound, not yet
// served), adopts the cluster, and only then opens the directory and
// starts its log member (startDataDirJoiner).

// lastStartFile holds the start id of the last process that ran with the
// directory.
const lastStartFile = "last.start"

// raftID is this member's raft ID: its data directory's first start, or
// the process's start without one.
func (n *Node) raftID() uint64 {
	if n.dd != nil {
		return n.dd.dir.Start
	}
	return n.ops.start
}

// heirOf is the start id of the incarnation whose data directory this
// process restarted with (0 for none).
func (n *Node) heirOf() uint64 {
	if n.dd != nil {
		return n.dd.heir
	}
	return 0
}

// dataDirCluster reads the cluster of the node's data directory into
// n.clusterID. It reports whether the directory is new and the node joins
// (it must learn its cluster from gossip first).
func (n *Node) dataDirCluster() (joinFirst bool, err error) {
	path := n.cfg.DataDir
	if path == "" {
		return false, nil
	}
	c, err := durable.DirCluster(path)
	if err != nil {
		return false, fmt.Errorf("peer: data directory %s: %w", path, err)
	}
	if c == "" {
		return len(n.cfg.Join) > 0, nil
	}
	id, err := strconv.ParseUint(c, 16, 64)
	if err != nil || id == 0 {
		return false, fmt.Errorf("peer: data directory %s: %w: %s: cluster %q is not a cluster id", path, durable.ErrCorrupt, filepath.Join(path, durable.MetaFile), c)
	}
	n.gossiper.clusterID.Store(id)
	return false, nil
}

// openDataDir opens the node's data directory for its cluster (known by
// now), records this process as the last to run with it, and opens its
// raft log.
func (n *Node) openDataDir() error {
	path := n.cfg.DataDir
	if path == "" {
		return nil
	}
	cl := fmt.Sprintf("%016x", n.gossiper.clusterID.Load())
	d, err := durable.OpenDir(path, cl, n.name, n.ops.start)
	if err != nil {
		return fmt.Errorf("peer: data directory %s: %w", path, err)
	}
	dd := &dataDir{dir: d}
	if !d.Fresh {
		_, b, err := durable.ReadBlob(filepath.Join(path, lastStartFile), cl)
		switch {
		case errors.Is(err, os.ErrNotExist):
			// The first process made the meta file and stopped before
			// it wrote this one: it was the directory's first start.
			dd.heir = d.Start
		case err != nil:
			d.Close()
			return fmt.Errorf("peer: data directory %s: %w", path, err)
		case len(b) != 8:
			d.Close()
			return fmt.Errorf("peer: data directory %s: %w: %s: %d bytes", path, durable.ErrCorrupt, filepath.Join(path, lastStartFile), len(b))
		default:
			dd.heir = binary.LittleEndian.Uint64(b)
		}
	}
	raft, err := ownlog.OpenDisk(path, cl)
	if err != nil {
		d.Close()
		return fmt.Errorf("peer: data directory %s: %w", path, err)
	}
	parts, err := openPartLog(partEnv{ctx: n.ctx, wg: &n.wg, clock: n.clock, started: n.started, table: &n.table, pt: n.pt, log: n.log, warn: n.warns.warn},
		path, cl, n.cfg.Ring.PartitionCount)
	if err != nil {
		raft.Close()
		d.Close()
		return fmt.Errorf("peer: data directory %s: %w", path, err)
	}
	dd.parts = parts
	// Written after every check passed: a refused directory is left as
	// it was.
	if err := durable.WriteBlob(path, lastStartFile, cl, 0, binary.LittleEndian.AppendUint64(nil, n.ops.start)); err != nil {
		parts.parts.Close()
		raft.Close()
		d.Close()
		return fmt.Errorf("peer: data directory %s: %w", path, err)
	}
	dd.raft, dd.resumed = raft, !raft.Empty()
	n.dd = dd
	n.log.Info("data directory open", "path", path, "cluster", cl, "raft_id", fmt.Sprintf("%016x", d.Start),
		"fresh", d.Fresh, "heir_of", fmt.Sprintf("%016x", dd.heir), "log_on_disk", dd.resumed)
	return nil
}

// startDataDir starts the partition log's flusher, a goroutine the node
// owns (it stops with n.ctx).
func (n *Node) startDataDir() {
	if n.dd == nil {
		return
	}
	n.wg.Add(1)
	go n.dd.parts.run()
}

// resumed reports whether the node resumed an ownership log from its data
// directory.
func (n *Node) resumed() bool { return n.dd != nil && n.dd.resumed }

// closeDataDir closes the raft log and releases the directory; after the
// log member stopped. Idempotent.
func (n *Node) closeDataDir() {
	dd := n.dd
	if dd == nil || dd.raft == nil {
		return
	}
	if err := dd.raft.Close(); err != nil {
		n.log.Warn("data directory: closing the raft log", "err", err)
	}
	if err := dd.parts.parts.Close(); err != nil {
		n.log.Warn("data directory: closing the partition log", "err", err)
	}
	_ = dd.dir.Close()
	dd.raft = nil
}
