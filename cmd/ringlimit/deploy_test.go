package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

const deployDir = "deploy/kubernetes"

// manifestDocs parses every YAML document of the manifests directory.
func manifestDocs(t *testing.T) map[string][]map[string]any {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(deployDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", deployDir, err)
	}
	out := map[string][]map[string]any{} // kind -> documents
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var doc map[string]any
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			kind, _ := doc["kind"].(string)
			out[kind] = append(out[kind], doc)
		}
	}
	return out
}

// dig walks maps and lists: dig(doc, "spec", "template", 0, ...).
func dig(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, _ := v.(map[string]any)
			v = m[k]
		case int:
			l, _ := v.([]any)
			if k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

// envRef matches a Kubernetes $(VAR) reference.
var envRef = regexp.MustCompile(`\$\([A-Z_]+\)`)

// TestDeployManifests checks the Kubernetes manifests against serve: every
// flag and RINGLIMIT_* variable they pass parses in serve's flag set,
// every HTTP path they probe is served, and the pieces the docs promise
// are there.
func TestDeployManifests(t *testing.T) {
	t.Parallel()
	docs := manifestDocs(t)
	if len(docs["StatefulSet"]) != 1 {
		t.Fatalf("want one StatefulSet, got %d", len(docs["StatefulSet"]))
	}
	ss := docs["StatefulSet"][0]
	pod := dig(ss, "spec", "template", "spec")
	c := dig(pod, "containers", 0)
	var args []string
	for _, a := range dig(c, "args").([]any) {
		args = append(args, envRef.ReplaceAllString(a.(string), "10.0.0.7"))
	}
	if len(args) == 0 || args[0] != "serve" {
		t.Fatalf("container args %q, want serve first", args)
	}
	flags := args[1:]
	for _, e := range dig(c, "env").([]any) {
		name := dig(e, "name").(string)
		if f, ok := strings.CutPrefix(name, "RINGLIMIT_"); ok {
			flags = append(flags, "--"+strings.ReplaceAll(strings.ToLower(f), "_", "-")+"=ringlimit-0")
		}
	}
	var stderr bytes.Buffer
	f, err := parseServeFlags(flags, &stderr)
	if err != nil {
		t.Fatalf("serve rejects the manifest's flags %q: %v\n%s", flags, err, stderr.String())
	}
	if !strings.HasPrefix(f.join, "dns+ringlimit-gossip.") || !strings.HasSuffix(f.join, ":7946") || string(f.gossipProfile) != "lan" {
		t.Errorf("join %q, profile %q: want dns+ringlimit-gossip.<ns>...:7946 and lan", f.join, f.gossipProfile)
	}
	if f.gossipKey == "" || f.tlsCert == "" || f.policies == "" {
		t.Errorf("manifest lacks --gossip-key, --tls-* or --policies: %q", flags)
	}
	grace, _ := dig(pod, "terminationGracePeriodSeconds").(int)
	if time.Duration(grace)*time.Second < f.drainTimeout+5*time.Second {
		t.Errorf("terminationGracePeriodSeconds %d does not cover --drain-timeout %v plus leaving", grace, f.drainTimeout)
	}

	// The HTTP decision API stays on the pod's loopback; the probes and
	// the scraper use the ops listener (issue 53 item 8).
	opsPort := checkDeployPorts(t, f, c)
	// Probed paths are served by serve's ops mux, on the ops port.
	mux := (&httpAPI{}).opsHandler().(*http.ServeMux)
	for probe, want := range map[string]string{"readinessProbe": "/readyz", "livenessProbe": "/healthz"} {
		path, _ := dig(c, probe, "httpGet", "path").(string)
		if path != want {
			t.Errorf("%s path %q, want %q", probe, path, want)
		}
		if _, pattern := mux.Handler(httptestRequest("GET", path)); pattern == "" {
			t.Errorf("%s probes %s, which serve's ops listener does not serve", probe, path)
		}
		if port := dig(c, probe, "httpGet", "port"); port != "ops" && port != opsPort {
			t.Errorf("%s probes port %v, want the ops port (ops, %d)", probe, port, opsPort)
		}
	}
	if dig(c, "resources", "requests") == nil || dig(c, "resources", "limits") == nil {
		t.Error("container lacks resource requests or limits")
	}

	var headless bool
	for _, s := range docs["Service"] {
		if dig(s, "spec", "clusterIP") == "None" && dig(s, "spec", "publishNotReadyAddresses") == true {
			headless = true // gossip discovery's (Envoy's, ringlimit-rls, lists ready pods only)
		}
	}
	if !headless {
		t.Error("want a headless Service with publishNotReadyAddresses: true")
	}
	if len(docs["PodDisruptionBudget"]) != 1 || dig(docs["PodDisruptionBudget"][0], "spec", "maxUnavailable") != 1 {
		t.Error("want a PodDisruptionBudget with maxUnavailable: 1")
	}
	// The policy ConfigMap parses as a policy file.
	cm := docs["ConfigMap"]
	if len(cm) != 1 {
		t.Fatalf("want one ConfigMap, got %d", len(cm))
	}
	if _, _, err := parsePolicyFile([]byte(dig(cm[0], "data", "policies.yaml").(string))); err != nil {
		t.Errorf("the ConfigMap's policies.yaml: %v", err)
	}
	if img, _ := dig(c, "image").(string); !strings.HasPrefix(img, "ringlimit:") {
		t.Errorf("image %q, want the ringlimit image the Dockerfile builds", img)
	}
	checkDeploySafety(t, ss, pod, c, mux)
}

// checkDeploySafety checks what issue 53 item 11 found missing: an odd
// replica count of 3 or more (the log needs a majority: never 2),
// OrderedReady (Parallel pods found clusters that never merge), a hard
// spread over machines, GOMEMLIMIT below the memory limit, and a scrape
// configuration of /metrics on the ops port.
func checkDeploySafety(t *testing.T, ss, pod, c any, mux *http.ServeMux) {
	t.Helper()
	if r, _ := dig(ss, "spec", "replicas").(int); r < 3 || r%2 == 0 {
		t.Errorf("replicas %v: want 3 or 5 (odd, at least 3; never 2)", dig(ss, "spec", "replicas"))
	}
	if p := dig(ss, "spec", "podManagementPolicy"); p != "OrderedReady" {
		t.Errorf("podManagementPolicy %v: want OrderedReady, stated (Parallel pods found separate clusters)", p)
	}
	spread := false
	for _, tsc := range asList(dig(pod, "topologySpreadConstraints")) {
		if dig(tsc, "topologyKey") == "kubernetes.io/hostname" && dig(tsc, "whenUnsatisfiable") == "DoNotSchedule" &&
			dig(tsc, "maxSkew") == 1 && dig(tsc, "labelSelector", "matchLabels", "app.kubernetes.io/name") == "ringlimit" {
			spread = true
		}
	}
	for _, term := range asList(dig(pod, "affinity", "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution")) {
		spread = spread || dig(term, "topologyKey") == "kubernetes.io/hostname"
	}
	if !spread {
		t.Error("pods are not spread over machines: want a topologySpreadConstraint on kubernetes.io/hostname (DoNotSchedule, maxSkew 1) or a required podAntiAffinity")
	}

	limit, err := parseQuantity(fmt.Sprint(dig(c, "resources", "limits", "memory")))
	if err != nil {
		t.Errorf("memory limit: %v", err)
	}
	var goMem string
	for _, e := range asList(dig(c, "env")) {
		if dig(e, "name") == "GOMEMLIMIT" {
			goMem, _ = dig(e, "value").(string)
		}
	}
	soft, err := parseQuantity(strings.TrimSuffix(goMem, "B"))
	if err != nil || goMem == "" {
		t.Errorf("GOMEMLIMIT %q: want one beside the memory limit (%v)", goMem, err)
	} else if soft < limit*7/10 || soft >= limit {
		t.Errorf("GOMEMLIMIT %s against a memory limit of %d bytes: want 70-99 %% of it", goMem, limit)
	}

	// Scraping: the annotations and the PodMonitor name the ops port and
	// a path serve's ops listener serves.
	var opsPort int
	for _, p := range asList(dig(c, "ports")) {
		if dig(p, "name") == "ops" {
			opsPort, _ = dig(p, "containerPort").(int)
		}
	}
	ann := dig(ss, "spec", "template", "metadata", "annotations")
	path, _ := dig(ann, "prometheus.io/path").(string)
	if opsPort == 0 || dig(ann, "prometheus.io/scrape") != "true" || dig(ann, "prometheus.io/port") != fmt.Sprint(opsPort) || path != "/metrics" {
		t.Errorf("pod annotations %v: want prometheus.io/scrape \"true\", port %d (ops), path /metrics", ann, opsPort)
	}
	if _, pattern := mux.Handler(httptestRequest("GET", path)); pattern == "" {
		t.Errorf("the scrape path %q is not served", path)
	}
	data, err := os.ReadFile(filepath.Join(deployDir, "monitoring", "podmonitor.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var pm map[string]any
	if err := yaml.Unmarshal(data, &pm); err != nil {
		t.Fatalf("podmonitor.yaml: %v", err)
	}
	ep := dig(pm, "spec", "podMetricsEndpoints", 0)
	if pm["kind"] != "PodMonitor" || dig(pm, "spec", "selector", "matchLabels", "app.kubernetes.io/name") != "ringlimit" ||
		dig(ep, "port") != "ops" || dig(ep, "path") != "/metrics" {
		t.Errorf("podmonitor.yaml: %v; want a PodMonitor of the ringlimit pods' ops port, /metrics", pm)
	}
}

// checkDeployPorts checks the listeners the manifest gives serve (f, the
// container c): the HTTP decision API on 127.0.0.1 (plaintext and
// unauthenticated, so off the pod network, and no containerPort for it),
// and an ops listener on all interfaces whose port is the containerPort
// named ops. It returns that port.
func checkDeployPorts(t *testing.T, f serveFlags, c any) int {
	t.Helper()
	if host, _, err := net.SplitHostPort(f.httpAddr); err != nil || host != "127.0.0.1" {
		t.Errorf("--http-addr %q: want 127.0.0.1:PORT (the decision API is unauthenticated: keep it off the pod network)", f.httpAddr)
	}
	host, port, err := net.SplitHostPort(f.opsAddr)
	if err != nil || host != "0.0.0.0" {
		t.Errorf("--ops-addr %q: want 0.0.0.0:PORT, for the kubelet's probes and Prometheus", f.opsAddr)
	}
	var opsPort int
	for _, p := range asList(dig(c, "ports")) {
		switch dig(p, "name") {
		case "ops":
			opsPort, _ = dig(p, "containerPort").(int)
		case "http":
			t.Errorf("container port http %v: the decision API listens on loopback, so it has no port on the pod network", dig(p, "containerPort"))
		}
	}
	if opsPort == 0 || port != strconv.Itoa(opsPort) {
		t.Errorf("--ops-addr %q, containerPort ops %d: want a port named ops that is --ops-addr's", f.opsAddr, opsPort)
	}
	return opsPort
}

// asList is v as a YAML list (nil when it is not one).
func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// parseQuantity reads a Kubernetes memory quantity (bytes, or with a Ki,
// Mi, Gi suffix) as bytes.
func parseQuantity(q string) (int64, error) {
	mult := int64(1)
	for suffix, m := range map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30} {
		if s, ok := strings.CutSuffix(q, suffix); ok {
			q, mult = s, m
		}
	}
	n, err := strconv.ParseInt(q, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("quantity %q: want a positive number of bytes, Ki, Mi or Gi", q)
	}
	return n * mult, nil
}

func httptestRequest(method, path string) *http.Request {
	r, _ := http.NewRequest(method, "http://x"+path, nil)
	return r
}

// TestDeployDockerfile runs the Dockerfile's go build line (no container
// runtime here) into a temporary directory and checks the binary runs, and
// that the run-time stage is shell-free and non-root.
func TestDeployDockerfile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel()
	data, err := os.ReadFile(filepath.Join(deployDir, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var run string
	var froms []string
	user, entry := "", ""
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.HasPrefix(line, "RUN ") && strings.Contains(line, " go build "):
			run = strings.TrimPrefix(line, "RUN ")
		case strings.HasPrefix(line, "FROM "):
			froms = append(froms, line)
		case strings.HasPrefix(line, "USER "):
			user = line
		case strings.HasPrefix(line, "ENTRYPOINT "):
			entry = line
		}
	}
	if len(froms) != 2 || !strings.HasPrefix(froms[0], "FROM golang:1.26") ||
		!(strings.Contains(froms[1], "distroless/static") || strings.Contains(froms[1], "scratch")) {
		t.Errorf("stages %q, want golang:1.26 then distroless/static or scratch", froms)
	}
	if u := strings.TrimPrefix(user, "USER "); user == "" || u == "root" || u == "0" || strings.HasPrefix(u, "root:") || strings.HasPrefix(u, "0:") {
		t.Errorf("USER line %q, want a non-root user", user)
	}
	if !strings.HasPrefix(entry, `ENTRYPOINT ["`) {
		t.Errorf("ENTRYPOINT %q, want the exec form (no shell at run time)", entry)
	}
	fields := strings.Fields(run)
	var env []string
	for len(fields) > 0 && strings.Contains(fields[0], "=") {
		env, fields = append(env, fields[0]), fields[1:]
	}
	if len(fields) < 2 || fields[0] != "go" || fields[1] != "build" || !strings.Contains(run, "CGO_ENABLED=0") {
		t.Fatalf("RUN line %q, want CGO_ENABLED=0 go build ...", run)
	}
	bin := filepath.Join(t.TempDir(), "ringlimit")
	for i := range fields {
		if fields[i] == "-o" && i+1 < len(fields) {
			fields[i+1] = bin
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", fields[1:]...)
	build.Dir = filepath.Join("..", "..") // the Dockerfile builds from the repository root
	build.Env = append(os.Environ(), env...)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", run, err, out)
	}
	out, err := exec.CommandContext(ctx, bin, "help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ringlimit help") {
		t.Errorf("%s help: %v\n%s", bin, err, out)
	}
}
