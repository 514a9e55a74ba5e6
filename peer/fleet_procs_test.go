package peer

// A rolling deploy of a fleet of real `ringlimit serve` processes (issue 54
// §6), opt-in: RINGLIMIT_FLEET_PROCS=32 (24 to 32; 1 means 32). The test
// builds cmd/ringlimit, starts that many processes on 127.0.0.1 (distinct
// ports, --expected-members set to the fleet size, the default
// lan gossip profile and LeaseDuration), puts paced load on every node,
// then restarts every process in waves of a quarter of the fleet, as an
// orchestrator with a readiness probe does: take the wave out of the
// clients' rotation, SIGTERM (a graceful leave: keys handed to their new
// holders), wait for the exit, start it again on the same addresses as a
// new incarnation, put each back in rotation once /readyz says ready, and
// start the next wave only when every node is ready with the whole fleet.
// It reports the history checker's verdict (peer/internal/history: both
// rules, every key; must be 0 violations), the answers by outcome, the
// longest a key went without a decision, each restart's drain time and
// time to ready, the same per wave, and whether a key with a limit no one
// reaches lost an admission (a reset or a lost copy shows as a remaining
// count above what the client saw admitted). When a key went without a
// decision, the worst one's timeline is printed beside the processes'
// events. RINGLIMIT_FLEET_PROCS_LOGS=dir keeps every process's log and
// every check, and watches who leads and votes in the ownership log and
// whose liveness lapsed; RINGLIMIT_FLEET_PROCS_LOG_LEVEL=debug has the
// processes name every partition they hand on.
//
// It is here, in peer's tests, and not beside serve's own process tests,
// because the checker is internal to peer; it builds the binary like any
// user would and talks to it over HTTP only.

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/history"
)

// fleetProcsEnv opts in to TestFleetProcsRollingDeploy and sets the fleet
// size.
const fleetProcsEnv = "RINGLIMIT_FLEET_PROCS"

// fleetProcsLogsEnv names a directory to keep every process's log in
// (NAME.log) and every check the clients made (ops.jsonl); fleetProcsLogLevelEnv
// sets the processes' --log-level (debug names each partition that moves).
const (
	fleetProcsLogsEnv     = "RINGLIMIT_FLEET_PROCS_LOGS"
	fleetProcsLogLevelEnv = "RINGLIMIT_FLEET_PROCS_LOG_LEVEL"
	// fleetProcsWavesEnv=index restarts the nodes in waves by index (a
	// quarter each, whoever votes) instead of fleetWaveOf's.
	fleetProcsWavesEnv = "RINGLIMIT_FLEET_PROCS_WAVES"
)

const fleetPolicies = `policies:
  - name: roll
    limit: 10
    window: 2s
  - name: wide
    limit: 1000000000
    window: 1h
`

// fleetProc is one serve process of the fleet.
type fleetProc struct {
	name               string
	http, grpc, gossip string
	cmd                *exec.Cmd
	stdin              io.WriteCloser
	exited             chan struct{}
	mu                 sync.Mutex
	log                bytes.Buffer // the last lines, trimmed to fleetLogKeep
	started, readyAt   time.Time
	exitedAt           time.Time // set before exited closes
	// inRotation: the test's clients send it checks (a load balancer's
	// endpoint): from when it was first seen ready until its SIGTERM.
	inRotation atomic.Bool
}

const fleetLogKeep = 64 << 10

func (p *fleetProc) logTail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// fleetRun is what every process of one fleet shares.
type fleetRun struct {
	bin, policies string
	members       int
	// logDir, when set (fleetProcsLogsEnv), receives each process's whole
	// stderr in NAME.log, a restart's appended to its predecessor's;
	// logLevel is serve's --log-level (fleetProcsLogLevelEnv, default
	// info).
	logDir, logLevel string
	procs            *fleetProcs
}

