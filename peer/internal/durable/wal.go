package durable

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Segment files hold a WAL's records: a header (magic "rlwalseg", the
// cluster, the index of the segment's first record, and prevEnd: how many
// bytes of the previous segment hold complete records), then records:
//
//	len u32 | ^len u32 | crc32c(payload) u32 | payload
//
// The length is stored twice (the second inverted), so a flipped bit in
// it is damage, not a record that seems to run past the end. A segment is
// created whole (header written, fsynced, renamed) and then only appended
// to; so the one shortfall a crash can leave is an incomplete last record
// of the last segment (a write cut by kill -9, never fsynced, hence never
// acknowledged under `disk`). It is ignored, left as it is, and the next
// segment's prevEnd says where the complete records ended; so a segment
// other than the last that is shorter than its successor says, or any
// other shortfall, is damage.
const segMagic = "rlwalseg"

const recHeader = 12

// maxRecord bounds one record: a whole partition's copy is one record.
const maxRecord = 1 << 30

// DefaultSegmentBytes is the size past which a WAL starts a new segment.
const DefaultSegmentBytes = 64 << 20

// WAL is an append-only log of records in segment files, with group
// commit: Append buffers a record in memory and returns its index; Sync
// waits until it is on disk, and one fsync serves every record appended
// before it began, whoever waits for them. Flushes are pipelined: records
// appended while an fsync runs are written at once and fsynced beside it
// (at most maxFlights fsyncs at a time), so a record waits for its own
// fsync, not for the one running to end first; a record counts as on
// disk only once every fsync begun before its own has ended too. It
// starts no goroutine: a driver that wants records flushed without
// waiting (disk_async) calls Flush on its own ticker. Safe for
// concurrent use.
type WAL struct {
	dir, prefix, cluster string
	segBytes             int64

	mu   sync.Mutex
	cond sync.Cond
	// buf holds the records appended and not yet handed to a flush;
	// spare is the buffer the last write handed back.
	buf, spare []byte
	// next is the index of the next record; durable the index of the
	// first record not yet fsynced; taken the index of the first record
	// not yet handed to a flush.
	next, durable, taken uint64
	// flights are the flushes begun and not yet counted, oldest first
	// (head, n of them in the ring): each the index its records end at
	// and whether its fsync has ended. starting: a flush is waiting for
	// wmu to take the buffer. fsyncing counts fsyncs running.
	flights  [maxFlights]flight
	head, n  int
	starting bool
	fsyncing int
	err      error
	// segs are the segments on disk, oldest first; the last is the one
	// being appended to once f is open. prevEnd is the complete length
	// of the last segment found at open (the next segment's header field).
	segs    []segment
	prevEnd uint64
	// wmu orders the flushes' writes: a flush takes the buffer and writes
	// it holding wmu (so records reach the file in their order), and
	// starts a new segment holding it. f, size: the segment being
	// appended to and its length, guarded by wmu; nil until the first
	// flush.
	wmu  sync.Mutex
	f    *os.File
	size int64
	// syncs counts fsyncs of records, for tests and metrics; syncTime
	// is their wall time, added up (two at once count twice).
	syncs    uint64
	syncTime time.Duration
	// syncer is the WAL's way to fsync (syncer.go), chosen at open;
	// ringErr says why the asynchronous one could not be set up, if
	// not. fsync syncs a segment: syncer.sync (tests hold it).
	syncer  syncer
	async   bool
	ringErr error
	fsync   func(*os.File) error
}

// maxFlights bounds the fsyncs a WAL runs at a time. Two: while one runs,
// what is appended meanwhile is written and fsynced beside it; the kernel
// overlaps them (ext4 commits both in one journal transaction when they
// meet).
const maxFlights = 2

type flight struct {
	upto uint64
	done bool
}

type segment struct {
	first uint64
	name  string
}

func segName(prefix string, first uint64) string { return fmt.Sprintf("%s-%016x.wal", prefix, first) }

// listSegments returns prefix's segments in dir, oldest first.
func listSegments(dir, prefix string) ([]segment, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var segs []segment
	for _, e := range ents {
		n := e.Name()
		hex, ok := strings.CutPrefix(n, prefix+"-")
		if !ok {
			continue
		}
		hex, ok = strings.CutSuffix(hex, ".wal")
		if !ok || len(hex) != 16 {
			continue
		}
		first, err := strconv.ParseUint(hex, 16, 64)
		if err != nil {
			continue
		}
		segs = append(segs, segment{first: first, name: n})
	}
	slices.SortFunc(segs, func(a, b segment) int { return compareU64(a.first, b.first) })
	return segs, nil
}

