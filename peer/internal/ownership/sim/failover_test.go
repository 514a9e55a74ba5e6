package sim

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestFailoverTimes measures how long a crash makes keys unavailable (one
// key's longest stretch of unavailable or unknown answers, Result.
// Unavailable): a holder's crash (FaultCrash, the first key's holder when
// it does not lead the log) and the log's leader's (FaultLeaderCrash), over
// RINGLIMIT_SIM_FAILOVER seeds each: opt-in, beyond CI's budget. It fails
// on any broken promise, and logs each kind's least, median, 90th
// percentile and most.
func TestFailoverTimes(t *testing.T) {
	v := os.Getenv("RINGLIMIT_SIM_FAILOVER")
	if v == "" {
		t.Skip("set RINGLIMIT_SIM_FAILOVER to a seed count, e.g. 40")
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("RINGLIMIT_SIM_FAILOVER=%q: want a positive seed count", v)
	}
	for _, f := range []Fault{FaultCrash, FaultLeaderCrash} {
		var gaps []time.Duration
		for seed := uint64(1); seed <= uint64(n); seed++ {
			o := options(seed)
			o.Fault, o.NoFault = f, false
			r := run(t, o)
			if r.Failed() || r.Lost > 0 {
				t.Errorf("seed %d:\n%s", seed, r)
			}
			sched := strings.Join(r.Schedule, "\n")
			if f == FaultCrash && strings.Contains(sched, "(it leads the log)") || f == FaultLeaderCrash && !strings.Contains(sched, ", the leader") {
				continue // the holder led the log, or no leader to crash
			}
			gaps = append(gaps, r.Unavailable)
		}
		if len(gaps) == 0 {
			t.Errorf("%s: no run measured", f)
			continue
		}
		slices.Sort(gaps)
		t.Logf("%s: %d runs, a key unavailable for at least %v, median %v, 90th percentile %v, at most %v", f, len(gaps),
			gaps[0].Round(time.Millisecond), gaps[len(gaps)/2].Round(time.Millisecond), gaps[len(gaps)*9/10].Round(time.Millisecond), gaps[len(gaps)-1].Round(time.Millisecond))
	}
}
