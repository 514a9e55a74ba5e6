package peer

import (
	"crypto/rand"
	"encoding/binary"

	"github.com/ringlimit/ringlimit/peer/internal/transport"
)

// opsState holds the node's operational state beyond placement: its
// process start id, the members' last seen start ids, name conflicts,
// readiness, the reconnect set and peer-RPC authentication. Each part is
// documented in its own file.
type opsState struct {
	// start is this process's id, gossiped in meta; never zero, so a
	// version 2 member (start 0) never looks like us.
	start uint64
	// starts maps member names to the start id last seen in their meta.
	// Only the rebuild goroutine (or New, before it starts) touches it.
	starts map[string]uint64
	// conflict records another member claiming our name (conflict.go).
	conflict conflictState
	// auth is the peer-RPC authentication, set in New (auth.go).
	auth transport.Auth
	// ready is the readiness bookkeeping (ready.go).
	ready readyState
	// reconnect is the set of failed members to rejoin (reconnect.go).
	reconnect reconnectState
}

func (o *opsState) init() {
	o.ready.last = "-"
	var b [8]byte
	for o.start == 0 {
		_, _ = rand.Read(b[:])
		o.start = binary.BigEndian.Uint64(b[:])
	}
}
