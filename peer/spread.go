package peer

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/grantee"
	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/peer/internal/policy"
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
// The grantee's rules, and why each use falls inside the lease on the
// holder's clock and is recorded there no earlier than it happened, are
// internal/grantee's package doc (the node and the ownership simulator
// run that code). The node adds: it asks for 1.5 × its recent rate × T;
// when the holder grants nothing (no spare unit) it refuses the key
// locally for min(the holder's RetryAfter, T/4) with ReasonOverLimit,
// then asks again; without rights it forwards as before.
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

// spreadSink is the optional Metrics method that counts rights: event is
// "granted" (received from a holder), "used" (admitted from them) or
// "unused" (replaced or expired with rights left: the under-admission
// spreading costs). peer/prommetrics has it.
type spreadSink interface {
	Spread(policy, event string, units int64)
}

// spreadEnv is what a node's spreader takes of it, set once in New.
type spreadEnv struct {
	ctx     context.Context // the node's lifetime: grant requests end with it
	wg      *sync.WaitGroup // the node's goroutines; grant requests join it
	self    string          // this node's name, the Owner of its answers
	metrics Metrics
	clock   func() time.Time // decisions' DecidedAt
	mono    func() int64     // the node's monotonic clock: rights' deadlines
	// pause is the tests' hook between spending rights and the answer
	// (faultHooks.decide).
	pause          *atomic.Pointer[func()]
	forwardTimeout time.Duration // Config.ForwardTimeout, bounding a grant request
	warn           func(msg string, args ...any)
	// route sends a grant request to the key's holder (the node's router).
	route func(ctx context.Context, r *opReq, ek []byte) (Decision, error)
}

// spreader is this node's side of spread keys as a grantee: the table of
// keys and their rights, and the grant requests it sends.
type spreader struct {
	env   spreadEnv
	table spreadTable
}

func (s *spreader) metric(pol, event string, units int64) {
	if units == 0 {
		return
	}
	if m, ok := s.env.metrics.(spreadSink); ok {
		m.Spread(pol, event, units)
	}
}

// decide decides r locally from rights when its policy spreads and
// this node holds usable rights (or was just refused rights), and starts
// a grant request when one is due. It reports whether it wrote *d; when
// not, the caller forwards as before. Called only where r would be
// forwarded.
func (sp *spreader) decide(v *view, r *opReq, ek []byte, d *Decision) bool {
	p := r.P
	if p.Config.Spread == SpreadOff || r.Op != partition.OpCheck || r.Multi != nil || p.Unlimited || p.Config.Shadow {
		return false
	}
	now := sp.env.mono()
	k := sp.table.lookup(ek, r.Key, now)
	if k == nil {
		return false
	}
	s := k.Spend(now, r.Hits, p.Config.Threshold())
	sp.metric(p.Name, "unused", s.Unused)
	if s.Refill {
		sp.startGrant(k, p)
	}
	switch {
	case s.Grant != nil:
		if h := sp.env.pause.Load(); h != nil {
			(*h)() // tests: a pause between spending the rights and the answer
		}
		if sp.env.mono() > s.Grant.Deadline {
			// Paused past the grant's deadline since its rights were
			// checked: admitting now would be an admission the holder
			// stops charging too early. The use stays recorded (and
			// reported: the holder charges it, which can only refuse
			// more); the request is forwarded instead.
			return false
		}
		*d = Decision{Allowed: true, Limit: p.Shard.Limit, Remaining: s.Left, Reason: ReasonSpread, Owner: sp.env.self, RingVersion: v.snap.Version(), DecidedAt: sp.env.clock()}
		sp.metric(p.Name, "used", r.Hits)
		return true
	case now < s.RefusedUntil:
		*d = Decision{Limit: p.Shard.Limit, RetryAfter: time.Duration(s.RefusedUntil - now), Reason: ReasonOverLimit, Owner: sp.env.self, RingVersion: v.snap.Version(), DecidedAt: sp.env.clock()}
		return true
	}
	return false
}

// startGrant asks k's holder for rights on a goroutine of the node's;
// the caller has set k.refilling.
func (sp *spreader) startGrant(k *spreadKey, p *policy.Entry) {
	sp.env.wg.Add(1)
	go func() {
		defer sp.env.wg.Done()
		sp.requestGrant(k, p)
	}()
}

// requestGrant sends one OP_GRANT for k, with the reports of its closed
// grants, and installs the answer.
func (sp *spreader) requestGrant(k *spreadKey, p *policy.Entry) {
	lease := p.Config.Lease()
	want, closed := k.Ask(sp.env.mono(), lease, p.Shard.Limit)
	sent := sp.env.mono()
	r := opReq{Op: partition.OpGrant, Key: k.key, P: p, Hits: want, Returns: grantee.Returns(closed, sent)}
	var buf [shard.MaxEncodedKeyLen]byte
	ek, _ := k.key.AppendEncoded(buf[:0])
	r.EK = ek
	ctx, cancel := context.WithTimeout(sp.env.ctx, sp.env.forwardTimeout)
	d, err := sp.env.route(ctx, &r, ek)
	cancel()
	switch {
	case err != nil || d.Reason != ReasonAdmitted:
		// Not decided, or not by a holder (a reason such as unavailable
		// is an error here).
		k.Requeue(closed)
		if errors.Is(err, ErrClosed) || err == nil {
			return
		}
		sp.env.warn("spread: asking for rights failed; deciding through the holder", "policy", p.Name, "err", err)
	case r.Granted <= 0 || r.Lease == 0:
		k.Refuse(sent, min(d.RetryAfter, lease/4))
	default:
		ttl := min(r.LeaseTTL, lease)
		if ttl <= 0 {
			ttl = lease
		}
		sp.metric(p.Name, "unused", k.Install(sent, r.Lease, r.Granted, ttl))
		sp.metric(p.Name, "granted", r.Granted)
	}
}

// keys lists the keys tracked for spreading, most active first.
func (sp *spreader) keys() []SpreadKey { return sp.table.list(sp.env.mono()) }
