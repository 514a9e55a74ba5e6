package durable

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ring is a syncer on a Linux io_uring: sync puts an IORING_OP_FSYNC in
// the submission queue and submits it (io_uring_enter returns at once:
// the kernel runs an fsync in its own io-wq worker thread), then parks
// its goroutine in Go's netpoller on an eventfd the ring signals for each
// completion. A blocking fsync keeps its goroutine's processor (P) until
// it returns, or until the runtime's monitor takes the P back, which it
// does late when a P is idle; parked, the goroutine leaves the P to
// others. The waiters take turns reading the eventfd: the one reading
// reaps every completion and hands each to its waiter.
type ring struct {
	fd  int
	ev  *os.File // the eventfd, non-blocking: a Read parks in the netpoller
	mem struct{ sq, cq, sqes []byte }

	// Pointers into the shared rings.
	sqTail, sqMask, cqHead, cqTail, cqMask *uint32
	sqArray                                []uint32
	cqes                                   []byte

	mu   sync.Mutex
	cond sync.Cond
	// slots are the submissions in flight, by user_data: busy, and once
	// reaped done with the fsync's result (0 or -errno).
	slots [ringEntries]ringSlot
	// reading: a waiter reads the eventfd (into evBuf); closed: the
	// rings are unmapped.
	reading, closed bool
	evBuf           [8]byte
}

type ringSlot struct {
	busy, done bool
	res        int32
}

// ringEntries bounds the fsyncs in flight on one ring: a WAL runs at most
// maxFlights; the rest is room.
const ringEntries = 8

const (
	ioringOffSQRing    = 0
	ioringOffCQRing    = 0x8000000
	ioringOffSQEs      = 0x10000000
	ioringOpFsync      = 3
	ioringRegisterEvfd = 4
	sqeSize            = 64
	cqeSize            = 16
)

// ioUringParams is struct io_uring_params.
type ioUringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
	resv                                                                   [3]uint32
	sqOff                                                                  struct {
		head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
		userAddr                                                        uint64
	}
	cqOff struct {
		head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
		userAddr                                                        uint64
	}
}

// newRing sets up a ring with its eventfd. Any error (ENOSYS on an old
// kernel, EPERM from seccomp or io_uring_disabled) leaves nothing open.
func newRing() (_ syncer, err error) {
	var p ioUringParams
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, ringEntries, uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &ring{fd: int(fd)}
	r.cond.L = &r.mu
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	if r.mem.sq, err = unix.Mmap(r.fd, ioringOffSQRing, int(p.sqOff.array+p.sqEntries*4), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return nil, fmt.Errorf("io_uring: mmap of the submission ring: %w", err)
	}
	if r.mem.cq, err = unix.Mmap(r.fd, ioringOffCQRing, int(p.cqOff.cqes+p.cqEntries*cqeSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return nil, fmt.Errorf("io_uring: mmap of the completion ring: %w", err)
	}
	if r.mem.sqes, err = unix.Mmap(r.fd, ioringOffSQEs, int(p.sqEntries*sqeSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return nil, fmt.Errorf("io_uring: mmap of the submissions: %w", err)
	}
	sq, cq := r.mem.sq, r.mem.cq
	r.sqTail = (*uint32)(unsafe.Pointer(&sq[p.sqOff.tail]))
	r.sqMask = (*uint32)(unsafe.Pointer(&sq[p.sqOff.ringMask]))
	r.sqArray = unsafe.Slice((*uint32)(unsafe.Pointer(&sq[p.sqOff.array])), p.sqEntries)
	r.cqHead = (*uint32)(unsafe.Pointer(&cq[p.cqOff.head]))
	r.cqTail = (*uint32)(unsafe.Pointer(&cq[p.cqOff.tail]))
	r.cqMask = (*uint32)(unsafe.Pointer(&cq[p.cqOff.ringMask]))
	r.cqes = cq[p.cqOff.cqes:]
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("io_uring: eventfd: %w", err)
	}
	r.ev = os.NewFile(uintptr(efd), "io_uring eventfd")
	e := int32(efd)
	if _, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, fd, ioringRegisterEvfd, uintptr(unsafe.Pointer(&e)), 1, 0, 0); errno != 0 {
		return nil, fmt.Errorf("io_uring_register of the eventfd: %w", errno)
	}
	return r, nil
}

