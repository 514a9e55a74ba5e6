package peer

import (
	"crypto/rand"
	"encoding/binary"

	"github.com/ringlimit/ringlimit/peer/internal/transport"
)

// opsState holds the node's operational state beyond placement: its
// process start id, readiness and peer-RPC authentication. Each part is
// documented in its own file.
type opsState struct {
	// start is this process's id, gossiped in meta; never zero, so a
	// version 2 member (start 0) never looks like us.
	start uint64
	// auth is the peer-RPC authentication, set in New (auth.go).
	auth transport.Auth
	// ready is the readiness bookkeeping (ready.go).
	ready readyState
}

func (o *opsState) init() {
	o.ready.last = "-"
	var b [8]byte
	for o.start == 0 {
		_, _ = rand.Read(b[:])
		o.start = binary.BigEndian.Uint64(b[:])
	}
}
