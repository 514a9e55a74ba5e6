package bench

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer"
)

// TestLoadDurability is what keeping admissions on disk costs the routed
// client (peer.Client: each key straight to its partition's holder, 64
// callers, 10 000 keys): a 3-node loopback cluster, each node with a data
// directory, and three policies alike but for their durability (memory,
// disk_async, disk), all under sync replication, so a disk admission is
// answered once it is fsynced on the holder and on its backup. The rows
// run one after another within each round, so a slow spell of the shared
// machine hits every row of a round; the table gives the medians over the
// rounds and the median of each round's ratio to memory. Opt-in
// (RINGLIMIT_LOAD_DURABILITY=1; RINGLIMIT_LOAD_DURATION and
// RINGLIMIT_LOAD_ROUNDS as for TestLoadSideBySide):
//
//	RINGLIMIT_LOAD_DURABILITY=1 RINGLIMIT_LOAD_ROUNDS=5 go test -run TestLoadDurability -v -timeout 10m ./bench/
func TestLoadDurability(t *testing.T) {
	if os.Getenv("RINGLIMIT_LOAD_DURABILITY") != "1" {
		t.Skip("opt-in: RINGLIMIT_LOAD_DURABILITY=1")
	}
	d, rounds := loadDuration(t), loadRounds(t)
	durs := []peer.Durability{peer.DurabilityMemory, peer.DurabilityDiskAsync, peer.DurabilityDisk}
	nodes, drivers := durabilityCluster(t, durs)
	// fsyncs is every node's data directory fsyncs so far, and their
	// wall time added up.
	fsyncs := func() (n uint64, took time.Duration) {
		for _, nd := range nodes {
			st := nd.Stats()
			n, took = n+st.DataDirSyncs, took+st.DataDirSyncTime
		}
		return n, took
	}
	t.Logf("fsyncs on an io_uring (their waiters parked): %v", nodes[0].Stats().DataDirAsyncSync)
	res := make([][]loadResult, len(durs))
	perDec := make([][]float64, len(durs))        // fsyncs per decision, all nodes
	perSync := make([][]time.Duration, len(durs)) // one fsync's mean wall time
	for r := range rounds {
		for i, dr := range drivers {
			f0, t0 := fsyncs()
			res[i] = append(res[i], runLoad(t, d, nil, dr.call))
			x := res[i][r]
			f1, t1 := fsyncs()
			perDec[i] = append(perDec[i], float64(f1-f0)/(x.ops*d.Seconds()))
			one := time.Duration(0)
			if f1 > f0 {
				one = (t1 - t0) / time.Duration(f1-f0)
			}
			perSync[i] = append(perSync[i], one)
			t.Logf("round %d %-50s %9.0f ops/s  p50 %v  p99 %v  cpu/op %v  fsyncs/op %.4f  fsync %v", r+1, dr.name, x.ops, x.p50.Round(time.Microsecond), x.p99.Round(time.Microsecond), x.cpuOp.Round(100*time.Nanosecond), perDec[i][r], one.Round(time.Microsecond))
		}
	}
	t.Logf("medians over %d rounds of %v (one fsync: its mean wall time, every node's):", rounds, d)
	t.Logf("| durability | decisions/s | p50 | p99 | CPU/decision | fsyncs/decision | one fsync | decisions/s ÷ memory's | p99 ÷ memory's |")
	t.Logf("|---|---|---|---|---|---|---|---|---|")
	for i, dur := range durs {
		m := median(res[i])
		f := slices.Clone(perDec[i])
		slices.Sort(f)
		one := slices.Clone(perSync[i])
		slices.Sort(one)
		t.Logf("| %v | %.0f | %v | %v | %v | %.3f | %v | %.2f | %.2f |", dur, m.ops, m.p50.Round(10*time.Microsecond), m.p99.Round(10*time.Microsecond), m.cpuOp.Round(100*time.Nanosecond), f[len(f)/2], one[len(one)/2].Round(10*time.Microsecond),
			medianRatio(res[i], res[0], func(r loadResult) float64 { return r.ops }),
			medianRatio(res[i], res[0], func(r loadResult) float64 { return float64(r.p99) }))
	}
}

// durPolicy is the name of the bench policy kept with durability dur.
func durPolicy(dur peer.Durability) string { return fmt.Sprintf("%s-%v", peerPolicy, dur) }

