package peer

import (
	"sort"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/grantee"
)

// The spread keys this node decides, or may decide, from rights: a table
// of at most maxSpreadKeys, each key's grantee state (internal/grantee,
// time passed in) beside the key it is for.

const (
	maxSpreadKeys = 4096
	spreadIdle    = 30 * time.Second
)

// spreadTable is this node's side of spread keys as a grantee.
type spreadTable struct {
	mu   sync.RWMutex
	keys map[string]*spreadKey
	// fullUntil (mono): the table was full with nothing idle; new keys
	// are not tracked until then, so a full table is not scanned per
	// request.
	fullUntil int64
}

// spreadKey is one key this node decides, or may decide, from rights.
type spreadKey struct {
	key Key
	*grantee.State
}

// lookup returns the key's entry, creating it (nil when the table is
// full even after forgetting idle keys).
func (t *spreadTable) lookup(ek []byte, key Key, now int64) *spreadKey {
	t.mu.RLock()
	k := t.keys[string(ek)]
	full := now < t.fullUntil
	t.mu.RUnlock()
	if k != nil || full {
		return k
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if k := t.keys[string(ek)]; k != nil {
		return k
	}
	if t.keys == nil {
		t.keys = make(map[string]*spreadKey)
	}
	if len(t.keys) >= maxSpreadKeys {
		for s, k := range t.keys {
			if k.Idle(now, spreadIdle) {
				delete(t.keys, s)
			}
		}
		if len(t.keys) >= maxSpreadKeys {
			t.fullUntil = now + int64(time.Second)
			return nil
		}
	}
	k = &spreadKey{key: key, State: grantee.New(now)}
	t.keys[string(ek)] = k
	return k
}

// list describes the keys of t at now, most active first.
func (t *spreadTable) list(now int64) []SpreadKey {
	t.mu.RLock()
	out := make([]SpreadKey, 0, len(t.keys))
	for _, k := range t.keys {
		d := k.Describe(now)
		out = append(out, SpreadKey{Key: k.key, Rate: d.Rate, Active: d.Active, Rights: d.Rights, Granted: d.Granted})
	}
	t.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Rate > out[j].Rate })
	return out
}

// SpreadKey describes one key this node decides from rights.
type SpreadKey struct {
	Key Key
	// Rate is the key's decisions per second at this node in the last
	// full second; Active whether it asks for rights.
	Rate   float64
	Active bool
	// Rights is the usable rights left; Granted the rights received in
	// all.
	Rights, Granted int64
}
