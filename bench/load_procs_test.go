package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// loadProcsEnv adds the side-by-side row against `ringlimit serve`
// processes (see TestLoadSideBySide).
const loadProcsEnv = "RINGLIMIT_LOAD_PROCS"

// serveProc is one `ringlimit serve` process of the load run.
type serveProc struct {
	cmd                *exec.Cmd
	stdin              io.WriteCloser
	grpc, http, gossip string
	exited             chan struct{}
}

// serveProcDrivers builds cmd/ringlimit, starts three `serve` processes on
// loopback (the default synchronous replication, the bench policy), waits
// until each is ready in a 3-member cluster, and returns the routed
// client's row against them. The processes stop when t ends.
func serveProcDrivers(t *testing.T) []loadDriver {
	dir := t.TempDir()
	bin := filepath.Join(dir, "ringlimit")
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, "github.com/ringlimit/ringlimit/cmd/ringlimit")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build cmd/ringlimit: %v\n%s", err, out)
	}
	policies := filepath.Join(dir, "policies.yaml")
	pol := fmt.Sprintf("policies:\n  - name: %s\n    limit: %d\n    window: 1s\n    resolution: 10ms\n", peerPolicy, int64(1)<<50)
	if err := os.WriteFile(policies, []byte(pol), 0o600); err != nil {
		t.Fatal(err)
	}
	var procs []*serveProc
	for i := range 3 {
		join := ""
		if i > 0 {
			join = procs[0].gossip
		}
		procs = append(procs, startServeProc(t, bin, fmt.Sprintf("load-%d", i), join, policies))
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range procs {
		for !p.ready() {
			if time.Now().After(deadline) {
				t.Fatalf("serve at %s not ready in a 3-member cluster within 30 s", p.http)
			}
			tick := time.NewTimer(20 * time.Millisecond)
			<-tick.C
		}
	}
	addrs := make([]string, len(procs))
	pids := make([]int, len(procs))
	for i, p := range procs {
		addrs[i], pids[i] = p.grpc, p.cmd.Process.Pid
	}
	return []loadDriver{routedDriver(t, "sidecar-routed procs keys=10000", addrs, pids)}
}

// startServeProc starts `bin serve` as node name (joining join unless
// empty) on ephemeral loopback ports and waits for its "serving" line.
func startServeProc(t *testing.T, bin, name, join, policies string) *serveProc {
	t.Helper()
	cmd := exec.Command(bin, "serve", "--name", name,
		"--gossip-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--join", join, "--policies", policies, "--log-format", "json",
		"--gossip-profile", "fast", "--exit-on-stdin-eof", "--drain-timeout", "2s")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &serveProc{cmd: cmd, stdin: stdin, exited: make(chan struct{})}
	serving := make(chan [3]string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var rec struct {
				Msg        string `json:"msg"`
				GRPCAddr   string `json:"grpc_addr"`
				HTTPAddr   string `json:"http_addr"`
				GossipAddr string `json:"gossip_addr"`
			}
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "serving" {
				serving <- [3]string{rec.GRPCAddr, rec.HTTPAddr, rec.GossipAddr}
			}
		}
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		// Closing stdin makes serve leave and exit; a kill covers a hang.
		_ = p.stdin.Close()
		timeout := time.NewTimer(10 * time.Second)
		defer timeout.Stop()
		select {
		case <-p.exited:
		case <-timeout.C:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})
	timeout := time.NewTimer(15 * time.Second)
	defer timeout.Stop()
	select {
	case a := <-serving:
		p.grpc, p.http, p.gossip = a[0], a[1], a[2]
	case <-p.exited:
		t.Fatalf("%s exited before serving", name)
	case <-timeout.C:
		t.Fatalf("%s did not start serving within 15 s", name)
	}
	return p
}

// ready reports whether the process answers /readyz with 200 and sees 3
// members.
func (p *serveProc) ready() bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.http+"/readyz", nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var body struct {
		Members int `json:"members"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&body) != nil {
		return false
	}
	return body.Members == 3
}
