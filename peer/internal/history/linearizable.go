package history

import (
	"fmt"
	"math"
	"sort"
	"sync/atomic"
	"time"

	"github.com/anishathalye/porcupine"
)

// reportOps is how many ops a RuleLinearizable violation lists at most.
const reportOps = 20

// CheckLinearizable checks, per key, that the key's admitted ops can be
// given decision instants τ, each inside its op's [Call, Return], such that
// no rolling window (τ − Window, τ] holds more than Limit units (doc.go).
// It searches with porcupine against a timed sliding-log model. timeout is
// each key's budget (≤ 0: none); the keys that run out are returned, not
// reported as violations. Malformed ops are reported as RuleMalformed and
// otherwise ignored.
func CheckLinearizable(ops []Op, limits func(string) Limits, timeout time.Duration) ([]Violation, []string) {
	keys, bad := byKey(ops, limits)
	var timedOut []string
	for _, k := range keys {
		v, to := k.checkLinearizable(timeout, false)
		bad = append(bad, v...)
		if to {
			timedOut = append(timedOut, k.key)
		}
	}
	return bad, timedOut
}

// model is one key's timed sliding log.
type model struct {
	L, W int64
	// exact makes the deterministic model's cache use plain equality
	// instead of covers (for the tests, which compare the two).
	exact bool
}

// ent is one admitted decision still possibly inside a window.
type ent struct{ tau, hits int64 }

// state is immutable: steps build new states. ents is sorted by tau with
// distinct taus (equal ones merged), and holds only entries with
// tau > lo − W: the others can never count again, since every later
// instant is ≥ lo. This canonical form makes Equal exact and cheap.
type state struct {
	lo   int64 // the last linearization point; MinInt64 before the first
	ents []ent
	hash uint64
	seq  uint64 // creation order, for covers
}

// seq numbers states in creation order.
var seq atomic.Uint64

// covers reports whether every continuation legal from n is legal from s:
// s.lo ≤ n.lo and, for every x ≥ n.lo − W, s holds no more units with
// τ > x than n does. (Then from s each later admission can be placed no
// later than from n, and the relation carries over to the next states.)
// Equal states cover each other.
func (m model) covers(s, n *state) bool {
	if s.lo > n.lo {
		return false
	}
	a := n.lo - m.W
	i, j := len(s.ents)-1, len(n.ents)-1
	var ss, sn int64 // units with τ > the current x
	for {
		v := int64(math.MinInt64)
		if i >= 0 {
			v = s.ents[i].tau
		}
		if j >= 0 {
			v = max(v, n.ents[j].tau)
		}
		if (i < 0 && j < 0) || v <= a {
			break
		}
		if ss > sn {
			return false
		}
		for ; i >= 0 && s.ents[i].tau == v; i-- {
			ss += s.ents[i].hits
		}
		for ; j >= 0 && n.ents[j].tau == v; j-- {
			sn += n.ents[j].hits
		}
	}
	return ss <= sn
}

func (s *state) rehash() *state {
	h := uint64(14695981039346656037)
	mix := func(x int64) { h = (h ^ uint64(x)) * 1099511628211 }
	mix(s.lo)
	for _, e := range s.ents {
		mix(e.tau)
		mix(e.hits)
	}
	s.hash = h
	s.seq = seq.Add(1)
	return s
}

func (s *state) equal(t *state) bool {
	if s == t {
		return true
	}
	if s.hash != t.hash || s.lo != t.lo || len(s.ents) != len(t.ents) {
		return false
	}
	for i := range s.ents {
		if s.ents[i] != t.ents[i] {
			return false
		}
	}
	return true
}

// units is how many units count at instant t ≥ s.lo: entries in (t − W, t].
func (m model) units(s *state, t int64) int64 {
	var sum int64
	for _, e := range s.ents {
		if e.tau > t-m.W {
			sum += e.hits
		}
	}
	return sum
}

// admit linearizes an admission of hits units called at call and answered
// by ret at the earliest feasible instant τ ≥ max(lo, call), or returns nil
// if τ > ret. Earliest is optimal for the rest of the order: the entry
// expires soonest and lo grows least, so every continuation legal from a
// later τ is legal from this one.
func (m model) admit(s *state, call, ret, hits int64) *state {
	if hits > m.L {
		return nil
	}
	t0 := max(s.lo, call)
	if t0 > ret {
		return nil
	}
	k := 0
	for k < len(s.ents) && s.ents[k].tau <= t0-m.W {
		k++
	}
	var sum int64
	for _, e := range s.ents[k:] {
		sum += e.hits
	}
	// The count is non-increasing in τ (every entry is ≤ lo ≤ τ): walk the
	// expiry instants tau+W, at which an entry stops counting.
	tau := t0
	for sum+hits > m.L {
		sum -= s.ents[k].hits
		tau = s.ents[k].tau + m.W
		k++
	}
	if tau > ret {
		return nil
	}
	rest := s.ents[k:]
	n := &state{lo: tau}
	if len(rest) > 0 && rest[len(rest)-1].tau == tau {
		n.ents = make([]ent, len(rest))
		copy(n.ents, rest)
		n.ents[len(rest)-1].hits += hits
	} else {
		n.ents = make([]ent, len(rest), len(rest)+1)
		copy(n.ents, rest)
		n.ents = append(n.ents, ent{tau, hits})
	}
	return n.rehash()
}

