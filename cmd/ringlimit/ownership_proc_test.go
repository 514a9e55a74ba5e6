package main

// Real-process fault tests for `ringlimit serve` (issue 8): a 3-node
// cluster of child processes (the test binary re-executed, see TestMain) on
// loopback with the fast gossip profile, driven over HTTP, with the owner
// of a key killed (SIGKILL), paused (SIGSTOP/SIGCONT) or every node
// restarted in turn (SIGTERM). They check the promise of peer/partition.go
// from outside: no window (t-W, t] ever holds more than L admissions, and
// a synchronously replicated key survives its holder's crash.
//
// The tests are not parallel: with the fast gossip timings a starved CPU
// can make live members look failed, so each cluster runs alone.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/shard"
)

// procPolicies is the policy table of every process test. "probe" has a
// limit no test reaches; it finds a subject's holder without using up the
// limits under test (placement is by tenant and subject, so every policy
// of a subject has the same holder).
const procPolicies = `policies:
  - name: probe
    limit: 1000000000
    window: 1h
  - name: kill
    limit: 20
    window: 1h
  - name: killoff
    limit: 20
    window: 1h
    replication: off
  - name: pause
    limit: 20
    window: 3s
  - name: roll
    limit: 10
    window: 2s
  - name: wide
    limit: 1000000000
    window: 1h
`

// procTenant is the tenant of every key the process tests use.
const procTenant = "acme"

// procCluster starts three serve processes named prefix-a, -b and -c, the
// second and third joining through the first, with debug logs (the
// ownership steps log at Debug and Warn), and waits until every node is
// ready, sees three members and the founder's partitions have moved to
// their targets.
func procCluster(t *testing.T, prefix string) (nodes []*serveProc, pols string) {
	t.Helper()
	pols = writeFile(t, t.TempDir(), "policies.yaml", procPolicies)
	a := startServe(t, prefix+"-a", nil, "--policies", pols, "--log-level", "debug")
	b := startServe(t, prefix+"-b", nil, "--policies", pols, "--log-level", "debug", "--join", a.gossipAddr)
	c := startServe(t, prefix+"-c", nil, "--policies", pols, "--log-level", "debug", "--join", a.gossipAddr)
	nodes = []*serveProc{a, b, c}
	waitMembers(t, nodes, 3)
	waitSettled(t, nodes)
	return nodes, pols
}

// waitMembers waits until every node answers /readyz 200 with members
// members and /debug/ring lists that many.
func waitMembers(t *testing.T, nodes []*serveProc, members int) {
	t.Helper()
	waitFor(t, 20*time.Second, fmt.Sprintf("every node ready with %d members", members), func() bool {
		for _, p := range nodes {
			r, err := httpDo("GET", "http://"+p.httpAddr+"/readyz", "")
			if err != nil || r.status != http.StatusOK || r.body["members"] != float64(members) {
				return false
			}
			r, err = httpDo("GET", "http://"+p.httpAddr+"/debug/ring", "")
			if ms, _ := r.body["members"].([]any); err != nil || len(ms) != members {
				return false
			}
		}
		return true
	})
}

// waitSettled waits until 12 probe subjects get a decision, with one and
// the same owner, through every node, and every node owns one of them: the
// transfers that follow a join have (for these subjects) ended.
func waitSettled(t *testing.T, nodes []*serveProc) {
	t.Helper()
	waitFor(t, 20*time.Second, "probe subjects to have one owner through every node, every node owning some", func() bool {
		owners := map[string]bool{}
		for i := range 12 {
			var first string
			for _, p := range nodes {
				o := probeOwner(p, fmt.Sprintf("settle-%d", i))
				if o == "" || first != "" && o != first {
					return false
				}
				first = o
			}
			owners[first] = true
		}
		return len(owners) == len(nodes)
	})
}

// probeOwner returns the member that decided a probe for subject through
// p, "" if there was no decision.
func probeOwner(p *serveProc, subject string) string {
	r, err := httpDo("POST", "http://"+p.httpAddr+"/v1/check", checkBody(subject, "probe"))
	if err != nil || r.status != http.StatusOK {
		return ""
	}
	o, _ := r.body["owner"].(string)
	return o
}

func checkBody(subject, policy string) string {
	return fmt.Sprintf(`{"tenant":%q,"subject":%q,"policy":%q}`, procTenant, subject, policy)
}

// outcome is one /v1/check exchange as the client saw it.
type outcome struct {
	key        string // subject/policy
	via        string // the node asked
	send, recv time.Time
	status     int   // 0 when err != nil
	err        error // transport error
	owner      string
	remaining  int64
}

// admitted reports a 200.
func (o outcome) admitted() bool { return o.status == http.StatusOK }

