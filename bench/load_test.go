package bench

// TestLoadSideBySide is the issue 9 measurement: every driver below runs in
// one process, one after another, with the same load shape (64 concurrent
// callers for a bounded duration, single-decision calls), and the table
// reports the median of several rounds (Redis rows run within the
// default mode's rounds, and "x redis" pairs each round with them). It is opt-in (RINGLIMIT_LOAD=1;
// RINGLIMIT_LOAD_ONLY=<substring>[,<substring>...] keeps only the
// drivers matching one of them);
// the Redis rows also need RINGLIMIT_REDIS=1 and redis-server on PATH:
//
//	RINGLIMIT_LOAD=1 RINGLIMIT_REDIS=1 go test -run LoadSideBySide -v -timeout 20m ./bench/
//
// Drivers:
//
//   - sidecar: a gRPC client (one connection per node) calls
//     ringlimit.v1.RateLimiter/Allow on the 3 nodes round-robin, so two
//     calls in three are forwarded once between nodes;
//   - sidecar-routed: peer.Client (Placement + AllowStream): each key
//     goes straight to its partition's holder on one stream per node,
//     the requests of concurrent callers gathered into shared messages;
//   - embedded: Node.Allow in-process, round-robin over the 3 nodes;
//   - redis-lua: EVALSHA of the exact sliding-log script
//     (redisScriptExact), one connection per caller;
//   - redis-lua+replica WAIT 1: the same on a second Redis with one
//     replica, each call pipelined with WAIT 1 (the replica's
//     acknowledgement: what sync replication gives);
//   - sidecar-routed procs (opt-in, RINGLIMIT_LOAD_PROCS=1): peer.Client
//     as sidecar-routed, against three `ringlimit serve` processes built
//     from this tree (their CPU time is srv-cpu/op), as a client in
//     another process would meet them; with it, sidecar procs (unary
//     Allow to any process, round-robin) and http procs (POST /v1/check
//     to any process, keep-alive HTTP/1.1), and rls procs
//     (ShouldRateLimit to any process);
//   - envoyproxy/ratelimit+redis (opt-in, RINGLIMIT_RLS_REF=<binary>
//     with RINGLIMIT_REDIS=1): the reference RLS service, three
//     processes over one Redis, with the rls procs row's requests;
//   - floor unary, rls and http procs (opt-in, RINGLIMIT_LOAD_FLOOR=1
//     with RINGLIMIT_LOAD_PROCS=1): three processes answering those rows'
//     requests with a fixed answer (floor_procs_test.go), the transport
//     alone; the run logs each path's ratio to its floor per round.
//
// preempt/s is how often the kernel took a core from a running thread of
// this process or of the server processes (involuntary context switches
// per second). A Go process that runs as many threads as there are cores
// (GOMAXPROCS=2 here) loses one whenever another thread wakes, for up to
// a scheduler tick (4 ms on this kernel), and the goroutines queued on
// the thread it took wait with it: the embedded row's p99 of 3-4 ms.
// GOMAXPROCS=1 for this process leaves a core for the rest (the Redis
// rows' clients run in it too); RINGLIMIT_LOAD_SERVER_GOMAXPROCS=1 does
// the same for the server processes.
//
// cpu/op is the test process's CPU time (getrusage: user + system) divided
// by the decisions made; for Redis, srv-cpu/op is redis-server's own CPU
// time (/proc/<pid>/stat) and cpu/op adds it to the client's. Every
// ringlimit figure includes the callers, the gRPC client and all three
// nodes, which share this process.

import (
	"context"
	"errors"
	"fmt"
	"os"
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

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/peer/peerpb"
)

const (
	loadEnv    = "RINGLIMIT_LOAD"
	loadLatCap = 1 << 15 // latency samples kept per caller (newest win)
)

// loadCallers is how many callers each driver runs: 64, or
// RINGLIMIT_LOAD_CALLERS (a positive integer) to see how a driver's rate
// follows the requests in flight (a disk-bound one does).
var loadCallers = func() int {
	s := os.Getenv("RINGLIMIT_LOAD_CALLERS")
	if s == "" {
		return 64
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		panic(fmt.Sprintf("RINGLIMIT_LOAD_CALLERS=%q must be a positive integer", s))
	}
	return n
}()

// loadDuration is how long each driver runs per round:
// RINGLIMIT_LOAD_DURATION (a Go duration), default 3 s.
func loadDuration(t *testing.T) time.Duration {
	if s := os.Getenv("RINGLIMIT_LOAD_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("RINGLIMIT_LOAD_DURATION=%q must be a positive Go duration such as 3s", s)
		}
		return d
	}
	return 3 * time.Second
}

