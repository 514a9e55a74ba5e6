//go:build !linux

package durable

import "errors"

// newRing has no asynchronous fsync to offer off Linux.
func newRing() (syncer, error) {
	return nil, errors.New("no io_uring on this platform")
}
