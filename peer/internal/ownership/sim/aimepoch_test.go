package sim

import (
	"testing"
	"time"
)

// TestLateSetBackup runs FaultLateSetBackup with the rule kept (a
// SetBackup commits only at its epoch): nothing over the limit, nothing
// lost. Most runs must reach the state the fault is for: a SetBackup
// sent on behind the Keep at its epoch, its holder deciding in between;
// the mutation catalogue breaks the rule on it. 40 schedules (4 under the
// race detector), or RINGLIMIT_SIM_SEEDS.
func TestLateSetBackup(t *testing.T) {
	behind := 0
	testReach(t, FaultLateSetBackup, lateSetBackupWindow, 0.5, "the holder of a late SetBackup deciding between its Keep and its next copy", func(r Result) bool {
		if r.LateSetBackup.Behind {
			behind++
		}
		return r.LateSetBackup.Admitted > 0
	})
	t.Logf("%d with a SetBackup sent on behind the Keep at its epoch", behind)
}

// lateSetBackupWindow gives FaultLateSetBackup windows of 5 s, which
// outlast the crashed holder's liveness, and a limit of 200, which the
// clients reach at times, so that the aimed request is admitted (of 40
// schedules: 21 at a limit of 40, 28 at 100, 39 at 200; the gate
// catches the broken rule at the first at 200, the second at 100; 200
// costs twice 100's time, admissions being most of the checking).
func lateSetBackupWindow(o *Options) { o.Window, o.Limit = 5*time.Second, 200 }
