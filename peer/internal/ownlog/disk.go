package ownlog

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/peer/internal/durable"
	"github.com/ringlimit/ringlimit/peer/internal/ownership"
)

// Disk keeps a member's raft log in a data directory, as etcd keeps its
// WAL and snapshots: every hard state and entry raft hands the member is
// a record of the "raft" WAL, fsynced (one fsync per Ready, for all of
// it) before the Ready's messages go out, as raft requires; each
// snapshot is a file (raft.snap) after which the records it covers are
// dropped. A member that restarts with it resumes as the same raft
// member (same raft ID, term, vote and log) under a new ownership
// incarnation: knows says why. Not safe for concurrent use: the member's goroutine owns it.
type Disk struct {
	dir, cluster string
	wal          *durable.WAL
	stored       stored
	err          error
}

// stored is what OpenDisk read back.
type stored struct {
	hs      *pb.HardState
	snap    *pb.Snapshot
	entries []*pb.Entry
}

const (
	raftPrefix = "raft"
	// RaftSnapshot is the raft snapshot's file name.
	RaftSnapshot = "raft.snap"
	recHard      = 1
	recEntry     = 2
	// recSnap marks where a snapshot was taken: the entries logged before
	// it are the snapshot's, or a suffix it replaced (a follower's
	// uncommitted entries a leader's snapshot overrode), or written
	// again after it.
	recSnap = 3
)

