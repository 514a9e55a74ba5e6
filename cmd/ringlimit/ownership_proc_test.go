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
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
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
	// The default forward timeout: what callers of a stopped or killed
	// owner see is what these tests measure.
	args := []string{"--policies", pols, "--log-level", "debug", "--forward-timeout", "500ms"}
	a := startServe(t, prefix+"-a", nil, args...)
	b := startServe(t, prefix+"-b", nil, append(args, "--join", a.gossipAddr)...)
	c := startServe(t, prefix+"-c", nil, append(args, "--join", a.gossipAddr)...)
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
	r, err := httpDo("POST", "http://"+p.httpAddr+"/v1/check", procCheckBody(subject, "probe"))
	if err != nil || r.status != http.StatusOK {
		return ""
	}
	o, _ := r.body["owner"].(string)
	return o
}

func procCheckBody(subject, policy string) string {
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
	// pieces, when set, narrow [send, recv] to the times the decision
	// may have been made at (see pausedVia), or hold the exact decision
	// time the owner reported (exact).
	pieces []span
	exact  bool
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
func ask(p *serveProc, subject, policy string) outcome { return askOp(p, "check", subject, policy) }

// askOp is ask through /v1/<op>: "check", or "acquire" for a lease of
// a concurrency policy.
func askOp(p *serveProc, op, subject, policy string) outcome {
	o := outcome{key: subject + "/" + policy, via: p.name, send: time.Now()}
	r, err := httpDo("POST", "http://"+p.httpAddr+"/v1/"+op, procCheckBody(subject, policy))
	o.recv = time.Now()
	if err != nil {
		o.err = err
		return o
	}
	o.status = r.status
	o.owner, _ = r.body["owner"].(string)
	rem, _ := r.body["remaining"].(float64)
	o.remaining = int64(rem)
	// The owner's decision time, exact (parsed from the text: a float64
	// would round nanoseconds). All nodes run on this machine's clock.
	if m := decidedAtRE.FindStringSubmatch(r.raw); m != nil {
		if ns, err := strconv.ParseInt(m[1], 10, 64); err == nil && ns > 0 {
			at := time.Unix(0, ns)
			o.pieces = []span{{at, at}}
			o.exact = true
		}
	}
	return o
}

var decidedAtRE = regexp.MustCompile(`"decided_at_unix_ns":\s*(\d+)`)

// span is a closed time interval [from, to].
type span struct{ from, to time.Time }

// when returns the times at which o may have been decided: [send, recv],
// or the pieces set by pausedVia.
func (o outcome) when() []span {
	if o.pieces != nil {
		return o.pieces
	}
	return []span{{o.send, o.recv}}
}

// pausedVia narrows the decision times of requests sent through a node
// that was stopped from stopAt to contAt: such a node runs no code while
// stopped, so a request sent to it during the stop was decided after
// contAt, and one sent before the stop and answered after it was decided
// either before stopAt plus slack (the node had already passed it on: the
// owner decides it as soon as it is scheduled) or after contAt.
func pausedVia(outs []outcome, node string, stopAt, contAt time.Time, slack time.Duration) {
	for i := range outs {
		o := &outs[i]
		if o.via != node || !o.recv.After(contAt) || o.exact {
			continue
		}
		switch {
		case !o.send.Before(stopAt):
			o.pieces = []span{{maxTime(o.send, contAt), o.recv}}
		case o.send.Before(stopAt) && stopAt.Add(slack).Before(contAt):
			o.pieces = []span{{o.send, stopAt.Add(slack)}, {contAt, o.recv}}
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// windowCheck is the rolling-window check of one key's admissions.
type windowCheck struct {
	// possible is the largest number of admissions that could have been
	// decided inside one window (t-W, t]: an admission is counted if any
	// time it may have been decided at (outcome.when) lies in the window.
	// It over-counts, never under-counts: a true window above the limit
	// always shows here.
	possible   int
	possibleAt time.Time
	// certain is the largest number of admissions whose every possible
	// decision time lies inside one window: a lower bound on the true
	// count.
	certain int
}

// checkWindows computes the rolling-window bounds over admissions of one
// key (any order). Decision times are on the deciding process's wall
// clock, which on one machine is the test's clock; an admission decided
// at d is in (t-W, t] iff d <= t < d+W, so with d in [a, b] it may be in
// that window iff a <= t < b+W. The count of such admissions is largest
// at the start of some interval.
func checkWindows(adms []outcome, w time.Duration) windowCheck {
	var c windowCheck
	mayBeIn := func(b outcome, t time.Time) bool {
		for _, sp := range b.when() {
			if !sp.from.After(t) && t.Before(sp.to.Add(w)) {
				return true
			}
		}
		return false
	}
	for _, a := range adms {
		for _, sp := range a.when() {
			n := 0
			for _, b := range adms {
				if mayBeIn(b, sp.from) {
					n++
				}
			}
			if n > c.possible {
				c.possible, c.possibleAt = n, sp.from
			}
		}
		// Certain: every possible time of b inside (t-W, t] with t the
		// latest possible time of a.
		ws := a.when()
		t := ws[len(ws)-1].to
		n := 0
		for _, b := range adms {
			bs := b.when()
			if !bs[len(bs)-1].to.After(t) && bs[0].from.After(t.Add(-w)) {
				n++
			}
		}
		c.certain = max(c.certain, n)
	}
	return c
}

// checkAllWindows runs checkWindows per key of outs' admissions. It fails
// the test when a window certainly holds more than limit admissions, or
// possibly holds more than limit+1.
//
// Why not "possibly more than limit": the responses carry no decision
// time, and a limiter at its limit admits the next request the moment the
// oldest admission leaves the window, so the two are exactly W apart and
// their [send, recv] intervals (a few ms each) straddle every window edge.
// The possible bound then reports limit+1 at nearly every edge of a
// saturated key (observed on every run) even with a correct limiter. A
// stale holder or a reset key admits a burst, which shows as more than
// limit certainly; a single extra admission within a round trip of a
// window edge is the one case these tests cannot tell from a correct run.
// Windows possibly at limit+1 are counted in the log.
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
	worstPossible, worstCertain, edgeKeys := 0, 0, 0
	for _, k := range keys {
		c := checkWindows(byKey[k], w)
		worstPossible, worstCertain = max(worstPossible, c.possible), max(worstCertain, c.certain)
		if c.possible > limit {
			edgeKeys++
		}
		if c.certain > limit || c.possible > limit+1 || exactAll(byKey[k]) && c.possible > limit {
			t.Errorf("key %s: %d admissions certainly and %d possibly in the window of %v ending at %s, limit %d\n%s",
				k, c.certain, c.possible, w, c.possibleAt.Format("15:04:05.000"), limit, describeWindow(byKey[k], c.possibleAt, w))
		}
	}
	t.Logf("rolling windows over %d keys: at most %d admissions certainly and %d possibly in one window of %v (limit %d); "+
		"%d keys possibly at limit+1 within a round trip of a window edge",
		len(keys), worstCertain, worstPossible, w, limit, edgeKeys)
}

// exactAll reports whether every admission carries its exact decision
// time: then the window check is exact and allows no slack.
func exactAll(adms []outcome) bool {
	for _, a := range adms {
		if !a.exact {
			return false
		}
	}
	return true
}

// describeWindow lists the admissions that may lie in the window ending at t.
func describeWindow(adms []outcome, t time.Time, w time.Duration) string {
	var b strings.Builder
	sort.Slice(adms, func(i, j int) bool { return adms[i].send.Before(adms[j].send) })
	for _, a := range adms {
		for _, sp := range a.when() {
			if !sp.from.After(t) && t.Before(sp.to.Add(w)) {
				fmt.Fprintf(&b, "  sent %s recv %s (decided in %s..%s) via %s owner %s remaining %d\n",
					a.send.Format("15:04:05.000000"), a.recv.Format("15:04:05.000000"),
					sp.from.Format("15:04:05.000"), sp.to.Format("15:04:05.000"), a.via, a.owner, a.remaining)
				break
			}
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
// without the policy: peer's placement) modulo the partition count of
// startServe's processes (testPartitions).
func partitionOf(t *testing.T, subject string) int {
	t.Helper()
	ek, ok := shard.Key{Tenant: procTenant, Subject: subject, Policy: "probe"}.AppendEncoded(nil)
	if !ok {
		t.Fatalf("invalid subject %q", subject)
	}
	n := 1 + int(ek[0])
	n += 1 + int(ek[n])
	snap, err := ring.New(ring.Config{PartitionCount: testPartitions}, []string{"any"}, 1)
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

// syncList collects values added from many goroutines.
type syncList[T any] struct {
	mu    sync.Mutex
	items []T
}

func (l *syncList[T]) add(v T) {
	l.mu.Lock()
	l.items = append(l.items, v)
	l.mu.Unlock()
}

// all returns a copy of the values, in the order they were added.
func (l *syncList[T]) all() []T {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]T(nil), l.items...)
}

// loadLog collects outcomes from many goroutines.
type loadLog struct{ syncList[outcome] }

// client sends checks through p every interval, cycling through subjects,
// until stop is closed or it has sent max requests.
func (l *loadLog) client(wg *sync.WaitGroup, stop <-chan struct{}, p func() *serveProc, subjects []string, policy string, interval time.Duration, max, offset int) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := 0; i < max; i++ {
			l.add(ask(p(), subjects[(i+offset)%len(subjects)], policy))
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
}

// TestProcPauseOwner stops the holder of some keys with SIGSTOP for longer
// than failure detection plus a lease, under traffic through every node
// (requests to the stopped node queue in its listen backlog), then resumes
// it. No window may hold more than L admissions, and the resumed node must
// not decide for a partition that was taken over while it was stopped
// unless the partition was transferred back to it first.
func TestProcPauseOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 3 serve processes and pauses one for 7s: skipped with -short")
	}
	const (
		limit  = 20
		window = 3 * time.Second
		paused = 7 * time.Second
	)
	nodes, _ := procCluster(t, "p")
	victim := nodes[2]
	var victimSubjects, otherSubjects []string
	for i := 0; i < 300 && (len(victimSubjects) < 4 || len(otherSubjects) < 2); i++ {
		s := fmt.Sprintf("pause-%d", i)
		switch o := probeOwner(nodes[i%3], s); {
		case o == victim.name && len(victimSubjects) < 4:
			victimSubjects = append(victimSubjects, s)
		case o != "" && o != victim.name && len(otherSubjects) < 2:
			otherSubjects = append(otherSubjects, s)
		}
	}
	if len(victimSubjects) < 4 || len(otherSubjects) < 2 {
		t.Fatalf("found subjects %v held by %s and %v held by others in 300 tries, want 4 and 2", victimSubjects, victim.name, otherSubjects)
	}
	subjects := append(append([]string(nil), victimSubjects...), otherSubjects...)

	var load loadLog
	var wg sync.WaitGroup
	stop := make(chan struct{})
	// Two paced clients per node, about 100 requests/s in all: enough to
	// keep every key at its limit, little enough for 2 cores.
	for i, p := range nodes {
		for j := range 2 {
			load.client(&wg, stop, func() *serveProc { return p }, subjects, "pause", 60*time.Millisecond, 1000, 3*i+j)
		}
	}
	// One window of traffic before the fault, so every key is at its limit.
	<-time.After(window)
	if err := victim.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopAt := time.Now()
	// While the victim is stopped, requests pile up in its listen backlog:
	// one every 100 ms, each on its own goroutine (at most 70).
	queued := time.NewTicker(100 * time.Millisecond)
	holdUntil := time.NewTimer(paused) // the fault itself: the pause lasts this long
	for hold := true; hold; {
		select {
		case <-queued.C:
			wg.Add(1)
			go func(s string) {
				defer wg.Done()
				load.add(ask(victim, s, "pause"))
			}(subjects[len(load.all())%len(subjects)])
		case <-holdUntil.C:
			hold = false
		}
	}
	queued.Stop()
	if err := victim.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	contAt := time.Now()
	<-time.After(4 * time.Second) // traffic after the resume
	close(stop)
	wg.Wait()
	outs := load.all()

	status := map[string]int{}
	for _, o := range outs {
		k := fmt.Sprint(o.status)
		if o.err != nil {
			k = "error"
		}
		status[k]++
	}
	t.Logf("%d requests: %v; paused %s from %s to %s", len(outs), status, victim.name,
		stopAt.Format("15:04:05.000"), contAt.Format("15:04:05.000"))
	// The stopped node ran no code for the pause; a request it had already
	// passed on was decided by its owner within a second (a generous bound
	// on one scheduling delay on a loaded machine).
	pausedVia(outs, victim.name, stopAt, contAt, time.Second)
	checkAllWindows(t, outs, limit, window)

	// Unavailability: from the stop to the first decision for each of the
	// victim's keys through another node.
	var worst time.Duration
	for _, s := range victimSubjects {
		first := time.Time{}
		for _, o := range outs {
			if o.key == s+"/pause" && o.via != victim.name && o.decided() && o.send.After(stopAt) && (first.IsZero() || o.recv.Before(first)) {
				first = o.recv
			}
		}
		if first.IsZero() || first.After(contAt) {
			t.Errorf("no decision for %s through the other nodes while %s was stopped (%v)", s, victim.name, paused)
			continue
		}
		worst = max(worst, first.Sub(stopAt))
	}
	t.Logf("unavailability of the stopped holder's keys: at most %v after SIGSTOP", worst.Round(time.Millisecond))

	// Partitions taken over from the victim while it was stopped, and
	// when (if ever) each came back to it by a transfer.
	takenOver := map[int]time.Time{}
	back := map[int]time.Time{}
	for _, p := range nodes {
		for _, l := range logLines(p, "partition taken over from failed holder") {
			if l.Partition != nil && l.Peer == victim.name {
				takenOver[*l.Partition] = l.Time
			}
		}
		for _, l := range logLines(p, "partition transferred") {
			if l.Partition != nil && l.Peer == victim.name && l.Time.After(contAt) {
				if b, ok := back[*l.Partition]; !ok || l.Time.Before(b) {
					back[*l.Partition] = l.Time
				}
			}
		}
	}
	lost := len(logLines(victim, "partition lost to a newer holder"))
	t.Logf("%d partitions taken over from %s, %d transferred back after SIGCONT; %s logged %d \"partition lost to a newer holder\"",
		len(takenOver), victim.name, len(back), victim.name, lost)
	for _, s := range victimSubjects {
		pid := partitionOf(t, s)
		if _, ok := takenOver[pid]; !ok {
			t.Errorf("subject %s (partition %d) was held by %s, but no node logged taking its partition over", s, pid, victim.name)
			continue
		}
		// A decision by the victim between the takeover and the partition
		// coming back to it would be a second decision point. When the
		// answer carries the owner's decision time, that decides (a request
		// sent as SIGSTOP was being delivered may still be decided, before
		// the takeover); otherwise any decision sent after the stop counts.
		// The sender logs the transfer back right after the victim accepted
		// it, so a decision may return a moment before that line: 100 ms of
		// slack.
		for _, o := range outs {
			if o.key != s+"/pause" || !o.decided() || o.owner != victim.name || !o.send.After(stopAt) {
				continue
			}
			if o.exact && o.pieces[0].from.Before(takenOver[pid]) {
				continue // decided while it still held the partition's lease
			}
			if b, ok := back[pid]; !ok || o.recv.Add(100*time.Millisecond).Before(b) {
				t.Errorf("%s decided %s (status %d, sent %s, received %s via %s) after it was stopped, on partition %d "+
					"that was taken over at %s and not transferred back before (transferred back: %v)",
					victim.name, s, o.status, o.send.Format("15:04:05.000"), o.recv.Format("15:04:05.000"), o.via,
					pid, takenOver[pid].Format("15:04:05.000"), ok)
			}
		}
	}
}

// TestProcRollingRestart restarts every node in turn (SIGTERM, wait for the
// exit, start again with the same name and ports, joining the other two)
// under load on 30 keys. No window may go over its limit, and a key with a
// limit no one reaches must not reset: the remaining count the cluster
// reports at the end is the limit minus what the client saw admitted, give
// or take the answers whose outcome the client cannot know.
func TestProcRollingRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 3 serve processes and restarts each: skipped with -short")
	}
	const (
		limit  = 10
		window = 2 * time.Second
		wide   = 1_000_000_000
	)
	nodes, pols := procCluster(t, "r")
	var mu sync.Mutex // guards nodes while a node is replaced
	nodeAt := func(i int) func() *serveProc {
		return func() *serveProc {
			mu.Lock()
			defer mu.Unlock()
			return nodes[i]
		}
	}
	subjects := make([]string, 30)
	for i := range subjects {
		subjects[i] = fmt.Sprintf("roll-%d", i)
	}
	var load, wideLoad loadLog
	var wg sync.WaitGroup
	stop := make(chan struct{})
	// About 240 requests/s on the 30 keys: enough to hold most of them at
	// their limit of 5/s.
	for i := range nodes {
		for j := range 2 {
			load.client(&wg, stop, nodeAt(i), subjects, "roll", 25*time.Millisecond, 1500, 5*i+j)
		}
		wideLoad.client(&wg, stop, nodeAt(i), []string{"wide"}, "wide", 50*time.Millisecond, 1000, 0)
	}
	started := time.Now()
	for i, old := range nodes {
		var join []string
		for j, p := range nodes {
			if j != i {
				join = append(join, p.gossipAddr)
			}
		}
		t0 := time.Now()
		if code := old.terminate(t); code != 0 {
			t.Fatalf("%s exited %d after SIGTERM, want 0\n%s", old.name, code, old.logText())
		}
		if os.Getenv("RL_DUMP") != "" {
			t.Logf("LOG %s:\n%s", old.name, old.logText())
		}
		drained := time.Since(t0)
		p := startServe(t, old.name, nil, []string{"--policies", pols, "--log-level", "debug", "--forward-timeout", "500ms",
			"--gossip-addr", old.gossipAddr, "--grpc-addr", old.grpcAddr, "--http-addr", old.httpAddr,
			"--join", strings.Join(join, ",")}...)
		mu.Lock()
		nodes[i] = p
		mu.Unlock()
		waitMembers(t, nodes, 3)
		// Ready means holding partitions again, not only gossiping: the
		// next node goes down once the transfers to this one are done.
		waitSettled(t, nodes)
		t.Logf("restarted %s: drained in %v, back with 3 members after %v", old.name,
			drained.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
	}
	close(stop)
	wg.Wait()
	t.Logf("three restarts in %v", time.Since(started).Round(time.Millisecond))

	outs := load.all()
	status := map[string]int{}
	for _, o := range outs {
		k := fmt.Sprint(o.status)
		switch {
		case o.refused():
			k = "refused"
		case o.err != nil:
			k = "error"
		}
		status[k]++
	}
	t.Logf("%d requests on %d keys: %v", len(outs), len(subjects), status)
	checkAllWindows(t, outs, limit, window)

	// The wide key: every 200 was admitted; a 503 or a transport error
	// after the request was sent may or may not have been; a refused
	// connection was not.
	admitted, unknown := 0, 0
	wideStatus := map[string]int{}
	for _, o := range wideLoad.all() {
		switch {
		case o.admitted():
			admitted++
		case o.refused():
		case o.err != nil || o.status == http.StatusServiceUnavailable:
			unknown++
		case o.status != 0:
			t.Errorf("wide key: status %d through %s", o.status, o.via)
		}
		k := fmt.Sprint(o.status)
		if o.err != nil {
			k = "error"
		}
		wideStatus[k]++
	}
	var last outcome
	waitFor(t, 10*time.Second, "a decision for the wide key", func() bool {
		last = ask(nodes[0], "wide", "wide")
		if last.err != nil || last.status == http.StatusServiceUnavailable {
			unknown++
			return false
		}
		return true
	})
	if !last.admitted() {
		t.Fatalf("final check of the wide key: status %d", last.status)
	}
	admitted++
	want := int64(wide - admitted)
	t.Logf("wide key: %v; %d admitted, %d unknown; the cluster reports %d remaining, want %d..%d",
		wideStatus, admitted, unknown, last.remaining, want-int64(unknown), want)
	if last.remaining > want || last.remaining < want-int64(unknown) {
		t.Errorf("wide key reset or double-counted: %d remaining after %d admissions (%d unknown), want %d..%d",
			last.remaining, admitted, unknown, want-int64(unknown), want)
	}
}
