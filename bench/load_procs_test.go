package bench

import (
	"bufio"
	"bytes"
	"cmp"
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

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// loadProcsEnv adds the side-by-side row against `ringlimit serve`
// processes (see TestLoadSideBySide).
const loadProcsEnv = "RINGLIMIT_LOAD_PROCS"

// serverProcsEnv sets GOMAXPROCS for every server process the load run
// starts in Go (the serve processes and the reference RLS service alike):
// RINGLIMIT_LOAD_SERVER_GOMAXPROCS=1 gives each a single running thread,
// so that the run's processes compete less for the cores. This process's
// own is GOMAXPROCS in its environment.
const serverProcsEnv = "RINGLIMIT_LOAD_SERVER_GOMAXPROCS"

// serverEnv is env with the server processes' GOMAXPROCS when
// serverProcsEnv sets one.
func serverEnv(env []string) []string {
	if n := os.Getenv(serverProcsEnv); n != "" {
		return append(env, "GOMAXPROCS="+n)
	}
	return env
}

// childProc is a server process the load run starts: it stops when its
// stdin closes.
type childProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{} // closed once cmd.Wait has returned
}

// stopAtCleanup stops p when t ends: its stdin closed, then a kill if it
// has not exited within 10 s.
func (p *childProc) stopAtCleanup(t *testing.T) {
	t.Cleanup(func() {
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
}

// serveProc is one `ringlimit serve` process of the load run.
type serveProc struct {
	childProc
	grpc, http, gossip string
}

// serveProcDrivers builds cmd/ringlimit, starts three `serve` processes on
// loopback (the default synchronous replication, the bench policy), waits
// until each is ready in a 3-member cluster, and returns the rows against
// them: the routed client's, unary gRPC to any node, and HTTP
// /v1/check to any node. The processes stop when t ends.
func serveProcDrivers(t *testing.T) []loadDriver {
	dir := t.TempDir()
	bin := filepath.Join(dir, "ringlimit")
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, "github.com/ringlimit/ringlimit/cmd/ringlimit")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build cmd/ringlimit: %v\n%s", err, out)
	}
	policies := filepath.Join(dir, "policies.yaml")
	// The bench policy, and an Envoy domain whose one descriptor has the
	// largest limit its file takes (4 294 967 295 a second, never
	// reached), for the RLS row.
	// RINGLIMIT_LOAD_RLS_REPLICATION sets the domain's replication
	// (default sync): off is the reference row's durability.
	repl := cmp.Or(os.Getenv("RINGLIMIT_LOAD_RLS_REPLICATION"), "sync")
	pol := fmt.Sprintf("policies:\n  - name: %s\n    limit: %d\n    window: 1s\n    resolution: 10ms\n"+
		"domains:\n  - domain: %s\n    replication: %s\n    descriptors:\n      - key: user\n        rate_limit: {window: 1s, requests: %d}\n",
		peerPolicy, int64(1)<<50, rlsLoadDomain, repl, uint32(1<<32-1))
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
	httpAddrs := make([]string, len(procs))
	for i, p := range procs {
		httpAddrs[i] = p.http
	}
	return []loadDriver{
		routedDriver(t, "sidecar-routed procs keys=10000", addrs, pids, ""),
		unaryProcDriver(t, unaryProcsRow, addrs, pids),
		rlsDriver(t, rlsProcsRow, addrs, pids),
		httpProcDriver(t, httpProcsRow, httpAddrs, pids),
	}
}

// The rows against the serve processes from clients in other languages.
const (
	unaryProcsRow = "sidecar procs keys=10000"
	httpProcsRow  = "http procs keys=10000"
)