// pass linearizes an attempt that took nothing (rejected, unavailable) at
// max(lo, call).
func (m model) pass(s *state, call int64) *state {
	if call <= s.lo {
		return s
	}
	k := 0
	for k < len(s.ents) && s.ents[k].tau <= call-m.W {
		k++
	}
	return (&state{lo: call, ents: s.ents[k:len(s.ents):len(s.ents)]}).rehash()
}

// input is a porcupine Operation's Input.
type input struct {
	op   Op
	call int64
	ret  int64 // math.MaxInt64 for Unknown
}

func (m model) init() *state { return (&state{lo: math.MinInt64}).rehash() }

// deterministic is the model for admitted ops only (what CheckLinearizable
// runs: doc.go explains why the other outcomes cannot change the verdict).
func (m model) deterministic() porcupine.Model {
	pm := porcupine.Model{
		Init: func() interface{} { return m.init() },
		Step: func(st, in, _ interface{}) (bool, interface{}) {
			i := in.(*input)
			n := m.admit(st.(*state), i.call, i.ret, i.op.Hits)
			if n == nil {
				return false, st
			}
			return true, n
		},
		// porcupine consults Equal only for its cache of visited
		// (linearized set, state) pairs, as Equal(new, cached): true
		// skips the new state. A cached state with the same linearized
		// set is never on the search path to the new one, so its subtree
		// has been searched and failed; if it covers the new state, the
		// new one fails too and is skipped. Which one is new is read from
		// the creation order, not from the argument order. Hash is left
		// nil so that every state with the same linearized set lands in
		// one bucket and is compared.
		Equal: func(a, b interface{}) bool {
			x, y := a.(*state), b.(*state)
			if x.seq < y.seq {
				return m.covers(x, y)
			}
			return m.covers(y, x)
		},
		DescribeOperation: func(in, _ interface{}) string {
			return in.(*input).op.String()
		},
		DescribeState: func(st interface{}) string { return fmt.Sprint(*st.(*state)) },
	}
	if m.exact {
		pm.Equal = func(a, b interface{}) bool { return a.(*state).equal(b.(*state)) }
		pm.Hash = func(st interface{}) uint64 { return st.(*state).hash }
	}
	return pm
}

// nondeterministic is the model for every outcome: rejected and
// unavailable attempts take nothing, an unknown one either did not happen
// or was admitted at some instant ≥ its call.
func (m model) nondeterministic() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []interface{} { return []interface{}{m.init()} },
		Step: func(st, in, _ interface{}) []interface{} {
			s, i := st.(*state), in.(*input)
			switch i.op.Outcome {
			case Admitted:
				if n := m.admit(s, i.call, i.ret, i.op.Hits); n != nil {
					return []interface{}{n}
				}
				return nil
			case Unknown:
				if n := m.admit(s, i.call, math.MaxInt64, i.op.Hits); n != nil {
					return []interface{}{s, n}
				}
				return []interface{}{s}
			default:
				return []interface{}{m.pass(s, i.call)}
			}
		},
		Equal: func(a, b interface{}) bool { return a.(*state).equal(b.(*state)) },
		Hash:  func(st interface{}) uint64 { return st.(*state).hash },
		DescribeOperation: func(in, _ interface{}) string {
			return in.(*input).op.String()
		},
		DescribeState: func(st interface{}) string { return fmt.Sprint(*st.(*state)) },
	}
	return nm.ToModel()
}

// segments splits admitted ops (sorted by Call) where the next op is
// called at least W after every earlier op returned: every decision before
// the split has expired by every decision after it, and none constrains
// their order, so the stretches are independent.
func segments(a []Op, W int64) [][]Op {
	var out [][]Op
	start := 0
	maxRet := int64(math.MinInt64)
	for i, o := range a {
		if i > start && o.Call-W >= maxRet {
			out = append(out, a[start:i])
			start = i
		}
		maxRet = max(maxRet, o.Return)
	}
	if start < len(a) {
		out = append(out, a[start:])
	}
	return out
}