func compareU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// OpenWAL reads the WAL named prefix in dir, calling replay for each
// record in order (index, payload; the payload is valid only during the
// call), and returns it ready to append after the last one. Every segment
// is checked before anything is written: a damaged segment
// (ErrCorrupt), one for another cluster (ErrOtherCluster) or in a newer
// format (ErrNewerFormat) is refused with an error naming the file, and
// the directory is left as it was. An error replay returns stops the
// open and is returned. segBytes zero means DefaultSegmentBytes.
func OpenWAL(dir, prefix, cluster string, segBytes int64, replay func(index uint64, rec []byte) error) (*WAL, error) {
	if segBytes <= 0 {
		segBytes = DefaultSegmentBytes
	}
	segs, err := listSegments(dir, prefix)
	if err != nil {
		return nil, err
	}
	w := &WAL{dir: dir, prefix: prefix, cluster: cluster, segBytes: segBytes, segs: segs}
	w.cond.L = &w.mu
	// Headers first: each segment's complete length is in its
	// successor's header.
	type seg struct {
		path string
		b    []byte
		off  int
		h    header
	}
	all := make([]seg, len(segs))
	for i, s := range segs {
		path := filepath.Join(dir, s.name)
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		h, n, err := parseHeader(path, b, segMagic, cluster, 2)
		if err != nil {
			return nil, err
		}
		if h.fields[0] != s.first {
			return nil, fmt.Errorf("%w: %s: named for record %d, its header says %d", ErrCorrupt, path, s.first, h.fields[0])
		}
		all[i] = seg{path: path, b: b, off: n, h: h}
	}
	var prevLen uint64
	for i, s := range all {
		if i > 0 && s.h.fields[0] != w.next {
			return nil, fmt.Errorf("%w: %s: starts at record %d, but %s ends at %d: a segment is missing", ErrCorrupt, s.path, s.h.fields[0], all[i-1].path, w.next)
		}
		w.next = s.h.fields[0]
		b, last := s.b, i == len(all)-1
		if !last {
			var err error
			if b, err = completeRecords(s.path, b, s.off, all[i+1].path, all[i+1].h); err != nil {
				// A missing successor makes the lengths disagree too:
				// say which it is.
				n := uint64(0)
				if _, perr := parseRecords(s.path, s.b, s.off, true, func([]byte) error { n++; return nil }); perr == nil && w.next+n != all[i+1].h.fields[0] {
					return nil, fmt.Errorf("%w: %s: starts at record %d, but %s ends at %d: a segment is missing", ErrCorrupt, all[i+1].path, all[i+1].h.fields[0], s.path, w.next+n)
				}
				return nil, err
			}
		}
		end, err := parseRecords(s.path, b, s.off, last, func(rec []byte) error {
			if err := replay(w.next, rec); err != nil {
				return err
			}
			w.next++
			return nil
		})
		if err != nil {
			return nil, err
		}
		prevLen = uint64(end)
	}
	w.durable, w.taken, w.prevEnd = w.next, w.next, prevLen
	w.syncer, w.ringErr = newSyncer()
	_, isFile := w.syncer.(fileSyncer)
	w.async = !isFile
	w.fsync = w.syncer.sync
	return w, nil
}

// AsyncSync reports whether the WAL's fsyncs run on an io_uring (the
// waiting goroutine parked, holding no processor) and, if they fall back
// to a blocking f.Sync though the ring was wanted, why.
func (w *WAL) AsyncSync() (bool, error) {
	return w.async, w.ringErr
}

// completeRecords returns segment b up to where its successor (next,
// with header h) says its complete records end, after checking that what
// follows is at most one record cut by a crash (never acknowledged).
func completeRecords(path string, b []byte, off int, next string, h header) ([]byte, error) {
	end := h.fields[1]
	if end > uint64(len(b)) || end < uint64(off) {
		return nil, fmt.Errorf("%w: %s: %d bytes, but %s says its complete records end at %d: cut short", ErrCorrupt, path, len(b), filepath.Base(next), end)
	}
	tail, err := parseRecords(path, b, int(end), true, func([]byte) error {
		return fmt.Errorf("%w: %s: a complete record after offset %d, where %s says the records end", ErrCorrupt, path, end, filepath.Base(next))
	})
	if err != nil {
		return nil, err
	}
	if tail != int(end) {
		return nil, fmt.Errorf("%w: %s: bytes after offset %d", ErrCorrupt, path, end)
	}
	return b[:end], nil
}

