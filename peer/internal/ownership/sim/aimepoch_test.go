package sim

import (
	"os"
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
	n := 40
	if raceOn {
		n = 4
	}
	if os.Getenv("RINGLIMIT_SIM_SEEDS") != "" {
		n = seeds(t)
	}
	behind, reached := 0, 0
	for seed := uint64(1); seed <= uint64(n); seed++ {
		o := options(seed)
		lateSetBackupWindow(&o)
		o.Fault, o.NoFault = FaultLateSetBackup, false
		r := run(t, o)
		if r.Failed() || r.Lost > 0 {
			t.Errorf("seed %d:\n%s", seed, r)
		}
		if r.LateSetBackup.Behind {
			behind++
		}
		if r.LateSetBackup.Admitted > 0 {
			reached++
		}
		if testing.Verbose() && seed <= 3 {
			t.Log(r)
		}
	}
	t.Logf("%d schedules, %d with a SetBackup sent on behind the Keep at its epoch, %d with its holder deciding between the Keep and its next copy", n, behind, reached)
	if reached < n/2 {
		t.Errorf("%d of %d schedules had the holder of a late SetBackup decide between its Keep and its next copy, want at least half: the fault no longer reaches what it is for", reached, n)
	}
}

// lateSetBackupWindow gives FaultLateSetBackup windows of 5 s, which
// outlast the crashed holder's liveness, and a limit of 200, which the
// clients reach at times, so that the aimed request is admitted (of 40
// schedules: 21 at a limit of 40, 28 at 100, 39 at 200; the gate
// catches the broken rule at the first at 200, the second at 100; 200
// costs twice 100's time, admissions being most of the checking).
func lateSetBackupWindow(o *Options) { o.Window, o.Limit = 5*time.Second, 200 }
