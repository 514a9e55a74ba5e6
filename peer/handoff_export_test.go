package peer

import "time"

// setHandoffFault installs f as n's handoff fault hook: the Handoff and Pull
// handlers call it at their fault points (faultHandoffBefore,
// faultHandoffAfter, faultPullAfter) and fail the RPC with its error. nil
// removes the hook.
func (n *Node) setHandoffFault(f func(point string) error) {
	if f == nil {
		n.handoff.faults.Store(nil)
		return
	}
	ff := faultFunc(f)
	n.handoff.faults.Store(&ff)
}

// stopRPCForTest stops n's gRPC server at once and leaves gossip running:
// peers still see n as a member, but every RPC to it fails.
func (n *Node) stopRPCForTest() { n.grpcSrv.Stop() }

// holdsForTest reports whether n's store holds state for key.
func (n *Node) holdsForTest(key Key) bool { return n.store.Has(key) }

// decisionPointForTest reports whether n is a decision point for key now:
// it holds the key's state, has no live tombstone for it, is not leaving,
// and its ring names it as owner or it adopted the key from the owner.
func (n *Node) decisionPointForTest(key Key) bool {
	if n.closing.Load() || !n.store.Has(key) {
		return false
	}
	var buf [64 * 3]byte
	ek, ok := key.AppendEncoded(buf[:0])
	if !ok {
		return false
	}
	v := n.view.Load()
	s := n.handoff.stripe(ek)
	s.mu.RLock()
	tp := s.gone[string(ek)]
	var t tombstone
	if tp != nil {
		t = *tp
	}
	s.mu.RUnlock()
	if tp != nil && t.live(v, n.clock(), n.cfg.HandoffGrace) {
		return false
	}
	owner := v.snap.Owner(ek)
	return owner == n.name || n.handoff.adoptedFrom(ek) == owner
}

// backupOwnerForTest returns the member that would own key if its owner
// left, in n's ring.
func (n *Node) backupOwnerForTest(key Key) string {
	var buf [64 * 3]byte
	ek, _ := key.AppendEncoded(buf[:0])
	return n.view.Load().snap.Backup(ek)
}

// lastBackupForTest returns the start (wall clock) of n's last backup
// stream that reached every backup member; zero if none did.
func (n *Node) lastBackupForTest() time.Time {
	n.backup.mu.Lock()
	defer n.backup.mu.Unlock()
	return n.backup.lastOK
}

// hasReplicaForTest reports whether n holds a crash backup of key.
func (n *Node) hasReplicaForTest(key Key) bool { return n.backup.replicas.Has(key) }
