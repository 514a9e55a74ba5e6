package durable

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// bothSyncers runs fn with WALs opened on the io_uring syncer and on the
// f.Sync fallback. The ring must be there on Linux unless the kernel
// refuses it, which is logged.
func bothSyncers(t *testing.T, fn func(t *testing.T)) {
	for _, ring := range []bool{true, false} {
		name := map[bool]string{true: "ring", false: "file"}[ring]
		t.Run(name, func(t *testing.T) {
			old := useRing
			useRing = ring
			t.Cleanup(func() { useRing = old })
			if ring {
				if _, err := newRing(); err != nil {
					t.Skipf("no io_uring here: %v", err)
				}
			}
			fn(t)
		})
	}
}

// TestRingSync: the ring fsyncs files, many at once from many goroutines,
// and reports the kernel's error for a descriptor it cannot fsync.
func TestRingSync(t *testing.T) {
	s, err := newRing()
	if runtime.GOOS != "linux" {
		if err == nil {
			t.Fatal("an io_uring off Linux")
		}
		return
	}
	if err != nil {
		t.Skipf("no io_uring here: %v", err)
	}
	defer s.close()
	dir := t.TempDir()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.Create(filepath.Join(dir, string(rune('a'+i))))
			if err != nil {
				errs <- err
				return
			}
			defer f.Close()
			for range 20 {
				if _, err := f.Write([]byte("x")); err != nil {
					errs <- err
					return
				}
				if err := s.sync(f); err != nil {
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
	// An fsync on the ring allocates nothing (a disk admission's path).
	f, err := os.Create(filepath.Join(dir, "allocs"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n := testing.AllocsPerRun(50, func() {
		if err := s.sync(f); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("%v allocations an fsync on the ring, want 0", n)
	}
	// A pipe cannot be fsynced: EINVAL, from the kernel's worker.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	if err := s.sync(pw); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("fsync of a pipe on the ring: %v, want EINVAL", err)
	}
}

// TestWALSyncers runs the WAL's tests on both syncers: the ring (each
// test alone runs on it where the kernel has it) and the f.Sync fallback.
func TestWALSyncers(t *testing.T) {
	tests := map[string]func(*testing.T){
		"Reopens": TestWALReopens, "GroupCommit": TestGroupCommit, "TornTail": TestWALTornTail,
		"DropBefore": TestWALDropBefore, "FailsForGood": TestWALFailsForGood,
		"PipelinedSegments": TestWALPipelinedSegments, "AsyncFsyncFails": testWALAsyncFsyncFails,
	}
	bothSyncers(t, func(t *testing.T) {
		w, _ := readAll(t, t.TempDir(), 0)
		async, err := w.AsyncSync()
		w.Close()
		if async != useRing || err != nil {
			t.Fatalf("AsyncSync() = %v, %v; want %v, nil", async, err, useRing)
		}
		for name, fn := range tests {
			t.Run(name, fn)
		}
	})
}

// testWALAsyncFsyncFails: an fsync the kernel refuses, through the WAL's
// syncer, fails that Sync and every later one with ErrFailed.
func testWALAsyncFsyncFails(t *testing.T) {
	w, _ := readAll(t, t.TempDir(), 0)
	defer w.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	defer pw.Close()
	s := w.syncer
	w.fsync = func(*os.File) error { return s.sync(pw) }
	i := w.Append(rec(0))
	if err := w.Sync(i); !errors.Is(err, ErrFailed) || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("Sync with an fsync refused: %v, want ErrFailed with EINVAL", err)
	}
	w.fsync = s.sync
	j := w.Append(rec(1))
	if err := w.Sync(j); !errors.Is(err, ErrFailed) {
		t.Fatalf("Sync after a refused fsync: %v, want ErrFailed", err)
	}
}

// TestWALCloseReleasesRing: a WAL's ring (its descriptor, its eventfd)
// and its files are released by Close: opening and closing WALs leaves
// no descriptor of those kinds open that was not open before. Only those
// kinds are counted, by number and target, so descriptors the rest of the
// process opens or closes meanwhile (an earlier test's cleanup, the
// runtime) move nothing.
func TestWALCloseReleasesRing(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("counts /proc/self/fd")
	}
	dir := t.TempDir()
	ours := func() map[string]bool {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		open := make(map[string]bool)
		for _, e := range ents {
			target, err := os.Readlink("/proc/self/fd/" + e.Name())
			if err != nil {
				continue // the directory's own descriptor, closed by now
			}
			if strings.Contains(target, "io_uring") || strings.Contains(target, "eventfd") ||
				strings.HasPrefix(target, dir) {
				open[e.Name()+" "+target] = true
			}
		}
		return open
	}
	before := ours()
	for i := range 5 {
		w, _ := readAll(t, dir, 0)
		if async, err := w.AsyncSync(); !async {
			t.Skipf("no io_uring here: %v", err)
		}
		if i == 0 {
			if during := ours(); len(during) <= len(before) {
				t.Fatalf("an open WAL shows no descriptor of its own (%d before, %d open): the count sees nothing", len(before), len(during))
			}
		}
		writeRecs(t, w, i, i+1)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); !errors.Is(err, ErrFailed) {
			t.Fatalf("second Close: %v, want ErrFailed", err)
		}
	}
	var leaked []string
	for fd := range ours() {
		if !before[fd] {
			leaked = append(leaked, fd)
		}
	}
	if len(leaked) > 0 {
		sort.Strings(leaked)
		t.Fatalf("%d descriptors open after 5 WALs opened and closed that were not before: %v", len(leaked), leaked)
	}
}
