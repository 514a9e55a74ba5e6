package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// serveProc is a `ringlimit serve` process: the test binary re-executed in
// child mode (see TestMain).
type serveProc struct {
	name                           string
	cmd                            *exec.Cmd
	httpAddr, grpcAddr, gossipAddr string
	opsAddr                        string // "" without --ops-addr
	mu                             sync.Mutex
	log                            bytes.Buffer
	exited                         chan struct{} // closed once the process has been reaped
	// stdin stays open while the test runs: the child runs with
	// --exit-on-stdin-eof, so it stops by itself if the test binary dies.
	stdin io.WriteCloser
}

const testPolicies = `policies:
  - name: api
    limit: 3
    window: 1m
  - name: shared
    limit: 10
    window: 1m
`

// writeFile writes data into a new file in dir and returns its path.
func writeFile(t *testing.T, dir, name, data string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// testPartitions is the partition count of the serve processes whose
// flags set neither --partitions nor --expected-members. Every partition
// of a forming cluster is a move and a backup copy through the ownership
// log (under the race detector, in a child per member) before the members
// settle; with the default 271 that start-up was most of a serve test's
// time. 31 still gives each of three members several partitions. The
// README's quick start (TestQuickStart) and the demo run the default.
const testPartitions = 31

// testForwardTimeout is the --forward-timeout of the serve processes
// whose flags set none. The default, half a second, is what a client of a
// healthy cluster should wait; under the race detector on a loaded 2-core
// machine a live owner sometimes takes longer (TestServeMutualTLS failed
// so: "no answer within 500ms"), and a test that forwards between healthy
// members must not fail because a forward took long. The process tests
// that stop or kill an owner and measure what callers see set their own.
const testForwardTimeout = "3s"

// startServe starts a node on loopback with ephemeral ports, fast gossip,
// testPartitions (unless extra sets the count) and testForwardTimeout
// (unless extra sets one), and waits for its "serving" line. extra are added flags; env are added environment
// variables. The process is killed at cleanup if still running.
func startServe(t *testing.T, name string, env []string, extra ...string) *serveProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"serve", "--name", name,
		"--gossip-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--log-format", "json", "--gossip-profile", "fast", "--drain-timeout", "5s", "--exit-on-stdin-eof"}, extra...)
	if !slices.Contains(extra, "--partitions") && !slices.Contains(extra, "--expected-members") {
		args = append(args, "--partitions", strconv.Itoa(testPartitions))
	}
	if !slices.Contains(extra, "--forward-timeout") {
		args = append(args, "--forward-timeout", testForwardTimeout)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(childEnv(os.Environ()), env...)
	p := launchServe(t, name, cmd)
	for _, a := range []string{p.httpAddr, p.grpcAddr, p.gossipAddr} {
		if host, _, err := net.SplitHostPort(a); err != nil || host != "127.0.0.1" {
			t.Fatalf("%s: serving line has address %q, want 127.0.0.1:port", name, a)
		}
	}
	return p
}

// launchServe starts cmd (a serve command line, its environment set) with
// its stdin held open (--exit-on-stdin-eof), records its log, and waits
// for its "serving" line. The process is killed at cleanup if still
// running, and its log is shown if the test failed.
func launchServe(t *testing.T, name string, cmd *exec.Cmd) *serveProc {
	t.Helper()
	p := &serveProc{name: name, cmd: cmd, exited: make(chan struct{})}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	serving := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.log.Write(sc.Bytes())
			p.log.WriteByte('\n')
			p.mu.Unlock()
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == "serving" {
				serving <- rec
			}
		}
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.stdin.Close()
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("log of %s:\n%s", name, p.logText())
		}
	})
	select {
	case rec := <-serving:
		p.httpAddr, _ = rec["http_addr"].(string)
		p.opsAddr, _ = rec["ops_addr"].(string)
		p.grpcAddr, _ = rec["grpc_addr"].(string)
		p.gossipAddr, _ = rec["gossip_addr"].(string)
	case <-p.exited:
		t.Fatalf("%s exited before serving (%v):\n%s", name, p.cmd.ProcessState, p.logText())
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not log \"serving\" within 20s:\n%s", name, p.logText())
	}
	return p
}

func (p *serveProc) logText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// terminate sends SIGTERM and returns the exit code, failing the test if
// the process does not exit within 15 s.
func (p *serveProc) terminate(t *testing.T) int {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM %s: %v", p.name, err)
	}
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(15 * time.Second):
		t.Fatalf("%s did not exit within 15s of SIGTERM", p.name)
		return -1
	}
}

// httpResult is one HTTP exchange.
type httpResult struct {
	status int
	header http.Header
	body   map[string]any
	raw    string
}

// doHTTP makes one request and fails the test if it cannot; call it on the
// test's goroutine only.
func doHTTP(t *testing.T, method, url, body string) httpResult {
	t.Helper()
	r, err := httpDo(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// httpDo makes one request; safe on any goroutine.
func httpDo(method, url, body string) (httpResult, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return httpResult{}, err
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return httpResult{}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := httpResult{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	_ = json.Unmarshal(raw, &r.body)
	return r, nil
}

// waitFor polls cond every 20 ms until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		<-tick.C
	}
}
