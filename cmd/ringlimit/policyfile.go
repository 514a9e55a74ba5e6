package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/shard"
)

// policiesUsage documents the --policies file and the default table.
const policiesUsage = `Policy file (--policies, YAML or JSON; unknown fields are errors):

  policies:
    - name: api               # the name requests use; 1-128 visible ASCII bytes
      limit: 100              # units per window, > 0
      window: 1m              # Go duration, > 0
      algorithm: sliding_log  # sliding_log (default) | token_bucket | fixed_window
      on_unavailable: fail_closed  # fail_closed (default) | fail_open | fallback
      fallback_limit: 0       # fallback's local limit; 0 = limit / members
      resolution: 1ms         # sliding_log timestamp granularity; default 1ms
      shadow: false           # decide and report, but admit everything
      replication: sync       # sync (default) | async | off: copy admissions to the backup

  The same as JSON: {"policies": [{"name": "api", "limit": 100, "window": "1m"}]}

Every node of a cluster must load the same table: it is fingerprinted in
gossip, and a member with another table is never used as an owner.

Without --policies the default table is:
  default  100 per 1m      sliding_log   fail_closed
  login    5 per 1m        sliding_log   fail_closed
  bulk     10000 per 1s    token_bucket  fail_open
`

// defaultPolicies is the table serve uses without --policies (documented in
// policiesUsage).
func defaultPolicies() map[string]peer.PolicyConfig {
	return map[string]peer.PolicyConfig{
		"default": {Limit: 100, Window: time.Minute},
		"login":   {Limit: 5, Window: time.Minute},
		"bulk":    {Limit: 10000, Window: time.Second, Algorithm: peer.TokenBucket, OnUnavailable: peer.FailOpen},
	}
}

// policyFile is the on-disk form of the policy table.
type policyFile struct {
	Policies []policyEntry `yaml:"policies"`
}

// policyEntry is one policy as written in the file. Durations and enums are
// strings so that errors can name the bad text.
type policyEntry struct {
	Name          string `yaml:"name"`
	Limit         int64  `yaml:"limit"`
	Window        string `yaml:"window"`
	Algorithm     string `yaml:"algorithm,omitempty"`
	OnUnavailable string `yaml:"on_unavailable,omitempty"`
	FallbackLimit int64  `yaml:"fallback_limit,omitempty"`
	Resolution    string `yaml:"resolution,omitempty"`
	Shadow        bool   `yaml:"shadow,omitempty"`
	Replication   string `yaml:"replication,omitempty"`
}

// maxPolicyFile bounds how much of a policy file is read.
const maxPolicyFile = 1 << 20

// loadPolicies reads and parses the policy file at path.
func loadPolicies(path string) (map[string]peer.PolicyConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("policy file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxPolicyFile+1))
	if err != nil {
		return nil, fmt.Errorf("policy file %s: %w", path, err)
	}
	if len(data) > maxPolicyFile {
		return nil, fmt.Errorf("policy file %s: larger than %d bytes", path, maxPolicyFile)
	}
	pols, err := parsePolicies(data)
	if err != nil {
		return nil, fmt.Errorf("policy file %s: %w", path, err)
	}
	return pols, nil
}

// parsePolicies parses a policy table from YAML or JSON (JSON is read as
// YAML). It reports every problem it finds, joined: unknown fields, missing
// or duplicate names, non-positive limits, unparsable durations and unknown
// algorithm or on_unavailable names.
func parsePolicies(data []byte) (map[string]peer.PolicyConfig, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var pf policyFile
	if err := dec.Decode(&pf); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty: want a top-level \"policies\" list")
		}
		return nil, err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, errors.New("more than one document: want exactly one")
	}
	if len(pf.Policies) == 0 {
		return nil, errors.New("no policies: want a top-level \"policies\" list with at least one entry")
	}
	var errs []error
	out := make(map[string]peer.PolicyConfig, len(pf.Policies))
	for i, e := range pf.Policies {
		bad := func(format string, a ...any) {
			errs = append(errs, fmt.Errorf("policies[%d] (%q): %s", i, e.Name, fmt.Sprintf(format, a...)))
		}
		var pc peer.PolicyConfig
		switch err := (shard.Key{Tenant: "t", Subject: "s", Policy: e.Name}).Validate(); {
		case e.Name == "":
			bad("name is missing")
		case err != nil:
			bad("name must be 1 to %d bytes of visible ASCII", shard.MaxKeyPartLen)
		}
		if _, dup := out[e.Name]; dup && e.Name != "" {
			bad("duplicate name")
		}
		if e.Limit <= 0 {
			bad("limit %d must be positive", e.Limit)
		}
		pc.Limit = e.Limit
		if e.Window == "" {
			bad("window is missing (a Go duration such as 1m or 500ms)")
		} else if w, err := time.ParseDuration(e.Window); err != nil || w <= 0 {
			bad("window %q must be a positive Go duration such as 1m or 500ms", e.Window)
		} else {
			pc.Window = w
		}
		if e.Resolution != "" {
			if r, err := time.ParseDuration(e.Resolution); err != nil || r <= 0 {
				bad("resolution %q must be a positive Go duration such as 1ms", e.Resolution)
			} else {
				pc.Resolution = r
			}
		}
		if a, err := shard.ParseAlgorithm(e.Algorithm); err != nil {
			bad("algorithm %q: want sliding_log, token_bucket or fixed_window", e.Algorithm)
		} else {
			pc.Algorithm = a
		}
		if o, err := peer.ParseOnUnavailable(e.OnUnavailable); err != nil {
			bad("on_unavailable %q: want fail_closed, fail_open or fallback", e.OnUnavailable)
		} else {
			pc.OnUnavailable = o
		}
		if e.FallbackLimit < 0 {
			bad("fallback_limit %d must not be negative", e.FallbackLimit)
		}
		pc.FallbackLimit = e.FallbackLimit
		pc.Shadow = e.Shadow
		if e.Replication != "" {
			if r, err := peer.ParseReplication(e.Replication); err != nil {
				bad("replication %q: want sync, async or off", e.Replication)
			} else {
				pc.Replication = r
			}
		}
		if e.Name != "" {
			out[e.Name] = pc
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// formatPolicies renders a table in the policy file format, sorted by name,
// so that parsePolicies(formatPolicies(t)) equals t. The demo uses it to hand
// its table to the child node it starts.
func formatPolicies(pols map[string]peer.PolicyConfig) ([]byte, error) {
	names := make([]string, 0, len(pols))
	for n := range pols {
		names = append(names, n)
	}
	sort.Strings(names)
	var pf policyFile
	for _, n := range names {
		p := pols[n]
		e := policyEntry{
			Name: n, Limit: p.Limit, Window: p.Window.String(),
			Algorithm: p.Algorithm.String(), OnUnavailable: p.OnUnavailable.String(),
			FallbackLimit: p.FallbackLimit, Shadow: p.Shadow,
			Replication: p.Replication.String(),
		}
		if p.Resolution != 0 {
			e.Resolution = p.Resolution.String()
		}
		pf.Policies = append(pf.Policies, e)
	}
	return yaml.Marshal(&pf)
}
