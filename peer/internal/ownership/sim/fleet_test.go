package sim

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// runFleet runs one fleet replayably (etcd raft draws its election
// timeouts from crypto/rand; run seeds it) and fails t for a broken
// promise or invariant, lost state, a stalled leave, a phase that did
// not settle, or a key unavailable for longer than 2 × Liveness at a
// time (issue 54's bound).
func runFleet(t *testing.T, f FleetOptions) FleetResult {
	t.Helper()
	run(t, Options{Seed: f.Seed, Members: 1, Duration: time.Nanosecond, Clients: 1}) // seeds crypto/rand
	r := RunFleet(f)
	t.Log(r)
	if r.Failed() {
		t.Errorf("the fleet broke the promise, lost state, did not settle or left a key unavailable too long:\n%s\nschedule:\n  %s", r, strings.Join(r.Result.Schedule, "\n  "))
	}
	want := []string{"founding", "at rest", "churn 10 %", "rolling deploy"}
	if f.RestOnly {
		want = want[:2]
	}
	if len(r.Phases) != len(want) {
		t.Fatalf("phases %d, want %v", len(r.Phases), want)
	}
	for i, p := range r.Phases {
		if p.Name != want[i] {
			t.Errorf("phase %d is %q, want %q", i, p.Name, want[i])
		}
		if p.Traffic.Total[Raft].Msgs == 0 {
			t.Errorf("phase %s: no raft message counted", p.Name)
		}
	}
	// At rest the leader is one of the voters, the others relay the
	// learners' keep-alives, and a learner (if any) exchanges less than
	// they do.
	learners := r.Options.Members > r.Options.Voters
	if rt := r.Phases[1].Traffic.Rates(); rt.Voters != r.Options.Voters-1 || learners && (rt.MaxLearnerMsgs == 0 || rt.MaxLearnerMsgs >= rt.MaxMemberMsgs) {
		t.Errorf("at rest: %d voting members besides the leader, want %d; a learner's max %.1f msgs/s, want some and under the max %.1f",
			rt.Voters, r.Options.Voters-1, rt.MaxLearnerMsgs, rt.MaxMemberMsgs)
	}
	if !f.RestOnly && len(r.Phases[3].Waves) != 4 {
		t.Errorf("rolling deploy in %d waves, want 4 of 25 %%", len(r.Phases[3].Waves))
	}
	return r
}

// TestFleet is the fleet run at CI's size: 32 members through the
// founding, rest, a 10 % churn and a rolling deploy of every member in
// waves of 25 %, with nothing over the limit, no holding without its
// state and every phase settled.
func TestFleet(t *testing.T) {
	f := FleetOptions{Seed: 1, Members: 32, Rest: 3 * time.Second}
	if raceOn {
		f.Members, f.Rest = 8, time.Second // the race detector slows the simulator tenfold
	}
	runFleet(t, f)
}

// TestFleetSizes runs the fleet at the sizes RINGLIMIT_FLEET lists
// (comma-separated member counts, e.g. 256,1024): opt-in, beyond CI's
// budget. RINGLIMIT_FLEET_PHASES=rest stops each after the at-rest phase,
// and RINGLIMIT_FLEET_REST (a Go duration, 10s unless set) is that
// phase's length; RINGLIMIT_FLEET_VOTERS fixes the voters
// (ownlog.VotersFor unless set), RINGLIMIT_SIM_TIMING raft's timing
// (simTiming) and RINGLIMIT_SIM_NOQUIET=1 keeps raft's heartbeats among
// three voters (Options.NoQuiet). Each size's phases and figures are logged (go test -v).
func TestFleetSizes(t *testing.T) {
	v := os.Getenv("RINGLIMIT_FLEET")
	if v == "" {
		t.Skip("set RINGLIMIT_FLEET to member counts, e.g. 256,1024")
	}
	restOnly := false
	switch ph := os.Getenv("RINGLIMIT_FLEET_PHASES"); ph {
	case "", "all":
	case "rest":
		restOnly = true
	default:
		t.Fatalf("RINGLIMIT_FLEET_PHASES=%q: want rest or all", ph)
	}
	var rest time.Duration
	if v := os.Getenv("RINGLIMIT_FLEET_REST"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("RINGLIMIT_FLEET_REST=%q: want a positive Go duration such as 5s", v)
		}
		rest = d
	}
	beat, election := simTiming(t)
	voters := 0
	if v := os.Getenv("RINGLIMIT_FLEET_VOTERS"); v != "" {
		if n, err := strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("RINGLIMIT_FLEET_VOTERS=%q: want a voter count", v)
		} else {
			voters = n
		}
	}
	for _, s := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 2 {
			t.Fatalf("RINGLIMIT_FLEET=%q: want comma-separated member counts of at least 2", v)
		}
		t.Run("members="+strconv.Itoa(n), func(t *testing.T) {
			runFleet(t, FleetOptions{Seed: 1, Members: n, RestOnly: restOnly, Rest: rest, Voters: min(voters, n), Heartbeat: beat, Election: election, NoQuiet: os.Getenv("RINGLIMIT_SIM_NOQUIET") != "", Progress: func(phase string, virtual, wall time.Duration) {
				t.Logf("%s done at %v of virtual time, %v of wall time", phase, virtual.Round(time.Millisecond), wall.Round(time.Second))
			}})
		})
	}
}

// TestFleetUnavailableBound: a fleet run whose phase left a key
// unavailable for longer than 2 × Liveness at a time fails, and says so;
// up to the bound it does not.
func TestFleetUnavailableBound(t *testing.T) {
	for _, c := range []struct {
		unavailable time.Duration
		fails       bool
	}{{0, false}, {4 * time.Second, false}, {4*time.Second + time.Millisecond, true}} {
		r := FleetResult{Options: FleetOptions{Liveness: 2 * time.Second}, Phases: []Phase{{Name: "churn 10 %", Settle: time.Second, Unavailable: c.unavailable}}}
		if got := r.Failed(); got != c.fails {
			t.Errorf("a phase with a key unavailable %v at a 2 s Liveness: Failed() = %v, want %v", c.unavailable, got, c.fails)
		}
		if said := strings.Contains(r.String(), "OVER the bound"); said != c.fails {
			t.Errorf("a phase with a key unavailable %v: the figures say it is over the bound: %v, want %v\n%s", c.unavailable, said, c.fails, r)
		}
	}
}