// fleetProcs is every process the test started, killed together when the
// test ends: the verdicts are in by then, and 32 graceful leaves one after
// another would take a minute.
type fleetProcs struct {
	mu    sync.Mutex
	procs []*fleetProc
}

func newFleetProcs(t *testing.T) *fleetProcs {
	f := &fleetProcs{}
	t.Cleanup(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, p := range f.procs {
			_ = p.stdin.Close()
			_ = p.cmd.Process.Kill() // an error: it has exited
		}
		for _, p := range f.procs {
			<-p.exited
		}
	})
	return f
}

func (f *fleetProcs) add(p *fleetProc) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.procs = append(f.procs, p)
}

// startFleetProc starts `bin serve` as name on the given addresses (port 0
// for new ones), joining join unless empty, and waits for its "serving"
// line. The process is killed when t ends (r.procs) and, on Linux, is killed if the test
// process dies first (fleetSysProcAttr), so that an interrupted run leaves
// no process holding its ports.
func startFleetProc(t *testing.T, r fleetRun, name string, addrs [3]string, join []string) *fleetProc {
	t.Helper()
	args := []string{"serve", "--name", name,
		"--http-addr", addrs[0], "--grpc-addr", addrs[1], "--gossip-addr", addrs[2],
		"--policies", r.policies, "--log-format", "json", "--exit-on-stdin-eof",
		"--expected-members", strconv.Itoa(r.members), "--drain-timeout", "20s",
		"--log-level", cmp.Or(r.logLevel, "info")}
	if len(join) > 0 {
		args = append(args, "--join", strings.Join(join, ","))
	}
	p := &fleetProc{name: name, cmd: exec.Command(r.bin, args...), exited: make(chan struct{})}
	p.cmd.Env = os.Environ()
	p.cmd.SysProcAttr = fleetSysProcAttr()
	var logFile *os.File
	if r.logDir != "" {
		var err error
		if logFile, err = os.OpenFile(filepath.Join(r.logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		if logFile != nil {
			_ = logFile.Close()
		}
		t.Fatalf("start %s: %v", name, err)
	}
	serving := make(chan [3]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			if p.log.Len() > fleetLogKeep {
				rest := slices.Clone(p.log.Bytes()[p.log.Len()-fleetLogKeep/2:])
				p.log.Reset()
				p.log.Write(rest)
			}
			p.log.Write(sc.Bytes())
			p.log.WriteByte('\n')
			p.mu.Unlock()
			if logFile != nil {
				_, _ = logFile.Write(append(sc.Bytes(), '\n'))
			}
			var rec struct {
				Msg      string `json:"msg"`
				HTTPAddr string `json:"http_addr"`
				GRPCAddr string `json:"grpc_addr"`
				Gossip   string `json:"gossip_addr"`
			}
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "serving" {
				select {
				case serving <- [3]string{rec.HTTPAddr, rec.GRPCAddr, rec.Gossip}:
				default:
				}
			}
		}
		_ = p.cmd.Wait()
		if logFile != nil {
			_ = logFile.Close()
		}
		p.exitedAt = time.Now()
		close(p.exited)
	}()
	r.procs.add(p)
	timeout := time.NewTimer(60 * time.Second)
	defer timeout.Stop()
	select {
	case a := <-serving:
		p.http, p.grpc, p.gossip = a[0], a[1], a[2]
	case <-p.exited:
		t.Fatalf("%s exited before serving (%v):\n%s", name, p.cmd.ProcessState, p.logTail())
	case <-timeout.C:
		t.Fatalf("%s did not log \"serving\" within 60 s:\n%s", name, p.logTail())
	}
	return p
}

// fleetHTTP is the test's HTTP client: keep-alive connections to every
// node, closed when the test ends (no goroutine outlives it).
type fleetHTTP struct{ c *http.Client }

func newFleetHTTP(t *testing.T) fleetHTTP {
	tr := &http.Transport{MaxIdleConnsPerHost: 8, IdleConnTimeout: 5 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return fleetHTTP{c: &http.Client{Transport: tr, Timeout: 5 * time.Second}}
}

// ready reports whether p answers /readyz 200 with members members.
func (h fleetHTTP) ready(p *fleetProc, members int) bool {
	resp, err := h.c.Get("http://" + p.http + "/readyz")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var body struct {
		Members int `json:"members"`
	}
	return resp.StatusCode == http.StatusOK && json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&body) == nil && body.Members == members
}

// readyBody is p's /readyz answer, or the error that stood in its way.
func (h fleetHTTP) readyBody(p *fleetProc) string {
	resp, err := h.c.Get("http://" + p.http + "/readyz")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return err.Error()
	}
	return strings.TrimSpace(string(b))
}

