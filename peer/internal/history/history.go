package history

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Outcome is what a client learned about one attempt.
type Outcome uint8

const (
	// Admitted: the limiter answered that the units were admitted.
	Admitted Outcome = iota + 1
	// Rejected: the limiter answered over limit; nothing was taken.
	Rejected
	// Unknown: no answer (timed out, connection lost); the attempt may or
	// may not have taken effect. Its Return is ignored (treated as +∞).
	Unknown
	// Unavailable: the limiter answered that it could not decide; the
	// attempt did not take effect.
	Unavailable
)

func (o Outcome) String() string {
	switch o {
	case Admitted:
		return "admitted"
	case Rejected:
		return "rejected"
	case Unknown:
		return "unknown"
	case Unavailable:
		return "unavailable"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Op is one recorded attempt on one key.
type Op struct {
	Key     string
	Hits    int64   // units asked for, ≥ 1
	Call    int64   // ns on the one recording clock
	Return  int64   // ns on the same clock; ignored for Unknown
	Outcome Outcome // what the client learned
	Client  int     // who asked, for messages

	// What the answer said, for reports only; never used by the checks.
	Owner     string
	Epoch     uint64
	DecidedAt int64
}

func (o Op) String() string {
	ret := fmtNs(o.Return)
	if o.Outcome == Unknown {
		ret = "∞"
	}
	s := fmt.Sprintf("client %d %s ×%d [%s, %s]", o.Client, o.Outcome, o.Hits, fmtNs(o.Call), ret)
	if o.Owner != "" || o.Epoch != 0 || o.DecidedAt != 0 {
		s += fmt.Sprintf(" (owner %q epoch %d decided at %s)", o.Owner, o.Epoch, fmtNs(o.DecidedAt))
	}
	return s
}

// Limits is one key's promise: at most Limit admitted units in any rolling
// interval (t − Window, t]. A Window ≤ 0 means the key is not checked (it is
// listed in Report.Unchecked); Limit 0 with a positive Window means nothing
// may be admitted.
type Limits struct {
	Limit  int64
	Window time.Duration
}

// The rules a Violation names.
const (
	RuleWindow       = "window"       // CheckWindow: > Limit units within intervals spanning < Window
	RuleLinearizable = "linearizable" // CheckLinearizable: no decision instants satisfy the promise
	RuleMalformed    = "malformed"    // the record itself is unusable (Hits < 1, Return < Call, bad Outcome, Limit < 0)
)

// Violation is one broken promise (or, for RuleMalformed, one unusable
// record: a bug in the recorder, not in the limiter, but never ignored).
type Violation struct {
	Key    string
	Rule   string
	Ops    []Op
	Detail string
}

func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "key %q: %s: %s", v.Key, v.Rule, v.Detail)
	for _, o := range v.Ops {
		fmt.Fprintf(&b, "\n\t%v", o)
	}
	return b.String()
}

// Report is the result of Check.
type Report struct {
	Keys, Ops, Admitted, Rejected, Unknown, Unavailable int
	Violations                                          []Violation
	// TimedOut lists the keys whose linearizability check gave up before
	// deciding (not violations: nothing is known about them beyond rule 1).
	TimedOut []string
	// Unchecked lists the keys whose Limits had Window ≤ 0.
	Unchecked []string
}

// Err is nil when the report has no violations; otherwise an error listing
// them. Timeouts are not errors.
func (r Report) Err() error {
	if len(r.Violations) == 0 {
		return nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d violation(s):", len(r.Violations))
	for _, v := range r.Violations {
		b.WriteString("\n")
		b.WriteString(v.String())
	}
	return fmt.Errorf("%s", b.String())
}

func (r Report) String() string {
	s := fmt.Sprintf("%d keys, %d ops (%d admitted, %d rejected, %d unknown, %d unavailable): %d violations",
		r.Keys, r.Ops, r.Admitted, r.Rejected, r.Unknown, r.Unavailable, len(r.Violations))
	if len(r.TimedOut) > 0 {
		s += fmt.Sprintf(", timed out on %q", r.TimedOut)
	}
	if len(r.Unchecked) > 0 {
		s += fmt.Sprintf(", unchecked %q", r.Unchecked)
	}
	return s
}

// Check applies both rules to every key: CheckWindow, then
// CheckLinearizable with timeout as each key's budget (≤ 0: no limit).
func Check(ops []Op, limits func(key string) Limits, timeout time.Duration) Report {
	var r Report
	r.Ops = len(ops)
	for _, o := range ops {
		switch o.Outcome {
		case Admitted:
			r.Admitted++
		case Rejected:
			r.Rejected++
		case Unknown:
			r.Unknown++
		case Unavailable:
			r.Unavailable++
		}
	}
	keys, bad := byKey(ops, limits)
	r.Keys = len(keys)
	r.Violations = bad
	for _, k := range keys {
		if k.lim.Window <= 0 {
			r.Unchecked = append(r.Unchecked, k.key)
			continue
		}
		r.Violations = append(r.Violations, k.checkWindow()...)
		v, to := k.checkLinearizable(timeout, false)
		r.Violations = append(r.Violations, v...)
		if to {
			r.TimedOut = append(r.TimedOut, k.key)
		}
	}
	return r
}

// keyOps is one key's admitted ops, checked and ready for the rules.
type keyOps struct {
	key      string
	lim      Limits
	admitted []Op // sorted by Call, then Return
	all      []Op // every well-formed op, in input order
}

// byKey groups ops by key (keys sorted), dropping malformed ops and
// returning a RuleMalformed violation for each. Dropping an op can only hide
// a violation, never make one.
func byKey(ops []Op, limits func(string) Limits) ([]*keyOps, []Violation) {
	m := map[string]*keyOps{}
	var keys []*keyOps
	var bad []Violation
	for _, o := range ops {
		k := m[o.Key]
		if k == nil {
			k = &keyOps{key: o.Key, lim: limits(o.Key)}
			m[o.Key] = k
			keys = append(keys, k)
			if k.lim.Limit < 0 && k.lim.Window > 0 {
				bad = append(bad, Violation{Key: o.Key, Rule: RuleMalformed,
					Detail: fmt.Sprintf("negative limit %d", k.lim.Limit)})
			}
		}
		if why := malformed(o); why != "" {
			bad = append(bad, Violation{Key: o.Key, Rule: RuleMalformed, Ops: []Op{o}, Detail: why})
			continue
		}
		k.all = append(k.all, o)
		if o.Outcome == Admitted {
			k.admitted = append(k.admitted, o)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].key < keys[j].key })
	for _, k := range keys {
		sort.SliceStable(k.admitted, func(i, j int) bool {
			a, b := k.admitted[i], k.admitted[j]
			if a.Call != b.Call {
				return a.Call < b.Call
			}
			return a.Return < b.Return
		})
	}
	return keys, bad
}

func malformed(o Op) string {
	switch {
	case o.Hits < 1:
		return fmt.Sprintf("hits %d < 1", o.Hits)
	case o.Outcome < Admitted || o.Outcome > Unavailable:
		return fmt.Sprintf("bad outcome %v", o.Outcome)
	case o.Outcome != Unknown && o.Return < o.Call:
		return "returned before it was called"
	}
	return ""
}

// checked reports whether the key's promise is checked at all.
func (k *keyOps) checked() bool { return k.lim.Window > 0 && k.lim.Limit >= 0 }

func fmtNs(ns int64) string { return time.Duration(ns).String() }