// checkLinearizable checks one key. full runs the nondeterministic model
// over every op instead of the deterministic one over admitted ops (the
// tests compare the two).
func (k *keyOps) checkLinearizable(timeout time.Duration, full bool) ([]Violation, bool) {
	return k.checkModel(model{L: k.lim.Limit, W: int64(k.lim.Window)}, timeout, full)
}

func (k *keyOps) checkModel(m model, timeout time.Duration, full bool) ([]Violation, bool) {
	if !k.checked() {
		return nil, false
	}
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	var segs [][]Op
	pm := m.deterministic()
	if full {
		segs = [][]Op{k.all}
		pm = m.nondeterministic()
	} else {
		segs = segments(k.admitted, m.W)
	}
	var out []Violation
	for _, seg := range segs {
		if len(seg) == 0 {
			continue
		}
		var budget time.Duration
		if timeout > 0 {
			if budget = time.Until(deadline); budget <= 0 {
				return out, true
			}
		}
		hist := make([]porcupine.Operation, len(seg))
		for i, o := range seg {
			ret := o.Return
			if o.Outcome == Unknown {
				ret = math.MaxInt64
			}
			hist[i] = porcupine.Operation{ClientId: o.Client, Call: o.Call, Return: ret,
				Input: &input{op: o, call: o.Call, ret: ret}}
		}
		res, info := porcupine.CheckOperationsVerbose(pm, hist, budget)
		switch res {
		case porcupine.Unknown:
			return out, true
		case porcupine.Illegal:
			out = append(out, m.explain(k.key, seg, info, full))
		}
	}
	return out, false
}

// explain builds the violation for an illegal stretch from porcupine's
// longest partial linearization: the op left out that had to be decided
// first (the earliest return), why it cannot follow that prefix, and the
// ops that could share a window with it.
func (m model) explain(key string, seg []Op, info porcupine.LinearizationInfo, full bool) Violation {
	var best []int
	if p := info.PartialLinearizations(); len(p) > 0 {
		for _, l := range p[0] {
			if len(l) > len(best) {
				best = l
			}
		}
	}
	placed := make([]bool, len(seg))
	for _, id := range best {
		placed[id] = true
	}
	stuck := -1
	for i, o := range seg {
		if !placed[i] && o.Outcome == Admitted && (stuck < 0 || o.Return < seg[stuck].Return) {
			stuck = i
		}
	}
	v := Violation{Key: key, Rule: RuleLinearizable}
	admitted := 0
	for _, o := range seg {
		if o.Outcome == Admitted {
			admitted++
		}
	}
	if stuck < 0 { // cannot happen for an illegal history; be safe
		v.Ops = seg[:min(len(seg), reportOps)]
		v.Detail = fmt.Sprintf("no decision instants for these %d admitted ops keep within %d units per %s",
			admitted, m.L, time.Duration(m.W))
		return v
	}
	so := seg[stuck]
	v.Detail = fmt.Sprintf("no decision instants for these %d admitted ops (of %d ops in this stretch) keep within %d units per %s; "+
		"the longest partial linearization found places %d ops and cannot place client %d's ×%d [%s, %s]",
		admitted, len(seg), m.L, time.Duration(m.W), len(best), so.Client, so.Hits, fmtNs(so.Call), fmtNs(so.Return))
	if !full {
		s := m.init()
		for _, id := range best {
			o := seg[id]
			if n := m.admit(s, o.Call, o.Return, o.Hits); n != nil {
				s = n
			}
		}
		switch {
		case so.Hits > m.L:
			v.Detail += fmt.Sprintf(": it alone asks for more than %d", m.L)
		case s.lo > so.Return:
			v.Detail += fmt.Sprintf(": the ops placed before it are decided as late as %s", fmtNs(s.lo))
		default:
			v.Detail += fmt.Sprintf(": after them the window (%s, %s] already holds %d units",
				fmtNs(so.Return-m.W), fmtNs(so.Return), m.units(s, so.Return))
		}
	}
	// The ops whose intervals meet (Return − W, Return] of the stuck op: the
	// ones that may share its window. Keep the stuck op and the nearest.
	var near []int
	for i, o := range seg {
		if o.Outcome != Admitted {
			continue
		}
		if o.Call <= so.Return && o.Return > so.Return-m.W {
			near = append(near, i)
		}
	}
	if len(near) > reportOps {
		sort.SliceStable(near, func(a, b int) bool {
			return absDiff(seg[near[a]].Call, so.Call) < absDiff(seg[near[b]].Call, so.Call)
		})
		near = near[:reportOps]
		sort.Ints(near)
		v.Detail += fmt.Sprintf(" (%d ops listed: the nearest of those that may share its window)", reportOps)
	}
	for _, i := range near {
		v.Ops = append(v.Ops, seg[i])
	}
	return v
}

func absDiff(a, b int64) int64 {
	if a < b {
		return b - a
	}
	return a - b
}