// decided reports a 200 or a 429: the limiter decided.
func (o outcome) decided() bool {
	return o.status == http.StatusOK || o.status == http.StatusTooManyRequests
}

// refused reports a connection that was refused: the request never reached
// a node, so it was certainly not admitted.
func (o outcome) refused() bool { return errors.Is(o.err, syscall.ECONNREFUSED) }

// ask sends one check for subject and policy through p; safe on any
// goroutine.
func ask(p *serveProc, subject, policy string) outcome {
	o := outcome{key: subject + "/" + policy, via: p.name, send: time.Now()}
	r, err := httpDo("POST", "http://"+p.httpAddr+"/v1/check", checkBody(subject, policy))
	o.recv = time.Now()
	if err != nil {
		o.err = err
		return o
	}
	o.status = r.status
	o.owner, _ = r.body["owner"].(string)
	rem, _ := r.body["remaining"].(float64)
	o.remaining = int64(rem)
	return o
}

// windowCheck is the rolling-window check of one key's admissions.
type windowCheck struct {
	// possible is the largest number of admissions that could have been
	// decided inside one window (t-W, t]: an admission is counted if any
	// time in [send, recv] lies in the window. It over-counts, never
	// under-counts: a true window above the limit always shows here.
	possible   int
	possibleAt time.Time
	// certain is the largest number of admissions whose whole [send, recv]
	// lies inside one window: a lower bound on the true count.
	certain int
}

// checkWindows computes the rolling-window bounds over admissions of one
// key (any order). Decision times are on the deciding process's wall
// clock, which on one machine is the test's clock; an admission decided
// at d is in (t-W, t] iff d <= t < d+W, so with d in [send, recv] it may
// be in that window iff send <= t < recv+W. The count of such intervals
// is largest at some send time.
func checkWindows(adms []outcome, w time.Duration) windowCheck {
	var c windowCheck
	for _, a := range adms {
		t := a.send
		n := 0
		for _, b := range adms {
			if !b.send.After(t) && t.Before(b.recv.Add(w)) {
				n++
			}
		}
		if n > c.possible {
			c.possible, c.possibleAt = n, t
		}
		// Certain: both ends of b inside (t'-W, t'] with t' = a.recv.
		n = 0
		for _, b := range adms {
			if !b.recv.After(a.recv) && b.send.After(a.recv.Add(-w)) {
				n++
			}
		}
		c.certain = max(c.certain, n)
	}
	return c
}

// checkAllWindows runs checkWindows per key of outs' admissions and reports
// keys over limit. It fails the test on a certain violation and on a
// possible one (the possible bound is the one the promise must meet: it
// is never below the truth).
func checkAllWindows(t *testing.T, outs []outcome, limit int, w time.Duration) {
	t.Helper()
	byKey := map[string][]outcome{}
	for _, o := range outs {
		if o.admitted() {
			byKey[o.key] = append(byKey[o.key], o)
		}
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	worstPossible, worstCertain := 0, 0
	for _, k := range keys {
		c := checkWindows(byKey[k], w)
		worstPossible, worstCertain = max(worstPossible, c.possible), max(worstCertain, c.certain)
		if c.possible > limit {
			t.Errorf("key %s: %d admissions may lie in the window of %v ending at %s (at least %d certainly do), limit %d\n%s",
				k, c.possible, w, c.possibleAt.Format("15:04:05.000"), c.certain, limit, describeWindow(byKey[k], c.possibleAt, w))
		}
	}
	t.Logf("rolling windows over %d keys: at most %d admissions possibly and %d certainly in one window of %v (limit %d)",
		len(keys), worstPossible, worstCertain, w, limit)
}

// describeWindow lists the admissions that may lie in the window ending at t.
func describeWindow(adms []outcome, t time.Time, w time.Duration) string {
	var b strings.Builder
	sort.Slice(adms, func(i, j int) bool { return adms[i].send.Before(adms[j].send) })
	for _, a := range adms {
		if !a.send.After(t) && t.Before(a.recv.Add(w)) {
			fmt.Fprintf(&b, "  sent %s recv %s via %s owner %s remaining %d\n",
				a.send.Format("15:04:05.000000"), a.recv.Format("15:04:05.000000"), a.via, a.owner, a.remaining)
		}
	}
	return b.String()
}

// logLine is one JSON log record of a serve process.
type logLine struct {
	Time      time.Time `json:"time"`
	Msg       string    `json:"msg"`
	Partition *int      `json:"partition"`
	Peer      string    `json:"peer"`
	Owner     string    `json:"owner"`
	Epoch     uint64    `json:"epoch"`
}

// logLines returns p's log records whose message is msg.
func logLines(p *serveProc, msg string) []logLine {
	var out []logLine
	sc := bufio.NewScanner(strings.NewReader(p.logText()))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var l logLine
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == msg {
			out = append(out, l)
		}
	}
	return out
}