// loadRounds is how many times each driver runs (the median is reported):
// RINGLIMIT_LOAD_ROUNDS, default 3.
func loadRounds(t *testing.T) int {
	if s := os.Getenv("RINGLIMIT_LOAD_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("RINGLIMIT_LOAD_ROUNDS=%q must be a positive integer", s)
		}
		return n
	}
	return 3
}

// loadResult is one round of one driver.
type loadResult struct {
	ops      float64 // decisions per second
	p50, p99 time.Duration
	cpuOp    time.Duration // client process (+ server process) CPU per decision
	srvCPUOp time.Duration // server process CPU per decision (Redis only)
	preempt  float64       // involuntary context switches per second, this process and the servers
}

// loadCall makes decision number i for caller c.
type loadCall func(c, i int) error

// processCPU is this process's user + system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// involuntary is how many times the kernel has preempted a thread of this
// process (getrusage) or of pids (each live thread's
// nonvoluntary_ctxt_switches in /proc/<pid>/task/*/status).
func involuntary(pids []int) int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	n := ru.Nivcsw
	for _, pid := range pids {
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
		for _, f := range tasks {
			if b, err := os.ReadFile(f); err == nil {
				n += nonvoluntary(string(b))
			}
		}
	}
	return n
}

// nonvoluntary is the nonvoluntary_ctxt_switches field of a thread's
// /proc status text; 0 without one.
func nonvoluntary(status string) int64 {
	_, v, ok := strings.Cut(status, "\nnonvoluntary_ctxt_switches:")
	if !ok {
		return 0
	}
	v, _, _ = strings.Cut(v, "\n")
	n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
	return n
}

// pidsCPU is the sum of pidCPU over pids.
func pidsCPU(pids []int) time.Duration {
	var sum time.Duration
	for _, pid := range pids {
		sum += pidCPU(pid)
	}
	return sum
}

// pidCPU is process pid's user + system CPU time from /proc/<pid>/stat
// (fields 14 and 15, in clock ticks of 1/100 s, Linux's USER_HZ).
func pidCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces; fields after it are
	// counted from the closing parenthesis.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// runLoad runs call from loadCallers goroutines for d and measures it.
// srvPIDs are server processes whose CPU time is added.
func runLoad(t *testing.T, d time.Duration, srvPIDs []int, call loadCall) loadResult {
	t.Helper()
	return runLoadN(t, d, loadCallers, srvPIDs, call)
}

// runLoadN is runLoad with callers goroutines. Each keeps its newest
// latencies, loadLatCap for 64 callers and as many in all for more.
func runLoadN(t *testing.T, d time.Duration, callers int, srvPIDs []int, call loadCall) loadResult {
	t.Helper()
	lat := make([][]time.Duration, callers)
	for i := range lat {
		lat[i] = make([]time.Duration, min(loadLatCap, max(1<<10, loadLatCap*64/callers)))
	}
	filled := make([]int, callers)
	counts := make([]int64, callers)
	var stop atomic.Bool
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	runtime.GC()
	cpu0, srv0, pre0, t0 := processCPU(), pidsCPU(srvPIDs), involuntary(srvPIDs), time.Now()
	for c := range callers {
		wg.Go(func() {
			rec := lat[c]
			i, j, n := c*7919, 0, 0
			for !stop.Load() {
				start := time.Now()
				err := call(c, i)
				el := time.Since(start)
				if err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				rec[j] = el
				if j++; j == len(rec) {
					j = 0
				}
				n++
				i++
			}
			filled[c] = min(n, len(rec))
			counts[c] = int64(n)
		})
	}
	// The measured interval: the workers run until the timer fires.
	interval := time.NewTimer(d)
	<-interval.C
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(t0)
	cpu, srv, pre := processCPU()-cpu0, pidsCPU(srvPIDs)-srv0, involuntary(srvPIDs)-pre0
	if err := failed.Load(); err != nil {
		t.Fatalf("decision failed: %v", *err)
	}
	var total int64
	var all []time.Duration
	for c := range callers {
		total += counts[c]
		all = append(all, lat[c][:filled[c]]...)
	}
	if total == 0 {
		t.Fatal("no decisions made")
	}
	slices.Sort(all)
	pct := func(p float64) time.Duration { return all[min(len(all)-1, int(p*float64(len(all))))] }
	return loadResult{
		ops: float64(total) / elapsed.Seconds(), p50: pct(0.50), p99: pct(0.99),
		cpuOp: (cpu + srv) / time.Duration(total), srvCPUOp: srv / time.Duration(total),
		preempt: float64(pre) / elapsed.Seconds(),
	}
}

