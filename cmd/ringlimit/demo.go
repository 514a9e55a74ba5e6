package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/ringlimit/ringlimit/peer"
)

const demoUsage = `Usage: ringlimit demo [-v] [--log-level L] [--ui] [--ui-addr H:P]

Starts a 3-node ringlimit cluster on 127.0.0.1 inside this process, plus one
node as a child process (this same binary running "serve"), and walks through
what ringlimit promises, with real decisions:

  1. boundary burst: a fixed window admits 200 around its edge, the sliding log 100
  2. exact expiry: an admission expires exactly one window later, not 1 ms sooner
  3. one decision point: 3 local limiters admit 300, the cluster exactly 100
  4. graceful leave: a key's quota moves with it
  5. crash: the owner is SIGKILLed; requests are "unavailable", never "over limit",
     until the ring converges and decisions resume
  6. hot keys: each owner reports its heaviest keys
  7. a hot key spread: the node that does not hold it decides from rights
     the holder granted; no window over the limit, the windows full
  8. concurrency cap: leases never exceed the cap; a lease never released
     comes back after its TTL

Tables go to stdout, the nodes' logs to stderr: by default only their
warnings and errors (a crash's forward failures and takeover summaries), so
the walkthrough reads cleanly on a terminal. Exits 1 if any promise it shows
does not hold. Takes a few seconds; needs no network beyond loopback.

Flags:
  -v                  also log the nodes' lifecycle (gossip membership,
                      readiness, handoffs): --log-level info
  --log-level L       debug, info, warn or error (default warn)
  --ui                serve each node's console (the first at --ui-addr),
                      pause --ui-pause between steps, and keep the cluster
                      and its consoles up after the walkthrough, with light
                      traffic, until Ctrl-C
  --ui-addr H:P       the first node's console (default 127.0.0.1:8400)
  --ui-pause D        the pause between steps with --ui (default 3s)
`

// demoPolicies is the demo's policy table. The child node loads the same
// table from a file, so that every holder decides alike.
func demoPolicies() map[string]peer.PolicyConfig {
	return map[string]peer.PolicyConfig{
		"api":   {Limit: 100, Window: time.Minute},
		"login": {Limit: 5, Window: time.Minute},
		"feed":  {Limit: 1_000_000, Window: time.Minute, Algorithm: peer.TokenBucket},
		// At most 3 jobs in progress per subject; a lease not released
		// expires after demoLeaseTTL.
		"jobs": {Limit: 3, Window: demoLeaseTTL, Algorithm: peer.Concurrency},
		// One organisation-wide key, decided from rights by every node
		// that receives it once it is hot.
		"org": {Limit: demoSpreadLimit, Window: demoSpreadWindow, Spread: peer.SpreadAuto, SpreadThreshold: 200},
	}
}

// demo holds the walkthrough's output and the promises checked so far.
type demo struct {
	out    io.Writer
	log    *slog.Logger
	level  slog.Level // of log, and of the child's lines passed on
	stderr io.Writer
	// gossipKey encrypts the cluster's gossip and authenticates its peer
	// RPCs (the child reads it from gossip.key beside the policy file).
	gossipKey []byte
	held      []string
	failed    []string
	// ui serves the nodes' consoles (demo --ui); nil without.
	ui *demoUI
	// uiAddr and uiPause are --ui-addr and --ui-pause; "" without --ui.
	uiAddr  string
	uiPause time.Duration
}

// promise records and prints one checked promise.
func (d *demo) promise(ok bool, format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	if ok {
		d.held = append(d.held, msg)
		fmt.Fprintf(d.out, "  ✓ %s\n", msg)
		return
	}
	d.failed = append(d.failed, msg)
	fmt.Fprintf(d.out, "  ✗ FAILED: %s\n", msg)
}

func (d *demo) heading(format string, a ...any) {
	fmt.Fprintf(d.out, "\n== %s ==\n", fmt.Sprintf(format, a...))
}

// table returns a tabwriter for one aligned table; call Flush when done.
func (d *demo) table() *tabwriter.Writer {
	return tabwriter.NewWriter(d.out, 0, 0, 2, ' ', 0)
}

