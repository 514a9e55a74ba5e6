package durable

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// MetaFile is the file that says whom a data directory belongs to: its
// cluster, its member name and the member's incarnation (Start), which a
// member restarted with the directory keeps.
const MetaFile = "ringlimit.meta"

// lockFile is flocked by the process using the directory.
const lockFile = "LOCK"

// Dir is an open data directory, locked for this process until Close.
type Dir struct {
	// Path is the directory.
	Path string
	// Cluster and Member are what the directory belongs to.
	Cluster, Member string
	// Start is the member's incarnation: the start it was first given,
	// kept across restarts. Fresh reports whether this open created the
	// directory's meta file (nothing from an earlier run).
	Start uint64
	Fresh bool
	lock  *os.File
}

// OpenDir opens the data directory path for member of cluster. A
// directory without a meta file and without any file of ours (an empty or
// missing directory) is made fresh, given start as its incarnation. One
// whose meta names another cluster or member is refused
// (ErrOtherCluster), one damaged or in a newer format likewise
// (ErrCorrupt, ErrNewerFormat); a refused directory is left as it was.
// Another process holding it: ErrLocked.
func OpenDir(path, cluster, member string, start uint64) (*Dir, error) {
	if cluster == "" || member == "" || start == 0 {
		return nil, fmt.Errorf("durable: open %s: cluster %q, member %q and start %d must all be set", path, cluster, member, start)
	}
	d := &Dir{Path: path, Cluster: cluster, Member: member}
	meta := filepath.Join(path, MetaFile)
	_, payload, err := ReadBlob(meta, cluster)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if ours, _ := hasOurFiles(path); ours != "" {
			return nil, fmt.Errorf("%w: %s is missing but %s is there", ErrCorrupt, meta, filepath.Join(path, ours))
		}
		d.Fresh, d.Start = true, start
	case err != nil:
		return nil, err
	default:
		name, st, err := parseMeta(meta, payload)
		if err != nil {
			return nil, err
		}
		if name != member {
			return nil, fmt.Errorf("%w: %s: written by member %q, this is %q", ErrOtherCluster, meta, name, member)
		}
		d.Start = st
	}
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, err
	}
	lk, err := os.OpenFile(filepath.Join(path, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(lk.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lk.Close()
		return nil, fmt.Errorf("%w: %s: %w", ErrLocked, path, err)
	}
	d.lock = lk
	if d.Fresh {
		b := binary.LittleEndian.AppendUint64(nil, d.Start)
		b = append(b, member...)
		if err := WriteBlob(path, MetaFile, cluster, 0, b); err != nil {
			d.Close()
			return nil, err
		}
	}
	return d, nil
}

func parseMeta(path string, b []byte) (member string, start uint64, err error) {
	if len(b) < 9 {
		return "", 0, fmt.Errorf("%w: %s: %d bytes of identity", ErrCorrupt, path, len(b))
	}
	return string(b[8:]), binary.LittleEndian.Uint64(b), nil
}

// hasOurFiles returns the name of a file in dir that one of our writers
// made ("" for none).
func hasOurFiles(dir string) (string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		if n := e.Name(); strings.HasSuffix(n, ".wal") || strings.HasSuffix(n, ".snap") {
			return n, nil
		}
	}
	return "", nil
}

// Close releases the directory's lock.
func (d *Dir) Close() error {
	if d.lock == nil {
		return nil
	}
	err := d.lock.Close() // closing the descriptor drops the flock
	d.lock = nil
	return err
}

// DirCluster returns the cluster the data directory at path was made for,
// read from its meta file and checked whole; "" for a directory that has
// none of our files (missing, empty, or never used), which OpenDir would
// make fresh. A directory with our files but no meta file, or a damaged
// or newer meta file, is refused as OpenDir refuses it. Nothing is
// written.
func DirCluster(path string) (string, error) {
	meta := filepath.Join(path, MetaFile)
	b, err := os.ReadFile(meta)
	switch {
	case errors.Is(err, os.ErrNotExist):
		ours, err := hasOurFiles(path)
		if errors.Is(err, os.ErrNotExist) {
			return "", nil
		}
		if err != nil {
			return "", err
		}
		if ours != "" {
			return "", fmt.Errorf("%w: %s is missing but %s is there", ErrCorrupt, meta, filepath.Join(path, ours))
		}
		return "", nil
	case err != nil:
		return "", err
	}
	cluster := ""
	if len(b) >= 12 {
		if cl := int(binary.LittleEndian.Uint16(b[10:])); 12+cl <= len(b) {
			cluster = string(b[12 : 12+cl])
		}
	}
	// ReadBlob checks the header, the length and the checksum.
	if _, _, err := ReadBlob(meta, cluster); err != nil {
		return "", err
	}
	if cluster == "" {
		return "", fmt.Errorf("%w: %s: no cluster", ErrCorrupt, meta)
	}
	return cluster, nil
}
