package durable

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// Partition state on disk is what copies and replication already send:
// peerpb.PartitionOp, each with the wall time (Unix ns, on the writer's
// clock) its ages are relative to. The log ("parts" WAL) holds them in
// the order the member applied them; a snapshot (PartsSnapshot) holds
// each partition's whole state at one instant as one KIND_SYNC_CHUNK op,
// and the log records it does not cover.
const (
	partsPrefix = "parts"
	// PartsSnapshot is the partition-state snapshot's file name.
	PartsSnapshot = "parts.snap"
)

// Op is one recorded operation on a partition's state, with the wall
// time its ages are relative to.
type Op struct {
	Wall int64
	Op   *peerpb.PartitionOp
}

// Parts is a member's partition state on disk: a log of operations and
// its latest snapshot. Safe for concurrent use.
type Parts struct {
	dir, cluster string
	wal          *WAL
	// newest is the latest wall time read back or written: a clock that
	// reads earlier after a restart has moved backwards (Recovery.At).
	newest int64
}

// OpenParts reads the partition state in dir (the snapshot, then the log
// records after it) into a Recovery, and returns the store ready to log
// more. A damaged file, one for another cluster or in a newer format is
// refused with an error naming it, and nothing on disk is changed.
func OpenParts(dir, cluster string, segBytes int64) (*Parts, *Recovery, error) {
	rec := newRecovery()
	covers := uint64(0)
	path := filepath.Join(dir, PartsSnapshot)
	idx, payload, err := ReadBlob(path, cluster)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, nil, err
	default:
		covers = idx
		wall, req, err := decodeSnapshot(path, payload)
		if err != nil {
			return nil, nil, err
		}
		for _, op := range req.GetOps() {
			rec.add(Op{Wall: wall, Op: &peerpb.PartitionOp{Kind: peerpb.PartitionOp_KIND_SYNC_BEGIN, Partition: op.GetPartition(), Epoch: op.GetEpoch(), HolderEpoch: op.GetHolderEpoch()}})
			rec.add(Op{Wall: wall, Op: op})
			rec.add(Op{Wall: wall, Op: &peerpb.PartitionOp{Kind: peerpb.PartitionOp_KIND_SYNC_END, Partition: op.GetPartition(), Epoch: op.GetEpoch(), HolderEpoch: op.GetHolderEpoch()}})
		}
	}
	wal, err := OpenWAL(dir, partsPrefix, cluster, segBytes, func(i uint64, b []byte) error {
		if i < covers {
			return nil // in the snapshot
		}
		op, err := decodeOp(b)
		if err != nil {
			return fmt.Errorf("%w: %s: record %d: %w", ErrCorrupt, filepath.Join(dir, partsPrefix+"-*.wal"), i, err)
		}
		rec.add(op)
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	if wal.Next() < covers {
		// The log ends before what the snapshot covers: the records in
		// between were dropped (the snapshot made them redundant), so the
		// next record must not take a covered index.
		return nil, nil, fmt.Errorf("%w: %s covers records before %d, but the log ends at %d", ErrCorrupt, path, covers, wal.Next())
	}
	return &Parts{dir: dir, cluster: cluster, wal: wal, newest: rec.newest}, rec, nil
}

func decodeOp(b []byte) (Op, error) {
	if len(b) < 8 {
		return Op{}, fmt.Errorf("record of %d bytes", len(b))
	}
	op := &peerpb.PartitionOp{}
	if err := proto.Unmarshal(b[8:], op); err != nil {
		return Op{}, err
	}
	return Op{Wall: int64(binary.LittleEndian.Uint64(b)), Op: op}, nil
}

func decodeSnapshot(path string, b []byte) (int64, *peerpb.ReplicateRequest, error) {
	if len(b) < 8 {
		return 0, nil, fmt.Errorf("%w: %s: payload of %d bytes", ErrCorrupt, path, len(b))
	}
	req := &peerpb.ReplicateRequest{}
	if err := proto.Unmarshal(b[8:], req); err != nil {
		return 0, nil, fmt.Errorf("%w: %s: %w", ErrCorrupt, path, err)
	}
	return int64(binary.LittleEndian.Uint64(b)), req, nil
}

// Log appends op, whose ages are relative to wall, and returns its index:
// on disk once Sync(index) returns, or after the next Flush.
func (p *Parts) Log(wall int64, op *peerpb.PartitionOp) (uint64, error) {
	b := binary.LittleEndian.AppendUint64(make([]byte, 0, 8+proto.Size(op)), uint64(wall))
	b, err := proto.MarshalOptions{}.MarshalAppend(b, op)
	if err != nil {
		return 0, err
	}
	return p.wal.Append(b), nil
}

// Forget logs that partition p is no longer held or backed here: its
// state on disk no longer counts.
func (p *Parts) Forget(wall int64, part uint32) (uint64, error) {
	return p.Log(wall, &peerpb.PartitionOp{Kind: peerpb.PartitionOp_KIND_SYNC_BEGIN, Partition: part})
}

// Sync waits until record index is on disk (group commit: WAL.Sync).
func (p *Parts) Sync(index uint64) error { return p.wal.Sync(index) }

// Synced reports whether record index is on disk.
func (p *Parts) Synced(index uint64) bool { return p.wal.Synced(index) }

// Flush writes and fsyncs every record logged so far (disk_async).
func (p *Parts) Flush() error { return p.wal.Flush() }

// Next returns the index the next logged record will have.
func (p *Parts) Next() uint64 { return p.wal.Next() }

// Syncs returns how many fsyncs of records the log has done.
func (p *Parts) Syncs() uint64 { return p.wal.Syncs() }

// SyncTime returns the wall time the log's fsyncs took, added up.
func (p *Parts) SyncTime() time.Duration { return p.wal.SyncTime() }

// AsyncSync reports whether the log's fsyncs run on an io_uring, and if
// not though it was wanted, why (WAL.AsyncSync).
func (p *Parts) AsyncSync() (bool, error) { return p.wal.AsyncSync() }

// Snapshot writes parts (one KIND_SYNC_CHUNK op per partition held or
// backed here whose state is complete, with its whole state, ages
// relative to wall) as the snapshot covering every
// record before covers, and drops the log segments it makes redundant.
// Take covers (Next) before exporting the state: a record logged between
// the two is then both in the snapshot and replayed after it, which adds
// an admission twice (more refusals, never more admissions), whereas the
// other order could lose it.
func (p *Parts) Snapshot(wall int64, covers uint64, parts []*peerpb.PartitionOp) error {
	if err := p.wal.Flush(); err != nil {
		return err
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(wall))
	b, err := proto.MarshalOptions{}.MarshalAppend(b, &peerpb.ReplicateRequest{Ops: parts})
	if err != nil {
		return err
	}
	if err := WriteBlob(p.dir, PartsSnapshot, p.cluster, covers, b); err != nil {
		return err
	}
	return p.wal.DropBefore(covers)
}

// Close flushes and closes the log.
func (p *Parts) Close() error { return p.wal.Close() }
