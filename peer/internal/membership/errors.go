package membership

import "errors"

// ErrKeyMismatch is returned by Join when a seed answered but its gossip
// encryption differs from this node's (no key on one side, or another
// key): waiting cannot fix that, so Join fails at once.
var ErrKeyMismatch = errors.New("peer: gossip encryption keys differ")
