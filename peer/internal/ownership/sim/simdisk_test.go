package sim

import (
	"strings"
	"testing"
	"testing/cryptotest"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/history"
)

// TestWholeRestartFromDisk: every member crashes at once under load and
// restarts from its data directory (FaultWholeRestart), every key sync
// and on disk. The log resumes (the old voters are the only ones it has)
// and every partition vacant for an old incarnation goes to its heir,
// which restores the state its directory holds (30 s windows: what was
// admitted before the crash still counts after it). No window may go over
// the limit, no acknowledged admission may be missing from a new
// decider's state (restarted or not), and every oracle must pass.
func TestWholeRestartFromDisk(t *testing.T) {
	n := max(seeds(t)/40, 4)
	for seed := uint64(1); seed <= uint64(n); seed++ {
		o := options(seed)
		o.Fault, o.NoFault, o.Modes = FaultWholeRestart, false, nil
		// A window longer than the restart takes: what the old
		// incarnations admitted still counts when their heirs decide.
		o.Window, o.Limit = 30*time.Second, 20
		o.defaults()
		cryptotest.SetGlobalRandom(t, o.Seed)
		s := newSim(o)
		s.run()
		s.removeDisks()
		bad, _ := s.checkOracles()
		lost := 0
		for _, l := range s.losses {
			if l.a.acked {
				lost++
			}
		}
		w := time.Duration(float64(o.Window) / (1 + o.RateBound))
		rep := history.Check(s.ops, func(k string) history.Limits { return history.Limits{Limit: o.Limit, Window: w} }, 3*time.Second)
		heirs, restored := len(s.disk.heirs), 0
		for _, line := range s.schedule {
			if strings.Contains(line, " restores p") {
				restored++
			}
		}
		if len(bad) > 0 || lost > 0 || len(rep.Violations) > 0 || heirs == 0 || restored == 0 {
			t.Errorf("seed %d: %d acknowledged admissions lost, oracles %v, windows %v, %d heirs, %d partitions restored\n%v", seed, lost, bad, rep.Violations, heirs, restored, s.schedule)
		} else if testing.Verbose() {
			t.Logf("seed %d: %d ops (%d admitted), %d heirs, %d partitions restored from disk, 0 lost", seed, rep.Ops, rep.Admitted, heirs, restored)
		}
	}
}

// TestRestoredBackup: the first key's holder is started again from an
// old backup of its data directory, its raft files removed (as a restore
// must). It joins the log as a new raft member and the heir of its old
// incarnation. Its partitions go to their backups, whose replicas are
// complete (every key sync): nothing is lost and no window goes over the
// limit; a partition that had no backup at the crash would come back from
// the older state, as a counted restart, and only then may a window go
// over. Every oracle must pass.
func TestRestoredBackup(t *testing.T) {
	n := max(seeds(t)/40, 4)
	for seed := uint64(1); seed <= uint64(n); seed++ {
		o := options(seed)
		o.Fault, o.NoFault, o.Modes = FaultRestoredBackup, false, nil
		o.Window, o.Limit = 30*time.Second, 20
		r := run(t, o)
		if len(r.Oracle) > 0 || r.Counters.MissingCopy > 0 || r.Misstood > 0 || len(r.Report.Violations) > 0 && r.Lost == 0 {
			t.Errorf("seed %d:\n%s", seed, r)
		} else if testing.Verbose() {
			t.Logf("seed %d: %d ops, %d admitted, %d takeovers, %d counted restarts, windows over the limit: %d", seed, r.Report.Ops, r.Report.Admitted, r.Counters.Takeovers, r.Lost, len(r.Report.Violations))
		}
		if !strings.Contains(strings.Join(r.Schedule, "\n"), "from the backup of its data directory") {
			t.Errorf("seed %d: the member was not restarted from its backup:\n%s", seed, r)
		}
	}
}
