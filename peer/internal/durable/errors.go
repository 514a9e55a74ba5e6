package durable

import "errors"

// ErrCorrupt is returned by the Open functions when a file in the data
// directory is damaged: a checksum that does not match, a record or
// header cut short where no crash could have cut it, a segment missing
// from the sequence. The message names the file and the offset.
var ErrCorrupt = errors.New("durable: data directory corrupt")

// ErrOtherCluster is returned when a file in the data directory was
// written for another cluster (or another member) than the one asking.
var ErrOtherCluster = errors.New("durable: data directory belongs to another cluster")

// ErrNewerFormat is returned when a file was written in a format version
// this build does not read.
var ErrNewerFormat = errors.New("durable: data directory written by a newer version")

// ErrLocked is returned when another process holds the data directory.
var ErrLocked = errors.New("durable: data directory in use by another process")

// ErrFailed is returned by every write once one write or fsync failed:
// after a failed fsync the kernel may have dropped the dirty pages, so
// nothing written since the last good fsync can be trusted to be on disk,
// and retrying could report success for lost data.
var ErrFailed = errors.New("durable: an earlier write to the data directory failed")
