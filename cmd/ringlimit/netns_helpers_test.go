package main

// Helpers shared by the real-process network tests (TestPartitionNetns,
// TestSplitNetns): the namespaces, bridges and links of one run, serve
// processes inside them, clients that record every /v1/check exchange, and
// the window checks over what the clients saw.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"
)

// netnsPreflight skips t unless the network tests may run here: not
// -short, RINGLIMIT_NETNS=1, root, and a working `ip netns`. It returns
// the path of ip and the run's name prefix ("rl" + the test's pid).
func netnsPreflight(t *testing.T) (ip, prefix string) {
	t.Helper()
	if testing.Short() {
		t.Skip("network-partition test skipped in -short mode")
	}
	if os.Getenv("RINGLIMIT_NETNS") != "1" {
		t.Skip("network-partition test is opt-in: set RINGLIMIT_NETNS=1 (needs root and `ip netns`; a minute or two)")
	}
	if os.Geteuid() != 0 {
		t.Skip("network-partition test needs root (it creates network namespaces)")
	}
	ip, err := exec.LookPath("ip")
	if err != nil {
		t.Skip("network-partition test needs the ip command (iproute2)")
	}
	prefix = fmt.Sprintf("rl%d", os.Getpid())
	if out, err := exec.Command(ip, "netns", "add", prefix+"probe").CombinedOutput(); err != nil {
		t.Skipf("network-partition test: `ip netns add` does not work here: %v: %s", err, out)
	}
	if out, err := exec.Command(ip, "netns", "del", prefix+"probe").CombinedOutput(); err != nil {
		t.Fatalf("ip netns del %sprobe: %v: %s", prefix, err, out)
	}
	return ip, prefix
}

// netnsLogLevel is the nodes' log level: RINGLIMIT_NETNS_LOG_LEVEL, else
// info.
func netnsLogLevel() string {
	if l := os.Getenv("RINGLIMIT_NETNS_LOG_LEVEL"); l != "" {
		return l
	}
	return "info"
}

// netnsServeArgs is the serve command line of node i of tn: its gossip and
// gRPC on the bridge address, HTTP on its mgmt link, JSON logs, stdin
// held, joining join (the first node's gossip address) unless it is "".
func netnsServeArgs(tn *testNet, i int, policies, profile, join string, extra ...string) []string {
	args := []string{"serve", "--name", fmt.Sprintf("n%d", i),
		"--gossip-addr", tn.nodeAddr(i) + ":7946", "--grpc-addr", tn.nodeAddr(i) + ":8081",
		"--http-addr", tn.mgmtAddr(i) + ":8080", "--policies", policies,
		"--log-format", "json", "--log-level", netnsLogLevel(), "--gossip-profile", profile,
		"--drain-timeout", "2s", "--exit-on-stdin-eof"}
	if join != "" {
		args = append(args, "--join", join)
	}
	return append(args, extra...)
}

// startNetnsNodes starts count nodes n0..n<count-1>, one in each of tn's
// node namespaces, each joining n0.
func startNetnsNodes(t *testing.T, tn *testNet, count int, policies, profile string, extra ...string) []*serveProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	nodes := make([]*serveProc, count)
	for i := range nodes {
		join := ""
		if i > 0 {
			join = nodes[0].gossipAddr
		}
		nodes[i] = startNetnsServe(t, tn.ip, tn.ns(i), exe, fmt.Sprintf("n%d", i),
			netnsServeArgs(tn, i, policies, profile, join, extra...))
	}
	return nodes
}

// membersOf is how many members node p lists on /debug/ring.
func membersOf(p *serveProc) (int, error) {
	r, err := httpDo("GET", "http://"+p.httpAddr+"/debug/ring", "")
	if err != nil {
		return 0, err
	}
	m, _ := r.body["members"].([]any)
	return len(m), nil
}

// allSee reports whether every node lists n members.
func allSee(nodes []*serveProc, n int) bool {
	for _, p := range nodes {
		if got, err := membersOf(p); err != nil || got != n {
			return false
		}
	}
	return true
}

// allReady reports whether every node answers /readyz with 200.
func allReady(nodes []*serveProc) bool {
	for _, p := range nodes {
		if r, err := httpDo("GET", "http://"+p.httpAddr+"/readyz", ""); err != nil || r.status != http.StatusOK {
			return false
		}
	}
	return true
}

