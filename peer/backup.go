package peer

import (
	"context"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// Crash backup (DESIGN.md §5). With Config.Backup, an owner notes every key
// it admits for and, every BackupInterval, streams those keys' full states
// to each key's backup member: the member that owns the key if this node
// disappears (ring.Snapshot.Backup). The backup keeps them in a separate
// replica store. When the owner fails, the new owner (that same member)
// restores a key from its replica before deciding for it for the first time.
//
// The bound: a crash loses the admissions made since the last backup that
// reached the replica, so at most BackupInterval plus one RPC of admissions
// per key can be admitted again. Without Backup a crash resets the crashed
// owner's keys: up to one extra window's limit per key.
type backupState struct {
	mu       sync.Mutex
	pending  map[string]Key // keys admitted since the last stream
	replicas *shard.Store   // states this node backs up for others
}

// maxPendingBackup bounds the keys noted between two streams; past it keys
// are not noted (and counted as dropped) until the next stream.
const maxPendingBackup = 1 << 18

func (b *backupState) init(cfg shard.Config) {
	b.pending = make(map[string]Key)
	b.replicas, _ = shard.NewStore(cfg)
}

// note records that key (encoded as ek) was admitted. It allocates only for
// a key not yet noted since the last stream.
func (b *backupState) note(key Key, ek []byte) {
	b.mu.Lock()
	if _, ok := b.pending[string(ek)]; !ok && len(b.pending) < maxPendingBackup {
		b.pending[string(ek)] = key
	}
	b.mu.Unlock()
}

func (n *Node) backupLoop() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.BackupInterval)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
			n.StreamBackups(n.ctx)
		}
	}
}

// StreamBackups sends the state of every key admitted since the last call to
// its backup member. The node calls it every BackupInterval when
// Config.Backup is set; tests may call it directly. It returns the number of
// keys that reached their backups.
func (n *Node) StreamBackups(ctx context.Context) int {
	n.backup.mu.Lock()
	pending := n.backup.pending
	n.backup.pending = make(map[string]Key, len(pending))
	n.backup.mu.Unlock()
	if len(pending) == 0 {
		return 0
	}
	v := n.view.Load()
	now := n.clock()
	groups := make(map[string][]*peerpb.KeyState)
	for ek, k := range pending {
		to := v.snap.Backup([]byte(ek))
		if to == "" || v.snap.Owner([]byte(ek)) != n.name {
			continue
		}
		if st, ok := n.store.Export(k, now); ok {
			groups[to] = append(groups[to], stateToWire(st))
		}
	}
	sent := 0
	for to, states := range groups {
		c, err := n.client(to, v.addrs[to])
		for len(states) > 0 && err == nil {
			b := states[:min(len(states), handoffBatch)]
			states = states[len(b):]
			rctx, cancel := context.WithTimeout(ctx, n.cfg.ForwardTimeout)
			_, err = c.stub.Backup(rctx, &peerpb.BackupRequest{Sender: n.name, Keys: b})
			cancel()
			if err == nil {
				sent += len(b)
				n.metrics.Backup("sent", "ok", len(b))
			}
		}
		if err != nil {
			n.metrics.Backup("sent", "failed", len(states))
			n.warnThrottled("backup stream failed", "peer", to, "err", err)
		}
	}
	return sent
}

// Backup stores the sender's key states as replicas, replacing older ones.
func (s *server) Backup(_ context.Context, req *peerpb.BackupRequest) (*peerpb.BackupResponse, error) {
	n := s.n
	if len(req.GetKeys()) > maxWireBatch {
		return nil, errBatchTooLarge(len(req.GetKeys()))
	}
	now := n.clock()
	var accepted uint32
	for _, ks := range req.GetKeys() {
		st, err := stateFromWire(ks)
		if err != nil {
			return nil, statusInvalid(err.Error())
		}
		p := n.policies[st.Key.Policy]
		if p == nil || p.sp.Algorithm != st.Algorithm {
			continue
		}
		// A replica is the owner's latest full state: replace, not merge.
		n.backup.replicas.Delete(st.Key)
		if err := n.backup.replicas.Import(st, p.sp, now); err == nil {
			accepted++
		}
	}
	n.metrics.Backup("received", "ok", int(accepted))
	return &peerpb.BackupResponse{Accepted: accepted}, nil
}

// restoreBackup moves key's replica, if this node holds one, into the store:
// its owner failed and this node now owns the key.
func (n *Node) restoreBackup(v *view, key Key, p *policy, now time.Time) error {
	if n.backup.replicas.Len() == 0 {
		return nil
	}
	st, ok := n.backup.replicas.Take(key, now)
	if !ok {
		return nil
	}
	if err := n.store.Import(st, p.sp, now); err != nil {
		n.log.Error("backup restore failed", "err", err)
		return nil
	}
	n.metrics.Backup("restored", "ok", 1)
	return nil
}
