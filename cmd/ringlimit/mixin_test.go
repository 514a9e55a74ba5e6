package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// mixinDir holds the Grafana dashboard and the Prometheus alert rules.
const mixinDir = "deploy/mixin"

const mixinPolicies = `policies:
  - name: api
    limit: 100000
    window: 1m
  - name: hot
    limit: 100000
    window: 1m
    spread: auto
    spread_threshold: 5
`

var metricName = regexp.MustCompile(`\bringlimit_[a-z_]+`)

// mixinMetrics returns every ringlimit_ series the dashboard's queries and
// the alert rules name, sorted.
func mixinMetrics(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(mixinDir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Query any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	text := ""
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			text += q.Expr + "\n"
		}
	}
	for _, v := range dash.Templating.List {
		text += fmt.Sprint(v.Query) + "\n"
	}
	rules, err := os.ReadFile(filepath.Join(mixinDir, "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(rules), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			text += line + "\n"
		}
	}
	names := metricName.FindAllString(text, -1)
	slices.Sort(names)
	return slices.Compact(names)
}

// TestMixin: the alert rules pass promtool (check and their unit tests),
// and every series the dashboard and the rules name is on the /metrics of
// real serve processes once they have done the work that creates it.
//
// It runs beside other tests: it waits up to 30 s for the series.
func TestMixin(t *testing.T) {
	t.Parallel()
	names := mixinMetrics(t)
	if len(names) < 15 {
		t.Fatalf("the mixin names only %d series: %v", len(names), names)
	}
	t.Run("promtool", func(t *testing.T) {
		promtool, err := exec.LookPath("promtool")
		if err != nil {
			if os.Getenv("CI") != "" {
				t.Fatal("no promtool and CI is set: .ci/run installs Debian's prometheus package; the rules must be checked in CI")
			}
			t.Skip("SKIPPED: NO PROMTOOL. The alert rules were not checked (apt-get install -y prometheus)")
		}
		for _, args := range [][]string{{"check", "rules", "alerts.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
			cmd := exec.Command(promtool, args...)
			cmd.Dir = mixinDir
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
	})
	t.Run("metrics exist", func(t *testing.T) {
		pols := writeFile(t, t.TempDir(), "policies.yaml", mixinPolicies)
		a := startServe(t, "mx-a", nil, "--policies", pols, "--ops-addr", "127.0.0.1:0")
		b := startServe(t, "mx-b", nil, "--policies", pols, "--ops-addr", "127.0.0.1:0", "--join", a.gossipAddr)
		nodes := []*serveProc{a, b}
		exposed := func() (missing []string) {
			var all string
			for _, p := range nodes {
				r, err := httpDo("GET", "http://"+p.opsAddr+"/metrics", "")
				if err != nil {
					return names
				}
				all += r.raw
			}
			for _, n := range names {
				if !regexp.MustCompile(`(?m)^` + n + `[{ ]`).MatchString(all) {
					missing = append(missing, n)
				}
			}
			return missing
		}
		// Decisions through both nodes (forwards, replication to
		// backups), and a spread key hot at both (rights granted).
		deadline := time.Now().Add(30 * time.Second)
		var missing []string
		for i := 0; time.Now().Before(deadline); i++ {
			for j, p := range nodes {
				_, _ = httpDo("POST", "http://"+p.httpAddr+"/v1/check", fmt.Sprintf(`{"tenant":"acme","subject":"u-%d","policy":"api"}`, (i+j)%16))
				_, _ = httpDo("POST", "http://"+p.httpAddr+"/v1/check", `{"tenant":"acme","subject":"hot","policy":"hot"}`)
			}
			if i%20 == 0 {
				if missing = exposed(); len(missing) == 0 {
					return
				}
			}
		}
		t.Errorf("series the mixin names are not on any node's /metrics after 30 s of traffic: %v", missing)
	})
}
