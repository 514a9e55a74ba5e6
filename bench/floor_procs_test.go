package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// The floor rows of the side-by-side run (opt-in: RINGLIMIT_LOAD_FLOOR=1
// with RINGLIMIT_LOAD_PROCS=1). Three processes answer the unary, RLS and
// HTTP rows' requests with a fixed answer: the same drivers, the same
// loopback, the same libraries and server settings as the three `serve`
// processes, and nothing behind the call (no decision, no forward, no
// replication). Each path's row over its floor row is how far it is from
// what the transport alone costs on this machine, across processes.
const floorProcsEnv = "RINGLIMIT_LOAD_FLOOR"

// floorServerEnv makes this test binary a floor server instead of running
// tests (floorProcDrivers starts it so).
const floorServerEnv = "RINGLIMIT_BENCH_FLOOR_SERVER"

// Floor row names, and the rows each is the floor of.
const (
	floorUnaryRow = "floor unary procs"
	floorRLSRow   = "floor rls procs"
	floorHTTPRow  = "floor http procs"
)

// floorOf pairs each path's row with its floor's.
var floorOf = [][2]string{
	{unaryProcsRow, floorUnaryRow},
	{rlsProcsRow, floorRLSRow},
	{httpProcsRow, floorHTTPRow},
}

func TestMain(m *testing.M) {
	if os.Getenv(floorServerEnv) == "1" {
		if err := floorServe(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "floor server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// floorServe serves the fixed answers on two loopback ports, writes
// "floor <grpc addr> <http addr>" to out, and stops when in ends.
func floorServe(in io.Reader, out io.Writer) error {
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	// serve's public gRPC server's settings (peer/node.go): 1 MiB
	// windows, 64 standing stream workers.
	srv := grpc.NewServer(grpc.InitialWindowSize(1<<20), grpc.InitialConnWindowSize(1<<20), grpc.NumStreamWorkers(64))
	peerpb.RegisterRateLimiterServer(srv, floorLimiter{})
	rlsv3.RegisterRateLimitServiceServer(srv, floorRLS{})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", floorCheck)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errs := make(chan error, 2)
	go func() { errs <- srv.Serve(gl) }()
	go func() { errs <- hs.Serve(hl) }()
	if _, err := fmt.Fprintf(out, "floor %s %s\n", gl.Addr(), hl.Addr()); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, in)
	srv.Stop()
	_ = hs.Close()
	<-errs
	<-errs
	return nil
}

// floorLimiter answers every Allow as a holder admitting under the bench
// policy would.
type floorLimiter struct {
	peerpb.UnimplementedRateLimiterServer
}

func (floorLimiter) Allow(context.Context, *peerpb.AllowRequest) (*peerpb.AllowResponse, error) {
	return &peerpb.AllowResponse{
		Allowed: true, Limit: 1 << 50, Remaining: 1<<50 - 1, ResetAfterNs: int64(time.Second),
		Reason: peerpb.Reason_REASON_ADMITTED, Owner: "load-0", RingVersion: 3, DecidedAtUnixNs: time.Now().UnixNano(),
	}, nil
}

// floorRLS answers every ShouldRateLimit with one OK status, as the RLS
// row's one-descriptor answers are.
type floorRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (floorRLS) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	st := make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.GetDescriptors()))
	for i := range st {
		st[i] = &rlsv3.RateLimitResponse_DescriptorStatus{
			Code:           rlsv3.RateLimitResponse_OK,
			CurrentLimit:   &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 1<<32 - 1, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND},
			LimitRemaining: 1<<32 - 2,
		}
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: st}, nil
}

// floorAnswer is shaped as serve's answer to an admitted /v1/check.
const floorAnswer = `{"allowed":true,"limit":1125899906842624,"remaining":1125899906842623,"retry_after_ms":0,"reset_after_ms":1000,"owner":"load-0"}` + "\n"

