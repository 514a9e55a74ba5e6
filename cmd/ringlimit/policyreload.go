package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/ringlimit/ringlimit/cmd/ringlimit/envoyrls"
	"github.com/ringlimit/ringlimit/peer"
)

// policyReloader re-reads serve's policy file on SIGHUP and whenever its
// contents change, and installs the new table with Node.SetPolicies.
//
// It compares contents, not modification times: a Kubernetes ConfigMap
// update swaps a symlink to a new directory, which leaves the path's
// mtime as it was on some file systems and changes it without news on
// others. Reading a small file every few seconds costs nothing.
//
// A file that cannot be read or parsed, or a table the node refuses, is
// logged at Error with the reason ("policy reload rejected") and counted
// (ringlimit_policy_reloads_total{result="rejected"}); the table in force
// stays. The same bad contents are not reported again until they change or
// a SIGHUP asks. The Envoy domains of the file are swapped with the table.
type policyReloader struct {
	path  string
	node  *peer.Node
	envoy *envoyrls.Server
	// metrics is the node's (serve's prommetrics.Metrics), told about files
	// that never reach SetPolicies.
	metrics peer.Metrics
	log     *slog.Logger
	data    []byte // contents last tried (installed or rejected)
}

// run reloads on every value of hup and every poll (0: no polling) until
// ctx ends. It runs on a goroutine runServe owns.
func (r *policyReloader) run(ctx context.Context, hup <-chan os.Signal, poll time.Duration) {
	var tick <-chan time.Time
	if poll > 0 {
		t := time.NewTicker(poll)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.reload("sighup", true)
		case <-tick:
			r.reload("file_changed", false)
		}
	}
}

// reload reads the file and installs it if its contents differ from the
// last ones tried, or always when force is set (SIGHUP).
func (r *policyReloader) reload(trigger string, force bool) {
	data, err := readPolicyFile(r.path)
	if err != nil {
		// A missing file during a symlink swap is transient; the next poll
		// sees the new one. Report it once per distinct failure.
		if force || r.data != nil {
			r.reject(trigger, err)
			r.data = nil
		}
		return
	}
	if !force && bytes.Equal(data, r.data) {
		return
	}
	r.data = data
	pols, envoy, err := parsePolicyFile(data)
	if err != nil {
		r.reject(trigger, fmt.Errorf("policy file %s: %w", r.path, err))
		return
	}
	if err := r.node.SetPolicies(pols); err != nil {
		// SetPolicies counted the rejection itself.
		r.log.Error("policy reload rejected: the previous table stays", "trigger", trigger, "path", r.path,
			"policy_version", r.node.PolicyVersion(), "err", err)
		return
	}
	if r.envoy != nil {
		if envoy == nil {
			envoy, _ = envoyrls.Compile(nil)
		}
		r.envoy.SetTable(envoy)
	}
	r.log.Info("policy table reloaded", "trigger", trigger, "path", r.path,
		"policy_version", r.node.PolicyVersion(), "policies", len(pols))
}

// reject logs and counts a file that could not become a table.
func (r *policyReloader) reject(trigger string, err error) {
	r.metrics.PolicyTable(r.node.PolicyVersion(), false)
	r.log.Error("policy reload rejected: the previous table stays", "trigger", trigger, "path", r.path,
		"policy_version", r.node.PolicyVersion(), "err", err)
}
