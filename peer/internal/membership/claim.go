package membership

import (
	"net"
	"time"

	"github.com/hashicorp/memberlist"
)

// OtherClaimant returns the member of peers, the member list a join's
// state exchange received, that claims the name self at an address other
// than selfAddr and may still be live; nil if none does.
//
// memberlist reports a second claimant of a name (its ConflictDelegate)
// only when the claim it merges is alive. A member the seed suspects, or
// has declared dead, merges as a suspicion instead: the joiner refutes it
// as a rumour about itself and joins, though the member may be live and
// only slow to answer probes (a loaded host). So:
//
//   - alive: a claimant;
//   - left: not one (it said goodbye; the name is free again);
//   - suspect or dead: a claimant if something accepts a TCP connection at
//     its gossip address within probeTimeout. A live host's kernel accepts
//     within a round trip however starved the process is; the address of
//     a crashed process refuses at once, and that of a host that is gone
//     answers nothing. A restart under the same name at another address
//     thus waits at most probeTimeout per such entry.
func OtherClaimant(self, selfAddr string, peers []*memberlist.Node, probeTimeout time.Duration) *memberlist.Node {
	return otherClaimant(self, selfAddr, peers, func(addr string) bool {
		conn, err := net.DialTimeout("tcp", addr, probeTimeout)
		if err != nil {
			return false
		}
		_ = conn.Close()
		return true
	})
}

// otherClaimant is OtherClaimant with the reachability check given.
func otherClaimant(self, selfAddr string, peers []*memberlist.Node, reachable func(addr string) bool) *memberlist.Node {
	for _, p := range peers {
		if p.Name != self || p.Address() == selfAddr {
			continue
		}
		switch p.State {
		case memberlist.StateAlive:
			return p
		case memberlist.StateSuspect, memberlist.StateDead:
			if reachable(p.Address()) {
				return p
			}
		}
	}
	return nil
}

// StateName is memberlist's word for a member's state, for logs.
func StateName(s memberlist.NodeStateType) string {
	switch s {
	case memberlist.StateAlive:
		return "alive"
	case memberlist.StateSuspect:
		return "suspect"
	case memberlist.StateDead:
		return "dead"
	case memberlist.StateLeft:
		return "left"
	}
	return "unknown"
}
