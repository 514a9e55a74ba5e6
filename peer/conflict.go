package peer

import (
	"fmt"
	"sync"

	"github.com/hashicorp/memberlist"
)

// Member names are identities: the ring places keys by name and peers dial
// the address gossiped under it. memberlist does not refuse a second node
// with a name already in use; every member that sees both only logs
// "Conflicting address" and keeps the first. The new node would then run
// with a ring that lists itself while no one else routes to it. So New
// refuses: the conflict is reported (memberlist's ConflictDelegate) during
// the join's state exchange, before Join returns, and New then shuts gossip
// down without a leave (a leave under the shared name would announce the
// established member's departure) and fails with ErrDuplicateName. The
// established member is not disturbed: it logs a warning and stays.

// conflictState records the first member found claiming this node's name.
type conflictState struct {
	mu   sync.Mutex
	addr string // gossip address of the other claimant; "" if none seen
}

// noteConflict is the membership delegate's OnConflict. It is called on
// memberlist's goroutines (during Join, on New's) and never blocks.
func (n *Node) noteConflict(existing, other *memberlist.Node) {
	if existing.Name != n.name {
		return // two other members; memberlist logs it on every claim
	}
	n.ops.conflict.mu.Lock()
	first := n.ops.conflict.addr == ""
	if first {
		n.ops.conflict.addr = other.Address()
	}
	n.ops.conflict.mu.Unlock()
	if first {
		n.log.Warn("another member uses this node's name", "member_addr", other.Address())
	}
}

// duplicateName returns an error wrapping ErrDuplicateName if a member
// with this node's name was seen at another address, else nil.
func (n *Node) duplicateName() error {
	n.ops.conflict.mu.Lock()
	defer n.ops.conflict.mu.Unlock()
	if n.ops.conflict.addr == "" {
		return nil
	}
	return fmt.Errorf("%w: %q is already the name of the member at %s; give this node another name (Config.Name, serve --name)",
		ErrDuplicateName, n.name, n.ops.conflict.addr)
}