// unaryProcDriver is the row, named name, of a client in another language
// calling unary RateLimiter.Allow on any node: one connection per process,
// round-robin, so two calls in three are forwarded once.
func unaryProcDriver(t *testing.T, name string, addrs []string, pids []int) loadDriver {
	keys := loadKeys(10000)
	wire := make([]*peerpb.AllowRequest, len(keys))
	for i, k := range keys {
		wire[i] = &peerpb.AllowRequest{Key: &peerpb.Key{Tenant: k.Tenant, Subject: k.Subject, Policy: k.Policy}}
	}
	return grpcRowDriver(t, name, addrs, pids, peerpb.NewRateLimiterClient, func(cl peerpb.RateLimiterClient, i int) error {
		resp, err := cl.Allow(context.Background(), wire[i%len(wire)])
		if err == nil && !resp.GetAllowed() {
			err = fmt.Errorf("refused: %v", resp)
		}
		return err
	})
}

// grpcRowDriver is a row of unary calls to any of the processes at addrs
// (pids, whose CPU is counted): one connection and client (newClient)
// each, call i going to client i mod their number through call.
func grpcRowDriver[C any](t *testing.T, name string, addrs []string, pids []int, newClient func(grpc.ClientConnInterface) C, call func(cl C, i int) error) loadDriver {
	var clients []C
	for _, conn := range procConns(t, addrs) {
		clients = append(clients, newClient(conn))
	}
	return loadDriver{
		name: name, pids: pids,
		call: func(_, i int) error { return call(clients[i%len(clients)], i) },
	}
}

// procConns is one plaintext gRPC connection to each of addrs, closed
// when t ends.
func procConns(t *testing.T, addrs []string) []*grpc.ClientConn {
	conns := make([]*grpc.ClientConn, len(addrs))
	for i, a := range addrs {
		conn, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		conns[i] = conn
	}
	return conns
}

// rlsLoadDomain is the Envoy domain of the RLS row.
const rlsLoadDomain = "load"

// httpProcDriver is the row, named name, of POST /v1/check on any of the
// nodes whose HTTP addresses are addrs: keep-alive HTTP/1.1 connections (one
// per caller and process at most), round-robin over the processes. A 200
// is an admission; anything else fails the run.
func httpProcDriver(t *testing.T, name string, addrs []string, pids []int) loadDriver {
	tr := &http.Transport{MaxIdleConnsPerHost: loadCallers, MaxConnsPerHost: loadCallers, IdleConnTimeout: time.Minute}
	t.Cleanup(tr.CloseIdleConnections)
	cl := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	keys := loadKeys(10000)
	bodies := make([][]byte, len(keys))
	for i, k := range keys {
		b, err := json.Marshal(map[string]string{"tenant": k.Tenant, "subject": k.Subject, "policy": k.Policy})
		if err != nil {
			t.Fatal(err)
		}
		bodies[i] = b
	}
	urls := make([]string, len(addrs))
	for i, a := range addrs {
		urls[i] = "http://" + a + "/v1/check"
	}
	return loadDriver{
		name: name, pids: pids,
		call: func(c, i int) error {
			resp, err := cl.Post(urls[i%len(urls)], "application/json", bytes.NewReader(bodies[i%len(bodies)]))
			if err != nil {
				return err
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("POST /v1/check answered %s", resp.Status)
			}
			return err
		},
	}
}

// startServeProc starts `bin serve` as node name (joining join unless
// empty) on ephemeral loopback ports and waits for its "serving" line.
func startServeProc(t *testing.T, bin, name, join, policies string) *serveProc {
	t.Helper()
	cmd := exec.Command(bin, "serve", "--name", name,
		"--gossip-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--join", join, "--policies", policies, "--log-format", "json",
		"--gossip-profile", "fast", "--exit-on-stdin-eof", "--drain-timeout", "2s")
	cmd.Env = serverEnv(os.Environ())
	if g := os.Getenv("RINGLIMIT_LOAD_SERVE_GOGC"); g != "" {
		// Only the serve processes' garbage collector (the reference
		// and this process keep theirs).
		cmd.Env = append(cmd.Env, "GOGC="+g)
	}
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
	p := &serveProc{childProc: childProc{cmd: cmd, stdin: stdin, exited: make(chan struct{})}}
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
	p.stopAtCleanup(t) // closing stdin makes serve leave and exit
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
