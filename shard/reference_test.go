package shard

import (
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// This file holds deliberately naive reference models of the three
// algorithms and drives the real Limiter and Store against them, decision by
// decision: seeded random sequences (seed printed on failure) and a fuzz
// target whose seed corpus lives in testdata/fuzz/FuzzAgainstModel.

// refModel is a from-scratch model of one key under one algorithm. now is in
// nanoseconds and never decreases between calls.
type refModel interface {
	decide(now, hits int64) Decision
	// refund gives back up to hits of the newest units still counted at
	// now and returns the state: Allowed if anything was given back.
	refund(now, hits int64) Decision
	// clone returns an independent copy, so peek is clone().decide().
	clone() refModel
	// edge returns a time at which the model's state changes by itself (an
	// admission expires, the bucket fills, the window ends), so generators can
	// aim exactly at boundaries.
	edge() (int64, bool)
}

func newRefModel(p Policy) refModel {
	switch p.Algorithm {
	case TokenBucket:
		return &refGCRA{limit: p.Limit, window: int64(p.Window)}
	case FixedWindow:
		return &refFixed{limit: p.Limit, window: int64(p.Window)}
	default:
		res := int64(p.Resolution)
		if res == 0 {
			res = int64(time.Millisecond)
		}
		return &refLog{limit: p.Limit, window: int64(p.Window), res: res}
	}
}

// refLog is the sliding log as a plain list of every admitted unit's time
// (rounded up to the resolution), scanned in full on every call. Units are
// dropped only once they can never count again (ts <= now − W with now never
// decreasing), which keeps the model's cost bounded without changing any
// answer.
type refLog struct {
	limit, window, res int64
	units              []int64
}

// refCeil rounds t (> 0) up to a multiple of res, written independently of
// roundUp.
func refCeil(t, res int64) int64 { return (t + res - 1) / res * res }

func (m *refLog) decide(now, hits int64) Decision {
	var live []int64
	for _, ts := range m.units {
		if now-m.window < ts { // the window (now − W, now] is open on the left
			live = append(live, ts)
		}
	}
	m.units = live
	count := int64(len(live))
	d := Decision{Limit: m.limit}
	if count+hits <= m.limit {
		ts := refCeil(now, m.res)
		for range hits {
			m.units = append(m.units, ts)
		}
		d.Allowed = true
		d.Remaining = m.limit - count - hits
	} else {
		d.Remaining = m.limit - count
		// The request fits once the oldest need units have expired; the last
		// of them expires at its time + W.
		sorted := slices.Sorted(slices.Values(live))
		need := count + hits - m.limit
		d.RetryAfter = time.Duration(sorted[need-1] + m.window - now)
	}
	if len(m.units) > 0 {
		d.ResetAfter = time.Duration(slices.Max(m.units) + m.window - now)
	}
	return d
}

func (m *refLog) refund(now, hits int64) Decision {
	var live []int64
	for _, ts := range m.units {
		if now-m.window < ts {
			live = append(live, ts)
		}
	}
	slices.Sort(live)
	d := Decision{Limit: m.limit}
	for hits > 0 && len(live) > 0 {
		live = live[:len(live)-1] // the newest unit
		hits--
		d.Allowed = true
	}
	m.units = live
	d.Remaining = m.limit - int64(len(live))
	if len(live) > 0 {
		d.ResetAfter = time.Duration(live[len(live)-1] + m.window - now)
	}
	return d
}

func (m *refLog) clone() refModel {
	c := *m
	c.units = slices.Clone(m.units)
	return &c
}

func (m *refLog) edge() (int64, bool) {
	if len(m.units) == 0 {
		return 0, false
	}
	return slices.Min(m.units) + m.window, true
}

// refGCRA is GCRA in exact rational arithmetic: each unit costs exactly W/L
// of time, and the theoretical arrival time tat is a rational number.
type refGCRA struct {
	limit, window int64
	tat           *big.Rat // nil: never used (bucket full)
}

func ratInt(v int64) *big.Rat { return new(big.Rat).SetInt64(v) }

// ratCeil returns the smallest integer >= r.
func ratCeil(r *big.Rat) int64 {
	q, m := new(big.Int).DivMod(r.Num(), r.Denom(), new(big.Int)) // floor division
	if m.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}

// ratFloor returns the largest integer <= r.
func ratFloor(r *big.Rat) int64 {
	q, _ := new(big.Int).DivMod(r.Num(), r.Denom(), new(big.Int))
	return q.Int64()
}

// remaining is how many units fit at now: n with tat + n·W/L − W <= now.
func (m *refGCRA) remaining(now int64, tat *big.Rat) int64 {
	free := new(big.Rat).Sub(ratInt(m.window), new(big.Rat).Sub(tat, ratInt(now)))
	n := ratFloor(free.Mul(free, new(big.Rat).SetFrac64(m.limit, m.window)))
	return max(n, 0)
}

func (m *refGCRA) decide(now, hits int64) Decision {
	nowR := ratInt(now)
	tat := nowR
	if m.tat != nil && m.tat.Cmp(nowR) > 0 {
		tat = m.tat
	}
	newTat := new(big.Rat).Add(tat, new(big.Rat).SetFrac64(hits*m.window, m.limit))
	allowAt := new(big.Rat).Sub(newTat, ratInt(m.window))
	d := Decision{Limit: m.limit}
	if nowR.Cmp(allowAt) >= 0 {
		m.tat = newTat
		d.Allowed = true
		d.Remaining = m.remaining(now, newTat)
		d.ResetAfter = time.Duration(ratCeil(newTat) - now)
		return d
	}
	d.RetryAfter = time.Duration(ratCeil(allowAt) - now)
	d.Remaining = m.remaining(now, tat)
	d.ResetAfter = time.Duration(ratCeil(tat) - now)
	return d
}

func (m *refGCRA) refund(now, hits int64) Decision {
	nowR := ratInt(now)
	d := Decision{Limit: m.limit, Remaining: m.limit}
	if m.tat == nil || m.tat.Cmp(nowR) <= 0 {
		return d // full
	}
	back := new(big.Rat).SetFrac(new(big.Int).Mul(big.NewInt(hits), big.NewInt(m.window)), big.NewInt(m.limit))
	m.tat = new(big.Rat).Sub(m.tat, back)
	if m.tat.Cmp(nowR) < 0 {
		m.tat = nowR
	}
	d.Allowed = true
	d.Remaining = m.remaining(now, m.tat)
	d.ResetAfter = time.Duration(ratCeil(m.tat) - now)
	return d
}

func (m *refGCRA) clone() refModel { c := *m; return &c } // decide never mutates a tat in place

func (m *refGCRA) edge() (int64, bool) {
	if m.tat == nil {
		return 0, false
	}
	return ratCeil(m.tat), true
}

// refFixed is the fixed window as a list of every admission, counting those
// inside the aligned window [kW, (k+1)W) that holds now.
type refFixed struct {
	limit, window int64
	adm           []struct{ ts, n int64 }
}

func (m *refFixed) decide(now, hits int64) Decision {
	start := now / m.window * m.window // now > 0 in every test
	var count int64
	for _, a := range m.adm {
		if a.ts >= start {
			count += a.n
		}
	}
	d := Decision{Limit: m.limit}
	if count+hits <= m.limit {
		m.adm = append(m.adm, struct{ ts, n int64 }{now, hits})
		count += hits
		d.Allowed = true
	} else {
		d.RetryAfter = time.Duration(start + m.window - now)
	}
	d.Remaining = m.limit - count
	if count > 0 {
		d.ResetAfter = time.Duration(start + m.window - now)
	}
	return d
}

func (m *refFixed) refund(now, hits int64) Decision {
	start := now / m.window * m.window
	d := Decision{Limit: m.limit}
	var count int64
	for i := len(m.adm) - 1; i >= 0; i-- {
		a := &m.adm[i]
		if a.ts < start {
			continue
		}
		take := min(hits, a.n)
		a.n -= take
		hits -= take
		if take > 0 {
			d.Allowed = true
		}
		count += a.n
	}
	d.Remaining = m.limit - count
	if count > 0 {
		d.ResetAfter = time.Duration(start + m.window - now)
	}
	return d
}

func (m *refFixed) clone() refModel {
	c := *m
	c.adm = slices.Clone(m.adm)
	return &c
}

func (m *refFixed) edge() (int64, bool) {
	if len(m.adm) == 0 {
		return 0, false
	}
	last := m.adm[len(m.adm)-1].ts
	return last/m.window*m.window + m.window, true
}

// modelHarness feeds the same requests to a Limiter, to a Store and to one
// model for each (the Limiter refuses a backward time, the Store clamps it,
// so their histories may differ) and compares every decision.
type modelHarness struct {
	p          Policy
	lim        *Limiter
	store      *Store
	key        Key
	limModel   refModel
	storeModel refModel
	limLast    int64 // latest time the Limiter accepted
	storeLast  int64 // the Store's clamped clock for key
	now        int64 // the generators' cursor
	ops        int
}

func newModelHarness(p Policy, store *Store, key Key, start int64) (*modelHarness, error) {
	lim, err := NewLimiter(p)
	if err != nil {
		return nil, err
	}
	return &modelHarness{
		p: p, lim: lim, store: store, key: key,
		limModel: newRefModel(p), storeModel: newRefModel(p),
		limLast: minTime, storeLast: minTime, now: start,
	}, nil
}

// do sends one request at now to both implementations and checks them
// against their models. Invalid hits must fail and change nothing.
func (h *modelHarness) do(now, hits int64) error {
	h.ops++
	at := time.Unix(0, now)
	// Peek first: it must answer exactly what the Allow that follows
	// decides, and change nothing (or the Allow would differ from the
	// model).
	peekL, perrL := h.lim.Peek(at, hits)
	peekS, perrS := h.store.Peek(h.key, h.p, hits, at)
	gotL, errL := h.lim.Allow(at, hits)
	var buf [MaxEncodedKeyLen]byte
	ek, _ := h.key.AppendEncoded(buf[:0])
	gotS, atS, errS := h.store.AllowEncodedAt(ek, h.p, hits, at)
	if (perrL == nil) != (errL == nil) || (errL == nil && peekL != gotL) {
		return fmt.Errorf("limiter at %d hits %d: Peek %+v, %v; Allow %+v, %v", now, hits, peekL, perrL, gotL, errL)
	}
	if (perrS == nil) != (errS == nil) || (errS == nil && peekS != gotS) {
		return fmt.Errorf("store at %d hits %d: Peek %+v, %v; Allow %+v, %v", now, hits, peekS, perrS, gotS, errS)
	}
	if hits <= 0 || hits > h.p.Limit {
		if !errors.Is(errL, ErrInvalidHits) || !errors.Is(errS, ErrInvalidHits) {
			return fmt.Errorf("hits %d: limiter err %v, store err %v, want ErrInvalidHits", hits, errL, errS)
		}
		return nil
	}
	if now < h.limLast {
		if !errors.Is(errL, ErrTimeBackwards) {
			return fmt.Errorf("limiter at %d < last %d: err %v, want ErrTimeBackwards", now, h.limLast, errL)
		}
	} else {
		if errL != nil {
			return fmt.Errorf("limiter: unexpected error %v", errL)
		}
		h.limLast = now
		if want := h.limModel.decide(now, hits); gotL != want {
			return fmt.Errorf("limiter decision at %d hits %d:\n got %+v\nwant %+v", now, hits, gotL, want)
		}
	}
	if errS != nil {
		return fmt.Errorf("store: unexpected error %v", errS)
	}
	h.storeLast = max(h.storeLast, now)
	if want := h.storeModel.decide(h.storeLast, hits); gotS != want {
		return fmt.Errorf("store decision at %d (clamped %d) hits %d:\n got %+v\nwant %+v", now, h.storeLast, hits, gotS, want)
	}
	if atS != h.storeLast {
		return fmt.Errorf("store decision at %d: decided at %d, want the key's clamped clock %d", now, atS, h.storeLast)
	}
	return nil
}

// refund sends one Refund at now to both implementations and checks them
// against their models.
func (h *modelHarness) refund(now, hits int64) error {
	h.ops++
	at := time.Unix(0, now)
	gotL, errL := h.lim.Refund(at, hits)
	gotS, errS := h.store.Refund(h.key, h.p, hits, at)
	if hits <= 0 {
		if !errors.Is(errL, ErrInvalidHits) || !errors.Is(errS, ErrInvalidHits) {
			return fmt.Errorf("refund hits %d: limiter err %v, store err %v, want ErrInvalidHits", hits, errL, errS)
		}
		return nil
	}
	if now < h.limLast {
		if !errors.Is(errL, ErrTimeBackwards) {
			return fmt.Errorf("limiter refund at %d < last %d: err %v, want ErrTimeBackwards", now, h.limLast, errL)
		}
	} else {
		if errL != nil {
			return fmt.Errorf("limiter refund: unexpected error %v", errL)
		}
		h.limLast = now
		if want := h.limModel.refund(now, hits); gotL != want {
			return fmt.Errorf("limiter refund at %d hits %d:\n got %+v\nwant %+v", now, hits, gotL, want)
		}
	}
	if errS != nil {
		return fmt.Errorf("store refund: unexpected error %v", errS)
	}
	if h.store.Has(h.key) {
		// Refund advances a held key's clock; a key not held stays so.
		h.storeLast = max(h.storeLast, now)
	}
	if want := h.storeModel.refund(max(h.storeLast, now), hits); gotS != want {
		return fmt.Errorf("store refund at %d (clamped %d) hits %d:\n got %+v\nwant %+v", now, h.storeLast, hits, gotS, want)
	}
	return nil
}

// opKind is how the next request's time is chosen.
type opKind uint8

const (
	opSame    opKind = iota // the same instant again
	opTiny                  // a few ns to a few resolution steps later
	opStep                  // up to a quarter window later
	opGap                   // one to several windows later
	opBack                  // a probe before the cursor (cursor unchanged)
	opEdge                  // exactly at, just before or just after the next expiry
	opRaw                   // a raw nanosecond step
	opBadHits               // invalid hits (0, negative or > limit)
	opRefund                // a refund of 1 to limit+2 units (or 0: invalid) a little later
	numOpKinds
)

// apply advances the harness according to kind and the magnitudes a, b (any
// values; they are reduced into range here) and sends one request.
func (h *modelHarness) apply(kind opKind, a, b uint64, hits int64) error {
	w := uint64(h.p.Window)
	res := uint64(h.p.resolution())
	now := h.now
	switch kind {
	case opSame:
	case opTiny:
		now += int64(a % (3*res + 2))
	case opStep:
		now += int64(a % (w/4 + 1))
	case opGap:
		now += int64(w*(1+b%3) + a%(w+1))
	case opBack:
		back := int64(1 + a%(w/2+1))
		return h.do(now-back, hits)
	case opEdge:
		if e, ok := h.storeModel.edge(); ok {
			now = max(now, e+int64(b%3)-1)
		}
	case opRaw:
		now += int64(a % (1 << 20))
	case opBadHits:
		bad := [...]int64{0, -1, -h.p.Limit, h.p.Limit + 1, h.p.Limit + int64(b%1000) + 1}
		return h.do(now, bad[a%uint64(len(bad))])
	case opRefund:
		now += int64(a % (w/8 + 1))
		h.now = now
		return h.refund(now, int64(b%uint64(h.p.Limit+3)))
	}
	h.now = now
	return h.do(now, hits)
}

// randomPolicy draws limit 1..50, window 1 ms..10 s and resolution 0, 1 ms or
// 7 ms (never above the window).
func randomPolicy(rng *rand.Rand, alg Algorithm) Policy {
	windows := [...]time.Duration{
		time.Millisecond, 2 * time.Millisecond, 7 * time.Millisecond, 10 * time.Millisecond,
		33*time.Millisecond + 333, 100 * time.Millisecond, time.Second, 10 * time.Second,
	}
	var w time.Duration
	if rng.IntN(3) == 0 {
		w = time.Millisecond + time.Duration(rng.Int64N(int64(10*time.Second-time.Millisecond)))
	} else {
		w = windows[rng.IntN(len(windows))]
	}
	resolutions := [...]time.Duration{0, time.Millisecond, 7 * time.Millisecond}
	r := resolutions[rng.IntN(len(resolutions))]
	if r > w {
		r = 0
	}
	return Policy{Limit: 1 + rng.Int64N(50), Window: w, Algorithm: alg, Resolution: r}
}

// randomHits is mostly 1, sometimes anything up to the limit.
func randomHits(rng *rand.Rand, limit int64) int64 {
	if rng.IntN(10) < 7 {
		return 1
	}
	return 1 + rng.Int64N(limit)
}

// runRandomSequence drives one fresh key for ops requests.
func runRandomSequence(t *testing.T, seed uint64, rng *rand.Rand, store *Store, seq int, p Policy, ops int) {
	t.Helper()
	key := Key{Tenant: "t", Subject: fmt.Sprintf("s%d", seq), Policy: "p"}
	start := t0.UnixNano() + rng.Int64N(int64(time.Hour))
	h, err := newModelHarness(p, store, key, start)
	if err != nil {
		t.Fatalf("seed %d: policy %+v: %v", seed, p, err)
	}
	// Weights per op kind: mostly equal times, small steps and edges, with
	// long gaps, backward probes and invalid hits mixed in.
	weights := [numOpKinds]int{opSame: 20, opTiny: 25, opStep: 20, opGap: 4, opBack: 5, opEdge: 15, opRaw: 8, opBadHits: 3, opRefund: 6}
	total := 0
	for _, wt := range weights {
		total += wt
	}
	for i := range ops {
		pick := rng.IntN(total)
		kind := opKind(0)
		for ; pick >= weights[kind]; kind++ {
			pick -= weights[kind]
		}
		if err := h.apply(kind, rng.Uint64(), rng.Uint64(), randomHits(rng, p.Limit)); err != nil {
			t.Fatalf("seed %d, sequence %d, op %d (%v), policy %+v, start %d: %v", seed, seq, i, kind, p, start, err)
		}
	}
}

func (k opKind) String() string {
	names := [...]string{"same", "tiny", "step", "gap", "back", "edge", "raw", "badhits", "refund"}
	if int(k) < len(names) {
		return names[k]
	}
	return fmt.Sprintf("op(%d)", uint8(k))
}

// TestAgainstModelRandom compares Limiter and Store with the models over
// seeded random sequences: about 200 000 sliding-log requests and 40 000 for
// each of the other algorithms.
func TestAgainstModelRandom(t *testing.T) {
	cases := []struct {
		alg   Algorithm
		seeds []uint64
		ops   int // per seed
	}{
		{SlidingLog, []uint64{1, 2, 3, 4, 5, 6, 7, 0x5eed_cafe}, 25_000},
		{TokenBucket, []uint64{11, 12, 13, 14}, 10_000},
		{FixedWindow, []uint64{21, 22, 23, 24}, 10_000},
	}
	for _, tc := range cases {
		for _, seed := range tc.seeds {
			t.Run(fmt.Sprintf("alg=%v/seed=%d", tc.alg, seed), func(t *testing.T) {
				t.Parallel()
				rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
				store, err := NewStore(Config{Stripes: 4})
				if err != nil {
					t.Fatal(err)
				}
				// Each sequence is a fresh key with a fresh random policy.
				for seq, done := 0, 0; done < tc.ops; seq++ {
					n := min(200+rng.IntN(2000), tc.ops-done)
					runRandomSequence(t, seed, rng, store, seq, randomPolicy(rng, tc.alg), n)
					done += n
				}
			})
		}
	}
}

// fuzzWindows and fuzzResolutions are the policies the fuzz decoder picks
// from.
var (
	fuzzWindows = [...]time.Duration{
		time.Millisecond, 2 * time.Millisecond, 7 * time.Millisecond, 10*time.Millisecond + 1,
		100 * time.Millisecond, time.Second, 10 * time.Second, 3*time.Second + 7,
	}
	fuzzResolutions = [...]time.Duration{0, time.Millisecond, 7 * time.Millisecond, time.Nanosecond}
)

// decodeFuzzPolicy reads the first three bytes of data as a policy.
func decodeFuzzPolicy(data []byte) (Policy, []byte, bool) {
	if len(data) < 3 {
		return Policy{}, nil, false
	}
	p := Policy{
		Limit:      1 + int64(data[0]%50),
		Window:     fuzzWindows[data[1]%8],
		Algorithm:  Algorithm((data[1] >> 3) % uint8(Concurrency)), // the rate algorithms; concurrency_test.go models leases
		Resolution: fuzzResolutions[data[2]%4],
	}
	if p.Resolution > p.Window {
		p.Resolution = 0
	}
	return p, data[3:], true
}

// FuzzAgainstModel decodes a policy and a sequence of requests from data
// and compares Limiter and Store with the model on every decision.
//
// Layout: byte 0 limit, byte 1 window (low 3 bits) and algorithm, byte 2
// resolution; then 4 bytes per request: kind, two magnitude bytes, hits.
func FuzzAgainstModel(f *testing.F) {
	f.Add([]byte{99, 7, 1, 1, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0, 5, 1, 1, 10, 0, 0, 5, 255, 255, 0, 0, 1, 1, 0})
	f.Add([]byte{4, 2, 2, 0, 0, 0, 3, 3, 0, 0, 200, 1, 200, 200, 1, 5, 0, 1, 0, 2, 0, 0, 0})
	f.Add([]byte{9, 14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 1, 0, 2, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		p, ops, ok := decodeFuzzPolicy(data)
		if !ok {
			return
		}
		store, err := NewStore(Config{Stripes: 1})
		if err != nil {
			t.Fatal(err)
		}
		h, err := newModelHarness(p, store, Key{Tenant: "t", Subject: "s", Policy: "p"}, t0.UnixNano())
		if err != nil {
			t.Fatalf("policy %+v: %v", p, err)
		}
		for i := 0; i+4 <= len(ops) && i < 4*4096; i += 4 {
			kind := opKind(ops[i] % uint8(numOpKinds))
			mag := uint64(ops[i+1])<<8 | uint64(ops[i+2])
			// Scale the magnitude so a few bytes can reach any window.
			a := mag * uint64(p.Window) / 0xffff
			if kind == opTiny || kind == opRaw {
				a = mag
			}
			hits := int64(1)
			if ops[i+3] >= 128 {
				hits = 1 + int64(ops[i+3])%p.Limit
			}
			if err := h.apply(kind, a, uint64(ops[i+2]), hits); err != nil {
				t.Fatalf("policy %+v, op %d (%v): %v", p, i/4, kind, err)
			}
		}
	})
}

// propertyPolicies are the shapes the property tests run over, including
// limits that do not divide the window.
var propertyPolicies = []struct{ limit int64 }{{1}, {3}, {7}, {10}, {50}}

// timedHits is one admission: hits units at ts (ns).
type timedHits struct{ ts, hits int64 }

// randomAdmissions sends n requests at random, mostly dense times to alg
// and returns the admissions.
func randomAdmissions(t *testing.T, rng *rand.Rand, p Policy, n int) []timedHits {
	t.Helper()
	lim, err := NewLimiter(p)
	if err != nil {
		t.Fatal(err)
	}
	var out []timedHits
	now := t0.UnixNano()
	for range n {
		switch rng.IntN(10) {
		case 0:
			now += rng.Int64N(2 * int64(p.Window))
		case 1, 2, 3:
		default:
			now += rng.Int64N(int64(p.Window)/p.Limit + 1)
		}
		hits := randomHits(rng, p.Limit)
		d, err := lim.Allow(time.Unix(0, now), hits)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			out = append(out, timedHits{now, hits})
		}
	}
	return out
}

