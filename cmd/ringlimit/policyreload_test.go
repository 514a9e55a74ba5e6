package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// rollPolicies is the table of TestReloadRolling with limit l for "roll".
func rollPolicies(l int) string {
	return fmt.Sprintf("policies:\n  - name: roll\n    limit: %d\n    window: 1s\n", l)
}

// configMapDir lays out dir as a Kubernetes ConfigMap volume does
// (policies.yaml -> ..data/policies.yaml, ..data -> a versioned directory)
// and returns the path a node reads. Calling it again swaps ..data to a
// new directory with an atomic rename, as the kubelet does.
func configMapDir(t *testing.T, dir, data string, gen int) string {
	t.Helper()
	ver := filepath.Join(dir, fmt.Sprintf("..v%d", gen))
	if err := os.Mkdir(ver, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, ver, "policies.yaml", data)
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ver), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "policies.yaml")
	if _, err := os.Lstat(p); err != nil {
		if err := os.Symlink(filepath.Join("..data", "policies.yaml"), p); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// replaceFile replaces dir/name with data atomically (write, then rename),
// so the node's file poll never reads half a file.
func replaceFile(t *testing.T, dir, name, data string) {
	t.Helper()
	tmp := writeFile(t, dir, name+".tmp", data)
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// rollAnswer is one /v1/check answer of TestReloadRolling.
type rollAnswer struct {
	status    int
	rolling   bool // answered after the warm-up, while or after the roll
	key       int
	limit     int64
	decidedAt int64
	owner     string
}

// metricValue returns the value of the first /metrics line starting with
// name (with its labels, if any), or "" if there is none.
func metricValue(t *testing.T, p *serveProc, name string) string {
	t.Helper()
	r := doHTTP(t, "GET", "http://"+p.httpAddr+"/metrics", "")
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(r.raw)
	if m == nil {
		return ""
	}
	return m[1]
}

// TestReloadRolling changes a policy's limit on three serve processes one
// after another, under load: two by SIGHUP, one by a ConfigMap-style
// symlink swap that only the file poll notices. The roll causes no
// unavailability (no member ignored, every node ready, no 503), every
// admission respects the limit its answer reports (counted over the
// window at the holder's decision times), a bad file is rejected with the
// old table kept, and the metric shows the version each node runs.
func TestReloadRolling(t *testing.T) {
	t.Parallel()
	const window = time.Second
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "cm"), 0o700); err != nil {
		t.Fatal(err)
	}
	files := []string{
		writeFile(t, dir, "p0.yaml", rollPolicies(20)),
		writeFile(t, dir, "p1.yaml", rollPolicies(20)),
		configMapDir(t, filepath.Join(dir, "cm"), rollPolicies(20), 1),
	}
	// A forward that waits past the default half second for a live owner
	// (the race detector on a loaded machine) is a 503 that is not the
	// roll's: give the owner time; a 503 then means the roll's fault.
	poll := []string{"--policies-poll", "100ms", "--forward-timeout", "5s"}
	n0 := startServe(t, "roll-0", nil, append([]string{"--policies", files[0]}, poll...)...)
	n1 := startServe(t, "roll-1", nil, append([]string{"--policies", files[1], "--join", n0.gossipAddr}, poll...)...)
	n2 := startServe(t, "roll-2", nil, append([]string{"--policies", files[2], "--join", n0.gossipAddr}, poll...)...)
	nodes := []*serveProc{n0, n1, n2}
	for _, p := range nodes {
		waitFor(t, 20*time.Second, p.name+" to be ready with 3 members", func() bool {
			r := doHTTP(t, "GET", "http://"+p.httpAddr+"/readyz", "")
			return r.status == 200 && r.body["members"] == 3.0
		})
	}
	oldVersion := metricValue(t, n0, "ringlimit_policy_table_version")
	if oldVersion == "" {
		t.Fatal("no ringlimit_policy_table_version on /metrics")
	}

	var (
		mu      sync.Mutex
		answers []rollAnswer
		stop    atomic.Bool
		wg      sync.WaitGroup
		other   atomic.Int64 // answers neither 200, 429 nor 503
		rolling atomic.Bool  // set once the warm-up is over
		last503 atomic.Int64 // unix ns of the last 503
	)
	const keys = 4
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				k := (w + i) % keys
				p := nodes[(w+i/keys)%len(nodes)]
				r, err := httpDo("POST", "http://"+p.httpAddr+"/v1/check", fmt.Sprintf(`{"tenant":"t","subject":"s%d","policy":"roll"}`, k))
				if err != nil {
					other.Add(1)
					continue
				}
				a := rollAnswer{status: r.status, key: k, rolling: rolling.Load()}
				var body struct {
					Limit     int64  `json:"limit"`
					DecidedAt int64  `json:"decided_at_unix_ns"`
					Owner     string `json:"owner"`
				}
				_ = json.Unmarshal([]byte(r.raw), &body)
				a.limit, a.decidedAt, a.owner = body.Limit, body.DecidedAt, body.Owner
				if r.status == 503 {
					last503.Store(time.Now().UnixNano())
				}
				if r.status == 503 && a.rolling {
					t.Logf("503 at %s from %s for s%d: %s", time.Now().Format("15:04:05.000"), p.name, k, r.raw)
				}
				switch r.status {
				case 200, 429, 503:
				default:
					other.Add(1)
				}
				mu.Lock()
				answers = append(answers, a)
				mu.Unlock()
			}
		}()
	}
	// applied waits until the load has run across p's change: 100 more
	// answers, and, if p decides for any of the keys, an answer p decided
	// under the new limit of 10. Conditions, not a fixed time.
	applied := func(p *serveProc) {
		t.Helper()
		mu.Lock()
		from := len(answers)
		holds := false
		for _, a := range answers {
			holds = holds || a.owner == p.name
		}
		mu.Unlock()
		waitFor(t, 20*time.Second, fmt.Sprintf("the load to run across %s's change", p.name), func() bool {
			mu.Lock()
			defer mu.Unlock()
			if len(answers) < from+100 {
				return false
			}
			for _, a := range answers[from:] {
				if !holds || a.owner == p.name && a.limit == 10 {
					return true
				}
			}
			return false
		})
	}
	reloaded := func(p *serveProc, n int) {
		t.Helper()
		waitFor(t, 10*time.Second, fmt.Sprintf("%s to log its reload #%d", p.name, n), func() bool {
			return strings.Count(p.logText(), `"msg":"policy table reloaded"`) >= n
		})
	}
	// Warm-up: right after the joins, partitions are still moving to the
	// new members and a few requests can time out waiting for them. That
	// is the join's, not the roll's: the roll starts once the load has run
	// 500 ms without a 503.
	start := time.Now()
	waitFor(t, 15*time.Second, "the cluster to settle (500 ms of load without a 503)", func() bool {
		return time.Since(start) > 500*time.Millisecond && time.Now().UnixNano()-max(last503.Load(), start.UnixNano()) > int64(500*time.Millisecond)
	})
	rolling.Store(true)
	t.Logf("warm-up %v; the roll starts", time.Since(start).Round(time.Millisecond))
	replaceFile(t, dir, "p0.yaml", rollPolicies(10))
	if err := n0.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	reloaded(n0, 1)
	applied(n0)
	replaceFile(t, dir, "p1.yaml", rollPolicies(10))
	if err := n1.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	reloaded(n1, 1)
	applied(n1)
	configMapDir(t, filepath.Join(dir, "cm"), rollPolicies(10), 2) // the poll finds it
	reloaded(n2, 1)
	applied(n2)
	// A bad file is rejected: logged, counted, the table stays.
	replaceFile(t, dir, "p0.yaml", "policies:\n  - name: roll\n    limit: -1\n    window: 1s\n")
	waitFor(t, 10*time.Second, "roll-0 to reject the bad file", func() bool {
		return strings.Contains(n0.logText(), `"msg":"policy reload rejected: the previous table stays"`)
	})
	// The load runs on until keys are admitted under the new table (a
	// window after the change, their old admissions have expired).
	waitFor(t, 20*time.Second, "an admission under the new limit", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, a := range answers {
			if a.status == 200 && a.limit == 10 {
				return true
			}
		}
		return false
	})
	stop.Store(true)
	wg.Wait()

	if got := metricValue(t, n0, `ringlimit_policy_reloads_total{result="rejected"}`); got != "1" {
		t.Errorf("roll-0 rejected reloads = %q, want 1", got)
	}
	var newVersion string
	for _, p := range nodes {
		v := metricValue(t, p, "ringlimit_policy_table_version")
		ring := doHTTP(t, "GET", "http://"+p.httpAddr+"/debug/ring", "")
		if fmt.Sprint(ring.body["policy_version"]) == "" || v == oldVersion {
			t.Errorf("%s runs version %s after the roll, still the old %s", p.name, v, oldVersion)
		}
		if newVersion != "" && v != newVersion {
			t.Errorf("%s runs version %s, another node %s: same file, same version expected", p.name, v, newVersion)
		}
		newVersion = v
		if l := p.logText(); strings.Contains(l, "member ignored") {
			t.Errorf("%s ignored a member during the roll", p.name)
		}
		if r := doHTTP(t, "GET", "http://"+p.httpAddr+"/readyz", ""); r.status != 200 {
			t.Errorf("%s /readyz after the roll = %d %s", p.name, r.status, r.raw)
		}
	}

	// Every admission respects the limit reported with it: the admissions
	// of its key in the window ending at its decision time number at most
	// that limit.
	byKey := make([][]rollAnswer, keys)
	var admitted, refused, unavailable, warm503 int
	limits := map[int64]int{}
	for _, a := range answers {
		switch a.status {
		case 200:
			admitted++
			byKey[a.key] = append(byKey[a.key], a)
			limits[a.limit]++
		case 429:
			refused++
		case 503:
			if a.rolling {
				unavailable++
			} else {
				warm503++
			}
		}
	}
	t.Logf("%d answers: %d admitted, %d refused, %d unavailable during the roll (%d in the warm-up), %d other; admissions by reported limit %v",
		len(answers), admitted, refused, unavailable, warm503, other.Load(), limits)
	if unavailable > 0 || other.Load() > 0 {
		t.Errorf("the roll caused %d unavailable and %d failed answers, want none", unavailable, other.Load())
	}
	if limits[20] == 0 || limits[10] == 0 {
		t.Errorf("admissions by reported limit %v: want some under each table", limits)
	}
	for k, as := range byKey {
		sort.Slice(as, func(i, j int) bool { return as[i].decidedAt < as[j].decidedAt })
		lo := 0
		for i, a := range as {
			if a.decidedAt == 0 {
				t.Fatalf("key s%d: an admission without decided_at_unix_ns", k)
			}
			for as[lo].decidedAt <= a.decidedAt-int64(window) {
				lo++
			}
			if n := i - lo + 1; int64(n) > a.limit {
				t.Fatalf("key s%d: %d admissions in the window ending at %d (decided by %s), above the limit %d it reported",
					k, n, a.decidedAt, a.owner, a.limit)
			}
		}
	}
}

