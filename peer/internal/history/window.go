package history

import (
	"fmt"
	"sort"
)

// maxWindowReports caps the RuleWindow violations reported per key; the
// last one reported says how many start points violated in all.
const maxWindowReports = 10

// CheckWindow applies the direct window rule alone: for each key, a set of
// admitted ops whose call–return intervals all lie inside one interval
// shorter than the key's Window, with more than Limit hits in total, is a
// violation whatever order they were decided in (doc.go). Malformed ops are
// reported as RuleMalformed and otherwise ignored.
func CheckWindow(ops []Op, limits func(string) Limits) []Violation {
	keys, bad := byKey(ops, limits)
	for _, k := range keys {
		bad = append(bad, k.checkWindow()...)
	}
	return bad
}

// checkWindow finds, for every distinct call instant c of an admitted op,
// the total hits of the admitted ops j with Call_j ≥ c and Return_j < c + W:
// exactly the ops that fit with the earliest-called one inside [c, c+W).
// Taking them all is the best subset for that c, so this is exhaustive.
// Ops are swept by descending Call into a Fenwick tree indexed by Return
// rank: O(n log n).
func (k *keyOps) checkWindow() []Violation {
	if !k.checked() || len(k.admitted) == 0 {
		return nil
	}
	a := k.admitted // sorted by Call
	n := len(a)
	W, L := int64(k.lim.Window), k.lim.Limit
	rets := make([]int64, n)
	for i, o := range a {
		rets[i] = o.Return
	}
	sort.Slice(rets, func(i, j int) bool { return rets[i] < rets[j] })
	tree := make([]int64, n+1)
	add := func(r int64, h int64) {
		i := sort.Search(n, func(i int) bool { return rets[i] >= r }) + 1
		for ; i <= n; i += i & -i {
			tree[i] += h
		}
	}
	// sumBelow is the total hits of inserted ops with Return < r.
	sumBelow := func(r int64) int64 {
		i := sort.Search(n, func(i int) bool { return rets[i] >= r })
		var s int64
		for ; i > 0; i -= i & -i {
			s += tree[i]
		}
		return s
	}
	over := make([]bool, n) // over[i]: i is the first op with its Call and violates
	count := 0
	for i := n - 1; i >= 0; {
		j := i
		for j >= 0 && a[j].Call == a[i].Call {
			add(a[j].Return, a[j].Hits)
			j--
		}
		if sumBelow(a[i].Call+W) > L {
			over[j+1] = true
			count++
		}
		i = j
	}
	var out []Violation
	lastEnd := int64(-1 << 63)
	for i := 0; i < n && len(out) < maxWindowReports; i++ {
		if !over[i] || a[i].Call <= lastEnd {
			continue
		}
		c := a[i].Call
		var set []Op
		var sum int64
		maxRet := c
		for j := i; j < n && a[j].Call < c+W; j++ {
			if a[j].Return < c+W {
				set = append(set, a[j])
				sum += a[j].Hits
				maxRet = max(maxRet, a[j].Return)
			}
		}
		lastEnd = maxRet
		d := fmt.Sprintf("%d units admitted (limit %d) by %d ops whose intervals all lie in [%s, %s], a span of %s < window %s",
			sum, L, len(set), fmtNs(c), fmtNs(maxRet), fmtNs(maxRet-c), k.lim.Window)
		out = append(out, Violation{Key: k.key, Rule: RuleWindow, Ops: set, Detail: d})
	}
	if count > len(out) {
		out[len(out)-1].Detail += fmt.Sprintf(" (%d violating start instants in all, %d reported)", count, len(out))
	}
	return out
}