// parseRecords calls fn for each record of segment b from offset off and
// returns where the complete records end. An incomplete record at the end
// is allowed only when last (a write cut by a crash).
func parseRecords(path string, b []byte, off int, last bool, fn func([]byte) error) (int, error) {
	for off < len(b) {
		if len(b)-off < recHeader {
			if last {
				return off, nil
			}
			return 0, fmt.Errorf("%w: %s: record at offset %d cut short", ErrCorrupt, path, off)
		}
		l, inv := binary.LittleEndian.Uint32(b[off:]), binary.LittleEndian.Uint32(b[off+4:])
		if l != ^inv || l > maxRecord {
			return 0, fmt.Errorf("%w: %s: record at offset %d has a damaged length", ErrCorrupt, path, off)
		}
		end := off + recHeader + int(l)
		if end > len(b) {
			if last {
				return off, nil
			}
			return 0, fmt.Errorf("%w: %s: record at offset %d cut short", ErrCorrupt, path, off)
		}
		rec := b[off+recHeader : end]
		if got, want := binary.LittleEndian.Uint32(b[off+8:]), crc32.Checksum(rec, crcTable); got != want {
			return 0, fmt.Errorf("%w: %s: record at offset %d: checksum %08x, want %08x", ErrCorrupt, path, off, want, got)
		}
		if err := fn(rec); err != nil {
			return 0, err
		}
		off = end
	}
	return off, nil
}

// Append buffers rec (copied) as the next record and returns its index.
// It is on disk once Sync(index) returns nil, or after a Flush that
// began after Append returned.
func (w *WAL) Append(rec []byte) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = binary.LittleEndian.AppendUint32(w.buf, uint32(len(rec)))
	w.buf = binary.LittleEndian.AppendUint32(w.buf, ^uint32(len(rec)))
	w.buf = binary.LittleEndian.AppendUint32(w.buf, crc32.Checksum(rec, crcTable))
	w.buf = append(w.buf, rec...)
	i := w.next
	w.next++
	return i
}

// Next returns the index the next appended record will have.
func (w *WAL) Next() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.next
}

// Sync waits until record index is on disk. Concurrent callers share
// fsyncs: while one runs, records appended meanwhile gather for the next,
// which starts at once beside it (pipelined group commit). It returns an
// error wrapping ErrFailed once any write failed.
func (w *WAL) Sync(index uint64) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if index >= w.next {
		return fmt.Errorf("durable: sync of record %d, only %d appended", index, w.next)
	}
	for {
		switch {
		case w.err != nil:
			return w.err
		case w.durable > index:
			return nil
		case index >= w.taken && w.n < maxFlights && !w.starting:
			w.flushLocked()
		default:
			w.cond.Wait()
		}
	}
}

// Synced reports whether record index is on disk.
func (w *WAL) Synced(index uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.durable > index
}

// Flush writes and fsyncs every record appended so far. The disk_async
// driver calls it every flush interval.
func (w *WAL) Flush() error {
	w.mu.Lock()
	n := w.next
	w.mu.Unlock()
	if n == 0 {
		return nil
	}
	return w.Sync(n - 1)
}

// Syncs returns how many fsyncs of records the WAL has done.
func (w *WAL) Syncs() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.syncs
}

// SyncTime returns the wall time those fsyncs took, added up: divided by
// Syncs, what one fsync costs on this disk under this load.
func (w *WAL) SyncTime() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.syncTime
}