// sync fsyncs f on the ring and waits, parked, for the result. It
// allocates nothing. f.Fd is safe here: the WAL closes a segment only
// once no fsync of it runs, and the kernel holds its own reference to
// the file from the submission on.
func (r *ring) sync(f *os.File) error {
	slot, err := r.submit(int32(f.Fd()))
	if err != nil {
		return err
	}
	res, err := r.wait(slot)
	if err != nil {
		return err
	}
	if res < 0 {
		return &os.PathError{Op: "fsync", Path: f.Name(), Err: syscall.Errno(-res)}
	}
	return nil
}

// submit queues an fsync of fd in a free slot and submits it.
func (r *ring) submit(fd int32) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	slot := r.freeSlotLocked()
	for slot < 0 {
		// Every slot's owner is in wait: one of them reaps and wakes us.
		r.cond.Wait()
		slot = r.freeSlotLocked()
	}
	tail := *r.sqTail // only submit writes it, under mu
	idx := tail & *r.sqMask
	sqe := r.mem.sqes[idx*sqeSize : (idx+1)*sqeSize]
	clear(sqe)
	sqe[0] = ioringOpFsync
	*(*int32)(unsafe.Pointer(&sqe[4])) = fd
	*(*uint64)(unsafe.Pointer(&sqe[32])) = uint64(slot)
	r.sqArray[idx] = idx
	atomic.StoreUint32(r.sqTail, tail+1)
	// Without SQPOLL the kernel takes the submission during the call; an
	// fsync cannot run without blocking, so it goes to an io-wq worker
	// and the call returns at once.
	n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), 1, 0, 0, 0, 0)
	if errno != 0 || n != 1 {
		// Not taken: take it back.
		atomic.StoreUint32(r.sqTail, tail)
		if errno == 0 {
			errno = unix.EAGAIN
		}
		return 0, fmt.Errorf("io_uring_enter: %w", errno)
	}
	r.slots[slot] = ringSlot{busy: true}
	return slot, nil
}

// freeSlotLocked returns a slot not in flight, or -1.
func (r *ring) freeSlotLocked() int {
	for i := range r.slots {
		if !r.slots[i].busy {
			return i
		}
	}
	return -1
}

// wait returns slot's result once its completion is reaped. While it
// waits, one waiter at a time reads the eventfd (parked in the
// netpoller, holding no P) and reaps every completion there is; the
// others wait on cond for a reap to give them theirs or the turn to read.
func (r *ring) wait(slot int) (int32, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reapLocked()
	for !r.slots[slot].done {
		if r.reading {
			r.cond.Wait()
			continue
		}
		r.reading = true
		r.mu.Unlock()
		_, err := r.ev.Read(r.evBuf[:])
		r.mu.Lock()
		r.reading = false
		r.reapLocked()
		r.cond.Broadcast()
		if err != nil && !r.slots[slot].done {
			return 0, fmt.Errorf("io_uring: reading its eventfd: %w", err)
		}
	}
	res := r.slots[slot].res
	r.slots[slot] = ringSlot{}
	r.cond.Broadcast() // a submit may wait for the slot
	return res, nil
}

// reapLocked moves every completion in the ring to its slot.
func (r *ring) reapLocked() {
	if r.closed {
		return
	}
	head, tail := *r.cqHead, atomic.LoadUint32(r.cqTail)
	for ; head != tail; head++ {
		off := (head & *r.cqMask) * cqeSize
		cqe := r.cqes[off : off+cqeSize]
		slot := *(*uint64)(unsafe.Pointer(&cqe[0]))
		if slot < ringEntries && r.slots[slot].busy {
			r.slots[slot].done = true
			r.slots[slot].res = *(*int32)(unsafe.Pointer(&cqe[8]))
		}
	}
	atomic.StoreUint32(r.cqHead, head)
}

// close unmaps the rings and closes the ring's and the eventfd's
// descriptors. No sync may be running. A second call does nothing.
func (r *ring) close() error {
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return nil
	}
	var errs []error
	if r.ev != nil {
		errs = append(errs, r.ev.Close())
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	for _, m := range [][]byte{r.mem.sqes, r.mem.cq, r.mem.sq} {
		if m != nil {
			errs = append(errs, unix.Munmap(m))
		}
	}
	errs = append(errs, unix.Close(r.fd))
	return errors.Join(errs...)
}
