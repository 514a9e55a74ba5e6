package durable

import "os"

// syncer makes a segment's written records durable. One per WAL, chosen
// when it opens: on Linux an io_uring whose fsyncs run in the kernel's
// workers while the waiting goroutine is parked, so it holds no
// processor (P) and no thread meanwhile (syncer_linux.go); elsewhere, or
// where the ring cannot be set up, the blocking f.Sync.
type syncer interface {
	// sync makes what was written to f durable (fsync).
	sync(f *os.File) error
	// close releases the syncer's resources; no sync runs or follows.
	close() error
}

// fileSyncer is the portable syncer: f.Sync, a blocking fsync that keeps
// the calling goroutine's processor until it returns.
type fileSyncer struct{}

func (fileSyncer) sync(f *os.File) error { return f.Sync() }
func (fileSyncer) close() error          { return nil }

// useRing chooses the syncer of the WALs opened from now on: the
// asynchronous one where the platform has it (true, the default), or
// f.Sync (false). For tests and measurements; a WAL's choice is fixed
// when it opens.
var useRing = true

// newSyncer returns the syncer for a new WAL and, when it fell back to
// f.Sync although the ring was wanted, why.
func newSyncer() (syncer, error) {
	if !useRing {
		return fileSyncer{}, nil
	}
	r, err := newRing()
	if err != nil {
		return fileSyncer{}, err
	}
	return r, nil
}