// TestTokenBucketProperties: from empty, a burst of L at one instant is
// admitted and the next unit is not; then the rate settles at L per W; and
// over any interval of length d at most L + d·L/W units are admitted.
func TestTokenBucketProperties(t *testing.T) {
	for _, pc := range propertyPolicies {
		for _, w := range []time.Duration{time.Second, 10*ms + 1} {
			p := Policy{Limit: pc.limit, Window: w, Algorithm: TokenBucket}
			t.Run(fmt.Sprintf("L=%d/W=%v", p.Limit, w), func(t *testing.T) {
				lim, err := NewLimiter(p)
				if err != nil {
					t.Fatal(err)
				}
				for i := range p.Limit {
					if d, _ := lim.Allow(t0, 1); !d.Allowed {
						t.Fatalf("burst unit %d of %d refused: %+v", i+1, p.Limit, d)
					}
				}
				if d, _ := lim.Allow(t0, 1); d.Allowed {
					t.Fatalf("unit %d of a burst admitted", p.Limit+1)
				}
				// A client that retries exactly after RetryAfter is admitted
				// every time, at the steady rate: exactly 20·L units in the
				// next 20 windows.
				const windows = 20
				end := t0.Add(windows * w)
				admitted := int64(0)
				for now := t0; ; {
					d, err := lim.Allow(now, 1)
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed {
						admitted++
						continue
					}
					if d.RetryAfter <= 0 {
						t.Fatalf("rejected at %v with RetryAfter %v", now.Sub(t0), d.RetryAfter)
					}
					now = now.Add(d.RetryAfter)
					if now.After(end) {
						break
					}
					if d, _ := lim.Allow(now, 1); !d.Allowed {
						t.Fatalf("refused at %v, exactly after RetryAfter: %+v", now.Sub(t0), d)
					}
					admitted++
				}
				if want := windows * p.Limit; admitted != want {
					t.Fatalf("steady state admitted %d over %d windows, want %d", admitted, windows, want)
				}
				for _, seed := range []uint64{1, 2, 3} {
					adm := randomAdmissions(t, rand.New(rand.NewPCG(seed, 7)), p, 3000)
					for i := range adm {
						var sum int64
						for j := i; j < len(adm); j++ {
							sum += adm[j].hits
							d := adm[j].ts - adm[i].ts
							// sum <= L + d·L/W, in integers.
							if (sum-p.Limit)*int64(w) > d*p.Limit {
								t.Fatalf("seed %d: %d units in an interval of %v (limit %d + %v·L/W)", seed, sum, time.Duration(d), p.Limit, time.Duration(d))
							}
							if d > 4*int64(w) {
								break
							}
						}
					}
				}
			})
		}
	}
}