// partitionOf is the partition of subject's keys, computed as the nodes
// do: xxhash64 of the placement bytes (the encoded tenant and subject,
// without the policy: peer's placement) modulo the default partition count.
func partitionOf(t *testing.T, subject string) int {
	t.Helper()
	ek, ok := shard.Key{Tenant: procTenant, Subject: subject, Policy: "probe"}.AppendEncoded(nil)
	if !ok {
		t.Fatalf("invalid subject %q", subject)
	}
	n := 1 + int(ek[0])
	n += 1 + int(ek[n])
	snap, err := ring.New(ring.Config{}, []string{"any"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	return snap.Partition(ek[:n])
}

// subjectOwnedBy returns a subject with prefix whose owner (through every
// node) is want.
func subjectOwnedBy(t *testing.T, nodes []*serveProc, prefix, want string) string {
	t.Helper()
	for i := range 300 {
		s := fmt.Sprintf("%s-%d", prefix, i)
		if probeOwner(nodes[i%len(nodes)], s) == want {
			return s
		}
	}
	t.Fatalf("no subject %s-N owned by %s in 300 tries", prefix, want)
	return ""
}

func TestProcKillOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 3 serve processes per case and kills one: skipped with -short")
	}
	for _, tc := range []struct {
		policy string
		sync   bool
	}{{"kill", true}, {"killoff", false}} {
		t.Run(tc.policy, func(t *testing.T) {
			const limit, before = 20, 12
			nodes, _ := procCluster(t, "k"+tc.policy[len(tc.policy)-1:])
			// The victim is the holder of the subject; pick a subject held
			// by the last node so that the founder (the join address)
			// survives — it does not matter to the ownership rules, only to
			// where the logs of a failure are worth reading first.
			victim := nodes[2]
			subject := subjectOwnedBy(t, nodes, "kill", victim.name)
			admittedBefore := 0
			for i := range before {
				o := ask(nodes[i%3], subject, tc.policy)
				if !o.admitted() || o.owner != victim.name {
					t.Fatalf("admission %d of %d through %s: status %d owner %q err %v, want 200 from %s",
						i+1, before, o.via, o.status, o.owner, o.err, victim.name)
				}
				admittedBefore++
			}
			killed := time.Now()
			if err := victim.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			<-victim.exited
			survivors := nodes[:2]
			var firstDecision time.Time
			admittedAfter, unavailable, over := 0, 0, false
			newOwners := map[string]int{}
			deadline := killed.Add(20 * time.Second)
			// Retries after a 503 are paced (10 ms): a spinning client
			// would starve the survivors' gossip on a small machine.
			pace := time.NewTicker(10 * time.Millisecond)
			defer pace.Stop()
			for i := 0; !over && time.Now().Before(deadline) && i < 5000; i++ {
				o := ask(survivors[i%2], subject, tc.policy)
				switch {
				case o.err != nil:
					t.Fatalf("check through %s after the kill: %v", o.via, o.err)
				case o.status == http.StatusServiceUnavailable:
					unavailable++
					<-pace.C
					continue
				case !o.decided():
					t.Fatalf("check through %s after the kill: status %d", o.via, o.status)
				}
				if firstDecision.IsZero() {
					firstDecision = o.recv
				}
				newOwners[o.owner]++
				if o.admitted() {
					admittedAfter++
				} else {
					over = true
				}
			}
			if firstDecision.IsZero() {
				t.Fatalf("no decision through the survivors within 20s of killing %s (%d answers 503)", victim.name, unavailable)
			}
			if !over {
				t.Fatalf("the survivors admitted %d after the kill and never refused within 20s", admittedAfter)
			}
			total := admittedBefore + admittedAfter
			t.Logf("policy %s: killed holder %s after %d admissions; unavailable for %v (%d answers 503); "+
				"then %d admitted by %v; total %d of limit %d (over-admission %d)",
				tc.policy, victim.name, admittedBefore, firstDecision.Sub(killed).Round(time.Millisecond), unavailable,
				admittedAfter, newOwners, total, limit, total-limit)
			if newOwners[victim.name] > 0 {
				t.Errorf("decisions from the killed node %s after the kill: %v", victim.name, newOwners)
			}
			if tc.sync {
				if total != limit {
					t.Errorf("sync replication: %d admitted in total (%d before the kill, %d after), want exactly the limit %d",
						total, admittedBefore, admittedAfter, limit)
				}
			} else if total <= limit {
				// Replication off: the backup's copy dates from when the
				// backup was made, before the key existed, so the takeover
				// restarts the key from zero.
				t.Errorf("replication off: %d admitted in total, want more than the limit %d (the key restarts on takeover)", total, limit)
			}
		})
	}
}