// request is one /v1/check exchange seen by a client.
type request struct {
	client, key int // node index, key index
	sent, recv  time.Time
	status      int // 0: no answer (the outcome is unknown)
	owner       string
	reason      string // the answer's reason ("" without one)
	errMsg      string // the body's error, or the transport error
	// decided is the owner's decision time from the answer (every node
	// runs on this machine's clock), zero if the answer had none.
	decided time.Time
}

func (r request) outcome() string {
	if r.status == 0 {
		return "no-answer"
	}
	return fmt.Sprint(r.status)
}

// decision reports whether the answer is a decision: admitted (200) or
// refused over the limit (429).
func (r request) decision() bool {
	return r.status == http.StatusOK || r.status == http.StatusTooManyRequests
}

// recorder collects requests from every client goroutine.
type recorder struct{ syncList[request] }

// sorted returns the requests sorted by send time.
func (rc *recorder) sorted() []request {
	out := rc.all()
	sort.Slice(out, func(i, j int) bool { return out[i].sent.Before(out[j].sent) })
	return out
}

// runClient sends body to url every `every` until ctx ends or it has sent
// maxReqs requests, recording each exchange.
func runClient(ctx context.Context, client *http.Client, node, key int, url, body string, every time.Duration, maxReqs int, rec *recorder) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for range maxReqs {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		r := request{client: node, key: key, sent: time.Now()}
		req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
		if err != nil {
			panic(err) // a constant URL and body
		}
		resp, err := client.Do(req)
		if err == nil {
			var b struct {
				Owner     string `json:"owner"`
				Reason    string `json:"reason"`
				Error     string `json:"error"`
				DecidedAt int64  `json:"decided_at_unix_ns"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&b)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			r.status, r.owner, r.reason, r.errMsg = resp.StatusCode, b.Owner, b.Reason, b.Error
			if b.DecidedAt > 0 {
				r.decided = time.Unix(0, b.DecidedAt)
			}
		} else if ctx.Err() != nil {
			return // cancelled at the end: not an observation
		} else {
			r.errMsg = err.Error()
		}
		r.recv = time.Now()
		rec.add(r)
	}
}

// maxCertainInWindow returns the largest number of admissions that were
// certainly decided inside one window (t-W, t]: the decision of each fell
// between its send and its receive time (one machine, one clock), so a
// set whose receives all come less than W after the earliest send fits in
// one window whatever the exact decision times were. adm is sorted by send
// time. It also returns the earliest send of the largest set.
func maxCertainInWindow(adm []request, w time.Duration) (int, time.Time) {
	best, at := 0, time.Time{}
	for i := range adm {
		n := 0
		for j := i; j < len(adm); j++ {
			if adm[j].recv.Sub(adm[i].sent) < w {
				n++
			}
		}
		if n > best {
			best, at = n, adm[i].sent
		}
	}
	return best, at
}

// admissionCheck is the direct check of the promise over one key's
// admissions as its clients saw them.
type admissionCheck struct {
	// Excess are the admissions that certainly broke the promise: each,
	// with at least limit others answered no later than it and all called
	// less than W before its answer, is the limit+1-th (or later) of a set
	// of admissions whose call..return intervals all lie within one span
	// shorter than W, so the owners decided them all inside one window
	// (t-W, t] whatever the exact decision times were.
	Excess []request
	// Most is the largest such set, ending at MostAt (an answer time).
	Most   int
	MostAt time.Time
}

// checkWindow sorts adm (one key's admissions, any order) by answer time
// and returns the admissions that certainly exceed limit in some window of
// w. Conservative: an admission counts towards a window only if its whole
// call..return interval lies inside it, so latency can hide a violation
// but never invent one.
func checkWindow(adm []request, limit int, w time.Duration) admissionCheck {
	byRecv := append([]request(nil), adm...)
	sort.SliceStable(byRecv, func(i, j int) bool { return byRecv[i].recv.Before(byRecv[j].recv) })
	var c admissionCheck
	for j, last := range byRecv {
		// Every admission answered no later than last and called after
		// last.recv-w: their intervals all lie in (last.recv-w, last.recv].
		n := 0
		for _, r := range byRecv[:j+1] {
			if r.sent.After(last.recv.Add(-w)) {
				n++
			}
		}
		if n > c.Most {
			c.Most, c.MostAt = n, last.recv
		}
		if n > limit {
			c.Excess = append(c.Excess, last)
		}
	}
	return c
}

// maxExactInWindow returns the largest number of admissions whose decision
// times lie in one window (t-W, t], with t the window's end; ok is false if
// some admission has no decision time.
func maxExactInWindow(adm []request, w time.Duration) (int, time.Time, bool) {
	best, at := 0, time.Time{}
	for _, e := range adm {
		if e.decided.IsZero() {
			return 0, time.Time{}, false
		}
		n := 0
		for _, r := range adm {
			if !r.decided.After(e.decided) && r.decided.After(e.decided.Add(-w)) {
				n++
			}
		}
		if n > best {
			best, at = n, e.decided
		}
	}
	return best, at, true
}

// maxPossibleInWindow returns the largest number of admissions whose
// [send, receive] interval meets one window (t-W, t]: an upper bound, which
// latency makes larger than the true count. The maximum is reached with t
// at some send time.
func maxPossibleInWindow(adm []request, w time.Duration) int {
	best := 0
	for _, e := range adm {
		t := e.sent
		n := 0
		for _, r := range adm {
			if !r.sent.After(t) && r.recv.After(t.Add(-w)) {
				n++
			}
		}
		best = max(best, n)
	}
	return best
}

// TestCheckWindow checks the direct window checker on hand-made admissions
// (it runs everywhere; the network tests that use it are opt-in).
func TestCheckWindow(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	at := func(sentMs, recvMs int) request {
		return request{sent: t0.Add(time.Duration(sentMs) * time.Millisecond), recv: t0.Add(time.Duration(recvMs) * time.Millisecond)}
	}
	const w = time.Second
	for _, tc := range []struct {
		name       string
		adm        []request
		limit      int
		wantExcess int
		wantMost   int
	}{
		{"empty", nil, 2, 0, 0},
		{"at the limit", []request{at(0, 10), at(100, 110)}, 2, 0, 2},
		{"one over", []request{at(0, 10), at(100, 110), at(200, 210)}, 2, 1, 3},
		// Answers out of call order: sorted by answer time.
		{"one over, answers reordered", []request{at(200, 210), at(0, 990), at(100, 110)}, 2, 1, 3},
		// The span from the first call to the last answer is exactly W:
		// the decisions may sit at both ends, one window apart.
		{"span exactly W is not certain", []request{at(0, 10), at(500, 510), at(990, 1000)}, 2, 0, 2},
		{"span just under W", []request{at(1, 10), at(500, 510), at(990, 1000)}, 2, 1, 3},
		// A long call could have been decided a window away from the rest.
		{"slow answer is not counted", []request{at(0, 1500), at(1200, 1210), at(1300, 1310)}, 2, 0, 2},
		// The third, the fourth, and the fifth with the third and fourth.
		{"rolling", []request{at(0, 1), at(100, 101), at(200, 201), at(300, 301), at(1150, 1151)}, 2, 3, 4},
	} {
		c := checkWindow(tc.adm, tc.limit, w)
		if len(c.Excess) != tc.wantExcess || c.Most != tc.wantMost {
			t.Errorf("%s: %d excess, most %d; want %d excess, most %d", tc.name, len(c.Excess), c.Most, tc.wantExcess, tc.wantMost)
		}
	}
}

// testNet is the namespaces, bridges and links of one test run.
type testNet struct {
	t      *testing.T
	ip     string
	prefix string
	octet  int // the bridge subnet is 10.213.octet.0/24, the mgmt one octet+1
	split  bool
}

func (n *testNet) ns(i int) string       { return fmt.Sprintf("%sn%d", n.prefix, i) }
func (n *testNet) brNS() string          { return n.prefix + "br" }
func (n *testNet) nodeAddr(i int) string { return fmt.Sprintf("10.213.%d.%d", n.octet, i+1) }
func (n *testNet) mgmtAddr(i int) string { return fmt.Sprintf("10.213.%d.%d", n.octet+1, 4*i+2) }
func (n *testNet) hostAddr(i int) string { return fmt.Sprintf("10.213.%d.%d", n.octet+1, 4*i+1) }
func (n *testNet) brPort(i int) string   { return fmt.Sprintf("v%d", i) } // in brNS

// run runs ip with args and fails the test if it fails.
func (n *testNet) run(args ...string) {
	n.t.Helper()
	if out, err := exec.Command(n.ip, args...).CombinedOutput(); err != nil {
		n.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// setLink brings node i's port on the bridge up or down.
func (n *testNet) setLink(i int, up bool) {
	n.t.Helper()
	state := "down"
	if up {
		state = "up"
	}
	n.run("-n", n.brNS(), "link", "set", "dev", n.brPort(i), state)
}

// splitOff moves the bridge ports of nodes side onto a second bridge
// ("rlbr2", made on first use): the nodes on it reach each other and no
// one else, the rest keep the first bridge. Every link stays up, so every
// node keeps its mgmt link and its clients; only peer traffic across the
// two groups is lost.
func (n *testNet) splitOff(side []int) {
	n.t.Helper()
	if !n.split {
		n.run("-n", n.brNS(), "link", "add", "name", "rlbr2", "type", "bridge")
		n.run("-n", n.brNS(), "link", "set", "dev", "rlbr2", "up")
		n.split = true
	}
	for _, i := range side {
		n.run("-n", n.brNS(), "link", "set", "dev", n.brPort(i), "master", "rlbr2")
	}
}

// rejoin puts the bridge ports of nodes side back on the first bridge.
func (n *testNet) rejoin(side []int) {
	n.t.Helper()
	for _, i := range side {
		n.run("-n", n.brNS(), "link", "set", "dev", n.brPort(i), "master", "rlbr")
	}
}

// newTestNet builds the topology for nodes nodes and registers its
// teardown. The subnet is chosen from the pid among the ones no address on
// this machine's root namespace uses yet, so parallel runs do not collide.
func newTestNet(t *testing.T, ip, prefix string, nodes int) *testNet {
	t.Helper()
	if nodes > 60 {
		t.Fatalf("newTestNet: %d nodes do not fit the mgmt /24", nodes)
	}
	n := &testNet{t: t, ip: ip, prefix: prefix, octet: -1}
	for try := range 64 {
		o := (os.Getpid()/2 + try) % 127 * 2
		out, err := exec.Command(ip, "-4", "addr", "show", "to", fmt.Sprintf("10.213.%d.0/23", o)).CombinedOutput()
		if err == nil && len(strings.TrimSpace(string(out))) == 0 {
			n.octet = o
			break
		}
	}
	if n.octet < 0 {
		t.Fatal("no free 10.213.x.0/23 subnet for the test network")
	}
	var names []string
	t.Cleanup(func() {
		// Deleting a namespace deletes the veth ends and bridges in it,
		// and with the veths their peers; the root-side mgmt ends are
		// deleted explicitly in case a namespace is still held open.
		for i := range nodes {
			_ = exec.Command(ip, "link", "del", fmt.Sprintf("%sm%d", prefix, i)).Run()
		}
		for _, ns := range names {
			if out, err := exec.Command(ip, "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("cleanup: ip netns del %s: %v: %s", ns, err, out)
			}
		}
	})
	add := func(ns string) {
		n.run("netns", "add", ns)
		names = append(names, ns)
		n.run("-n", ns, "link", "set", "dev", "lo", "up")
	}
	add(n.brNS())
	n.run("-n", n.brNS(), "link", "add", "name", "rlbr", "type", "bridge")
	n.run("-n", n.brNS(), "link", "set", "dev", "rlbr", "up")
	for i := range nodes {
		ns := n.ns(i)
		add(ns)
		// The bridge link: "eth" in the node's namespace, v<i> on the bridge.
		n.run("-n", ns, "link", "add", "name", "eth", "type", "veth", "peer", "name", n.brPort(i), "netns", n.brNS())
		n.run("-n", n.brNS(), "link", "set", "dev", n.brPort(i), "master", "rlbr", "up")
		n.run("-n", ns, "addr", "add", n.nodeAddr(i)+"/24", "dev", "eth")
		n.run("-n", ns, "link", "set", "dev", "eth", "up")
		// The mgmt link: "mgmt" in the namespace, rl<pid>m<i> in the root.
		host := fmt.Sprintf("%sm%d", prefix, i)
		n.run("link", "add", "name", host, "type", "veth", "peer", "name", "mgmt", "netns", ns)
		n.run("addr", "add", n.hostAddr(i)+"/30", "dev", host)
		n.run("link", "set", "dev", host, "up")
		n.run("-n", ns, "addr", "add", n.mgmtAddr(i)+"/30", "dev", "mgmt")
		n.run("-n", ns, "link", "set", "dev", "mgmt", "up")
	}
	return n
}

// startNetnsServe starts args (a serve command line) with exe inside
// network namespace ns and waits for its "serving" line. Like startServe,
// the process keeps its stdin open (--exit-on-stdin-eof) and is killed at
// cleanup; `ip netns exec` execs the binary, so the process is serve itself.
func startNetnsServe(t *testing.T, ip, ns, exe, name string, args []string) *serveProc {
	t.Helper()
	cmd := exec.Command(ip, append([]string{"netns", "exec", ns, exe}, args...)...)
	cmd.Env = childEnv(os.Environ())
	return launchServe(t, name, cmd)
}
