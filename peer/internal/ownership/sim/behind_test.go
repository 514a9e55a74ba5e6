package sim

import (
	"strings"
	"testing"
)

// TestBehindBackupTakesOver: the log falls silent to the first key's
// backup while its holder copies the partition to it again, and the
// holder crashes as the backup installs that copy (FaultBehindBackup).
// The log ends the holder and hands the partition to the backup, which
// learns that from a snapshot: it must take over with the copy it
// installed. Before, it held the partition without its state for good
// (counted in MissingCopy since), as a 32-process fleet's start showed.
func TestBehindBackupTakesOver(t *testing.T) {
	n := max(seeds(t)/40, 4)
	caught := 0
	for seed := uint64(1); seed <= uint64(n); seed++ {
		o := options(seed)
		o.Fault, o.NoFault = FaultBehindBackup, false
		r := run(t, o)
		if r.Failed() {
			t.Errorf("seed %d:\n%s", seed, r)
		}
		sched := strings.Join(r.Schedule, "\n")
		if strings.Contains(sched, "installs a copy of") && strings.Contains(sched, "caught up by a snapshot") {
			caught++
		}
		if testing.Verbose() {
			t.Logf("seed %d: %d ops, %d admitted, %d takeovers, %d missing copies\n%s", seed, r.Report.Ops, r.Report.Admitted, r.Counters.Takeovers, r.Counters.MissingCopy, sched)
		}
	}
	if caught == 0 {
		t.Errorf("no seed crashed a holder as its backup installed a copy, the backup then caught up by a snapshot")
	}
}
