package durable

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func rec(i int) []byte {
	return []byte(fmt.Sprintf("record %d %s", i, bytes.Repeat([]byte{'x'}, i%50)))
}

// readAll opens prefix in dir and returns its records.
func readAll(t *testing.T, dir string, segBytes int64) (*WAL, [][]byte) {
	t.Helper()
	var got [][]byte
	w, err := OpenWAL(dir, "log", "c1", segBytes, func(i uint64, b []byte) error {
		if i != uint64(len(got)) {
			return fmt.Errorf("record %d replayed as index %d", len(got), i)
		}
		got = append(got, bytes.Clone(b))
		return nil
	})
	if err != nil {
		t.Fatalf("OpenWAL: %v", err)
	}
	return w, got
}

func writeRecs(t *testing.T, w *WAL, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if idx := w.Append(rec(i)); idx != uint64(i) {
			t.Fatalf("Append %d returned index %d", i, idx)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

func checkRecs(t *testing.T, got [][]byte, n int) {
	t.Helper()
	if len(got) != n {
		t.Fatalf("replayed %d records, want %d", len(got), n)
	}
	for i, b := range got {
		if !bytes.Equal(b, rec(i)) {
			t.Fatalf("record %d = %q, want %q", i, b, rec(i))
		}
	}
}

func TestWALReopens(t *testing.T) {
	dir := t.TempDir()
	w, got := readAll(t, dir, 512)
	checkRecs(t, got, 0)
	for i := range 40 {
		w.Append(rec(i))
		if i%7 == 0 {
			if err := w.Sync(uint64(i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	segs, _ := listSegments(dir, "log")
	if len(segs) < 3 {
		t.Fatalf("%d segments of 512 bytes for 40 records, want several", len(segs))
	}
	w, got = readAll(t, dir, 512)
	checkRecs(t, got, 40)
	writeRecs(t, w, 40, 60)
	w.Close()
	_, got = readAll(t, dir, 512)
	checkRecs(t, got, 60)
}

// TestGroupCommit: one fsync serves every record appended before it.
func TestGroupCommit(t *testing.T) {
	w, _ := readAll(t, t.TempDir(), 0)
	defer w.Close()
	var last uint64
	for i := range 100 {
		last = w.Append(rec(i))
	}
	if err := w.Sync(last); err != nil {
		t.Fatal(err)
	}
	for i := range last + 1 {
		if err := w.Sync(i); err != nil {
			t.Fatal(err)
		}
	}
	if n := w.Syncs(); n != 1 {
		t.Fatalf("%d fsyncs for 100 records appended before one Sync, want 1", n)
	}
	if err := w.Sync(last + 1); err == nil {
		t.Fatal("Sync of a record never appended returned nil")
	}
}

// TestWALTornTail: a record cut at the end of the last segment (a crash
// mid-write, never fsynced) is dropped, left on disk, and the next segment
// records where the complete records ended, so that reopening again is
// clean.
func TestWALTornTail(t *testing.T) {
	dir := t.TempDir()
	w, _ := readAll(t, dir, 0)
	writeRecs(t, w, 0, 10)
	w.Close()
	segs, _ := listSegments(dir, "log")
	path := filepath.Join(dir, segs[len(segs)-1].name)
	fi, _ := os.Stat(path)
	if err := os.Truncate(path, fi.Size()-3); err != nil {
		t.Fatal(err)
	}
	w, got := readAll(t, dir, 0)
	checkRecs(t, got, 9)
	if fi2, _ := os.Stat(path); fi2.Size() != fi.Size()-3 {
		t.Fatalf("open changed the torn segment: %d bytes, want %d", fi2.Size(), fi.Size()-3)
	}
	writeRecs(t, w, 9, 15)
	w.Close()
	_, got = readAll(t, dir, 0)
	checkRecs(t, got, 15)
}

func TestWALDropBefore(t *testing.T) {
	dir := t.TempDir()
	w, _ := readAll(t, dir, 256)
	for i := range 50 {
		writeRecs(t, w, i, i+1)
	}
	segs, _ := listSegments(dir, "log")
	if err := w.DropBefore(30); err != nil {
		t.Fatal(err)
	}
	w.Close()
	left, _ := listSegments(dir, "log")
	if len(left) >= len(segs) || left[0].first > 30 {
		t.Fatalf("segments %v after dropping before 30 (were %v)", left, segs)
	}
	var first uint64 = 1 << 63
	n := 0
	_, err := OpenWAL(dir, "log", "c1", 256, func(i uint64, b []byte) error {
		first = min(first, i)
		if !bytes.Equal(b, rec(int(i))) {
			return fmt.Errorf("record %d = %q", i, b)
		}
		n++
		return nil
	})
	if err != nil || first > 30 || first+uint64(n) != 50 {
		t.Fatalf("after DropBefore(30): first %d, %d records, err %v; want records from at most 30 to 49", first, n, err)
	}
}

// TestWALFailsForGood: after a failed write every Sync fails, even for
// records a later write could have carried.
func TestWALFailsForGood(t *testing.T) {
	dir := t.TempDir()
	w, _ := readAll(t, dir, 0)
	writeRecs(t, w, 0, 1)
	w.f.Close() // the next write fails
	i := w.Append(rec(1))
	if err := w.Sync(i); !errors.Is(err, ErrFailed) {
		t.Fatalf("Sync after a failed write: %v, want ErrFailed", err)
	}
	j := w.Append(rec(2))
	if err := w.Sync(j); !errors.Is(err, ErrFailed) {
		t.Fatalf("second Sync after a failed write: %v, want ErrFailed", err)
	}
}

// TestWALPipelined: a record appended while an fsync runs is written and
// fsynced at once beside it, not after it; and it counts as on disk only
// once the fsync begun before its own has ended too (a record is never
// reported durable while an earlier one may still be lost).
func TestWALPipelined(t *testing.T) {
	w, _ := readAll(t, t.TempDir(), 0)
	entered := make(chan int, 4)
	release := []chan struct{}{make(chan struct{}), make(chan struct{})}
	released := make([]bool, len(release))
	free := func(i int) {
		if !released[i] {
			released[i] = true
			close(release[i])
		}
	}
	defer func() {
		// On failure too: Close waits for the held fsyncs.
		free(0)
		free(1)
		w.Close()
	}()
	var calls atomic.Int32
	w.fsync = func(f *os.File) error {
		c := int(calls.Add(1)) - 1
		entered <- c
		if c < len(release) {
			<-release[c]
		}
		return f.Sync()
	}
	wait := func(what string) int {
		t.Helper()
		select {
		case c := <-entered:
			return c
		case <-time.After(10 * time.Second):
			t.Fatalf("timed out waiting for %s", what)
			return 0
		}
	}
	r0 := w.Append(rec(0))
	done0 := make(chan error, 1)
	go func() { done0 <- w.Sync(r0) }()
	wait("the first fsync")
	r1 := w.Append(rec(1))
	r2 := w.Append(rec(2))
	done1 := make(chan error, 1)
	go func() { done1 <- w.Sync(r2) }()
	// The second fsync starts while the first still runs.
	wait("the second fsync, beside the first")
	if w.Synced(r0) || w.Synced(r1) {
		t.Fatal("a record reported on disk before its fsync ended")
	}
	free(1) // the second ends first: not yet on disk
	deadline := time.Now().Add(10 * time.Second)
	for w.Syncs() < 1 && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	if w.Syncs() != 1 {
		t.Fatalf("%d fsyncs ended; want the second one", w.Syncs())
	}
	select {
	case err := <-done1:
		t.Fatalf("Sync of records after the running fsync returned (%v) before it ended", err)
	default:
	}
	if w.Synced(r1) || w.Synced(r2) {
		t.Fatal("records reported on disk while an fsync begun before theirs still runs")
	}
	free(0)
	for _, ch := range []chan error{done0, done1} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
	if !w.Synced(r2) {
		t.Fatal("record 2 not on disk after both fsyncs")
	}
	// A third record, appended with no fsync running, starts its own.
	r3 := w.Append(rec(3))
	if err := w.Sync(r3); err != nil {
		t.Fatal(err)
	}
	if c := wait("the third fsync"); c != 2 || w.Syncs() != 3 {
		t.Fatalf("fsync call %d, %d fsyncs; want 3", c, w.Syncs())
	}
}

// TestWALPipelinedSegments: many writers syncing at once through small
// segments (each flush may start a segment while another's fsync runs)
// leave every record on disk, in order.
func TestWALPipelinedSegments(t *testing.T) {
	dir := t.TempDir()
	w, _ := readAll(t, dir, 300)
	const writers, each = 8, 40
	var mu sync.Mutex // appends in rec order: record i is rec(i)
	next := 0
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				mu.Lock()
				i := w.Append(rec(next))
				next++
				mu.Unlock()
				if err := w.Sync(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	segs, _ := listSegments(dir, "log")
	if len(segs) < 5 {
		t.Fatalf("%d segments of 300 bytes, want many", len(segs))
	}
	_, got := readAll(t, dir, 300)
	checkRecs(t, got, writers*each)
}