// TestOverrideServe checks overrides through serve's HTTP API: the
// effective limit in the body and in RateLimit-Policy, an unlimited
// subject, and an override added by a reload.
func TestOverrideServe(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const base = `policies:
  - name: api
    limit: 2
    window: 1m
    overrides:
      - {tenant: bigco, limit: 5}
      - {tenant: acme, subject: internal, unlimited: true}
`
	file := writeFile(t, dir, "p.yaml", base)
	p := startServe(t, "over", nil, "--policies", file, "--policies-poll", "100ms")
	check := "http://" + p.httpAddr + "/v1/check"
	body := func(tenant, subject string) string {
		return fmt.Sprintf(`{"tenant":%q,"subject":%q,"policy":"api"}`, tenant, subject)
	}
	for _, tc := range []struct {
		name, tenant, subject string
		admits                int
		limit                 float64
		policyHeader          string
	}{
		{"policy limit", "acme", "alice", 2, 2, `"api";q=2;w=60`},
		{"tenant override", "bigco", "bob", 5, 5, `"api";q=5;w=60`},
		{"unlimited", "acme", "internal", 8, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 8 {
				r := doHTTP(t, "POST", check, body(tc.tenant, tc.subject))
				want := 200
				if i >= tc.admits {
					want = 429
				}
				if r.status != want || r.body["limit"] != tc.limit || r.header.Get("RateLimit-Policy") != tc.policyHeader {
					t.Fatalf("check #%d: %d %s RateLimit-Policy %q; want %d, limit %v, RateLimit-Policy %q",
						i, r.status, r.raw, r.header.Get("RateLimit-Policy"), want, tc.limit, tc.policyHeader)
				}
				if tc.limit == 0 && (r.body["reason"] != "unlimited" || r.header.Get("RateLimit-Reason") != "unlimited") {
					t.Fatalf("unlimited check #%d: %s, RateLimit-Reason %q", i, r.raw, r.header.Get("RateLimit-Reason"))
				}
			}
		})
	}
	// Hits are bounded by the key's own limit, and the error says which.
	r := doHTTP(t, "POST", check, `{"tenant":"bigco","subject":"new","policy":"api","hits":6}`)
	if e, _ := r.body["error"].(string); r.status != 400 || !strings.Contains(e, "limit 5") {
		t.Fatalf("hits 6 for bigco: %d %s; want 400 naming the limit 5", r.status, r.raw)
	}
	// A reload adds an override for alice: her log (2 admissions) now
	// counts against 3.
	replaceFile(t, dir, "p.yaml", base+"      - {tenant: acme, subject: alice, limit: 3}\n")
	waitFor(t, 10*time.Second, "the reload", func() bool {
		return strings.Contains(p.logText(), `"msg":"policy table reloaded"`)
	})
	for _, l := range strings.Split(p.logText(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(l), &rec) == nil && rec["msg"] == "policy table reloaded" && rec["node"] != p.name {
			t.Errorf("reload line without node=%s: %s", p.name, l)
		}
	}
	if r := doHTTP(t, "POST", check, body("acme", "alice")); r.status != 200 || r.body["limit"] != 3.0 || r.body["remaining"] != 0.0 {
		t.Fatalf("alice after her override: %d %s; want admitted, limit 3, remaining 0", r.status, r.raw)
	}
	if r := doHTTP(t, "POST", check, body("acme", "alice")); r.status != 429 {
		t.Fatalf("alice's 4th: %d %s; want 429", r.status, r.raw)
	}
}
