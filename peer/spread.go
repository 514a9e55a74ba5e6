package peer

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// Spread keys: one hot key decided by many nodes, still exact. A key is
// one decision point, its partition's holder; a key hot enough to keep
// that holder busy would gain nothing from more nodes. With a policy's
// Spread set to SpreadAuto, a node that forwards more than the policy's
// SpreadThreshold decisions a second for one key asks the holder for
// rights instead (OP_GRANT) and admits from them locally, with no network
// on the decision.
//
// The holder's accounting rule is shard.Store.Grant's: a grant of k
// rights with lease T counts as k admissions at every instant of
// [grant, grant+T], so it holds its slots until grant+T+W, and every
// window's real admissions stay within the limit. A grant is decided like
// a reservation: under the partition's gate in write mode, the key's new
// state (its grants with it) queued for the backup, and under
// ReplicateSync answered only once the backup has it. So a takeover's new
// holder counts the old holder's outstanding grants until they expire, and
// a copy or a handoff moves them with the partition.
//
// The grantee's rules:
//
//   - it uses a grant only until 85 % of its lease has passed on its own
//     monotonic clock, counted from before it sent the request: with clock
//     rates within 10 % of each other, every use falls inside the lease on
//     the holder's clock (the holder's lease starts no earlier than the
//     request was sent);
//   - it records each use in one of 64 bins of the lease, at the bin's
//     end (later than it happened, never earlier), and reports them with
//     its next request as ages, shrunk by 10 % for the rate bound: the
//     holder records them no earlier than they happened, frees the rest,
//     and ends the grant. A grant never reported is charged until its
//     lease's end plus W (under-admission, never over);
//   - it asks for more when half the rights are spent or half the lease
//     has passed, sized to 1.5 × its recent rate × T; the new grant
//     replaces the old one, whose unused rights come back with the next
//     report;
//   - when the holder grants nothing (no spare unit) it refuses the key
//     locally for min(the holder's RetryAfter, T/4) with ReasonOverLimit,
//     then asks again; without rights it forwards as before.
//
// How the holder shares: a grant takes at most half the spare units
// (rounded up), so the holder's own decisions and the next grantee always
// find the rest, and a key has at most shard.MaxGrants outstanding grants.
// A grantee that fails or is cut off keeps its rights only until its
// deadline; the holder charges them until the lease's end plus W. A
// grantee that pauses past its deadline uses nothing more.
//
// A node tracks at most maxSpreadKeys keys; keys idle for spreadIdle are
// forgotten (their closed grants unreported, charged until they expire).

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

// spreadSink is the optional Metrics method that counts rights: event is
// "granted" (received from a holder), "used" (admitted from them) or
// "unused" (replaced or expired with rights left: the under-admission
// spreading costs). peer/prommetrics has it.
type spreadSink interface {
	Spread(policy, event string, units int64)
}

func (n *Node) spreadMetric(pol, event string, units int64) {
	if units == 0 {
		return
	}
	if m, ok := n.metrics.(spreadSink); ok {
		m.Spread(pol, event, units)
	}
}