// TestFixedWindowProperties: at most L units per aligned window, and
// exactly L when demand is dense.
func TestFixedWindowProperties(t *testing.T) {
	for _, pc := range propertyPolicies {
		p := Policy{Limit: pc.limit, Window: 100 * ms, Algorithm: FixedWindow}
		t.Run(fmt.Sprintf("L=%d", p.Limit), func(t *testing.T) {
			for _, seed := range []uint64{1, 2, 3} {
				per := map[int64]int64{}
				for _, a := range randomAdmissions(t, rand.New(rand.NewPCG(seed, 9)), p, 3000) {
					per[a.ts/int64(p.Window)] += a.hits
				}
				for k, n := range per {
					if n > p.Limit {
						t.Fatalf("seed %d: window %d admitted %d > %d", seed, k, n, p.Limit)
					}
				}
			}
			lim, _ := NewLimiter(p)
			per := map[int64]int64{}
			for now := t0.UnixNano(); now < t0.UnixNano()+10*int64(p.Window); now += int64(ms) {
				for range 2 * p.Limit / 10 {
					if d, _ := lim.Allow(time.Unix(0, now), 1); d.Allowed {
						per[now/int64(p.Window)]++
					}
				}
			}
			for k, n := range per {
				if n != p.Limit {
					t.Fatalf("dense demand: window %d admitted %d, want %d", k, n, p.Limit)
				}
			}
		})
	}
}

// TestSlidingLogProperty: no rolling window (t − W, t] ever holds more than
// L admitted units, over random traffic.
func TestSlidingLogProperty(t *testing.T) {
	for _, pc := range propertyPolicies {
		p := Policy{Limit: pc.limit, Window: 100 * ms}
		for _, seed := range []uint64{1, 2, 3} {
			adm := randomAdmissions(t, rand.New(rand.NewPCG(seed, 11)), p, 3000)
			for j := range adm {
				var sum int64
				for i := j; i >= 0 && adm[i].ts > adm[j].ts-int64(p.Window); i-- {
					sum += adm[i].hits
				}
				if sum > p.Limit {
					t.Fatalf("L=%d seed %d: %d units in the window ending at %d", p.Limit, seed, sum, adm[j].ts)
				}
			}
		}
	}
}