// median returns the median of rs by each field separately.
func median(rs []loadResult) loadResult {
	pick := func(f func(loadResult) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	return loadResult{
		ops:      pick(func(r loadResult) float64 { return r.ops }),
		p50:      time.Duration(pick(func(r loadResult) float64 { return float64(r.p50) })),
		p99:      time.Duration(pick(func(r loadResult) float64 { return float64(r.p99) })),
		cpuOp:    time.Duration(pick(func(r loadResult) float64 { return float64(r.cpuOp) })),
		srvCPUOp: time.Duration(pick(func(r loadResult) float64 { return float64(r.srvCPUOp) })),
		preempt:  pick(func(r loadResult) float64 { return r.preempt }),
	}
}

// medianRatio is the median over rounds of f(a[r]) / f(b[r]): two rows
// compared within each round, so a slow spell of the machine hits both.
func medianRatio(a, b []loadResult, f func(loadResult) float64) float64 {
	rs := make([]float64, len(a))
	for r := range a {
		rs[r] = f(a[r]) / f(b[r])
	}
	slices.Sort(rs)
	return rs[len(rs)/2]
}

// loadKeys returns distinct keys of the bench policy.
func loadKeys(distinct int) []peer.Key {
	keys := make([]peer.Key, distinct)
	for i := range keys {
		keys[i] = peer.Key{Tenant: "bench", Subject: fmt.Sprintf("user-%08d", i), Policy: peerPolicy}
	}
	return keys
}

// loadDriver is one row of the table.
type loadDriver struct {
	name string
	pids []int // server processes to add the CPU time of; none for none
	call loadCall
}

// loadGroup is drivers sharing one setup (a Redis server or a cluster),
// run in a subtest so the setup is torn down before the next group.
type loadGroup struct {
	name  string
	setup func(t *testing.T) []loadDriver
}

func TestLoadSideBySide(t *testing.T) {
	if os.Getenv(loadEnv) != "1" {
		t.Skipf("the side-by-side load run is opt-in: set %s=1 (and %s=1 for the Redis rows)", loadEnv, redisEnv)
	}
	d, rounds := loadDuration(t), loadRounds(t)
	var groups []loadGroup
	for _, mode := range []peer.Replication{peer.ReplicateSync, peer.ReplicateAsync, peer.ReplicateOff} {
		groups = append(groups, loadGroup{"repl=" + mode.String(), func(t *testing.T) []loadDriver {
			var drivers []loadDriver
			if mode == peer.ReplicateSync && os.Getenv(redisEnv) == "1" {
				// Redis runs in the default mode's rounds, interleaved
				// with its rows, so the ratios pair runs made moments
				// apart on the shared machine.
				drivers = redisDrivers(t)
			}
			drivers = append(drivers, ringlimitDrivers(t, mode)...)
			if mode == peer.ReplicateSync && os.Getenv(loadProcsEnv) == "1" {
				drivers = append(drivers, serveProcDrivers(t)...)
				if os.Getenv(floorProcsEnv) == "1" {
					drivers = append(drivers, floorProcDrivers(t)...)
				}
			}
			if bin := os.Getenv(rlsRefEnv); mode == peer.ReplicateSync && bin != "" && os.Getenv(redisEnv) == "1" {
				drivers = append(drivers, rlsRefDriver(t, bin))
			}
			return drivers
		}})
	}
	var names []string
	var medians []loadResult
	var ratios []float64 // median over rounds of ops / redis-lua keys=10000 ops; 0: none
	var pids [][]int
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			drivers := g.setup(t)
			if only := os.Getenv("RINGLIMIT_LOAD_ONLY"); only != "" {
				// Profiling one driver: RINGLIMIT_LOAD_ONLY=embedded; a
				// comma-separated list keeps the drivers matching any.
				drivers = slices.DeleteFunc(drivers, func(d loadDriver) bool {
					return !slices.ContainsFunc(strings.Split(only, ","), func(o string) bool { return strings.Contains(d.name, o) })
				})
			}
			results := make([][]loadResult, len(drivers))
			// Rounds interleave the group's drivers, so a slow spell of
			// the shared machine hits them alike.
			for r := range rounds {
				for i, dr := range drivers {
					res := runLoad(t, d, dr.pids, dr.call)
					t.Logf("round %d %-36s %9.0f ops/s p50 %8v p99 %8v cpu/op %v preempt/s %.0f", r+1, dr.name, res.ops, res.p50, res.p99, res.cpuOp, res.preempt)
					results[i] = append(results[i], res)
				}
			}
			row := func(name string) int {
				return slices.IndexFunc(drivers, func(d loadDriver) bool { return d.name == name })
			}
			ref := row("redis-lua keys=10000")
			// Rows compared within each round: RLS against the reference
			// service, and each path against its floor.
			for _, pair := range append([][2]string{{rlsProcsRow, rlsRefRow}}, floorOf...) {
				if p, f := row(pair[0]), row(pair[1]); p >= 0 && f >= 0 {
					a, b := results[p], results[f]
					t.Logf("%s / %s, median over rounds: ops/s %.2f×, p99 %.2f×, srv-cpu/op %.2f×", pair[0], pair[1],
						medianRatio(a, b, func(r loadResult) float64 { return r.ops }),
						medianRatio(a, b, func(r loadResult) float64 { return float64(r.p99) }),
						medianRatio(a, b, func(r loadResult) float64 { return float64(r.srvCPUOp) }))
				}
			}
			for i, dr := range drivers {
				names, pids = append(names, dr.name), append(pids, dr.pids)
				medians = append(medians, median(results[i]))
				ratio := 0.0
				if ref >= 0 {
					ratio = medianRatio(results[i], results[ref], func(r loadResult) float64 { return r.ops })
				}
				ratios = append(ratios, ratio)
			}
		})
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nmedian of %d rounds of %v, %d callers, GOMAXPROCS=%d\n", rounds, d, loadCallers, runtime.GOMAXPROCS(0))
	fmt.Fprintf(&sb, "| %-36s | %10s | %9s | %9s | %9s | %11s | %9s | %8s |\n", "driver", "ops/s", "p50", "p99", "cpu/op", "srv-cpu/op", "preempt/s", "x redis")
	fmt.Fprintf(&sb, "|%s|%s|%s|%s|%s|%s|%s|%s|\n", strings.Repeat("-", 38), strings.Repeat("-", 12), strings.Repeat("-", 11), strings.Repeat("-", 11), strings.Repeat("-", 11), strings.Repeat("-", 13), strings.Repeat("-", 11), strings.Repeat("-", 10))
	for i, m := range medians {
		srv, ratio := "-", "-"
		if len(pids[i]) > 0 {
			srv = m.srvCPUOp.Round(10 * time.Nanosecond).String()
		}
		if ratios[i] > 0 {
			ratio = fmt.Sprintf("%.2f", ratios[i])
		}
		fmt.Fprintf(&sb, "| %-36s | %10.0f | %9v | %9v | %9v | %11s | %9.0f | %8s |\n", names[i], m.ops,
			m.p50.Round(time.Microsecond), m.p99.Round(time.Microsecond), m.cpuOp.Round(10*time.Nanosecond), srv, m.preempt, ratio)
	}
	sb.WriteString("x redis: median over rounds of ops/s divided by redis-lua keys=10000's in the same round\n")
	t.Log(sb.String())
}

