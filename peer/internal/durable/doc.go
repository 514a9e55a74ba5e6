// Package durable is a member's data directory: the files that let the
// ownership log and the state of the partitions a member holds or backs
// survive a restart of every member at once.
//
// What it owns:
//
//   - OpenDir: the directory's identity (MetaFile: cluster, member name,
//     and the incarnation the member was first given, which it keeps
//     across restarts) and a lock, so that two processes never share one.
//   - WAL: an append-only log in segment files, each record framed with its
//     length (twice, the second inverted) and a CRC-32C, with group commit:
//     Append buffers, Sync waits for an fsync that serves every record
//     appended before it began, Flush writes everything now (a driver
//     flushing every N ms for disk_async calls it on its ticker). Records
//     appended while an fsync runs are written and fsynced beside it (two
//     at a time), and count as on disk only once the earlier fsync has
//     ended too. On Linux the fsyncs run on an io_uring, the waiter
//     parked in the netpoller rather than holding a processor; where the
//     kernel refuses a ring, f.Sync (WAL.AsyncSync says which).
//   - WriteBlob/ReadBlob: whole files (snapshots, the meta file) written
//     to a temporary file, fsynced and renamed.
//   - Parts: partition state as the operations copies and replication
//     already send (peerpb.PartitionOp with the wall time its ages are
//     relative to), logged in the order they were applied, plus a snapshot;
//     Recovery gives them back per partition, and Restore applies them to
//     a fresh shard.Store, ages rebased on the restart's wall clock.
//
// What it guarantees:
//
//   - A record is on disk once Sync(index) returned nil; after a failed
//     write or fsync every later Sync fails (ErrFailed), since the kernel
//     may have dropped the pages.
//   - Opening never writes before everything was checked: a directory of
//     another cluster or member (ErrOtherCluster), damaged (ErrCorrupt: a
//     checksum, a length, a segment cut short or missing, the meta file
//     missing beside other files) or in a newer format (ErrNewerFormat) is
//     refused with an error naming the file, and left exactly as it was.
//   - The one shortfall a crash can leave, a record cut at the end of the
//     last segment (never fsynced, so never acknowledged), is skipped and
//     left in place; the next segment's header records where the complete
//     records ended, so later opens tell it from damage.
//   - Time across a restart: monotonic clocks restart, so only wall time
//     links the runs. Each record keeps the wall time its ages were taken
//     at; Recovery.At restores at the later of the restarted clock and
//     the newest wall time written. A clock that moved backwards across the
//     restart therefore holds the restored keys' time at that instant (the
//     shard's per-key rule: time never moves backward) until it catches
//     up: windows count longer, never shorter, and a calendar period is
//     never taken for an earlier one.
//
// What it does not do: it decides nothing about ownership (whether a
// partition's state on disk is the one the table counts on is the
// ownership machine's question: RecoveredPart carries the copy's epoch
// and sequence for it), starts no goroutine, and does not detect a wall
// clock that moved forwards across a restart (windows then end early by
// that step, as they would for a clock step without a restart). A record
// cut at the end of the last segment cannot be told from a file
// truncated at that point: the shortfall is taken as the crash's.
package durable
