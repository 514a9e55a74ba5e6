// Command ringlimit runs, demonstrates and queries the ringlimit distributed
// rate limiter. See usageText (or `ringlimit help`) for the subcommands.
//
// The command is wiring only: flags and environment become a peer.Config,
// and everything a library user would need lives in package peer.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
)

// usageText is printed by `ringlimit help` and on a usage error.
const usageText = `ringlimit: a distributed exact sliding-window rate limiter

Usage:
  ringlimit demo                 walk a 3-node cluster through the promise (< 30 s)
  ringlimit serve [flags]        run one node (gRPC API, HTTP API, metrics)
  ringlimit check [flags]        ask a running node for one decision
  ringlimit bench [flags]        measure decisions per second and latency
  ringlimit help [command]       show this text, or a command's flags

Exit codes:
  0  success (check: the request was allowed)
  1  error (bad flags, bad input, a failed demo promise, ...)
  2  check: refused, over limit
  3  check: unavailable (the node answered: the limiter could not decide)
  4  check: unreachable (no usable connection to the node: wrong address or
     port, node down, name not found, the other API's port (--http), a TLS
     mismatch (--tls-*); the error says which)

Every serve flag can also be set in the environment as RINGLIMIT_<FLAG>, with
dashes as underscores, uppercase (--gossip-addr -> RINGLIMIT_GOSSIP_ADDR).
A flag on the command line wins over the environment.
`

// main runs the command with signal handling and exits with its code.
func main() {
	os.Exit(mainExit(os.Args[1:], os.Stdout, os.Stderr))
}

// mainExit runs args with SIGINT and SIGTERM cancelling the context, and
// returns the process exit code. It is what main does, and what the test
// binary does in child mode, so both behave alike.
func mainExit(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return exitCode(run(ctx, args, stdout, stderr), stderr)
}

// run dispatches to a subcommand. It never calls os.Exit: its error tells
// main which exit code to use (see exitCode), so every subcommand can be
// tested in-process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	stdout, stderr = lockWriter(stdout), lockWriter(stderr)
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return usageError("no command given")
	}
	cmd, rest := args[0], args[1:]
	// "ringlimit CMD -h" is "ringlimit help CMD": help is asked for, so it
	// goes to stdout. (Help flags among other flags are the subcommand's
	// to handle.)
	if len(rest) == 1 && isHelpFlag(rest[0]) {
		if _, ok := commandUsage(cmd); ok {
			cmd, rest = "help", []string{cmd}
		}
	}
	switch cmd {
	case "demo":
		return runDemo(ctx, rest, stdout, stderr)
	case "serve":
		return runServe(ctx, rest, stdout, stderr)
	case "check":
		return runCheck(ctx, rest, stdout, stderr)
	case "bench":
		return runBench(ctx, rest, stdout, stderr)
	case "help", "-h", "-help", "--help":
		// Every help goes to stdout and exits 0; only usage errors go to
		// stderr.
		if len(rest) > 0 && rest[0] != "help" && !strings.HasPrefix(rest[0], "-") {
			text, ok := commandUsage(rest[0])
			if !ok {
				fmt.Fprint(stderr, usageText)
				return usageError(fmt.Sprintf("help: unknown command %q", rest[0]))
			}
			fmt.Fprint(stdout, text)
			return nil
		}
		fmt.Fprint(stdout, usageText)
		return nil
	default:
		fmt.Fprint(stderr, usageText)
		return usageError(fmt.Sprintf("unknown command %q", cmd))
	}
}

// commandUsage returns the help text of subcommand name.
func commandUsage(name string) (string, bool) {
	switch name {
	case "demo":
		return demoUsage, true
	case "serve":
		return serveUsageText() + policiesUsage + "\n" + domainsUsage, true
	case "check":
		return checkUsage, true
	case "bench":
		return benchUsage, true
	}
	return "", false
}

// isHelpFlag reports whether arg asks the flag package for help.
func isHelpFlag(arg string) bool {
	switch arg {
	case "-h", "-help", "--help", "--h":
		return true
	}
	return false
}

// exitError carries a specific exit code. A nil err means the command has
// already said everything (for example check printing "over limit").
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// Exit codes shared by every subcommand; check documents 2, 3 and 4.
const (
	exitOK          = 0
	exitFailure     = 1
	exitRefused     = 2
	exitUnavailable = 3
	exitUnreachable = 4
)

// usageError is a bad command line: exit code 1 (2 is check's "refused").
func usageError(msg string) error {
	return &exitError{code: exitFailure, err: errors.New(msg)}
}

// exitCode maps run's error to an exit code, printing it to stderr when it
// has something to say.
func exitCode(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(stderr, "ringlimit: %v\n", ee.err)
		}
		return ee.code
	}
	fmt.Fprintf(stderr, "ringlimit: %v\n", err)
	return exitFailure
}

// lockedWriter serialises writes, so that loggers on several goroutines and
// the command's own output never interleave inside one line or race on a
// caller's buffer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func lockWriter(w io.Writer) io.Writer {
	if lw, ok := w.(*lockedWriter); ok {
		return lw
	}
	return &lockedWriter{w: w}
}

// newLogger builds the command's slog logger: format "text" or "json" on w,
// at level, with memberlist's own chatter (component=memberlist) raised to
// Warn so that the node's lifecycle and "gossip membership" lines stand out.
// dropTime removes the time attribute (the demo prints its own timings).
func newLogger(w io.Writer, format string, level slog.Level, dropTime bool) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	if dropTime {
		opts.ReplaceAttr = func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}
	}
	var h slog.Handler
	switch format {
	case "", "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, fmt.Errorf("log format %q: want text or json", format)
	}
	return slog.New(componentFilter{h: h, min: level}), nil
}

// parseLevel maps debug, info, warn or error to a slog level.
func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("log level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

// componentFilter raises the minimum level of loggers derived with
// component=memberlist to Warn; everything else passes at the handler's
// level.
type componentFilter struct {
	h   slog.Handler
	min slog.Level
}

func (f componentFilter) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= f.min && f.h.Enabled(ctx, l)
}

func (f componentFilter) Handle(ctx context.Context, r slog.Record) error {
	return f.h.Handle(ctx, r)
}

func (f componentFilter) WithAttrs(as []slog.Attr) slog.Handler {
	g := componentFilter{h: f.h.WithAttrs(as), min: f.min}
	for _, a := range as {
		if a.Key == "component" && a.Value.String() == "memberlist" {
			g.min = max(g.min, slog.LevelWarn)
		}
	}
	return g
}

func (f componentFilter) WithGroup(name string) slog.Handler {
	return componentFilter{h: f.h.WithGroup(name), min: f.min}
}
