package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDeployReadmeWaitsForPortForward: the Kubernetes README's curl after
// `kubectl port-forward … &` waits for the forward to listen (it raced:
// `& curl` ran before the forward accepted connections and failed at
// once). Its curl line retries refused connections, with a bound, and runs
// as written (against a loopback server in place of the forward).
func TestDeployReadmeWaitsForPortForward(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(deployDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var forward, curl string
	for _, line := range strings.Split(string(raw), "\n") {
		switch {
		case strings.HasPrefix(line, "kubectl port-forward "):
			forward = line
		case forward != "" && curl == "" && strings.HasPrefix(line, "curl "):
			curl = line
		}
	}
	if forward == "" || curl == "" {
		t.Fatalf("the README has no port-forward line followed by a curl line:\n%s", raw)
	}
	if strings.Contains(forward, "curl") {
		t.Errorf("the port-forward line runs curl at once, racing the forward: %s", forward)
	}
	for _, flag := range []string{"--retry ", "--retry-connrefused", "--retry-max-time "} {
		if !strings.Contains(curl, flag) {
			t.Errorf("the curl line after the port-forward lacks %s (a refused connection must be retried, for a bounded time): %s", strings.TrimSpace(flag), curl)
		}
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("no curl to run the line with")
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/debug/ring" {
			_, _ = w.Write([]byte(`{"ring":"ok"}`))
			return
		}
		http.NotFound(w, r)
	}))
	defer srv.Close()
	const target = "localhost:8080"
	if !strings.Contains(curl, target) {
		t.Fatalf("the curl line does not ask %s: %s", target, curl)
	}
	line := strings.Replace(curl, target, strings.TrimPrefix(srv.URL, "http://"), 1)
	out, err := exec.Command("sh", "-c", line).CombinedOutput()
	if err != nil || string(out) != `{"ring":"ok"}` {
		t.Fatalf("%s: %v, output %q; want the forwarded /debug/ring", line, err, out)
	}
}