// flushLocked writes what is buffered and fsyncs it, with w.mu held on
// entry and exit but released during the I/O. Up to maxFlights run at
// once; their writes are in the order they took the buffer (wmu), and
// durable moves past a flush's records only once every flush begun
// before it has ended.
func (w *WAL) flushLocked() {
	w.starting = true
	w.mu.Unlock()
	w.wmu.Lock()
	w.mu.Lock()
	w.starting = false
	if w.err != nil || w.taken == w.next {
		// Another flush took the records meanwhile.
		w.mu.Unlock()
		w.wmu.Unlock()
		w.mu.Lock()
		w.cond.Broadcast()
		return
	}
	buf, upto := w.buf, w.next
	w.buf = w.spare[:0]
	w.spare = nil
	w.taken = upto
	slot := (w.head + w.n) % maxFlights
	w.flights[slot] = flight{upto: upto}
	w.n++
	w.mu.Unlock()

	f, err := w.write(buf, upto)
	full := err == nil && w.size >= w.segBytes
	w.mu.Lock()
	w.spare = buf[:0]
	if err == nil {
		w.fsyncing++
	}
	w.mu.Unlock()
	if !full {
		w.wmu.Unlock()
	}
	var took time.Duration
	if err == nil {
		t0 := time.Now()
		err = w.fsync(f)
		took = time.Since(t0)
		w.mu.Lock()
		w.fsyncing--
		w.cond.Broadcast()
		w.mu.Unlock()
	}
	if full {
		// A new segment once no other fsync uses this one.
		if err == nil {
			err = w.nextSegment(upto)
		}
		w.wmu.Unlock()
	}
	w.mu.Lock()
	w.flights[slot].done = true
	if err != nil {
		if w.err == nil {
			w.err = fmt.Errorf("%w: %w", ErrFailed, err)
		}
	} else {
		w.syncs++
		w.syncTime += took
	}
	for w.n > 0 && w.flights[w.head].done {
		w.durable = max(w.durable, w.flights[w.head].upto)
		w.head = (w.head + 1) % maxFlights
		w.n--
	}
	w.cond.Broadcast()
}

// write appends buf (records up to index upto) to the current segment,
// creating the first one, and returns the file to fsync. Called holding
// wmu.
func (w *WAL) write(buf []byte, upto uint64) (*os.File, error) {
	if w.f == nil {
		first := upto - uint64(countRecords(buf))
		if err := w.newSegment(first, w.prevEnd); err != nil {
			return nil, err
		}
	}
	if _, err := w.f.Write(buf); err != nil {
		return nil, err
	}
	w.size += int64(len(buf))
	return w.f, nil
}

// nextSegment closes the full segment, once no fsync of it runs, and
// starts the next, whose first record is upto. Called holding wmu.
func (w *WAL) nextSegment(upto uint64) error {
	w.mu.Lock()
	for w.fsyncing > 0 {
		w.cond.Wait()
	}
	w.mu.Unlock()
	if err := w.f.Close(); err != nil {
		return err
	}
	w.f = nil
	return w.newSegment(upto, uint64(w.size))
}

// countRecords counts the records in buf.
func countRecords(buf []byte) int {
	n := 0
	for off := 0; off < len(buf); n++ {
		off += recHeader + int(binary.LittleEndian.Uint32(buf[off:]))
	}
	return n
}

// newSegment creates the segment whose first record is first, after a
// segment of prevEnd bytes of complete records, whole (a temporary file
// renamed), and opens it for appending.
func (w *WAL) newSegment(first, prevEnd uint64) error {
	name := segName(w.prefix, first)
	h := header{magic: segMagic, version: FormatVersion, cluster: w.cluster, fields: []uint64{first, prevEnd}}.append(nil)
	if err := writeFileSync(w.dir, name, h); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(w.dir, name), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	w.f, w.size = f, int64(len(h))
	w.mu.Lock()
	w.segs = append(w.segs, segment{first: first, name: name})
	w.mu.Unlock()
	return nil
}

// DropBefore removes the segments whose records all come before index
// (a snapshot covers them). The segment being appended to stays.
func (w *WAL) DropBefore(index uint64) error {
	w.mu.Lock()
	var drop []segment
	for len(w.segs) > 1 && w.segs[1].first <= index {
		drop = append(drop, w.segs[0])
		w.segs = w.segs[1:]
	}
	w.mu.Unlock()
	var errs []error
	for _, s := range drop {
		if err := os.Remove(filepath.Join(w.dir, s.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if len(drop) > 0 {
		errs = append(errs, syncDir(w.dir))
	}
	return errors.Join(errs...)
}

// Close flushes what is buffered and closes the segment. Later calls
// return ErrFailed.
func (w *WAL) Close() error {
	err := w.Flush()
	w.mu.Lock()
	for w.n > 0 || w.starting {
		w.cond.Wait()
	}
	if w.err == nil {
		w.err = fmt.Errorf("%w: closed", ErrFailed)
	}
	w.mu.Unlock()
	w.wmu.Lock()
	defer w.wmu.Unlock()
	if w.f != nil {
		if cerr := w.f.Close(); err == nil {
			err = cerr
		}
		w.f = nil
	}
	if cerr := w.syncer.close(); err == nil {
		err = cerr
	}
	return err
}
