package peer

import (
	"sort"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/shard"
)

// The grantee's side of spread keys (spread.go has the protocol and the
// holder's side), as state with time passed in: every method takes now,
// a reading of the node's monotonic clock, and none sends, logs or counts
// a metric. The node's glue (Node.spreadDecide, Node.requestGrant) reads
// the clock, calls these, and sends what they ask for.
//
// The rules:
//
//   - spend decides one request: from the oldest usable grant, or
//     refused while the holder granted nothing, or neither (forward);
//   - a grant is usable until its deadline and while it has rights for
//     the request's hits;
//   - a grant that ends here (deadline passed, rights spent, or replaced)
//     is closed: its uses wait for the next request's report (8 kept);
//   - one request for rights is in flight per key (refilling), started
//     only by spend and ended only by requeue, refuse or install.

const (
	maxSpreadKeys = 4096
	spreadBins    = 64
	spreadIdle    = 30 * time.Second
	// spreadUseFraction is the part of a lease a grantee uses, and
	// spreadAgeFraction the part of an age it reports: both leave the
	// 10 % clock-rate bound on the safe side.
	spreadUseFraction = 0.85
	spreadAgeFraction = 0.9
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

	mu sync.Mutex
	// The rate meter: decisions of the key at this node (forwarded or
	// spread) in the second from epoch, and the last full second's rate.
	epoch    int64
	count    int64
	rate     float64
	active   bool
	lastSeen int64
	// live is the grants in use, oldest first (at most maxLiveGrants):
	// decisions spend the oldest first.
	live   []*spreadGrant
	closed []*spreadGrant // replaced grants whose uses are to report
	// refilling: a grant request is in flight.
	refilling    bool
	refusedUntil int64
	granted      int64 // rights received in all (for /debug/hotkeys)
}

// spreadGrant is one grant held by this node.
type spreadGrant struct {
	id       uint64
	n, left  int64
	sent     int64 // mono when the request was sent
	deadline int64 // mono: the last instant of use
	bin      int64 // ns per use bin
	uses     [spreadBins]int64
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
			k.mu.Lock()
			idle := now-k.lastSeen > int64(spreadIdle) && !k.refilling
			k.mu.Unlock()
			if idle {
				delete(t.keys, s)
			}
		}
		if len(t.keys) >= maxSpreadKeys {
			t.fullUntil = now + int64(time.Second)
			return nil
		}
	}
	k = &spreadKey{key: key, epoch: now, lastSeen: now}
	t.keys[string(ek)] = k
	return k
}

// spent is what spend decided for one request.
type spent struct {
	// grant is the grant the request's hits were taken from; nil: none
	// was usable.
	grant *spreadGrant
	// left is the usable rights left after it; unused the rights of
	// grants that ended here unspent (the under-admission spreading
	// costs).
	left, unused int64
	// refill: a request for rights is due and k.refilling is now set;
	// the caller sends it.
	refill bool
	// refusedUntil > now: the holder granted nothing; refuse the key
	// until then.
	refusedUntil int64
}

// spend decides one request for hits at now: it updates the key's rate
// meter (active at threshold decisions a second, inactive below half of
// it), takes the hits from the oldest usable grant, closing the grants
// that ended, and says whether a request for rights is due.
func (k *spreadKey) spend(now, hits int64, threshold float64) spent {
	var s spent
	k.mu.Lock()
	defer k.mu.Unlock()
	k.lastSeen = now
	if el := now - k.epoch; el >= int64(time.Second) {
		k.rate = float64(k.count) / (float64(el) / float64(time.Second))
		k.count, k.epoch = 0, now
		k.active = k.rate >= threshold || k.active && k.rate >= threshold/2
	}
	k.count++
	if !k.active && float64(k.count) >= threshold {
		k.active = true
	}
	// Spend the oldest usable grant; close the ones whose lease is over
	// here or whose rights are spent (their uses go with the next
	// report).
	var g *spreadGrant
	for len(k.live) > 0 {
		o := k.live[0]
		if now <= o.deadline && o.left >= hits {
			g = o
			break
		}
		if now <= o.deadline && o.left > 0 && len(k.live) == 1 {
			break // too few rights for these hits: keep them for smaller ones
		}
		s.unused += o.left
		k.close(o)
		k.live = k.live[1:]
	}
	if g != nil {
		g.left -= hits
		g.record(now, hits)
		if g.left == 0 {
			k.close(g)
			k.live = k.live[1:]
		}
		for _, o := range k.live {
			s.left += o.left
		}
	}
	s.grant = g
	s.refusedUntil = k.refusedUntil
	if k.active && !k.refilling && k.due(now) {
		k.refilling, s.refill = true, true
	}
	return s
}

// maxLiveGrants bounds the grants a node uses at once: the one it spends
// and the one it asked for before running out.
const maxLiveGrants = 2

