package durable

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
)

// FormatVersion is the on-disk format this build writes and the newest it
// reads. A file with a larger version is refused (ErrNewerFormat).
const FormatVersion = 1

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// header is what every file starts with: its kind (an 8-byte magic), the
// format version and the cluster it was written for, then fields of its
// own kind, then a CRC of all of that.
//
//	magic [8] | version u16 | len(cluster) u16 | cluster | fields… | crc32c u32
type header struct {
	magic   string
	version uint16
	cluster string
	fields  []uint64
}

func (h header) append(b []byte) []byte {
	start := len(b)
	b = append(b, h.magic...)
	b = binary.LittleEndian.AppendUint16(b, h.version)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(h.cluster)))
	b = append(b, h.cluster...)
	for _, f := range h.fields {
		b = binary.LittleEndian.AppendUint64(b, f)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:], crcTable))
}

// parseHeader reads a header of magic with nfields fields from the start
// of b, checks it against cluster, and returns it with its length. name
// is the file, for messages.
func parseHeader(name string, b []byte, magic, cluster string, nfields int) (header, int, error) {
	short := fmt.Errorf("%w: %s: header cut short at %d bytes", ErrCorrupt, name, len(b))
	if len(b) < 12 {
		return header{}, 0, short
	}
	if string(b[:8]) != magic {
		return header{}, 0, fmt.Errorf("%w: %s: not a %q file (magic %q)", ErrCorrupt, name, magic, b[:8])
	}
	h := header{magic: magic, version: binary.LittleEndian.Uint16(b[8:])}
	cl := int(binary.LittleEndian.Uint16(b[10:]))
	n := 12 + cl + 8*nfields + 4
	if len(b) < n {
		return header{}, 0, short
	}
	if got, want := binary.LittleEndian.Uint32(b[n-4:]), crc32.Checksum(b[:n-4], crcTable); got != want {
		return header{}, 0, fmt.Errorf("%w: %s: header checksum %08x, want %08x", ErrCorrupt, name, got, want)
	}
	// The version is checked after the checksum, so that a flipped bit
	// is reported as damage rather than as a newer release.
	if h.version > FormatVersion {
		return header{}, 0, fmt.Errorf("%w: %s: format version %d, this build reads up to %d", ErrNewerFormat, name, h.version, FormatVersion)
	}
	if h.version == 0 {
		return header{}, 0, fmt.Errorf("%w: %s: format version 0", ErrCorrupt, name)
	}
	h.cluster = string(b[12 : 12+cl])
	if h.cluster != cluster {
		return header{}, 0, fmt.Errorf("%w: %s: written for %q, this member is in %q", ErrOtherCluster, name, h.cluster, cluster)
	}
	for i := range nfields {
		h.fields = append(h.fields, binary.LittleEndian.Uint64(b[12+cl+8*i:]))
	}
	return h, n, nil
}

// writeFileSync writes b to dir/name whole or not at all: into a
// temporary file, fsynced, renamed over name, and the directory fsynced,
// so that a crash leaves either the old file or the new one.
func writeFileSync(dir, name string, b []byte) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Blob files: a header with an index field and the payload's length,
// then the payload, then a CRC of the whole file. Written whole by
// writeFileSync, so any shortfall is damage.
const blobMagic = "rlblob01"

// WriteBlob writes payload to dir/name for cluster, tagged with index,
// whole or not at all (a temporary file, fsynced and renamed).
func WriteBlob(dir, name, cluster string, index uint64, payload []byte) error {
	b := header{magic: blobMagic, version: FormatVersion, cluster: cluster, fields: []uint64{index, uint64(len(payload))}}.append(nil)
	b = append(b, payload...)
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
	return writeFileSync(dir, name, b)
}

// ReadBlob reads a file WriteBlob wrote and checks it whole: a file cut
// short, damaged, of another cluster or in a newer format is refused with
// an error naming it.
func ReadBlob(path, cluster string) (index uint64, payload []byte, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, nil, err
	}
	h, n, err := parseHeader(path, b, blobMagic, cluster, 2)
	if err != nil {
		return 0, nil, err
	}
	size := h.fields[1]
	if uint64(len(b)) != uint64(n)+size+4 {
		return 0, nil, fmt.Errorf("%w: %s: %d bytes, its header says %d", ErrCorrupt, path, len(b), uint64(n)+size+4)
	}
	if got, want := binary.LittleEndian.Uint32(b[len(b)-4:]), crc32.Checksum(b[:len(b)-4], crcTable); got != want {
		return 0, nil, fmt.Errorf("%w: %s: checksum %08x, want %08x", ErrCorrupt, path, got, want)
	}
	return h.fields[0], b[n : len(b)-4], nil
}