// durabilityCluster starts TestLoadDurability's cluster: 3 nodes, each
// with a data directory, one policy per durability in durs, and a routed
// driver for each.
func durabilityCluster(t *testing.T, durs []peer.Durability) ([]*peer.Node, []loadDriver) {
	t.Helper()
	base := t.TempDir()
	nodes := startPeerClusterWith(t, 3, func(cfg *peer.Config) {
		cfg.DataDir = filepath.Join(base, cfg.Name)
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		for _, dur := range durs {
			p := cfg.Policies[peerPolicy]
			p.Durability = dur
			cfg.Policies[durPolicy(dur)] = p
		}
	})
	addrs := make([]string, len(nodes))
	for i, nd := range nodes {
		addrs[i] = nd.RPCAddr()
	}
	drivers := make([]loadDriver, len(durs))
	for i, dur := range durs {
		drivers[i] = routedDriver(t, fmt.Sprintf("sidecar-routed keys=10000 repl=sync durability=%v", dur), addrs, nil, durPolicy(dur))
	}
	return nodes, drivers
}

// TestLoadDurabilityCapacity is TestLoadDurability's cluster driven at
// several caller counts, memory and disk alternately at each, to find
// each durability's capacity: the highest decisions/s any caller count
// reached (its median over the rounds). Few callers measure the wait
// (each caller has one decision in flight, so its rate is callers over
// the latency, and disk's latency includes two fsyncs, the holder's and
// the backup's); enough callers measure what the nodes can decide, which
// is what group commit is for. Opt-in (RINGLIMIT_LOAD_CAPACITY=1;
// RINGLIMIT_LOAD_CAPACITY_CALLERS, comma-separated, default
// 64,256,512,1024,2048; RINGLIMIT_LOAD_DURATION and RINGLIMIT_LOAD_ROUNDS
// as for TestLoadSideBySide):
//
//	RINGLIMIT_LOAD_CAPACITY=1 RINGLIMIT_LOAD_ROUNDS=3 RINGLIMIT_LOAD_DURATION=2s go test -run TestLoadDurabilityCapacity -v -timeout 20m ./bench/
func TestLoadDurabilityCapacity(t *testing.T) {
	if os.Getenv("RINGLIMIT_LOAD_CAPACITY") != "1" {
		t.Skip("opt-in: RINGLIMIT_LOAD_CAPACITY=1")
	}
	callers := []int{64, 256, 512, 1024, 2048}
	if s := os.Getenv("RINGLIMIT_LOAD_CAPACITY_CALLERS"); s != "" {
		callers = callers[:0]
		for f := range strings.SplitSeq(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				t.Fatalf("RINGLIMIT_LOAD_CAPACITY_CALLERS=%q: %q is not a positive integer", s, f)
			}
			callers = append(callers, n)
		}
	}
	d, rounds := loadDuration(t), loadRounds(t)
	durs := []peer.Durability{peer.DurabilityMemory, peer.DurabilityDisk}
	_, drivers := durabilityCluster(t, durs)
	res := make([][][]loadResult, len(callers)) // by callers, durability, round
	for c := range callers {
		res[c] = make([][]loadResult, len(durs))
	}
	for r := range rounds {
		for c, n := range callers {
			for i, dr := range drivers {
				x := runLoadN(t, d, n, nil, dr.call)
				res[c][i] = append(res[c][i], x)
				t.Logf("round %d callers %4d %-8v %9.0f ops/s  p50 %v  p99 %v  cpu/op %v", r+1, n, durs[i], x.ops, x.p50.Round(time.Microsecond), x.p99.Round(time.Microsecond), x.cpuOp.Round(100*time.Nanosecond))
			}
		}
	}
	t.Logf("medians over %d rounds of %v:", rounds, d)
	t.Logf("| callers | memory: decisions/s, p99 | disk: decisions/s, p99 | disk ÷ memory (decisions/s) |")
	t.Logf("|---|---|---|---|")
	peak := make([]loadResult, len(durs))
	peakAt := make([]int, len(durs))
	for c, n := range callers {
		m := make([]loadResult, len(durs))
		for i := range durs {
			m[i] = median(res[c][i])
			if m[i].ops > peak[i].ops {
				peak[i], peakAt[i] = m[i], n
			}
		}
		t.Logf("| %d | %.0f, %v | %.0f, %v | %.2f |", n, m[0].ops, m[0].p99.Round(10*time.Microsecond), m[1].ops, m[1].p99.Round(10*time.Microsecond),
			medianRatio(res[c][1], res[c][0], func(r loadResult) float64 { return r.ops }))
	}
	t.Logf("capacity: memory %.0f/s (%d callers), disk %.0f/s (%d callers): disk ÷ memory %.2f", peak[0].ops, peakAt[0], peak[1].ops, peakAt[1], peak[1].ops/peak[0].ops)
}
