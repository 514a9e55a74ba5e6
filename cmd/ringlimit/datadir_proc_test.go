package main

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// datadirPolicies: "probe" finds holders; "month", "api" and "conc" (a
// concurrency limit: its slots are held, never released here) keep their
// admissions on disk; "mem" keeps them in memory (the control).
const datadirPolicies = `policies:
  - name: probe
    limit: 1000000000
    window: 1h
  - name: month
    limit: 20
    window: calendar_month
    durability: disk
  - name: api
    limit: 20
    window: 1h
    durability: disk
  - name: conc
    limit: 20
    window: 1h
    algorithm: concurrency
    durability: disk
  - name: fast
    limit: 20
    window: 1h
    durability: disk_async
  - name: mem
    limit: 20
    window: 1h
`

// TestProcDataDirKill9: three `serve` processes with --data-dir, under
// load on policies with durability disk (sync replication), are killed
// with SIGKILL at once and started again with their directories. Every
// admission acknowledged before the kill still counts after it: through
// the restarted cluster each key admits at most its limit less what was
// acknowledged, so no window holds more than the limit, and a memory
// policy's key starts over. Under disk_async ("fast") the admissions lost
// are reported beside those acknowledged in the last flush interval (10
// ms) before the kill, the bound. Opt-in (RINGLIMIT_PROC_DATADIR=1): it starts
// six processes.
//
//	RINGLIMIT_PROC_DATADIR=1 go test -count=1 -run TestProcDataDirKill9 -v ./cmd/ringlimit/
func TestProcDataDirKill9(t *testing.T) {
	if os.Getenv("RINGLIMIT_PROC_DATADIR") != "1" {
		t.Skip("set RINGLIMIT_PROC_DATADIR=1 to run (six serve processes)")
	}
	root := t.TempDir()
	pols := writeFile(t, root, "policies.yaml", datadirPolicies)
	dirs := []string{filepath.Join(root, "a"), filepath.Join(root, "b"), filepath.Join(root, "c")}
	names := []string{"dd-a", "dd-b", "dd-c"}
	start := func() []*serveProc {
		args := func(i int) []string {
			return []string{"--policies", pols, "--data-dir", dirs[i], "--forward-timeout", "500ms"}
		}
		a := startServe(t, names[0], nil, args(0)...)
		b := startServe(t, names[1], nil, append(args(1), "--join", a.gossipAddr)...)
		c := startServe(t, names[2], nil, append(args(2), "--join", a.gossipAddr)...)
		nodes := []*serveProc{a, b, c}
		waitMembers(t, nodes, 3)
		waitSettled(t, nodes)
		return nodes
	}
	nodes := start()

	// Load: 8 callers over 12 keys of each disk policy, through every
	// node, until each key has been asked 30 times (bounded in count and
	// time); then the kill, while a last round is in flight.
	const keys, callers = 12, 8
	loadPols := []string{"api", "month", "conc", "fast"}
	var mu sync.Mutex
	acked := map[string]int{} // key → admissions acknowledged before the kill
	var ackTimes []time.Time  // when each "fast" admission was answered
	var wg sync.WaitGroup
	stop := make(chan struct{})
	deadline := time.Now().Add(20 * time.Second)
	for c := range callers {
		wg.Go(func() {
			for i := c; i < len(loadPols)*keys*30 && time.Now().Before(deadline); i += callers {
				select {
				case <-stop:
					return
				default:
				}
				pol := loadPols[i%len(loadPols)]
				o := askOp(nodes[i%3], opOf(pol), fmt.Sprint("k", (i/len(loadPols))%keys), pol)
				if o.admitted() {
					mu.Lock()
					acked[o.key]++
					if pol == "fast" {
						ackTimes = append(ackTimes, o.recv)
					}
					mu.Unlock()
				}
			}
		})
	}
	for range 5 {
		if o := ask(nodes[0], "m0", "mem"); !o.admitted() {
			t.Fatalf("memory key before the kill: %+v", o)
		}
	}
	// Kill once a third of the load is through, under load.
	waitFor(t, 20*time.Second, "load under way", func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, v := range acked {
			n += v
		}
		return n >= keys*len(loadPols)*20/3
	})
	killAt := time.Now()
	var kills sync.WaitGroup
	for _, p := range nodes {
		kills.Go(func() { _ = p.cmd.Process.Kill() })
	}
	kills.Wait()
	close(stop)
	wg.Wait()
	for _, p := range nodes {
		<-p.exited
	}
	mu.Lock()
	before := map[string]int{}
	total := 0
	for k, v := range acked {
		before[k] = v
		total += v
	}
	mu.Unlock()
	t.Logf("acknowledged before the kill: %d admissions over %d keys", total, len(before))

	restartAt := time.Now()
	nodes = start()
	t.Logf("restarted and settled in %v", time.Since(restartAt).Round(time.Millisecond))
	lost, over, asyncLost := 0, 0, 0
	for i := range keys {
		for _, pol := range loadPols {
			key := fmt.Sprint("k", i) + "/" + pol
			after := 0
			for range 21 {
				o := askOp(nodes[i%3], opOf(pol), fmt.Sprint("k", i), pol)
				if o.status == http.StatusTooManyRequests {
					break
				}
				if !o.admitted() {
					t.Fatalf("%s after the restart: %+v", key, o)
				}
				after++
			}
			if want := 20 - before[key]; pol == "fast" {
				asyncLost += max(0, after-want)
			} else if after > want {
				lost += after - want
				over++
				t.Errorf("%s: %d acknowledged before the kill, %d admitted after: %d acknowledged admissions lost", key, before[key], after, after-want)
			}
		}
	}
	if o := ask(nodes[1], "m0", "mem"); !o.admitted() || o.remaining != 19 {
		t.Errorf("memory key after the restart: %+v; want admitted with 19 left (its state was in memory)", o)
	}
	t.Logf("after the restart: %d acknowledged admissions lost, %d keys over their limit (durability disk)", lost, over)
	inLast := 0
	for _, at := range ackTimes {
		if at.After(killAt.Add(-10 * time.Millisecond)) {
			inLast++
		}
	}
	t.Logf("durability disk_async: %d acknowledged admissions lost; %d were answered in the last 10 ms before the kill", asyncLost, inLast)
}

// opOf is the /v1 operation that admits under datadirPolicies' policy pol:
// a concurrency policy takes a lease.
func opOf(pol string) string {
	if pol == "conc" {
		return "acquire"
	}
	return "check"
}