// redisDrivers starts Redis and returns the redis-lua rows (1 and 10 000
// keys). The policy mirrors the ringlimit rows' (2^50 per 1 s: everything
// is admitted).
func redisDrivers(t *testing.T) []loadDriver {
	addr, pid := startRedisProc(t)
	conns, sha := redisCallers(t, addr)
	limit, window := strconv.FormatInt(1<<50, 10), strconv.FormatInt(time.Second.Milliseconds(), 10)
	var out []loadDriver
	for _, distinct := range []int{1, 10000} {
		keys := loadKeys(distinct)
		logs, seqs := make([]string, distinct), make([]string, distinct)
		for i, k := range keys {
			logs[i], seqs[i] = redisKeys(k)
		}
		out = append(out, loadDriver{
			name: fmt.Sprintf("redis-lua keys=%d", distinct), pids: []int{pid},
			call: func(c, i int) error {
				s := i % distinct
				ok, err := redisEval(conns[c], sha, logs[s], seqs[s], limit, window, "")
				if err == nil && !ok {
					err = errors.New("redis-lua refused a request under a limit of 2^50")
				}
				return err
			},
		})
	}
	return append(out, redisWaitDriver(t))
}

// redisCallers opens one connection per caller to the Redis at addr
// (closed when t ends) and loads the exact sliding-log script, returning
// its SHA.
func redisCallers(t *testing.T, addr string) ([]*respConn, string) {
	pool := &respPool{addr: addr}
	t.Cleanup(pool.close)
	if err := pool.warm(loadCallers); err != nil {
		t.Fatal(err)
	}
	conns := make([]*respConn, loadCallers)
	for i := range conns {
		c, err := pool.get()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	return conns, redisLoad(t, conns[0], redisScriptExact)
}

// redisWaitDriver is the row of Redis with one replica and WAIT 1 (the
// durability sync replication gives): a second master with its own
// replica; each call sends EVALSHA and WAIT 1 in one pipeline and needs
// the replica's acknowledgement (WAIT answering 1, within 1 s).
func redisWaitDriver(t *testing.T) loadDriver {
	addr, pid := startRedisProc(t)
	replica := startRedisReplica(t, addr)
	conns, sha := redisCallers(t, addr)
	limit, window := strconv.FormatInt(1<<50, 10), strconv.FormatInt(time.Second.Milliseconds(), 10)
	keys := loadKeys(10000)
	logs, seqs := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		logs[i], seqs[i] = redisKeys(k)
	}
	wait := []string{"WAIT", "1", "1000"}
	return loadDriver{
		name: "redis-lua+replica WAIT 1 keys=10000", pids: []int{pid, replica},
		call: func(c, i int) error {
			s := i % len(keys)
			r, w, err := conns[c].do2([]string{"EVALSHA", sha, "2", logs[s], seqs[s], limit, window, ""}, wait)
			switch {
			case err != nil:
				return err
			case r.kind != ':' || r.n != 1:
				return fmt.Errorf("redis-lua+replica answered %+v, want an admission under a limit of 2^50", r)
			case w.kind != ':' || w.n < 1:
				return fmt.Errorf("WAIT 1 answered %+v: the replica did not acknowledge within 1 s", w)
			}
			return nil
		},
	}
}