// due reports whether k should ask for rights now: it holds fewer than
// maxLiveGrants and has none, or has spent half of its newest grant, or
// half of that grant's lease has passed; never while refused. Called
// with k.mu held.
func (k *spreadKey) due(now int64) bool {
	if now < k.refusedUntil || len(k.live) >= maxLiveGrants {
		return false
	}
	if len(k.live) == 0 {
		return true
	}
	g := k.live[len(k.live)-1]
	var left int64
	for _, o := range k.live {
		left += o.left
	}
	return 2*left <= g.n || now-g.sent >= (g.deadline-g.sent)/2
}

// close queues g's report (at most 8 are kept; an older one unreported
// stays charged until its lease's end plus W). Called with k.mu held.
func (k *spreadKey) close(g *spreadGrant) {
	k.closed = append(k.closed, g)
	if len(k.closed) > 8 {
		k.closed = k.closed[len(k.closed)-8:]
	}
}

// ask starts the request for rights that spend made due: want is 1.5 ×
// the recent rate × lease (at least 1, at most limit), and closed the
// grants whose uses it reports (requeue takes them back if it fails).
func (k *spreadKey) ask(now int64, lease time.Duration, limit int64) (want int64, closed []*spreadGrant) {
	k.mu.Lock()
	defer k.mu.Unlock()
	// The recent rate: the last full second's, or this one's so far
	// (over at least 10 ms), whichever is higher.
	el := max(now-k.epoch, int64(10*time.Millisecond))
	rate := max(k.rate, float64(k.count)/(float64(el)/float64(time.Second)))
	want = min(max(int64(1.5*rate*lease.Seconds()), 1), limit)
	closed, k.closed = k.closed, nil
	return want, closed
}

// grantReturns is the report of closed at sent: each grant's id and its
// uses as ages.
func grantReturns(closed []*spreadGrant, sent int64) []grantReturn {
	var out []grantReturn
	for _, g := range closed {
		out = append(out, grantReturn{id: g.id, uses: g.report(sent)})
	}
	return out
}

// requeue ends a request that was not decided by a holder: its reports
// go with the next one (a return is idempotent), the oldest dropped past
// 8.
func (k *spreadKey) requeue(closed []*spreadGrant) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.refilling = false
	k.closed = append(closed, k.closed...)
	if len(k.closed) > 8 {
		k.closed = k.closed[len(k.closed)-8:]
	}
}

// refuse ends a request the holder granted nothing for: spend refuses
// the key locally until sent+retry.
func (k *spreadKey) refuse(sent int64, retry time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.refilling = false
	k.refusedUntil = sent + int64(retry)
}

// install ends a request with a grant of granted rights under lease id,
// whose lease on the holder is ttl, asked for at sent: usable until 85 %
// of ttl has passed since sent. A third grant replaces the oldest; unused
// is what that one had left.
func (k *spreadKey) install(sent int64, id uint64, granted int64, ttl time.Duration) (unused int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.refilling = false
	if len(k.live) >= maxLiveGrants {
		old := k.live[0]
		k.close(old)
		k.live = k.live[1:]
		unused = old.left
	}
	k.live = append(k.live, &spreadGrant{
		id: id, n: granted, left: granted, sent: sent,
		deadline: sent + int64(spreadUseFraction*float64(ttl)),
		bin:      max(int64(ttl)/spreadBins, 1),
	})
	k.granted += granted
	return unused
}

// report returns g's uses as runs whose ages are relative to now (mono),
// each at its bin's end and shrunk for the clock-rate bound.
func (g *spreadGrant) report(now int64) []shard.Run {
	var out []shard.Run
	for i := spreadBins - 1; i >= 0; i-- {
		if g.uses[i] == 0 {
			continue
		}
		at := g.sent + int64(i+1)*g.bin
		age := time.Duration(spreadAgeFraction * float64(max(now-at, 0)))
		out = append(out, shard.Run{Age: age, Count: g.uses[i]})
	}
	return out
}

// record counts hits used at now in the use bin of now. A grant asked for
// after the deciding call read its clock (another caller's request,
// installed while this one waited for the key's lock) has sent > now: the
// use goes in the first bin, whose end is later than both, so it is still
// recorded no earlier than the call began. (Indexing by the negative
// difference panicked under load.)
func (g *spreadGrant) record(now, hits int64) {
	i := min(max(now-g.sent, 0)/g.bin, spreadBins-1)
	g.uses[i] += hits
}

// list describes the keys of t at now, most active first.
func (t *spreadTable) list(now int64) []SpreadKey {
	t.mu.RLock()
	out := make([]SpreadKey, 0, len(t.keys))
	for _, k := range t.keys {
		k.mu.Lock()
		s := SpreadKey{Key: k.key, Rate: k.rate, Active: k.active, Granted: k.granted}
		for _, g := range k.live {
			if now <= g.deadline {
				s.Rights += g.left
			}
		}
		k.mu.Unlock()
		out = append(out, s)
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

// grantReturn is one grant ended by an OP_GRANT: its id and uses.
type grantReturn struct {
	id   uint64
	uses []shard.Run
}
