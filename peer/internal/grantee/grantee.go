package grantee

import (
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/shard"
)

const (
	// bins is the number of use bins of a lease.
	bins = 64
	// useFraction is the part of a lease a grantee uses, and ageFraction
	// the part of an age it reports: both leave the 10 % clock-rate bound
	// on the safe side.
	useFraction = 0.85
	ageFraction = 0.9
	// maxLive bounds the grants a key uses at once: the one it spends and
	// the one it asked for before running out.
	maxLive = 2
	// maxClosed bounds the closed grants whose reports wait; an older one
	// unreported stays charged until its lease's end plus the window.
	maxClosed = 8
)

// State is one key's side as a grantee. Its methods are safe for
// concurrent use.
type State struct {
	mu sync.Mutex
	// The rate meter: decisions of the key at this node (forwarded or
	// spread) in the second from epoch, and the last full second's rate.
	epoch    int64
	count    int64
	rate     float64
	active   bool
	lastSeen int64
	// live is the grants in use, oldest first (at most maxLive):
	// decisions spend the oldest first.
	live   []*Grant
	closed []*Grant // ended grants whose uses are to report
	// refilling: a grant request is in flight.
	refilling    bool
	refusedUntil int64
	granted      int64 // rights received in all
}

// New returns a key's state first seen at now.
func New(now int64) *State {
	return &State{epoch: now, lastSeen: now}
}

// Grant is one grant held.
type Grant struct {
	ID       uint64
	n, left  int64
	sent     int64 // when the request for it was sent
	Deadline int64 // the last instant of use
	bin      int64 // ns per use bin
	uses     [bins]int64
}

// Spent is what Spend decided for one request.
type Spent struct {
	// Grant is the grant the request's hits were taken from; nil: none
	// was usable.
	Grant *Grant
	// Left is the usable rights left after it; Unused the rights of
	// grants that ended here unspent (the under-admission spreading
	// costs).
	Left, Unused int64
	// Refill: a request for rights is due and is now in flight; the
	// caller sends it (Ask) and ends it (Requeue, Refuse or Install).
	Refill bool
	// RefusedUntil > now: the holder granted nothing; refuse the key
	// until then.
	RefusedUntil int64
}

// Spend decides one request for hits at now: it updates the key's rate
// meter (active at threshold decisions a second, inactive below half of
// it; a threshold of 0 keeps it active), takes the hits from the oldest
// usable grant, closing the grants that ended, and says whether a
// request for rights is due.
func (s *State) Spend(now, hits int64, threshold float64) Spent {
	var sp Spent
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastSeen = now
	if el := now - s.epoch; el >= int64(time.Second) {
		s.rate = float64(s.count) / (float64(el) / float64(time.Second))
		s.count, s.epoch = 0, now
		s.active = s.rate >= threshold || s.active && s.rate >= threshold/2
	}
	s.count++
	if !s.active && float64(s.count) >= threshold {
		s.active = true
	}
	var g *Grant
	for len(s.live) > 0 {
		o := s.live[0]
		if now <= o.Deadline && o.left >= hits {
			g = o
			break
		}
		if now <= o.Deadline && o.left > 0 && len(s.live) == 1 {
			break // too few rights for these hits: keep them for smaller ones
		}
		sp.Unused += o.left
		s.close(o)
		s.live = s.live[1:]
	}
	if g != nil {
		g.left -= hits
		g.record(now, hits)
		if g.left == 0 {
			s.close(g)
			s.live = s.live[1:]
		}
		for _, o := range s.live {
			sp.Left += o.left
		}
	}
	sp.Grant = g
	sp.RefusedUntil = s.refusedUntil
	if s.active && !s.refilling && s.due(now) {
		s.refilling, sp.Refill = true, true
	}
	return sp
}

// due reports whether a request for rights is due at now. Called with
// s.mu held.
func (s *State) due(now int64) bool {
	if now < s.refusedUntil || len(s.live) >= maxLive {
		return false
	}
	if len(s.live) == 0 {
		return true
	}
	g := s.live[len(s.live)-1]
	var left int64
	for _, o := range s.live {
		left += o.left
	}
	return 2*left <= g.n || now-g.sent >= (g.Deadline-g.sent)/2
}