// ringlimitDrivers starts a 3-node cluster whose policy replicates with
// mode and returns its sidecar and embedded rows.
func ringlimitDrivers(t *testing.T, mode peer.Replication) []loadDriver {
	nodes := startPeerClusterWith(t, 3, func(cfg *peer.Config) {
		p := cfg.Policies[peerPolicy]
		p.Replication = mode
		cfg.Policies[peerPolicy] = p
	})
	var clients []peerpb.RateLimiterClient
	for _, nd := range nodes {
		conn, err := grpc.NewClient(nd.RPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		clients = append(clients, peerpb.NewRateLimiterClient(conn))
	}
	var out []loadDriver
	sidecarKeys := []int{10000}
	if mode == peer.ReplicateSync {
		sidecarKeys = []int{1, 10000}
	}
	for _, distinct := range sidecarKeys {
		keys := loadKeys(distinct)
		wire := make([]*peerpb.AllowRequest, distinct)
		for i, k := range keys {
			wire[i] = &peerpb.AllowRequest{Key: &peerpb.Key{Tenant: k.Tenant, Subject: k.Subject, Policy: k.Policy}}
		}
		out = append(out, loadDriver{
			name: fmt.Sprintf("sidecar keys=%d repl=%v", distinct, mode),
			call: func(c, i int) error {
				resp, err := clients[i%3].Allow(context.Background(), wire[i%distinct])
				if err == nil && !resp.GetAllowed() {
					err = fmt.Errorf("refused: %v", resp)
				}
				return err
			},
		})
	}
	keys := loadKeys(10000)
	addrs := make([]string, len(nodes))
	for i, nd := range nodes {
		addrs[i] = nd.RPCAddr()
	}
	out = append(out, routedDriver(t, fmt.Sprintf("sidecar-routed keys=10000 repl=%v", mode), addrs, nil, ""))
	out = append(out, loadDriver{
		name: fmt.Sprintf("embedded keys=10000 repl=%v", mode),
		call: func(c, i int) error {
			d, err := nodes[i%3].Allow(context.Background(), peer.Request{Key: keys[i%len(keys)]})
			if err == nil && !d.Allowed {
				err = fmt.Errorf("refused: %+v", d)
			}
			return err
		},
	})
	return out
}

// routedDriver is the row of peer.Client (Placement + AllowStream) against
// the nodes at addrs, 10 000 keys (of policy pol, or the bench's default
// when ""); pids are server processes to count the CPU of. The client
// closes when t ends.
func routedDriver(t *testing.T, name string, addrs []string, pids []int, pol string) loadDriver {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	routed, err := peer.Dial(ctx, peer.ClientConfig{Addrs: addrs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { routed.Close() })
	keys := loadKeys(10000)
	if pol != "" {
		for i := range keys {
			keys[i].Policy = pol
		}
	}
	return loadDriver{
		name: name,
		pids: pids,
		call: func(c, i int) error {
			d, err := routed.Allow(context.Background(), peer.Request{Key: keys[i%len(keys)]})
			if err == nil && !d.Allowed {
				err = fmt.Errorf("refused: %+v", d)
			}
			return err
		},
	}
}
