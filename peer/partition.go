package peer

import (
	"fmt"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/shard"
)

// Partitions. A key belongs to the ring partition of its (tenant,
// subject) — never of the policy — so one holder has every policy of a
// subject, and keys move only with their partition (each partition's keys
// live in a store of their own).
//
// Who holds a partition is the ownership log's business (logown.go drives
// it; the rules are stated once in package internal/ownership): a holder
// decides only while the log's table names it at its current liveness
// epoch and its liveness lease holds on its own clock. The ring names
// each partition's target, which the log's leader moves holders toward.
// partTable mirrors, per partition, what the table says, under the
// partition's lock (internal/partition.Part), so that routing,
// replication and the decision path read memory only.
type partTable struct {
	parts []part
	store shard.Config // Config.Store: each partition's store is made from it (newStore)
}

// part is one partition as this node sees it (internal/partition).
type part = partition.Part

// replica is a copy of a partition from its holder, on its backup.
type replica = partition.Replica

// opReq is one validated request: an operation on one key, or a check of
// several policies of one tenant and subject (internal/partition).
type opReq = partition.Request

func newPartTable(n int, store shard.Config) *partTable {
	return &partTable{parts: partition.NewParts(n), store: store}
}

// placementScheme names how keys map to partitions; it is part of the
// cluster fingerprint.
const placementScheme = "tenant-subject/v1"

// placement returns the bytes of ek (a key's canonical encoding) that place
// it: the encoded tenant and subject, without the policy.
func placement(ek []byte) []byte {
	n := 1 + int(ek[0])
	n += 1 + int(ek[n])
	return ek[:n]
}

// newStore returns an empty store for one partition's keys. MaxKeys is
// shared out evenly: each partition may hold MaxKeys/partitions keys (at
// least 64), on whichever member holds or backs it up, so that a member
// holds at most MaxKeys keys however many partitions it has (Config.Store)
// and any partition's copy fits on any member.
func (t *partTable) newStore() *shard.Store {
	cfg := t.store
	cfg.Stripes = partStripes
	if cfg.MaxKeys > 0 {
		cfg.MaxKeys = max(64, cfg.MaxKeys/len(t.parts))
	}
	st, err := shard.NewStore(cfg)
	if err != nil {
		// cfg was validated in New; NewStore only fails on bad values.
		panic(fmt.Sprintf("peer: partition store: %v", err))
	}
	return st
}

// partStripes is the lock stripes of one partition's store.
const partStripes = 16