// fleetAnswer is one /v1/check as the client saw it.
type fleetAnswer struct {
	status    int
	err       error
	remaining int64
	reason    string
	owner     string
}

func (h fleetHTTP) check(p *fleetProc, subject, policy string) fleetAnswer {
	body := fmt.Sprintf(`{"tenant":"fleet","subject":%q,"policy":%q}`, subject, policy)
	resp, err := h.c.Post("http://"+p.http+"/v1/check", "application/json", strings.NewReader(body))
	if err != nil {
		return fleetAnswer{err: err}
	}
	defer resp.Body.Close()
	var b struct {
		Remaining int64  `json:"remaining"`
		Reason    string `json:"reason"`
		Owner     string `json:"owner"`
	}
	a := fleetAnswer{status: resp.StatusCode}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&b); err != nil {
		a.err = fmt.Errorf("status %d, unreadable body: %w", resp.StatusCode, err)
		return a
	}
	a.remaining, a.reason, a.owner = b.Remaining, b.Reason, b.Owner
	return a
}

// fleetWaitReady waits until every node of nodes is ready with len(nodes)
// members, polling every 50 ms, and notes for each when it first was.
func fleetWaitReady(t *testing.T, h fleetHTTP, nodes []*fleetProc, d time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		waiting := 0
		for _, p := range nodes {
			if !p.readyAt.IsZero() {
				continue
			}
			if h.ready(p, len(nodes)) {
				p.readyAt = time.Now()
				p.inRotation.Store(true)
			} else {
				waiting++
			}
		}
		if waiting == 0 {
			// Each was ready once; all must be at the same time now.
			all := true
			for _, p := range nodes {
				if !h.ready(p, len(nodes)) {
					p.readyAt, all = time.Time{}, false
				}
			}
			if all {
				return
			}
		}
		if time.Now().After(deadline) {
			var not []string
			var first *fleetProc
			for _, p := range nodes {
				if !h.ready(p, len(nodes)) {
					not = append(not, p.name+": "+h.readyBody(p))
					first = cmp.Or(first, p)
				}
			}
			if first == nil {
				return // ready at the last look
			}
			t.Fatalf("%s: %d nodes not ready with %d members within %v:\n%s\nlast log lines of %s:\n%s",
				what, len(not), len(nodes), d, strings.Join(not, "\n"), first.name, lastLines(first.logTail(), 30))
		}
		<-tick.C
	}
}

// lowPorts hands out loopback ports below the kernel's ephemeral range, so
// that a port a process held before its restart cannot meanwhile become
// the source port of some outgoing connection (this test's own clients
// make thousands): each is checked free for TCP and UDP when handed out.
type lowPorts struct {
	next, end int
}

func newLowPorts(t *testing.T) *lowPorts {
	t.Helper()
	lo := 32768 // Linux's default start of the ephemeral range
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				lo = v
			}
		}
	}
	if lo < 12000 {
		t.Skipf("the ephemeral port range starts at %d: no room below it for the fleet's listeners", lo)
	}
	// A random start, so that two runs on one machine rarely meet.
	start := 10000 + int(time.Now().UnixNano()%int64(lo-12000))
	return &lowPorts{next: start, end: lo}
}

