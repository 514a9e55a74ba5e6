package durable

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// fillDir makes a data directory of member m1 in cluster c1 with a
// partition snapshot and a log of three segments after it.
func fillDir(t *testing.T, dir string) {
	t.Helper()
	d, err := OpenDir(dir, "c1", "m1", 7)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	p, _, err := OpenParts(dir, "c1", 300)
	if err != nil {
		t.Fatal(err)
	}
	wall := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	for i := range 20 {
		op := &peerpb.PartitionOp{Kind: peerpb.PartitionOp_KIND_ADMIT, Partition: 3, Epoch: 2, Keys: []*peerpb.KeyState{{
			Key: &peerpb.Key{Tenant: "t", Subject: fmt.Sprint("s", i), Policy: "p"}, Runs: []*peerpb.Run{{AgeNs: 0, Count: 1}}}}}
		idx, err := p.Log(wall, op)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Sync(idx); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			if err := p.Snapshot(wall, p.Next(), []*peerpb.PartitionOp{{Kind: peerpb.PartitionOp_KIND_SYNC_CHUNK, Partition: 3, Epoch: 2}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// dirSum is every file's name, size and content hash in dir.
func dirSum(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, fmt.Sprintf("%s %d %x", e.Name(), len(b), sha256.Sum256(b)))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// openAll opens the directory as a member starting would: its identity,
// then its partition state.
func openAll(dir, cluster, member string) error {
	d, err := OpenDir(dir, cluster, member, 99)
	if err != nil {
		return err
	}
	defer d.Close()
	p, _, err := OpenParts(dir, cluster, 300)
	if err != nil {
		return err
	}
	return p.Close()
}

func segFiles(t *testing.T, dir string) []string {
	t.Helper()
	segs, err := listSegments(dir, partsPrefix)
	if err != nil || len(segs) < 3 {
		t.Fatalf("segments %v (%v): want at least 3", segs, err)
	}
	out := make([]string, len(segs))
	for i, s := range segs {
		out[i] = s.name
	}
	return out
}

func flip(t *testing.T, path string, off int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if off < 0 {
		off += len(b)
	}
	b[off] ^= 0x20
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func cut(t *testing.T, path string, n int64) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, fi.Size()-n); err != nil {
		t.Fatal(err)
	}
}

// newer rewrites path's header as format version FormatVersion+1, with a
// valid header checksum (and, for a blob, a valid file checksum).
func newer(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint16(b[8:], FormatVersion+1)
	cl := int(binary.LittleEndian.Uint16(b[10:]))
	n := 12 + cl + 16 + 4
	binary.LittleEndian.PutUint32(b[n-4:], crc32.Checksum(b[:n-4], crcTable))
	if string(b[:8]) == blobMagic {
		binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], crcTable))
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestBadDataDirs: each damaged or foreign directory is refused with an
// error that names the file and says why, and the directory is unchanged.
func TestBadDataDirs(t *testing.T) {
	cases := []struct {
		name    string
		cluster string
		member  string
		spoil   func(t *testing.T, dir string) string // returns the file to name
		want    error
	}{
		{"another cluster", "c2", "m1", func(t *testing.T, dir string) string { return MetaFile }, ErrOtherCluster},
		{"another member", "c1", "m2", func(t *testing.T, dir string) string { return MetaFile }, ErrOtherCluster},
		{"segment of another cluster", "c1", "m1", func(t *testing.T, dir string) string {
			// A segment copied in from another cluster's directory.
			other := t.TempDir()
			w, err := OpenWAL(other, partsPrefix, "c2", 0, func(uint64, []byte) error { return nil })
			if err != nil {
				t.Fatal(err)
			}
			w.Append([]byte("x"))
			w.Close()
			segs := segFiles(t, dir)
			b, _ := os.ReadFile(filepath.Join(other, segName(partsPrefix, 0)))
			os.WriteFile(filepath.Join(dir, segs[1]), b, 0o600)
			return segs[1]
		}, ErrOtherCluster},
		{"meta truncated", "c1", "m1", func(t *testing.T, dir string) string { cut(t, filepath.Join(dir, MetaFile), 2); return MetaFile }, ErrCorrupt},
		{"snapshot truncated", "c1", "m1", func(t *testing.T, dir string) string {
			cut(t, filepath.Join(dir, PartsSnapshot), 5)
			return PartsSnapshot
		}, ErrCorrupt},
		{"middle segment truncated", "c1", "m1", func(t *testing.T, dir string) string {
			s := segFiles(t, dir)[1]
			cut(t, filepath.Join(dir, s), 30)
			return s
		}, ErrCorrupt},
		{"segment missing", "c1", "m1", func(t *testing.T, dir string) string {
			s := segFiles(t, dir)
			os.Remove(filepath.Join(dir, s[1]))
			return s[2]
		}, ErrCorrupt},
		{"meta missing", "c1", "m1", func(t *testing.T, dir string) string { os.Remove(filepath.Join(dir, MetaFile)); return MetaFile }, ErrCorrupt},
		{"flipped byte in a record", "c1", "m1", func(t *testing.T, dir string) string {
			s := segFiles(t, dir)[1]
			flip(t, filepath.Join(dir, s), -10)
			return s
		}, ErrCorrupt},
		{"flipped byte in a record length", "c1", "m1", func(t *testing.T, dir string) string {
			s := segFiles(t, dir)
			last := s[len(s)-1]
			b, _ := os.ReadFile(filepath.Join(dir, last))
			_, n, err := parseHeader(last, b, segMagic, "c1", 2)
			if err != nil || n >= len(b) {
				t.Fatalf("last segment has no record to spoil (%v)", err)
			}
			flip(t, filepath.Join(dir, last), n+1)
			return last
		}, ErrCorrupt},
		{"flipped byte in a segment header", "c1", "m1", func(t *testing.T, dir string) string {
			s := segFiles(t, dir)[0]
			flip(t, filepath.Join(dir, s), 13)
			return s
		}, ErrCorrupt},
		{"flipped byte in the snapshot", "c1", "m1", func(t *testing.T, dir string) string {
			flip(t, filepath.Join(dir, PartsSnapshot), -6)
			return PartsSnapshot
		}, ErrCorrupt},
		{"flipped byte in the meta", "c1", "m1", func(t *testing.T, dir string) string {
			flip(t, filepath.Join(dir, MetaFile), -6)
			return MetaFile
		}, ErrCorrupt},
		{"newer meta", "c1", "m1", func(t *testing.T, dir string) string { newer(t, filepath.Join(dir, MetaFile)); return MetaFile }, ErrNewerFormat},
		{"newer segment", "c1", "m1", func(t *testing.T, dir string) string {
			s := segFiles(t, dir)[2]
			newer(t, filepath.Join(dir, s))
			return s
		}, ErrNewerFormat},
		{"newer snapshot", "c1", "m1", func(t *testing.T, dir string) string {
			newer(t, filepath.Join(dir, PartsSnapshot))
			return PartsSnapshot
		}, ErrNewerFormat},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			fillDir(t, dir)
			if err := openAll(dir, "c1", "m1"); err != nil {
				t.Fatalf("the unspoilt directory: %v", err)
			}
			file := tc.spoil(t, dir)
			before := dirSum(t, dir)
			err := openAll(dir, tc.cluster, tc.member)
			if !errors.Is(err, tc.want) {
				t.Fatalf("open as %s/%s: %v, want %v", tc.cluster, tc.member, err, tc.want)
			}
			if !strings.Contains(err.Error(), file) {
				t.Errorf("error %q does not name %s", err, file)
			}
			if after := dirSum(t, dir); after != before {
				t.Errorf("the refused directory changed:\nbefore\n%s\nafter\n%s", before, after)
			}
		})
	}
}

func TestOpenDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	d, err := OpenDir(dir, "c1", "m1", 42)
	if err != nil || !d.Fresh || d.Start != 42 {
		t.Fatalf("fresh OpenDir: %+v, %v; want Fresh with Start 42", d, err)
	}
	if _, err := OpenDir(dir, "c1", "m1", 43); !errors.Is(err, ErrLocked) {
		t.Fatalf("second open while held: %v, want ErrLocked", err)
	}
	d.Close()
	d, err = OpenDir(dir, "c1", "m1", 43)
	if err != nil || d.Fresh || d.Start != 42 {
		t.Fatalf("reopened: %+v, %v; want the first start, 42, not fresh", d, err)
	}
	d.Close()
}

// TestDirCluster: a directory reports the cluster it was made for before
// it is opened; one never used reports none; a meta file missing beside
// our files, or damaged, is refused; nothing is written.
func TestDirCluster(t *testing.T) {
	root := t.TempDir()
	if c, err := DirCluster(filepath.Join(root, "missing")); c != "" || err != nil {
		t.Fatalf("missing directory: %q, %v; want none", c, err)
	}
	dir := filepath.Join(root, "data")
	fillDir(t, dir)
	if c, err := DirCluster(dir); c != "c1" || err != nil {
		t.Fatalf("DirCluster = %q, %v; want c1", c, err)
	}
	meta := filepath.Join(dir, MetaFile)
	b, err := os.ReadFile(meta)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-6] ^= 1
	if err := os.WriteFile(meta, b, 0o600); err != nil {
		t.Fatal(err)
	}
	before := dirSum(t, dir)
	if _, err := DirCluster(dir); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), meta) {
		t.Fatalf("flipped byte: %v; want ErrCorrupt naming %s", err, meta)
	}
	if after := dirSum(t, dir); after != before {
		t.Fatalf("DirCluster changed the directory:\n%s\nthen\n%s", before, after)
	}
	if err := os.Remove(meta); err != nil {
		t.Fatal(err)
	}
	if _, err := DirCluster(dir); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), meta) {
		t.Fatalf("meta missing beside segments: %v; want ErrCorrupt naming %s", err, meta)
	}
}