// close queues g's report. Called with s.mu held.
func (s *State) close(g *Grant) {
	s.closed = append(s.closed, g)
	if len(s.closed) > maxClosed {
		s.closed = s.closed[len(s.closed)-maxClosed:]
	}
}

// Ask starts the request for rights that Spend made due: want is 1.5 ×
// the recent rate × lease (at least 1, at most limit), and closed the
// grants whose uses it reports (Returns); Requeue takes them back if the
// request fails.
func (s *State) Ask(now int64, lease time.Duration, limit int64) (want int64, closed []*Grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// The recent rate: the last full second's, or this one's so far
	// (over at least 10 ms), whichever is higher.
	el := max(now-s.epoch, int64(10*time.Millisecond))
	rate := max(s.rate, float64(s.count)/(float64(el)/float64(time.Second)))
	want = min(max(int64(1.5*rate*lease.Seconds()), 1), limit)
	closed, s.closed = s.closed, nil
	return want, closed
}

// Return is one ended grant's report: its id and its uses as ages.
type Return struct {
	ID   uint64
	Uses []shard.Run
}

// Returns is the report of closed at sent, the instant the request
// carrying it is sent.
func Returns(closed []*Grant, sent int64) []Return {
	var out []Return
	for _, g := range closed {
		out = append(out, Return{ID: g.ID, Uses: g.report(sent)})
	}
	return out
}

// Requeue ends a request that was not decided by a holder: its reports
// go with the next one (a return is idempotent), the oldest dropped past
// maxClosed.
func (s *State) Requeue(closed []*Grant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refilling = false
	s.closed = append(closed, s.closed...)
	if len(s.closed) > maxClosed {
		s.closed = s.closed[len(s.closed)-maxClosed:]
	}
}

// Refuse ends a request the holder granted nothing for: Spend refuses
// the key until sent+retry.
func (s *State) Refuse(sent int64, retry time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refilling = false
	s.refusedUntil = sent + int64(retry)
}

// Install ends a request with a grant of granted rights under lease id,
// whose lease on the holder is ttl, asked for at sent: usable until
// useFraction of ttl has passed since sent. A grant past maxLive replaces
// the oldest; unused is what that one had left.
func (s *State) Install(sent int64, id uint64, granted int64, ttl time.Duration) (unused int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refilling = false
	if len(s.live) >= maxLive {
		old := s.live[0]
		s.close(old)
		s.live = s.live[1:]
		unused = old.left
	}
	s.live = append(s.live, &Grant{
		ID: id, n: granted, left: granted, sent: sent,
		Deadline: sent + int64(useFraction*float64(ttl)),
		bin:      max(int64(ttl)/bins, 1),
	})
	s.granted += granted
	return unused
}

// Idle reports whether the key has not been decided for longer than
// idle at now and has no request in flight: a table may forget it (its
// closed grants unreported, charged until they expire).
func (s *State) Idle(now int64, idle time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return now-s.lastSeen > int64(idle) && !s.refilling
}

// Summary describes a key's state.
type Summary struct {
	// Rate is the key's decisions per second in the last full second;
	// Active whether it asks for rights.
	Rate   float64
	Active bool
	// Rights is the usable rights left; Granted the rights received in
	// all.
	Rights, Granted int64
	// Deadline is the latest deadline of the grants in use; 0 with none.
	Deadline int64
}

// Describe summarizes the state at now.
func (s *State) Describe(now int64) Summary {
	s.mu.Lock()
	defer s.mu.Unlock()
	sum := Summary{Rate: s.rate, Active: s.active, Granted: s.granted}
	for _, g := range s.live {
		if now <= g.Deadline {
			sum.Rights += g.left
		}
		sum.Deadline = max(sum.Deadline, g.Deadline)
	}
	return sum
}

// report returns g's uses as runs whose ages are relative to now, each
// at its bin's end and shrunk for the clock-rate bound.
func (g *Grant) report(now int64) []shard.Run {
	var out []shard.Run
	for i := bins - 1; i >= 0; i-- {
		if g.uses[i] == 0 {
			continue
		}
		at := g.sent + int64(i+1)*g.bin
		age := time.Duration(ageFraction * float64(max(now-at, 0)))
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
func (g *Grant) record(now, hits int64) {
	i := min(max(now-g.sent, 0)/g.bin, bins-1)
	g.uses[i] += hits
}