// floorCheck reads the body and answers a fixed admission.
func floorCheck(w http.ResponseWriter, r *http.Request) {
	if _, err := io.Copy(io.Discard, r.Body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("RateLimit-Policy", `"bench";q=1125899906842624;w=1`)
	h.Set("RateLimit", `"bench";r=1125899906842623;t=1`)
	_, _ = io.WriteString(w, floorAnswer)
}

// floorProcDrivers starts three floor servers (this test binary again)
// and returns their rows, driven as the `serve` rows are. They stop when
// t ends.
func floorProcDrivers(t *testing.T) []loadDriver {
	var grpcAddrs, httpAddrs []string
	var pids []int
	for range 3 {
		g, h, pid := startFloorProc(t)
		grpcAddrs, httpAddrs, pids = append(grpcAddrs, g), append(httpAddrs, h), append(pids, pid)
	}
	return []loadDriver{
		unaryProcDriver(t, floorUnaryRow, grpcAddrs, pids),
		rlsDriver(t, floorRLSRow, grpcAddrs, pids),
		httpProcDriver(t, floorHTTPRow, httpAddrs, pids),
	}
}

// startFloorProc starts one floor server (this test binary again),
// stopped when t ends, and returns its gRPC and HTTP addresses and pid.
func startFloorProc(t *testing.T) (grpcAddr, httpAddr string, pid int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(serverEnv(os.Environ()), floorServerEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &childProc{cmd: cmd, stdin: stdin, exited: make(chan struct{})}
	lines := make(chan string, 1)
	go func() {
		// The first line names the addresses; Wait only once stdout is
		// read to its end.
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- line
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
		close(p.exited)
	}()
	p.stopAtCleanup(t)
	var line string
	select {
	case line = <-lines:
	case <-time.After(15 * time.Second):
		t.Fatal("floor server did not name its addresses within 15 s")
	}
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "floor" {
		t.Fatalf("floor server said %q", line)
	}
	return f[1], f[2], cmd.Process.Pid
}

// TestFloorServe checks that the floor server answers each path as its
// driver expects, and stops when its input ends.
func TestFloorServe(t *testing.T) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- floorServe(inR, outW) }()
	line, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, outR) }()
	f := strings.Fields(line)
	if len(f) != 3 {
		t.Fatalf("floor server said %q", line)
	}
	drivers := []loadDriver{
		unaryProcDriver(t, floorUnaryRow, f[1:2], nil),
		rlsDriver(t, floorRLSRow, f[1:2], nil),
		httpProcDriver(t, floorHTTPRow, f[2:3], nil),
	}
	for _, d := range drivers {
		for i := range 3 {
			if err := d.call(0, i); err != nil {
				t.Errorf("%s: %v", d.name, err)
			}
		}
	}
	_ = inW.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("floor server did not stop when its input ended")
	}
	_ = outW.Close()
}

// TestLoadRunHelpers: the preemption count reads the involuntary field
// of a thread's status (not the voluntary one before it), and the
// server processes get GOMAXPROCS only when the run sets one.
func TestLoadRunHelpers(t *testing.T) {
	status := "Name:\tx\nvoluntary_ctxt_switches:\t17\nnonvoluntary_ctxt_switches:\t42\n"
	if got := nonvoluntary(status); got != 42 {
		t.Errorf("nonvoluntary = %d, want 42", got)
	}
	if got := nonvoluntary("Name:\tx\n"); got != 0 {
		t.Errorf("nonvoluntary without the field = %d, want 0", got)
	}
	if own := involuntary(nil); own < 0 || involuntary([]int{os.Getpid()}) < own {
		t.Errorf("this process counted as a server added less than nothing")
	}
	t.Setenv(serverProcsEnv, "")
	if got := serverEnv([]string{"A=1"}); len(got) != 1 {
		t.Errorf("serverEnv without %s = %v, want it unchanged", serverProcsEnv, got)
	}
	t.Setenv(serverProcsEnv, "1")
	if got := serverEnv([]string{"A=1"}); len(got) != 2 || got[1] != "GOMAXPROCS=1" {
		t.Errorf("serverEnv with %s=1 = %v, want GOMAXPROCS=1 added", serverProcsEnv, got)
	}
}
