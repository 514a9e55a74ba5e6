package ownership

import (
	"fmt"
	"strings"
	"time"
)

// Explain describes partition p as this member sees it at now, for an
// operator or a failure message: the table's entry, the view's target,
// whether the target is fit to take it, and any copy or proposal under
// way (with its age) or the wait before the next copy.
func (m *Machine) Explain(p int, now int64) string {
	if p < 0 || p >= len(m.parts) {
		return fmt.Sprintf("p%d: no such partition", p)
	}
	e, l := m.table.Parts[p], m.parts[p]
	var b strings.Builder
	fmt.Fprintf(&b, "p%d holder %q@%d backup %q epoch %d", p, e.Holder, e.HolderEpoch, e.Backup, e.Epoch)
	if e.Holder == "" && e.Last != "" {
		fmt.Fprintf(&b, " last %q", e.Last)
	}
	if p < len(m.view.Target) {
		t := m.view.Target[p]
		fmt.Fprintf(&b, "; target %q fresh %v", t, t != "" && m.fresh(t, now))
	}
	switch l.fence {
	case fenceCopy:
		fmt.Fprintf(&b, "; copying to %q (move %v) for %v of %v", l.to, l.move, time.Duration(now-l.since), time.Duration(l.wait))
	case fenceProposed:
		fmt.Fprintf(&b, "; proposed handing to %q (move %v) at epoch %d, %v ago", l.to, l.move, l.epoch, time.Duration(now-l.since))
	}
	if l.retryAt > now {
		fmt.Fprintf(&b, "; next copy in %v", time.Duration(l.retryAt-now))
	}
	fmt.Fprintf(&b, "; have %v recopy %v leader %v", l.have, l.recopy, m.leader)
	return b.String()
}