// runDemo runs the walkthrough. It returns an error (exit 1) if the cluster
// cannot be set up or any promise fails.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, demoUsage) }
	verbose := fs.Bool("v", false, "")
	levelName := fs.String("log-level", "warn", "")
	ui := fs.Bool("ui", false, "")
	uiAddr := fs.String("ui-addr", "127.0.0.1:8400", "")
	uiPause := fs.Duration("ui-pause", 3*time.Second, "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError("demo: " + err.Error())
	}
	if fs.NArg() > 0 {
		return usageError(fmt.Sprintf("demo: unexpected argument %q", fs.Arg(0)))
	}
	level, err := parseLevel(*levelName)
	if err != nil {
		return usageError("demo: " + err.Error())
	}
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "log-level" })
	if *verbose && !given {
		level = slog.LevelInfo
	}
	log, err := newLogger(stderr, "text", level, true)
	if err != nil {
		return err
	}
	start := time.Now()
	d := &demo{out: stdout, log: log, level: level, stderr: stderr}
	if *ui {
		if *uiPause < 0 {
			return usageError("demo: --ui-pause must not be negative")
		}
		d.uiAddr, d.uiPause = *uiAddr, *uiPause
	}
	fmt.Fprintln(stdout, "ringlimit demo: at most L admissions in any rolling window (t − W, t], cluster-wide")

	d.boundaryBurst()
	d.expiryEdge()
	if err := d.cluster(ctx); err != nil {
		return fmt.Errorf("demo: %w", err)
	}

	fmt.Fprintln(stdout)
	if len(d.failed) > 0 {
		fmt.Fprintf(stdout, "%d of %d promises FAILED (%.1fs):\n", len(d.failed), len(d.held)+len(d.failed), time.Since(start).Seconds())
		for _, f := range d.failed {
			fmt.Fprintf(stdout, "  - %s\n", f)
		}
		return &exitError{code: exitFailure, err: fmt.Errorf("demo: %d promises failed", len(d.failed))}
	}
	fmt.Fprintf(stdout, "all %d promises held (%.1fs)\n", len(d.held), time.Since(start).Seconds())
	return nil
}

// cluster runs steps 3 to 6 on a live cluster.
func (d *demo) cluster(ctx context.Context) error {
	pols, dir, err := demoPolicyFile()
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if d.gossipKey, err = writeDemoGossipKey(dir); err != nil {
		return err
	}
	base := peer.Config{Policies: pols, GossipProfile: peer.GossipFast, Logger: d.log, ForwardTimeout: 2 * time.Second, GossipKey: d.gossipKey}
	fmt.Fprintln(d.out, "\nstarting a 3-node cluster on 127.0.0.1 (gossip and gRPC on ephemeral ports)...")
	names := []string{"n1", "n2", "n3"}
	var each func(*peer.Config)
	if d.uiAddr != "" {
		if d.ui, err = newDemoUI(d.uiAddr, names, d.uiPause); err != nil {
			return err
		}
		defer d.ui.close()
		each = d.ui.configure
	}
	nodes, err := startClusterWith(ctx, names, base, each)
	if err != nil {
		return err
	}
	// Close is idempotent: the leaver, already closed, returns at once.
	defer closeAll(nodes, 5*time.Second)
	if d.ui != nil {
		if err := d.ui.serve(nodes); err != nil {
			return err
		}
		fmt.Fprintf(d.out, "console: open %s (each step waits %v)\n", d.ui.urls[0], d.uiPause)
		d.ui.step(ctx)
	}

	if err := d.oneDecisionPoint(ctx, nodes); err != nil {
		return err
	}
	d.ui.step(ctx)
	leaver, live := nodes[2], nodes[:2]
	if err := d.gracefulLeave(ctx, live, leaver); err != nil {
		return err
	}
	d.ui.step(ctx)
	if err := d.crash(ctx, live, filepath.Join(dir, "policies.yaml")); err != nil {
		return err
	}
	d.ui.step(ctx)
	if err := d.hotKeys(ctx, live); err != nil {
		return err
	}
	d.ui.step(ctx)
	if err := d.spreadHotKey(ctx, live); err != nil {
		return err
	}
	d.ui.step(ctx)
	if err := d.concurrencyCap(ctx, live); err != nil {
		return err
	}
	if d.ui != nil {
		d.ui.linger(ctx, live, func(s string) { fmt.Fprintln(d.out, s) })
	}
	return nil
}

// demoPolicyFile writes the demo's table to a temporary policy file and
// returns the table as parsed back from it: the in-process nodes and the
// child node then hold byte-for-byte the same table.
func demoPolicyFile() (map[string]peer.PolicyConfig, string, error) {
	dir, err := os.MkdirTemp("", "ringlimit-demo-")
	if err != nil {
		return nil, "", err
	}
	data, err := formatPolicies(demoPolicies())
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "policies.yaml"), data, 0o600)
	}
	var pols map[string]peer.PolicyConfig
	if err == nil {
		pols, err = loadPolicies(filepath.Join(dir, "policies.yaml"))
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, "", fmt.Errorf("policy file: %w", err)
	}
	return pols, dir, nil
}

// writeDemoGossipKey writes a random 32-byte gossip key, base64, to
// dir/gossip.key (the child's --gossip-key) and returns it: the demo's
// cluster gossips encrypted and authenticates its peer RPCs, as a real
// one should.
func writeDemoGossipKey(dir string) ([]byte, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "gossip.key"), []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("gossip key: %w", err)
	}
	return key, nil
}