// three returns HTTP, gRPC and gossip addresses on free low ports.
func (l *lowPorts) three(t *testing.T) [3]string {
	t.Helper()
	var out [3]string
	for i := range out {
		for ; ; l.next++ {
			if l.next >= l.end {
				t.Fatalf("no free loopback port left below %d", l.end)
			}
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(l.next))
			tl, err := net.Listen("tcp", addr)
			if err != nil {
				continue
			}
			ul, err := net.ListenPacket("udp", addr)
			_ = tl.Close()
			if err != nil {
				continue
			}
			_ = ul.Close()
			out[i] = addr
			l.next++
			break
		}
	}
	return out
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// fleetWaveOf picks the next wave of size nodes among pending (indices
// into nodes), as a deploy of a raft cluster's servers goes (Consul's and
// etcd's upgrade guides: one server at a time, the leader last): at most
// one voter of the ownership log (ringlimit_log_voter on /metrics) per
// wave, the leader only once no other voter is pending, the rest members
// that do not vote, in index order. A wave that drained several voters
// at once, or the leader with them, stalled the log's keep-alive reads
// while they drained: every member's lease lapsed for seconds (issue 54's
// rolling-deploy runs). Fewer than size when only voters are left.
func fleetWaveOf(h fleetHTTP, nodes []*fleetProc, pending []int, size int) []int {
	var learners, voters []int
	leader := -1
	for _, i := range pending {
		v := h.metrics(nodes[i], "ringlimit_log_voter", "ringlimit_log_leader")
		switch {
		case v != nil && v[1] == 1:
			leader = i
		case v != nil && v[0] == 1:
			voters = append(voters, i)
		default:
			learners = append(learners, i) // a node that did not answer counts as one
		}
	}
	var wave []int
	switch {
	case len(voters) > 0:
		wave = append(wave, voters[0])
	case leader >= 0:
		wave = append(wave, leader)
	}
	wave = append(wave, learners[:min(len(learners), size-len(wave))]...)
	if len(wave) == 0 {
		return pending[:min(size, len(pending))]
	}
	slices.Sort(wave)
	return wave
}

