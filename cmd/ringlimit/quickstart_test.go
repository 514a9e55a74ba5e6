package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readmeBlocks returns the ```lang blocks of README.md between the
// markers <!-- name:begin --> and <!-- name:end -->, in order, joined.
func readmeBlocks(t *testing.T, name, lang string) string {
	t.Helper()
	return readmeBlocksOf(t, "README.md", name, lang)
}

// readmeBlocksOf is readmeBlocks of the markdown file file.
func readmeBlocksOf(t *testing.T, file, name, lang string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	begin, end := "<!-- "+name+":begin -->", "<!-- "+name+":end -->"
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no %s ... %s section", file, begin, end)
	}
	var out strings.Builder
	in := false
	for _, line := range strings.Split(s[i+len(begin):j], "\n") {
		switch {
		case !in && line == "```"+lang:
			in = true
		case in && line == "```":
			in = false
		case in:
			out.WriteString(line + "\n")
		}
	}
	if out.Len() == 0 {
		t.Fatalf("%s's %s section has no ```%s block", file, name, lang)
	}
	return out.String()
}

// quickStart returns the shell commands of the repository's top-level
// README.md quick start: the ```sh blocks between the quickstart markers,
// in order.
func quickStart(t *testing.T) string {
	t.Helper()
	return readmeBlocksOf(t, filepath.Join("..", "..", "README.md"), "quickstart", "sh")
}

// TestQuickStart runs the top-level README.md's quick start as written, from the
// repository root, with bash and curl (the block builds the binary
// itself); a port the block names is replaced by a free one only if
// something else holds it here. It fails on the first command that fails
// (bash -e), checks that the examples got the answers the text promises,
// and that the block's last step stopped every node it started.
func TestQuickStart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and starts three nodes")
	}
	for _, tool := range []string{"bash", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the quick start needs %s: %v", tool, err)
		}
	}
	t.Parallel()
	script := freePorts(t, quickStart(t))
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-c", script)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir()) // mktemp -d's parent
	// Its own process group: the nodes are killed with it, whatever the
	// script did.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	err = cmd.Wait()
	got := out.String()
	if err != nil {
		t.Fatalf("the quick start failed: %v\nscript:\n%s\noutput:\n%s", err, script, got)
	}
	// Every process the block started is gone: its kill and wait
	// stopped the nodes (nothing is left in the script's process group).
	if err := syscall.Kill(-cmd.Process.Pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("processes of the quick start still run after it ended (kill -0 of its group: %v)", err)
	}
	for _, want := range []string{
		`{"members":3,"status":"ready"}`,
		"HTTP/1.1 200 OK",
		`Ratelimit-Policy: "per_second";q=10;w=1`,
		`"limits":[{"policy":"per_second"`,
		`"reason":"peek"`,
		`"reason":"released"`,
		"decision     ALLOWED",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the quick start's output lacks %q:\n%s", want, got)
		}
	}
	for _, bad := range []string{"unknown policy", `"error"`, "UNREACHABLE"} {
		if strings.Contains(got, bad) {
			t.Errorf("the quick start's output has %q:\n%s", bad, got)
		}
	}
}

// freePorts returns script with each 127.0.0.1 port it names kept if it is
// free here (TCP and UDP: gossip uses both), and otherwise replaced,
// everywhere it appears, by a free one.
func freePorts(t *testing.T, script string) string {
	t.Helper()
	seen := map[string]bool{}
	for _, m := range regexp.MustCompile(`127\.0\.0\.1:(\d+)`).FindAllStringSubmatch(script, -1) {
		port := m[1]
		if seen[port] {
			continue
		}
		seen[port] = true
		if portFree(port) {
			continue
		}
		var free string
		for free == "" || !portFree(free) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			free = fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
			_ = l.Close()
		}
		t.Logf("port %s is taken here: the quick start runs with %s instead", port, free)
		script = regexp.MustCompile(`\b`+port+`\b`).ReplaceAllString(script, free)
	}
	return script
}

// portFree reports whether port on 127.0.0.1 can be bound for TCP and UDP.
func portFree(port string) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+port)
	if err != nil {
		return false
	}
	defer l.Close()
	p, err := net.ListenPacket("udp", "127.0.0.1:"+port)
	if err != nil {
		return false
	}
	_ = p.Close()
	return true
}
