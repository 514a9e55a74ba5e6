package peer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// Crash backup (DESIGN.md §5). With Config.Backup, an owner notes every key
// whose state changes (an admission, or state arriving by handoff or
// restore) and, every BackupInterval, streams those keys' full states to
// each key's backup member: the member that owns the key if this node
// disappears (ring.Snapshot.Backup). After a ring change it streams every
// key it owns, since backup members move with the ring. The backup keeps
// the states in a separate replica store, each replacing the previous one.
// When the owner fails, the new owner (that same member) finds no live
// previous owner holding the key and restores the replica before it decides
// for the key for the first time (within HandoffGrace of the ring change).
//
// The bound, per key: a crash loses the admissions made after the start of
// the last stream that reached the backup. Streams start every
// BackupInterval and a failed one is retried by the next, so with a healthy
// backup that is at most the admissions of the last BackupInterval plus one
// stream's duration (one RPC per 1024 keys per backup member, bounded by
// ForwardTimeout) before the crash: those are admitted again after it, on
// top of the limit. Keys are unavailable from the crash until the survivors'
// failure detector removes the owner from the ring (memberlist's probe and
// suspicion timeouts): requests forwarded to the dead owner fail meanwhile.
// Without Backup a crash resets the crashed owner's keys: each can admit up
// to its full limit again, on top of what it admitted in the window.
//
// Cost: on each admission, a map lookup under one of 64 striped mutexes
// (an insert for a key not yet noted since the last stream); per interval,
// one export of each noted key's whole log plus its share of one RPC per
// 1024 keys. The stream's cost grows with the keys admitted per interval
// and their log lengths (at most min(L, W/resolution) runs each); see
// BenchmarkAllowBackup.
type backupState struct {
	// pending holds the keys changed since the last stream, striped by key
	// hash so that noting an admission does not serialise all decisions.
	pending  [pendingStripes]pendingStripe
	mu       sync.Mutex // guards lastOK
	lastOK   time.Time  // start of the last stream that reached every backup
	replicas *shard.Store
	full     atomic.Bool // stream every owned key next time
}

type pendingStripe struct {
	mu sync.Mutex
	m  map[string]Key
	_  [64 - 16]byte // one stripe per cache line
}

const pendingStripes = 64

// maxPendingBackup bounds the keys noted between two streams (per stripe:
// maxPendingBackup / pendingStripes); past it keys are not noted and the
// next stream sends every owned key instead.
const maxPendingBackup = 1 << 18

func (b *backupState) init(cfg shard.Config) {
	for i := range b.pending {
		b.pending[i].m = make(map[string]Key)
	}
	b.replicas, _ = shard.NewStore(cfg)
}

// note records that key (encoded as ek) changed. It allocates only for a
// key not yet noted since the last stream.
func (b *backupState) note(key Key, ek []byte) {
	ps := &b.pending[xxhash.Sum64(ek)&(pendingStripes-1)]
	ps.mu.Lock()
	if _, ok := ps.m[string(ek)]; !ok {
		if len(ps.m) < maxPendingBackup/pendingStripes {
			ps.m[string(ek)] = key
		} else {
			b.full.Store(true)
		}
	}
	ps.mu.Unlock()
}

// takePending returns the noted keys and starts a new set.
func (b *backupState) takePending() []Key {
	var out []Key
	for i := range b.pending {
		ps := &b.pending[i]
		ps.mu.Lock()
		m := ps.m
		if len(m) == 0 {
			ps.mu.Unlock()
			continue
		}
		ps.m = make(map[string]Key, len(m))
		ps.mu.Unlock()
		for _, k := range m { // m is ours now: note writes to the new map
			out = append(out, k)
		}
	}
	return out
}

// noteBackup notes key for the next backup stream when backups are on.
func (n *Node) noteBackup(key Key) {
	if !n.cfg.Backup {
		return
	}
	var buf [shard.MaxEncodedKeyLen]byte
	if ek, ok := key.AppendEncoded(buf[:0]); ok {
		n.backup.note(key, ek)
	}
}

