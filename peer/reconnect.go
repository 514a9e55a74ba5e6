package peer

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/membership"
)

// memberlist never contacts a member again once it has declared it dead:
// after a network partition heals, each side keeps the ring it shrank to,
// and a key has two owners for good. Like serf's reconnect, the node
// therefore remembers the gossip address of each member that FAILED (a
// member that left gracefully said so and is never retried) and, every
// Config.ReconnectInterval, joins one of them at random. The join's state
// exchange tells each side the other declared it dead; each refutes, and
// both rings grow back. While the node knows no other member at all and was
// given seeds, it also re-joins the seeds (a node cut off since start-up,
// or whose every peer failed). The set is bounded (maxReconnect, oldest
// forgotten first) and aged (Config.ReconnectTimeout): a member that is
// gone for good costs one refused dial per interval until then.

// maxReconnect bounds the remembered failed members.
const maxReconnect = 256

// reconnectState is the set of failed members to retry.
type reconnectState struct {
	mu     sync.Mutex
	failed map[string]failedMember // by member name
}

type failedMember struct {
	addr string    // gossip address, host:port
	at   time.Time // when it was declared failed (wall clock)
}

// note updates the set from one membership event (of another member).
// Called from memberlist's callbacks; never blocks.
func (r *reconnectState) note(e membership.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch e.Kind {
	case "failed":
		if r.failed == nil {
			r.failed = make(map[string]failedMember)
		}
		if _, ok := r.failed[e.Name]; !ok && len(r.failed) >= maxReconnect {
			oldest := ""
			for name, f := range r.failed {
				if oldest == "" || f.at.Before(r.failed[oldest].at) {
					oldest = name
				}
			}
			delete(r.failed, oldest)
		}
		r.failed[e.Name] = failedMember{addr: e.Addr, at: time.Now()}
	case "joined", "left":
		delete(r.failed, e.Name)
	}
}

// pick forgets the members declared failed longer than timeout before
// now and returns one of the others at random ("", "" for none), with
// its gossip address.
func (r *reconnectState) pick(now time.Time, timeout time.Duration) (name, addr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var names []string
	for name, f := range r.failed {
		if now.Sub(f.at) > timeout {
			delete(r.failed, name)
			continue
		}
		names = append(names, name)
	}
	if len(names) > 0 {
		name = names[rand.IntN(len(names))]
		addr = r.failed[name].addr
	}
	return name, addr
}