// spreadLookup returns the key's entry, creating it (nil when the table
// is full even after forgetting idle keys).
func (n *Node) spreadLookup(ek []byte, key Key, now int64) *spreadKey {
	t := &n.spread
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

// spreadDecide decides r locally from rights when its policy spreads and
// this node holds usable rights (or was just refused rights), and starts
// a grant request when one is due. It reports whether it wrote *d; when
// not, the caller forwards as before. Called only where r would be
// forwarded.
func (n *Node) spreadDecide(v *view, r *opReq, ek []byte, d *Decision) bool {
	p := r.p
	if p.Config.Spread == SpreadOff || r.op != peerpb.Op_OP_CHECK || r.multi != nil || p.Unlimited || p.Config.Shadow {
		return false
	}
	now := n.mono()
	k := n.spreadLookup(ek, r.key, now)
	if k == nil {
		return false
	}
	var unused int64 // rights of a lease that ended here unspent
	defer func() { n.spreadMetric(p.Name, "unused", unused) }()
	k.mu.Lock()
	k.lastSeen = now
	if el := now - k.epoch; el >= int64(time.Second) {
		k.rate = float64(k.count) / (float64(el) / float64(time.Second))
		k.count, k.epoch = 0, now
		th := p.Config.Threshold()
		k.active = k.rate >= th || k.active && k.rate >= th/2
	}
	k.count++
	if !k.active && float64(k.count) >= p.Config.Threshold() {
		k.active = true
	}
	// Spend the oldest usable grant; close the ones whose lease is over
	// here or whose rights are spent (their uses go with the next
	// report).
	var g *spreadGrant
	for len(k.live) > 0 {
		o := k.live[0]
		if now <= o.deadline && o.left >= r.hits {
			g = o
			break
		}
		if now <= o.deadline && o.left > 0 && len(k.live) == 1 {
			break // too few rights for these hits: keep them for smaller ones
		}
		unused += o.left
		k.close(o)
		k.live = k.live[1:]
	}
	var left int64
	if g != nil {
		g.left -= r.hits
		g.record(now, r.hits)
		if g.left == 0 {
			k.close(g)
			k.live = k.live[1:]
		}
		for _, o := range k.live {
			left += o.left
		}
	}
	refill := k.active && !k.refilling && k.due(now)
	if refill {
		k.refilling = true
	}
	if g != nil {
		k.mu.Unlock()
		if refill {
			n.startGrant(k, p)
		}
		if h := n.hooks.decide.Load(); h != nil {
			(*h)() // tests: a pause between spending the rights and the answer
		}
		if n.mono() > g.deadline {
			// Paused past the grant's deadline since its rights were
			// checked: admitting now would be an admission the holder
			// stops charging too early. The use stays recorded (and
			// reported: the holder charges it, which can only refuse
			// more); the request is forwarded instead.
			return false
		}
		*d = Decision{Allowed: true, Limit: p.Shard.Limit, Remaining: left, Reason: ReasonSpread, Owner: n.name, RingVersion: v.snap.Version(), DecidedAt: n.clock()}
		n.spreadMetric(p.Name, "used", r.hits)
		return true
	}
	refused := now < k.refusedUntil
	until := k.refusedUntil
	k.mu.Unlock()
	if refill {
		n.startGrant(k, p)
	}
	if !refused {
		return false
	}
	*d = Decision{Limit: p.Shard.Limit, RetryAfter: time.Duration(until - now), Reason: ReasonOverLimit, Owner: n.name, RingVersion: v.snap.Version(), DecidedAt: n.clock()}
	return true
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

// startGrant asks k's holder for rights on a goroutine of the node's;
// the caller has set k.refilling.
func (n *Node) startGrant(k *spreadKey, p *policy.Entry) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.requestGrant(k, p)
	}()
}