// StreamBackups sends the state of every key changed since the last call
// (every owned key after a ring change) to its backup member. The node
// calls it every BackupInterval when Config.Backup is set; tests and
// embedders may call it directly, for example right before a planned
// restart. Keys whose stream failed are sent again by the next call. It
// returns the number of keys that reached their backups. Safe for
// concurrent use.
func (n *Node) StreamBackups(ctx context.Context) int {
	start := time.Now()
	full := n.backup.full.Swap(false)
	pending := n.backup.takePending()
	if len(pending) == 0 && !full {
		return 0
	}
	v := n.view.Load()
	now := n.clock()
	type group struct {
		keys   []Key
		states []*peerpb.KeyState
	}
	groups := make(map[string]*group)
	add := func(k Key, ek []byte) {
		to := v.snap.Backup(ek)
		if to == "" || v.snap.Owner(ek) != n.name {
			return
		}
		if st, ok := n.store.Export(k, now); ok {
			g := groups[to]
			if g == nil {
				g = &group{}
				groups[to] = g
			}
			g.keys = append(g.keys, k)
			g.states = append(g.states, stateToWire(st))
		}
	}
	if full {
		n.store.Range(func(k Key) bool {
			var buf [shard.MaxEncodedKeyLen]byte
			ek, _ := k.AppendEncoded(buf[:0])
			add(k, ek)
			return true
		})
	} else {
		for _, k := range pending {
			var buf [shard.MaxEncodedKeyLen]byte
			ek, _ := k.AppendEncoded(buf[:0])
			add(k, ek)
		}
	}
	sent := 0
	allOK := true
	for to, g := range groups {
		c, err := n.client(to, v.addrs[to])
		done := 0
		for done < len(g.states) && err == nil {
			b := g.states[done:min(len(g.states), done+handoffBatch)]
			rctx, cancel := context.WithTimeout(ctx, n.cfg.ForwardTimeout)
			_, err = c.stub.Backup(rctx, &peerpb.BackupRequest{Sender: n.name, Keys: b})
			cancel()
			if err == nil {
				done += len(b)
				n.metrics.Backup("sent", "ok", len(b))
			}
		}
		sent += done
		if err != nil {
			allOK = false
			n.metrics.Backup("sent", "failed", len(g.states)-done)
			n.warnThrottled("backup stream failed", "peer", to, "keys", len(g.states)-done, "err", err)
			// Send them again next time rather than leave the backup stale.
			for _, k := range g.keys[done:] {
				n.noteBackup(k)
			}
		}
	}
	if allOK {
		n.backup.mu.Lock()
		if start.After(n.backup.lastOK) {
			n.backup.lastOK = start
		}
		n.backup.mu.Unlock()
	}
	return sent
}

// Backup stores the sender's key states as replicas, replacing older ones.
func (s *server) Backup(_ context.Context, req *peerpb.BackupRequest) (*peerpb.BackupResponse, error) {
	n := s.n
	if len(req.GetKeys()) > maxWireBatch {
		return nil, errBatchTooLarge(len(req.GetKeys()))
	}
	if err := n.handoff.fault(faultBackup); err != nil {
		return nil, err
	}
	now := n.clock()
	var accepted uint32
	for _, ks := range req.GetKeys() {
		st, p, err := n.decodeState(ks)
		if err != nil {
			return nil, statusInvalid(err.Error())
		}
		if p == nil {
			continue // a policy this node does not share: nothing to back up
		}
		// A replica is the owner's latest full state: replace, not merge.
		n.backup.replicas.Delete(st.Key)
		if err := n.backup.replicas.Import(st, p.sp, now); err == nil {
			accepted++
		}
	}
	n.metrics.Backup("received", "ok", int(accepted))
	if int(accepted) < len(req.GetKeys()) {
		n.metrics.Backup("received", "failed", len(req.GetKeys())-int(accepted))
	}
	return &peerpb.BackupResponse{Accepted: accepted}, nil
}
