package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// childNode is a node running as a child process: this binary's serve
// subcommand (or, under go test, the test binary in child mode).
type childNode struct {
	cmd      *exec.Cmd
	stdin    io.Closer
	grpcAddr string
	httpAddr string
	done     chan struct{} // closed when the child's stderr is drained
	reaped   sync.Once
}

// childEnvVar marks a re-executed process as the demo's child. The real
// binary ignores it (its arguments already say "serve"); the test binary's
// TestMain uses it to run main's code instead of the tests.
const childEnvVar = "RINGLIMIT_CHILD"

// startChild starts `<this executable> serve` as node name, joining join,
// with fast gossip and the policy file, and waits for its "serving" line.
// The child stops by itself if its stdin closes, so it never outlives the
// demo, even if the demo is killed.
func startChild(ctx context.Context, d *demo, name, join, policyPath string) (*childNode, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	cmd := exec.Command(exe, "serve", "--name", name,
		"--gossip-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--join", join, "--policies", policyPath, "--log-format", "json",
		"--gossip-key", filepath.Join(filepath.Dir(policyPath), "gossip.key"),
		// Info at least: the demo reads the "serving" line.
		"--log-level", strings.ToLower(min(d.level, slog.LevelInfo).String()),
		"--gossip-profile", "fast", "--exit-on-stdin-eof", "--drain-timeout", "2s")
	cmd.Env = childEnv(os.Environ())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start child %s: %w", name, err)
	}
	c := &childNode{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	serving := make(chan [2]string, 1)
	go c.readLog(stderr, name, d.stderr, d.level, serving)
	t := time.NewTimer(15 * time.Second)
	defer t.Stop()
	select {
	case addrs := <-serving:
		c.grpcAddr, c.httpAddr = addrs[0], addrs[1]
		return c, nil
	case <-c.done:
		c.stop()
		return nil, fmt.Errorf("child %s exited before serving", name)
	case <-t.C:
		c.stop()
		return nil, fmt.Errorf("child %s did not start serving within 15s", name)
	case <-ctx.Done():
		c.stop()
		return nil, ctx.Err()
	}
}

// members asks the child's /readyz how many members its ring has; 0 if it
// cannot tell.
func (c *childNode) members(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.httpAddr+"/readyz", nil)
	if err != nil {
		return 0
	}
	resp, err := (&http.Client{}).Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var body struct {
		Members int `json:"members"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&body) != nil {
		return 0
	}
	return body.Members
}

// readLog reads the child's JSON log: it reports the gRPC address from the
// "serving" line and passes lines at level or above on, prefixed with the
// name.
func (c *childNode) readLog(r io.Reader, name string, w io.Writer, level slog.Level, serving chan<- [2]string) {
	defer close(c.done)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var rec struct {
			Msg      string `json:"msg"`
			Level    string `json:"level"`
			GRPCAddr string `json:"grpc_addr"`
			HTTPAddr string `json:"http_addr"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) != nil {
			fmt.Fprintf(w, "[child %s] %s\n", name, sc.Bytes())
			continue
		}
		if rec.Msg == "serving" {
			select {
			case serving <- [2]string{rec.GRPCAddr, rec.HTTPAddr}:
			default:
			}
		}
		var l slog.Level
		if l.UnmarshalText([]byte(rec.Level)) != nil || l >= level {
			fmt.Fprintf(w, "[child %s] %s\n", name, sc.Bytes())
		}
	}
}

// stop kills the child if it still runs and reaps it.
func (c *childNode) stop() {
	_ = c.stdin.Close()
	_ = c.cmd.Process.Kill() // an error only says it has already exited
	c.reap()
}

// reap waits for the child's log to be drained, then for the process; it
// may be called more than once.
func (c *childNode) reap() {
	c.reaped.Do(func() {
		<-c.done // Wait must not run before the pipe's reads are done
		_ = c.cmd.Wait()
	})
}

// childEnv is the parent's environment without RINGLIMIT_* settings (the
// child gets everything it needs as flags), plus the child marker.
func childEnv(env []string) []string {
	out := make([]string, 0, len(env)+1)
	for _, e := range env {
		if !strings.HasPrefix(e, "RINGLIMIT_") {
			out = append(out, e)
		}
	}
	return append(out, childEnvVar+"=1")
}