// fleetSize reads fleetProcsEnv: 0 when unset.
func fleetSize(t *testing.T) int {
	v := os.Getenv(fleetProcsEnv)
	if v == "" {
		return 0
	}
	if v == "1" {
		return 32
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 24 || n > 32 {
		t.Fatalf("%s=%q: want 1 (32 processes) or a fleet size from 24 to 32", fleetProcsEnv, v)
	}
	return n
}

// TestFleetProcsRollingDeploy: see the comment at the top of this file.
// About two to three minutes for 32 processes on two cores.
func TestFleetProcsRollingDeploy(t *testing.T) {
	n := fleetSize(t)
	if n == 0 {
		t.Skipf("set %s=32 (24 to 32) to deploy a fleet of serve processes", fleetProcsEnv)
	}
	const (
		rollLimit  = 10
		rollWindow = 2 * time.Second
		wideLimit  = 1_000_000_000
		waves      = 4
		subjects   = 16                     // 4/5 of n×10 checks a second on 16 keys: each above its 5 a second
		pace       = 100 * time.Millisecond // per node: 10 checks a second
	)
	dir := t.TempDir()
	run := fleetRun{bin: filepath.Join(dir, "ringlimit"), policies: filepath.Join(dir, "policies.yaml"), members: n,
		logDir: os.Getenv(fleetProcsLogsEnv), logLevel: os.Getenv(fleetProcsLogLevelEnv), procs: newFleetProcs(t)}
	if run.logDir != "" {
		if err := os.MkdirAll(run.logDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", run.bin, "github.com/ringlimit/ringlimit/cmd/ringlimit")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build cmd/ringlimit: %v\n%s", err, out)
	}
	if err := os.WriteFile(run.policies, []byte(fleetPolicies), 0o600); err != nil {
		t.Fatal(err)
	}
	h := newFleetHTTP(t)

	// Start: the founder, then the others joining through it and the
	// last one started.
	t0 := time.Now()
	nodes := make([]*fleetProc, n)
	ports := newLowPorts(t)
	for i := range n {
		var join []string
		if i > 0 {
			join = []string{nodes[0].gossip, nodes[i-1].gossip}
		}
		nodes[i] = startFleetProc(t, run, fmt.Sprintf("fleet-%02d", i), ports.three(t), join)
	}
	fleetWaitReady(t, h, nodes, 3*time.Minute, "start")
	t.Logf("%d serve processes started and ready in %v (load average %s)", n, time.Since(t0).Round(time.Millisecond), loadAverage())

	// Load: one paced client per node, each on its own node while that
	// node is in rotation, else on the next one that is, as a load
	// balancer with a readiness probe sends it: a node leaves rotation
	// before its SIGTERM (Kubernetes takes a terminating pod out of its
	// Service's endpoints) and its new process joins once it was seen
	// ready. A node that refuses the connection all the same is skipped
	// for the next one. Every fifth check is on the wide key.
	for _, p := range nodes {
		p.inRotation.Store(true)
	}
	rec := &fleetRecord{clock: time.Now()}
	var mu sync.Mutex // guards nodes while a node is replaced
	nodeAt := func(i int) *fleetProc {
		mu.Lock()
		defer mu.Unlock()
		for j := range n {
			if p := nodes[(i+j)%n]; p.inRotation.Load() {
				return p
			}
		}
		return nodes[i%n]
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	const maxPerClient = 6000 // 10 minutes at the pace: a bound, never reached
	for c := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(pace)
			defer tick.Stop()
			for i := range maxPerClient {
				subject, policy := fmt.Sprintf("s%03d", (c*7+i)%subjects), "roll"
				if i%5 == 4 {
					subject, policy = "wide", "wide"
				}
				var a fleetAnswer
				var call, ret int64
				var to *fleetProc
				for try := range n {
					to = nodeAt(c + try)
					call = rec.since()
					a = h.check(to, subject, policy)
					ret = rec.since()
					if !errors.Is(a.err, syscall.ECONNREFUSED) {
						break
					}
					rec.refused.Add(1) // never reached a node: nothing taken
				}
				op := history.Op{Key: subject + "/" + policy, Hits: 1, Call: call, Return: ret, Client: c, Owner: a.owner}
				m := fleetMeta{node: to.name, status: a.status, reason: a.reason}
				switch {
				case a.err != nil:
					op.Outcome = history.Unknown
					m.err = a.err.Error()
				case a.status == http.StatusOK:
					op.Outcome = history.Admitted
				case a.status == http.StatusTooManyRequests:
					op.Outcome = history.Rejected
				case a.status == http.StatusServiceUnavailable && a.reason == "unavailable":
					// Unknown, not Unavailable: a forward that timed out
					// may have been decided by the holder all the same
					// (the answer says the owner could not decide in
					// time), so the checker must allow both.
					op.Outcome = history.Unknown
				default:
					op.Outcome = history.Unknown
					t.Errorf("%s through client %d: status %d reason %q", op.Key, c, a.status, a.reason)
				}
				rec.add(op, m)
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		}()
	}
	watched := make(chan struct{})
	if run.logDir != "" {
		go rec.watch(h, func() []*fleetProc {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(nodes)
		}, stop, watched)
	} else {
		close(watched)
	}
	loadDone := false
	endLoad := func() {
		if !loadDone {
			loadDone = true
			close(stop)
			wg.Wait()
			<-watched
		}
	}
	t.Cleanup(endLoad)
	warm := time.NewTimer(3 * rollWindow) // every key at its limit before the deploy
	<-warm.C

	// The rolling deploy, as an orchestrator does it with a readiness
	// probe: a wave starts only once every node answers /readyz with the
	// whole fleet (which includes holding exactly its partitions, each
	// with its backup).
	deploy0 := time.Now()
	per := (n + waves - 1) / waves
	byIndex := os.Getenv(fleetProcsWavesEnv) == "index"
	pending := make([]int, n) // indices of the nodes not yet restarted
	for i := range pending {
		pending[i] = i
	}
	for w := 0; len(pending) > 0 && w < n; w++ { // a quarter a wave, more waves when voters are many
		var idx []int
		if byIndex {
			idx = pending[:min(per, len(pending))]
		} else {
			idx = fleetWaveOf(h, nodes, pending, per)
		}
		// A copy: DeleteFunc below shifts pending's array, which idx may share.
		idx = slices.Clone(idx)
		pending = slices.DeleteFunc(pending, func(i int) bool { return slices.Contains(idx, i) })
		wave := make([]*fleetProc, len(idx))
		var voters []string
		for k, i := range idx {
			wave[k] = nodes[i]
			if v := h.metrics(nodes[i], "ringlimit_log_voter", "ringlimit_log_leader"); v != nil && v[0] == 1 {
				role := " (voter)"
				if v[1] == 1 {
					role = " (leader)"
				}
				voters = append(voters, nodes[i].name+role)
			}
		}
		wv := fleetWave{n: len(wave), loadAverage: loadAverage()}
		w0 := time.Now()
		wv.term = rec.at(w0)
		for _, p := range wave {
			p.inRotation.Store(false)
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatalf("SIGTERM %s: %v", p.name, err)
			}
			rec.event(w0, p.name+" SIGTERM")
		}
		for _, p := range wave {
			timeout := time.NewTimer(60 * time.Second)
			select {
			case <-p.exited:
			case <-timeout.C:
				t.Fatalf("wave %d: %s did not exit within 60 s of SIGTERM:\n%s", w, p.name, lastLines(p.logTail(), 30))
			}
			timeout.Stop()
			rec.event(p.exitedAt, p.name+" exited")
			wv.drains = append(wv.drains, p.exitedAt.Sub(w0))
			if code := p.cmd.ProcessState.ExitCode(); code != 0 {
				t.Fatalf("wave %d: %s exited %d after SIGTERM, want 0:\n%s", w, p.name, code, lastLines(p.logTail(), 30))
			}
		}
		// Back on the same addresses, joining through live nodes of
		// other waves.
		var join []string
		for i := 0; i < n && len(join) < 3; i++ {
			if !slices.Contains(idx, i) {
				join = append(join, nodes[i].gossip)
			}
		}
		fresh := make([]*fleetProc, len(wave))
		for i, p := range wave {
			fresh[i] = startFleetProc(t, run, p.name, [3]string{p.http, p.grpc, p.gossip}, join)
			rec.event(fresh[i].started, p.name+" started")
		}
		mu.Lock()
		for k, i := range idx {
			nodes[i] = fresh[k]
		}
		mu.Unlock()
		fleetWaitReady(t, h, nodes, 3*time.Minute, fmt.Sprintf("wave %d", w))
		wv.allReady = time.Since(w0)
		for _, p := range fresh {
			rec.event(p.readyAt, p.name+" ready")
			wv.toReady = append(wv.toReady, p.readyAt.Sub(p.started))
		}
		rec.waves = append(rec.waves, wv)
		t.Logf("wave %d (%d nodes, of the ownership log's voters %v): drained and exited within %v, all %d ready %v after the SIGTERMs",
			w, len(wave), voters, slices.Max(wv.drains).Round(time.Millisecond), n, wv.allReady.Round(time.Millisecond))
	}
	deployTook := time.Since(deploy0)
	cool := time.NewTimer(rollWindow) // traffic after the last wave
	<-cool.C
	endLoad()
	rec.end = rec.since()

	// The wide key's final count, through every node: one answer.
	var last fleetAnswer
	deadline := time.Now().Add(20 * time.Second)
	for {
		call := rec.since()
		last = h.check(nodes[0], "wide", "wide")
		op := history.Op{Key: "wide/wide", Hits: 1, Call: call, Return: rec.since(), Client: -1, Outcome: history.Unknown}
		if last.err == nil && last.status == http.StatusOK {
			op.Outcome = history.Admitted
		}
		rec.add(op, fleetMeta{node: nodes[0].name, status: last.status, reason: last.reason})
		if op.Outcome == history.Admitted || time.Now().After(deadline) {
			break
		}
	}
	ops := rec.ops

	// Verdicts.
	limits := func(key string) history.Limits {
		if strings.HasSuffix(key, "/wide") {
			return history.Limits{Limit: wideLimit, Window: time.Hour}
		}
		return history.Limits{Limit: rollLimit, Window: rollWindow}
	}
	rep := history.Check(ops, limits, 10*time.Second)
	unavailable := map[string]int{}
	for i, m := range rec.meta {
		if m.status == http.StatusServiceUnavailable {
			unavailable[strings.SplitN(ops[i].Key, "/", 2)[1]]++
		}
	}
	t.Logf("history: %v (of the unknown, %d were 503 unavailable: %v); %d checks refused a connection (node restarting) and went to the next node",
		rep, unavailable["roll"]+unavailable["wide"], unavailable, rec.refused.Load())
	if err := rep.Err(); err != nil {
		t.Error(err)
	}

	// Unavailability: per key, the longest stretch from an answer that was
	// not a decision to the next decision; per wave and its worst key's
	// timeline.
	gaps := fleetGaps(ops)
	worst := slices.MaxFunc(append(gaps, fleetGap{}), func(a, b fleetGap) int { return cmp.Compare(a.len(), b.len()) })
	t.Logf("longest a key went without a decision: %v (%s); LeaseDuration is the default 2 s; slowest decision %v",
		worst.len().Round(time.Millisecond), worst.key, fleetSlowest(ops).Round(time.Millisecond))
	t.Log(rec.waveReport(gaps))
	if worst.key != "" {
		t.Logf("the worst key's timeline (ms since the load began):\n%s", rec.timeline(worst))
	}
	if run.logDir != "" {
		if err := rec.writeOps(filepath.Join(run.logDir, "ops.jsonl")); err != nil {
			t.Error(err)
		}
		t.Logf("logs of every process and every check in %s", run.logDir)
	}

	// The wide key: every admission the client saw must still count.
	admitted, unknown := 0, 0
	for _, o := range ops {
		if o.Key != "wide/wide" {
			continue
		}
		switch o.Outcome {
		case history.Admitted:
			admitted++
		case history.Unknown:
			unknown++
		}
	}
	want := int64(wideLimit - admitted)
	t.Logf("wide key: %d admitted, %d unknown; the cluster reports %d remaining, want %d..%d",
		admitted, unknown, last.remaining, want-int64(unknown), want)
	if last.status != http.StatusOK || last.remaining > want || last.remaining < want-int64(unknown) {
		t.Errorf("wide key lost or double-counted admissions: status %d, %d remaining after %d admissions (%d unknown), want %d..%d",
			last.status, last.remaining, admitted, unknown, want-int64(unknown), want)
	}

	// Restarts.
	var toReady, drains []time.Duration
	for _, wv := range rec.waves {
		toReady, drains = append(toReady, wv.toReady...), append(drains, wv.drains...)
	}
	slices.Sort(toReady)
	slices.Sort(drains)
	t.Logf("rolling deploy of %d processes in %d waves took %v; time to ready median %v, max %v; drain median %v, max %v; load average now %s",
		n, len(rec.waves), deployTook.Round(time.Millisecond), toReady[len(toReady)/2].Round(time.Millisecond), toReady[len(toReady)-1].Round(time.Millisecond),
		drains[len(drains)/2].Round(time.Millisecond), drains[len(drains)-1].Round(time.Millisecond), loadAverage())
}
