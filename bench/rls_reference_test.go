package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// rlsRefEnv names a built envoyproxy/ratelimit service binary; with it
// (and RINGLIMIT_REDIS=1), the side-by-side load run gains the reference
// RLS row. Build it once, outside this module:
//
//	git clone https://github.com/envoyproxy/ratelimit /tmp/rlsref
//	(cd /tmp/rlsref && go build -o ratelimit ./src/service_cmd)
//	RINGLIMIT_RLS_REF=/tmp/rlsref/ratelimit RINGLIMIT_REDIS=1 RINGLIMIT_LOAD=1 \
//	  RINGLIMIT_LOAD_PROCS=1 go test -count=1 -run LoadSideBySide -v -timeout 20m ./bench/
//
// The reference keeps its counters in one Redis with no replica: a
// restart loses them. RINGLIMIT_LOAD_RLS_REPLICATION=off (or async) runs
// the rls procs row at that durability (the domain's replication;
// default sync). RINGLIMIT_LOAD_ONLY=rls,ratelimit keeps the two rows.
// RINGLIMIT_LOAD_SERVE_GOGC=100 runs the serve processes with Go's
// default collector (GOGC set turns serve's --gc-headroom off).
const rlsRefEnv = "RINGLIMIT_RLS_REF"

// rlsRefRow and rlsProcsRow are the two RLS rows; with both, the run
// logs their ratio per round (median): decisions/s, p99 and server CPU.
const (
	rlsRefRow   = "envoy-ratelimit+redis keys=10000"
	rlsProcsRow = "rls procs keys=10000"
)

// rlsRefDriver starts one Redis and three envoyproxy/ratelimit processes
// sharing it (the reference's own deployment: stateless services over
// one Redis), each with its defaults but statsd off, and the same domain
// as the ringlimit RLS row (descriptor user, 4 294 967 295 a second,
// never reached). The row calls ShouldRateLimit with the RLS row's
// requests, round-robin, one connection per process. srv-cpu/op is the
// three services' CPU and Redis's.
func rlsRefDriver(t *testing.T, bin string) loadDriver {
	redisAddr, redisPID := startRedisProc(t)
	root := t.TempDir()
	conf := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		t.Fatal(err)
	}
	yaml := fmt.Sprintf("domain: %s\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: second\n      requests_per_unit: %d\n",
		rlsLoadDomain, uint32(1<<32-1))
	if err := os.WriteFile(filepath.Join(conf, "load.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	var addrs []string
	pids := []int{redisPID}
	for i := range 3 {
		ports := freePorts(t, 3)
		cmd := exec.Command(bin)
		cmd.Env = append(serverEnv(os.Environ()),
			"HOST=127.0.0.1", "GRPC_HOST=127.0.0.1", "DEBUG_HOST=127.0.0.1",
			"PORT="+strconv.Itoa(ports[0]), "GRPC_PORT="+strconv.Itoa(ports[1]), "DEBUG_PORT="+strconv.Itoa(ports[2]),
			"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr,
			"USE_STATSD=false", "LOG_LEVEL=warn",
			"RUNTIME_ROOT="+root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true")
		logf, err := os.Create(filepath.Join(root, fmt.Sprintf("ref-%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", bin, err)
		}
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); logf.Close(); close(exited) }()
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
		health := fmt.Sprintf("http://127.0.0.1:%d/healthcheck", ports[0])
		deadline := time.Now().Add(20 * time.Second)
		for !httpOK(health) {
			select {
			case <-exited:
				out, _ := os.ReadFile(logf.Name())
				t.Fatalf("the reference ratelimit exited before it was healthy:\n%s", out)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("the reference ratelimit at %s was not healthy within 20 s", health)
			}
			tick := time.NewTimer(20 * time.Millisecond)
			<-tick.C
		}
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", ports[1]))
		pids = append(pids, cmd.Process.Pid)
	}
	d := rlsDriver(t, rlsRefRow, addrs, pids)
	// The reference loads its configuration from files; a first call
	// that is not OK fails the setup, not a round.
	if err := d.call(0, 0); err != nil {
		t.Fatalf("the reference ratelimit's first decision: %v", err)
	}
	return d
}

// rlsDriver is the row of Envoy's rate limit filter calling
// RateLimitService/ShouldRateLimit on any of addrs, as an Envoy fleet
// does: one descriptor (user=<one of 10 000 subjects>) in domain
// rlsLoadDomain, one connection per process, round-robin.
func rlsDriver(t *testing.T, name string, addrs []string, pids []int) loadDriver {
	keys := loadKeys(10000)
	wire := make([]*rlsv3.RateLimitRequest, len(keys))
	for i, k := range keys {
		wire[i] = &rlsv3.RateLimitRequest{Domain: rlsLoadDomain, Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: k.Subject}},
		}}}
	}
	return grpcRowDriver(t, name, addrs, pids, rlsv3.NewRateLimitServiceClient, func(cl rlsv3.RateLimitServiceClient, i int) error {
		resp, err := cl.ShouldRateLimit(context.Background(), wire[i%len(wire)])
		if err == nil && resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			err = fmt.Errorf("not OK: %v", resp)
		}
		return err
	})
}

// freePorts returns n loopback ports that were free a moment ago (a
// service that takes a port number, not :0, binds them next).
func freePorts(tb testing.TB, n int) []int {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		ls = append(ls, l)
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports
}

// httpOK reports whether GET url answers 200 within a second.
func httpOK(url string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
