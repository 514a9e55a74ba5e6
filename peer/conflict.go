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
// refuses: each join's state exchange is checked before it is merged
// (memberlist's MergeDelegate, membership.OtherClaimant) for another
// member under this node's name that may be live, whatever state the
// seed gives it; memberlist's own report (its ConflictDelegate) covers
// only an alive one, and a seed that suspected a slow member, or had
// declared it dead, let the duplicate in. The check refuses the merge,
// the join stops, and New shuts gossip down without a leave (a leave
// under the shared name would announce the established member's
// departure) and fails with ErrDuplicateName. A member that sees a joiner
// claim its own name refuses that merge too. The established member is
// not disturbed: it logs a warning and stays.

// conflictState records the first member found claiming this node's name.
type conflictState struct {
	mu   sync.Mutex
	addr string // gossip address of the other claimant; "" if none seen
	// stop, if set, is called once the first claimant is seen: it ends
	// the join under way (New's).
	stop func()
}

// note records other as a claimant of name self (existing is the
// member memberlist knows under the name) and reports whether it is the
// first one seen. Called on memberlist's goroutines (during Join, on
// New's); never blocks.
func (c *conflictState) note(self string, existing, other *memberlist.Node) (first bool) {
	if existing.Name != self {
		return false // two other members; memberlist logs it on every claim
	}
	return c.claim(other.Address())
}

// claim records addr as the gossip address of another claimant of this
// node's name and reports whether it is the first one seen. Never
// blocks.
func (c *conflictState) claim(addr string) (first bool) {
	c.mu.Lock()
	first = c.addr == ""
	if first {
		c.addr = addr
	}
	stop := c.stop
	c.mu.Unlock()
	if first && stop != nil {
		stop()
	}
	return first
}

// err returns an error wrapping ErrDuplicateName if a member with name
// self was seen at another address, else nil.
func (c *conflictState) err(self string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.addr == "" {
		return nil
	}
	return fmt.Errorf("%w: %q is already the name of the member at %s; give this node another name (Config.Name, serve --name)",
		ErrDuplicateName, self, c.addr)
}