// requestGrant sends one OP_GRANT for k, with the reports of its closed
// grants, and installs the answer.
func (n *Node) requestGrant(k *spreadKey, p *policy.Entry) {
	lease := p.Config.Lease()
	k.mu.Lock()
	// The recent rate: the last full second's, or this one's so far
	// (over at least 10 ms), whichever is higher.
	el := max(n.mono()-k.epoch, int64(10*time.Millisecond))
	rate := max(k.rate, float64(k.count)/(float64(el)/float64(time.Second)))
	want := min(max(int64(1.5*rate*lease.Seconds()), 1), p.Shard.Limit)
	closed := k.closed
	k.closed = nil
	k.mu.Unlock()

	sent := n.mono()
	r := opReq{op: peerpb.Op_OP_GRANT, key: k.key, p: p, hits: want}
	for _, g := range closed {
		r.returns = append(r.returns, grantReturn{id: g.id, uses: g.report(sent)})
	}
	var buf [shard.MaxEncodedKeyLen]byte
	ek, _ := k.key.AppendEncoded(buf[:0])
	r.ek = ek
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.ForwardTimeout)
	d, err := n.route(ctx, &r, ek)
	cancel()

	k.mu.Lock()
	defer k.mu.Unlock()
	k.refilling = false
	if err != nil || d.Reason != ReasonAdmitted {
		// Not decided, or not by a holder (a reason such as unavailable
		// is an error here): the reports go with the next request (a
		// return is idempotent), the oldest dropped past 8.
		k.closed = append(closed, k.closed...)
		if len(k.closed) > 8 {
			k.closed = k.closed[len(k.closed)-8:]
		}
		if errors.Is(err, ErrClosed) || err == nil {
			return
		}
		n.warnThrottled("spread: asking for rights failed; deciding through the holder", "policy", p.Name, "err", err)
		return
	}
	if r.granted <= 0 || r.lease == 0 {
		k.refusedUntil = sent + int64(min(d.RetryAfter, lease/4))
		return
	}
	ttl := min(r.leaseTTL, lease)
	if ttl <= 0 {
		ttl = lease
	}
	if len(k.live) >= maxLiveGrants {
		old := k.live[0]
		k.close(old)
		k.live = k.live[1:]
		n.spreadMetric(p.Name, "unused", old.left)
	}
	k.live = append(k.live, &spreadGrant{
		id: r.lease, n: r.granted, left: r.granted, sent: sent,
		deadline: sent + int64(spreadUseFraction*float64(ttl)),
		bin:      max(int64(ttl)/spreadBins, 1),
	})
	k.granted += r.granted
	n.spreadMetric(p.Name, "granted", r.granted)
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

// grantReturn is one grant ended by an OP_GRANT: its id and uses.
type grantReturn struct {
	id   uint64
	uses []shard.Run
}

// decideGrantLocked ends the returned grants and grants new rights under
// the partition gate held in write mode, and queues the key's new state
// for the backup: a grant is waited for under ReplicateSync, so a
// takeover's new holder charges it.
func (n *Node) decideGrantLocked(pt *part, pid int, r *opReq, now time.Time, d Decision) (Decision, []chan error, error) {
	p := r.p
	if p.Config.Spread == SpreadOff || p.Unlimited {
		// The holder's table does not spread this policy (a table change
		// under way): grant nothing, so the grantee forwards.
		d.Limit, d.Reason = p.Shard.Limit, ReasonAdmitted
		return d, nil, nil
	}
	changed := false
	for _, ret := range r.returns {
		res, err := pt.store.Return(r.key, p.Shard, ret.id, ret.uses, now)
		if err != nil {
			return d, nil, err
		}
		changed = changed || res.Found
	}
	var g shard.GrantResult
	var err error
	for range 4 {
		r.lease = newLeaseID()
		if g, err = pt.store.Grant(r.key, p.Shard, r.hits, p.Config.Lease(), r.lease, now); !errors.Is(err, shard.ErrInvalidReservation) {
			break
		}
	}
	if err != nil {
		return d, nil, err
	}
	d = fillDecision(d, g.Decision, ReasonAdmitted)
	r.granted, r.leaseTTL = g.Granted, p.Config.Lease()
	if g.Granted == 0 {
		r.lease = 0
	}
	if g.Granted == 0 && !changed {
		return d, nil, nil
	}
	w, err := n.replicateLeaseLocked(pt, pid, r, now, g.Granted > 0 && p.Config.Replication == ReplicateSync)
	if err != nil {
		return d, nil, err
	}
	if w == nil {
		return d, nil, nil
	}
	return d, []chan error{w}, nil
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

// SpreadKeys lists the keys this node tracks for spreading, most active
// first (for /debug/hotkeys).
func (n *Node) SpreadKeys() []SpreadKey {
	now := n.mono()
	n.spread.mu.RLock()
	out := make([]SpreadKey, 0, len(n.spread.keys))
	for _, k := range n.spread.keys {
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
	n.spread.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Rate > out[j].Rate })
	return out
}