// OpenDisk reads the raft log in dir (written for cluster) and returns it
// ready for New (Config.Disk). A damaged file, one of another cluster or
// in a newer format is refused with an error naming it, and nothing on
// disk changes.
func OpenDisk(dir, cluster string) (*Disk, error) {
	d := &Disk{dir: dir, cluster: cluster}
	path := filepath.Join(dir, RaftSnapshot)
	_, payload, err := durable.ReadBlob(path, cluster)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		s := &pb.Snapshot{}
		if err := proto.Unmarshal(payload, s); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", durable.ErrCorrupt, path, err)
		}
		d.stored.snap = s
	}
	snapIndex := d.stored.snap.GetMetadata().GetIndex()
	d.wal, err = durable.OpenWAL(dir, raftPrefix, cluster, 0, func(i uint64, b []byte) error {
		if len(b) == 0 {
			return fmt.Errorf("%w: %s: record %d is empty", durable.ErrCorrupt, filepath.Join(dir, raftPrefix+"-*.wal"), i)
		}
		switch b[0] {
		case recHard:
			hs := &pb.HardState{}
			if err := proto.Unmarshal(b[1:], hs); err != nil {
				return fmt.Errorf("%w: %s: record %d: %w", durable.ErrCorrupt, filepath.Join(dir, raftPrefix+"-*.wal"), i, err)
			}
			d.stored.hs = hs
		case recEntry:
			e := &pb.Entry{}
			if err := proto.Unmarshal(b[1:], e); err != nil {
				return fmt.Errorf("%w: %s: record %d: %w", durable.ErrCorrupt, filepath.Join(dir, raftPrefix+"-*.wal"), i, err)
			}
			if e.GetIndex() <= snapIndex {
				return nil
			}
			// An entry at an index already logged replaces it and every
			// later one (raft overwrote a conflicting suffix).
			es := d.stored.entries
			for len(es) > 0 && es[len(es)-1].GetIndex() >= e.GetIndex() {
				es = es[:len(es)-1]
			}
			if len(es) > 0 && es[len(es)-1].GetIndex()+1 != e.GetIndex() || len(es) == 0 && snapIndex > 0 && e.GetIndex() != snapIndex+1 {
				return fmt.Errorf("%w: %s: record %d: entry %d does not follow the log", durable.ErrCorrupt, filepath.Join(dir, raftPrefix+"-*.wal"), i, e.GetIndex())
			}
			d.stored.entries = append(es, e)
		case recSnap:
			d.stored.entries = nil
		default:
			return fmt.Errorf("%w: %s: record %d of unknown kind %d", durable.ErrCorrupt, filepath.Join(dir, raftPrefix+"-*.wal"), i, b[0])
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return d, nil
}

// Empty reports whether the directory held no raft state: a member that
// starts afresh (and bootstraps, or joins).
func (d *Disk) Empty() bool {
	return d.stored.snap == nil && d.stored.hs == nil && len(d.stored.entries) == 0
}

// Close closes the log.
func (d *Disk) Close() error { return d.wal.Close() }

// Err returns the first write that failed: the member then sends
// nothing more (a vote or an acknowledgement not on disk must not be
// given) and its liveness lapses, so it stops deciding.
func (d *Disk) Err() error { return d.err }

// load fills storage from what OpenDisk read, and returns the table in
// the snapshot, if any, for the machine (restored at the first Ready,
// which has a time).
func (d *Disk) load(storage *raft.MemoryStorage) (*pb.Snapshot, error) {
	s := d.stored
	if s.snap != nil {
		if err := storage.ApplySnapshot(s.snap); err != nil {
			return nil, err
		}
	}
	if s.hs != nil {
		if err := storage.SetHardState(s.hs); err != nil {
			return nil, err
		}
	}
	if err := storage.Append(s.entries); err != nil {
		return nil, err
	}
	d.stored = stored{}
	return s.snap, nil
}

func (d *Disk) append(kind byte, m proto.Message) (uint64, error) {
	b, err := proto.MarshalOptions{}.MarshalAppend([]byte{kind}, m)
	if err != nil {
		return 0, err
	}
	return d.wal.Append(b), nil
}

// save writes a Ready's hard state, entries and snapshot, and fsyncs them
// once, before its messages are sent.
func (d *Disk) save(rd raft.Ready) error {
	if d.err != nil {
		return d.err
	}
	if !raft.IsEmptySnap(rd.Snapshot) {
		if err := d.saveSnapshot(rd.Snapshot, nil); err != nil {
			return d.fail(err)
		}
	}
	last, any := uint64(0), false
	if !raft.IsEmptyHardState(rd.HardState) {
		i, err := d.append(recHard, rd.HardState)
		if err != nil {
			return d.fail(err)
		}
		last, any = i, true
	}
	for _, e := range rd.Entries {
		i, err := d.append(recEntry, e)
		if err != nil {
			return d.fail(err)
		}
		last, any = i, true
	}
	if any {
		if err := d.wal.Sync(last); err != nil {
			return d.fail(err)
		}
	}
	return nil
}

// saveSnapshot writes s as the snapshot, then writes again the hard
// state and the entries after it that storage holds, so that the records
// before them (all covered by s or written again) can be dropped.
func (d *Disk) saveSnapshot(s *pb.Snapshot, storage *raft.MemoryStorage) error {
	b, err := proto.Marshal(s)
	if err != nil {
		return err
	}
	if err := d.wal.Flush(); err != nil {
		return err
	}
	cut := d.wal.Next()
	if err := durable.WriteBlob(d.dir, RaftSnapshot, d.cluster, cut, b); err != nil {
		return err
	}
	marker, err := d.append(recSnap, s.GetMetadata())
	if err != nil {
		return err
	}
	if storage == nil {
		// A snapshot from the leader replaces the whole log: nothing
		// before it counts, and raft hands the entries after it in the
		// same Ready (saved after the marker).
		if err := d.wal.Sync(marker); err != nil {
			return err
		}
		return d.wal.DropBefore(cut)
	}
	hs, _, _ := storage.InitialState()
	last := marker
	if !raft.IsEmptyHardState(hs) {
		if last, err = d.append(recHard, hs); err != nil {
			return err
		}
	}
	first, _ := storage.FirstIndex()
	lastIdx, _ := storage.LastIndex()
	first = max(first, s.GetMetadata().GetIndex()+1)
	if first <= lastIdx {
		es, err := storage.Entries(first, lastIdx+1, 1<<62)
		if err != nil {
			return err
		}
		for _, e := range es {
			if last, err = d.append(recEntry, e); err != nil {
				return err
			}
		}
	}
	if err := d.wal.Sync(last); err != nil {
		return err
	}
	return d.wal.DropBefore(cut)
}

func (d *Disk) fail(err error) error {
	if d.err == nil {
		d.err = fmt.Errorf("ownlog: raft log on disk: %w", err)
	}
	return d.err
}

// restoreTable gives the machine the table of the snapshot a restarted
// member found on disk, with the configuration it was taken at.
func (m *Member) restoreTable(s *pb.Snapshot, now int64) {
	t := ownership.NewTable(m.cfg.Partitions)
	if b := s.GetData(); len(b) > 0 {
		if err := json.Unmarshal(b, t); err != nil || len(t.Parts) != m.cfg.Partitions {
			t = ownership.NewTable(m.cfg.Partitions)
		}
	}
	m.conf = s.GetMetadata().GetConfState()
	m.applied, m.snapAt = s.GetMetadata().GetIndex(), s.GetMetadata().GetIndex()
	m.poke = true
	m.do(m.own.Restored(t, now))
}

// loadDisk fills the member's storage from Config.Disk and reports
// whether it held a log to resume.
func (m *Member) loadDisk() (bool, error) {
	d := m.cfg.Disk
	if d == nil || d.Empty() {
		return false, nil
	}
	if err := d.knows(m.cfg.Ownership.ID, m.cfg.Partitions); err != nil {
		return false, err
	}
	snap, err := d.load(m.storage)
	if err != nil {
		return false, fmt.Errorf("ownlog: resume the log from %s: %w", d.dir, err)
	}
	if snap != nil {
		m.conf = snap.GetMetadata().GetConfState()
		m.boot = snap
	}
	return true, nil
}

// saveBootstrap writes a founding member's first snapshot to its disk.
func (m *Member) saveBootstrap(s *pb.Snapshot) error {
	if d := m.cfg.Disk; d != nil {
		if err := d.saveSnapshot(s, nil); err != nil {
			return d.fail(err)
		}
	}
	return nil
}

// diskStopped gives a restarted member's machine its table, once, and
// reports whether a write to the disk failed (the member then stops).
func (m *Member) diskStopped(now int64) bool {
	d := m.cfg.Disk
	if d == nil {
		return false
	}
	if m.boot != nil {
		s := m.boot
		m.boot = nil
		m.restoreTable(s, now)
	}
	if d.err != nil {
		m.out = Output{}
		return true
	}
	return false
}

// knows refuses a resumed log that already names member id: a member
// resumes its log under a new ownership incarnation, its raft ID kept.
//
// Why: the machine's knowledge of which partitions' state it has (rule
// 1's "the state is here", rule 8's Fresh chains) lives in memory and is
// not in the log. Under its old ID, replaying the log would hand it
// back holdings, and a Grant replayed or a Fresh chain restored would
// let it decide from an empty store for partitions it decided for
// before the crash: admissions lost without a count. As a new
// incarnation it has nothing in the table: its old self is gone for good
// (a later incarnation runs), so the log ends it and its partitions go
// to their backups or, without one, restart empty, counted, exactly as
// for a member restarted without a data directory; only the log itself
// (term, vote, entries, voter set) carries over, which is what lets a
// log whose every voter restarted elect a leader again. Its old self's
// partition state comes back through the heir rule (ownership rule 10:
// View.Heirs), which the driver feeds and restores from disk (peer:
// datadir.go and partlog.go).
//
// A raft log must never go back: a member started from a restored copy
// of its raft files could vote twice in a term or forget an entry it
// acknowledged, and two leaders could commit different entries. Restore
// a data directory from a backup only without its raft files (the member
// then joins the log as a new raft member).
func (d *Disk) knows(id string, partitions int) error {
	refuse := fmt.Errorf("%w: member %q is already in the log in %s: a member resumed from its data directory comes back as a new incarnation (a new ownership ID; its raft ID stays)", ErrConfig, id, d.dir)
	if s := d.stored.snap; s != nil && len(s.GetData()) > 0 {
		t := ownership.NewTable(partitions)
		if err := json.Unmarshal(s.GetData(), t); err == nil && t.Members[id] != nil {
			return refuse
		}
	}
	for _, e := range d.stored.entries {
		if e.GetType() != pb.EntryNormal || len(e.GetData()) == 0 {
			continue
		}
		if c, err := ownership.Decode(e.GetData()); err == nil && (c.Member == id || c.To == id) {
			return refuse
		}
	}
	return nil
}
