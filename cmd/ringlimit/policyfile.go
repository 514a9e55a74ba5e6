package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ringlimit/ringlimit/cmd/ringlimit/envoyrls"
	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/shard"
)

// policiesUsage documents the --policies file and the default table.
const policiesUsage = `Policy file (--policies, YAML or JSON; unknown fields are errors):

  policies:
    - name: api               # the name requests use; 1-128 visible ASCII bytes
      limit: 100              # units per window, > 0
      window: 1m              # Go duration, > 0; or a calendar period (below)
      algorithm: sliding_log  # sliding_log (default) | token_bucket | fixed_window | concurrency
                              # concurrency: at most limit leases held at once
                              # (/v1/acquire, /v1/release); window is the lease TTL
      on_unavailable: fail_closed  # fail_closed (default) | fail_open | fallback
      fallback_limit: 0       # fallback's local limit; 0 = limit / members
      resolution: 1ms         # sliding_log timestamp granularity; default 1ms
      shadow: false           # decide and report, but admit everything
      replication: sync       # sync (default) | async | off: copy admissions to the backup
      durability: memory      # memory (default) | disk | disk_async: keep admissions
                              # in --data-dir across a restart of every node (disk:
                              # answered once fsynced; disk_async: fsynced every 10 ms)
      overrides:              # exceptions for exact tenants or (tenant, subject) pairs
        - {tenant: bigco, limit: 10000}                      # every subject of bigco
        - {tenant: acme, subject: internal, unlimited: true} # never limited

    - name: monthly           # a calendar quota: at most limit per calendar period
      limit: 1000000
      window: calendar_month  # calendar_day | calendar_week (ISO, from Monday 00:00)
                              # | calendar_month | calendar_year; algorithm calendar
                              # is implied (write it or leave it out)
      zone: Europe/Berlin     # IANA time zone of the calendar; default UTC

  The same as JSON: {"policies": [{"name": "api", "limit": 100, "window": "1m"}]}

Each node decides the keys it holds with its own table, so nodes may run
different tables while a change rolls out (see "Changing policies" in the
README). serve reloads the file on SIGHUP and when its contents change
(--policies-poll); a file that does not parse, or a table that is invalid,
is logged ("policy reload rejected") and counted, and the table in force
stays. ringlimit_policy_table_version and /debug/ring show the version
each node runs.

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
	Name          string          `yaml:"name"`
	Limit         int64           `yaml:"limit"`
	Window        string          `yaml:"window"`
	Algorithm     string          `yaml:"algorithm,omitempty"`
	OnUnavailable string          `yaml:"on_unavailable,omitempty"`
	FallbackLimit int64           `yaml:"fallback_limit,omitempty"`
	Resolution    string          `yaml:"resolution,omitempty"`
	Shadow        bool            `yaml:"shadow,omitempty"`
	Replication   string          `yaml:"replication,omitempty"`
	Durability    string          `yaml:"durability,omitempty"`
	Zone          string          `yaml:"zone,omitempty"`
	Spread        string          `yaml:"spread,omitempty"`
	SpreadThresh  float64         `yaml:"spread_threshold,omitempty"`
	SpreadLease   string          `yaml:"spread_lease,omitempty"`
	Overrides     []overrideEntry `yaml:"overrides,omitempty"`
}

// overrideEntry is one override as written in the file.
type overrideEntry struct {
	Tenant    string `yaml:"tenant"`
	Subject   string `yaml:"subject,omitempty"`
	Limit     int64  `yaml:"limit,omitempty"`
	Unlimited bool   `yaml:"unlimited,omitempty"`
}

// maxPolicyFile bounds how much of a policy file is read.
const maxPolicyFile = 1 << 20

// loadPolicies reads and parses the policy file at path: its policies and
// the policies generated for its Envoy domains.
func loadPolicies(path string) (map[string]peer.PolicyConfig, error) {
	pols, _, err := loadPolicyFile(path)
	return pols, err
}

// loadPolicyFile reads and parses the policy file at path. The table holds
// the file's policies and those generated for its Envoy domains; envoy is
// nil when the file has no domains.
func loadPolicyFile(path string) (map[string]peer.PolicyConfig, *envoyrls.Table, error) {
	data, err := readPolicyFile(path)
	if err != nil {
		return nil, nil, err
	}
	pols, envoy, err := parsePolicyFile(data)
	if err != nil {
		return nil, nil, fmt.Errorf("policy file %s: %w", path, err)
	}
	return pols, envoy, nil
}

// readPolicyFile reads the policy file at path, at most maxPolicyFile
// bytes.
func readPolicyFile(path string) ([]byte, error) {
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
	return data, nil
}

// parsePolicies parses a policy table from YAML or JSON (JSON is read as
// YAML). It reports every problem it finds, joined, in the file's terms
// with line numbers: a wrong shape, unknown or repeated fields, values of
// the wrong kind, missing or duplicate names, non-positive limits,
// unparsable durations and unknown algorithm or on_unavailable names.
func parsePolicies(data []byte) (map[string]peer.PolicyConfig, error) {
	pols, _, err := parsePolicyFile(data)
	return pols, err
}

// parsePolicyFile is parsePolicies that also returns the compiled Envoy
// domains (nil without a "domains" section); the returned table includes
// the policies generated for them (domains.go).
func parsePolicyFile(data []byte) (map[string]peer.PolicyConfig, *envoyrls.Table, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil, errors.New("empty: want a top-level \"policies\" list")
		}
		return nil, nil, fmt.Errorf("not valid YAML or JSON: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, nil, errors.New("more than one document: want exactly one")
	}
	entries, skip, domainsNode, unknownNode, errs := policyEntries(&doc)
	var envoy *envoyrls.Table
	if domainsNode != nil {
		var derrs []error
		envoy, derrs = parseDomains(domainsNode)
		errs = append(errs, derrs...)
	}
	if len(entries) == 0 && len(errs) == 0 && envoy == nil {
		return nil, nil, errors.New("no policies: want a top-level \"policies\" list with at least one entry, or \"domains\"")
	}
	if unknownNode != nil {
		u, err := parseUnknownDomain(unknownNode)
		switch {
		case err != nil:
			errs = append(errs, err)
		case envoy == nil && len(errs) == 0:
			envoy, _ = envoyrls.Compile(nil) // no domains: every one is unknown
			fallthrough
		case envoy != nil:
			envoy = envoy.WithUnknownDomain(u)
		}
	}
	out := make(map[string]peer.PolicyConfig, len(entries))
	for i, e := range entries {
		bad := func(format string, a ...any) {
			errs = append(errs, fmt.Errorf("policies[%d] (%q): %s", i, e.Name, fmt.Sprintf(format, a...)))
		}
		// The fields whose shape is already reported: their values would
		// only repeat that (every other field's value is still checked:
		// every problem of the entry is listed at once).
		shaky := skip[i]
		if shaky[""] {
			continue // not a map at all
		}
		checkBad := func(field string, format string, a ...any) {
			if !shaky[field] {
				bad(format, a...)
			}
		}
		var pc peer.PolicyConfig
		switch err := (shard.Key{Tenant: "t", Subject: "s", Policy: e.Name}).Validate(); {
		case e.Name == "":
			checkBad("name", "name is missing")
		case err != nil:
			bad("name must be 1 to %d bytes of visible ASCII", shard.MaxKeyPartLen)
		}
		if _, dup := out[e.Name]; dup && e.Name != "" {
			bad("duplicate name")
		}
		if e.Limit <= 0 {
			checkBad("limit", "limit %d must be positive", e.Limit)
		}
		pc.Limit = e.Limit
		// A calendar window ("calendar_month") names a period, not a
		// duration, and implies algorithm calendar.
		calendar := strings.HasPrefix(e.Window, "calendar_")
		switch {
		case e.Window == "":
			checkBad("window", "window is missing (a Go duration such as 1m or 500ms, or calendar_day, calendar_week, calendar_month or calendar_year)")
		case calendar:
			if u, err := shard.ParsePeriod(e.Window); err != nil {
				bad("window %q: want calendar_day, calendar_week, calendar_month or calendar_year (or a Go duration such as 1m)", e.Window)
			} else {
				pc.Period = u
			}
		default:
			if w, err := time.ParseDuration(e.Window); err != nil || w <= 0 {
				bad("window %q must be a positive Go duration such as 1m or 500ms, or a calendar period such as calendar_month", e.Window)
			} else {
				pc.Window = w
			}
		}
		if e.Resolution != "" {
			if r, err := time.ParseDuration(e.Resolution); err != nil || r <= 0 {
				bad("resolution %q must be a positive Go duration such as 1ms", e.Resolution)
			} else if calendar {
				bad("resolution %q does not apply to a calendar window; remove it", e.Resolution)
			} else {
				pc.Resolution = r
			}
		}
		switch a, err := shard.ParseAlgorithm(e.Algorithm); {
		case err != nil:
			bad("algorithm %q: want sliding_log, token_bucket, fixed_window, concurrency or calendar", e.Algorithm)
		case calendar && a != shard.Calendar && e.Algorithm != "":
			bad("window %q is a calendar period, which algorithm %s does not count; write algorithm calendar or leave it out", e.Window, e.Algorithm)
		case calendar:
			pc.Algorithm = shard.Calendar
		case a == shard.Calendar && e.Window != "":
			bad("algorithm calendar needs a calendar window: calendar_day, calendar_week, calendar_month or calendar_year, not %q", e.Window)
		default:
			pc.Algorithm = a
		}
		switch {
		case e.Zone == "":
		case !calendar:
			bad("zone %q applies to calendar windows only (window: calendar_day, calendar_week, calendar_month or calendar_year); remove it", e.Zone)
		case e.Zone == "Local":
			bad(`zone "Local" depends on the host; name an IANA zone such as Europe/Berlin, or leave zone out for UTC`)
		default:
			if _, err := time.LoadLocation(e.Zone); err != nil {
				bad("zone %q is not a known IANA time zone: write a name such as Europe/Berlin or America/New_York, or leave zone out for UTC", e.Zone)
			} else {
				pc.Zone = e.Zone
			}
		}
		if o, err := peer.ParseOnUnavailable(e.OnUnavailable); err != nil {
			bad("on_unavailable %q: want fail_closed, fail_open or fallback", e.OnUnavailable)
		} else {
			pc.OnUnavailable = o
		}
		if e.FallbackLimit < 0 {
			checkBad("fallback_limit", "fallback_limit %d must not be negative", e.FallbackLimit)
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
		if e.Durability != "" {
			if d, err := peer.ParseDurability(e.Durability); err != nil {
				bad("durability %q: want memory, disk or disk_async", e.Durability)
			} else {
				pc.Durability = d
			}
		}
		if sp, err := peer.ParseSpread(e.Spread); err != nil {
			bad("spread %q: want off or auto", e.Spread)
		} else {
			pc.Spread = sp
		}
		if e.SpreadThresh < 0 {
			bad("spread_threshold %v must not be negative", e.SpreadThresh)
		}
		pc.SpreadThreshold = e.SpreadThresh
		if e.SpreadLease != "" {
			if d, err := time.ParseDuration(e.SpreadLease); err != nil || d <= 0 {
				bad("spread_lease %q: want a positive duration such as 100ms", e.SpreadLease)
			} else {
				pc.SpreadLease = d
			}
		}
		type ts struct{ tenant, subject string }
		seen := map[ts]bool{}
		for j, o := range e.Overrides {
			where := fmt.Sprintf("overrides[%d] (tenant %q, subject %q)", j, o.Tenant, o.Subject)
			ov := peer.Override{Tenant: o.Tenant, Subject: o.Subject, Limit: o.Limit, Unlimited: o.Unlimited}
			if err := ov.Validate(); err != nil && !shaky["overrides"] {
				for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
					bad("%s: %v", where, e)
				}
			}
			if seen[ts{o.Tenant, o.Subject}] {
				bad("%s: given twice", where)
			}
			seen[ts{o.Tenant, o.Subject}] = true
			pc.Overrides = append(pc.Overrides, ov)
		}
		if strings.HasPrefix(e.Name, envoyrls.PolicyPrefix) {
			bad("names starting with %q are reserved for the policies generated from \"domains\"", envoyrls.PolicyPrefix)
		}
		if e.Name != "" {
			out[e.Name] = pc
		}
	}
	if envoy != nil {
		for name, pc := range envoy.Policies() {
			out[name] = pc
		}
	}
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}
	return out, envoy, nil
}

// policyFields lists an entry's fields in the order the docs give them.
const policyFields = "name, limit, window, algorithm, zone, on_unavailable, fallback_limit, resolution, shadow, replication, durability, spread, spread_threshold, spread_lease, overrides"

// overrideFields lists an override's fields.
const overrideFields = "tenant, subject, limit, unlimited"

// policyEntries reads the entries of a policy file's document node without
// the YAML library's struct decoding, whose errors name Go types
// ("!!map into []main.policyEntry"). Entries whose shape is wrong are
// reported in errs, and the fields of the wrong shape marked in skip (the
// key "" for an entry that is not a map), so that their values are not
// checked again.
func policyEntries(doc *yaml.Node) (entries []policyEntry, skip []map[string]bool, domains, unknown *yaml.Node, errs []error) {
	root := resolve(doc)
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = resolve(root.Content[0])
	}
	if root.Kind != yaml.MappingNode {
		return nil, nil, nil, nil, []error{fmt.Errorf("the file must be a map with a \"policies\" list, got %s at line %d", kindOf(root), root.Line)}
	}
	var list, listKey, domainsKey, unknownKey *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], resolve(root.Content[i+1])
		switch {
		case k.Value == "domains" && domainsKey != nil:
			errs = append(errs, fmt.Errorf("\"domains\" given twice (lines %d and %d)", domainsKey.Line, k.Line))
		case k.Value == "domains":
			domainsKey, domains = k, v
		case k.Value == "unknown_domain" && unknownKey != nil:
			errs = append(errs, fmt.Errorf("\"unknown_domain\" given twice (lines %d and %d)", unknownKey.Line, k.Line))
		case k.Value == "unknown_domain":
			unknownKey, unknown = k, v
		case k.Value != "policies":
			errs = append(errs, fmt.Errorf("unknown top-level field %q at line %d: the file holds only \"policies\", \"domains\" and \"unknown_domain\"", k.Value, k.Line))
		case listKey != nil:
			errs = append(errs, fmt.Errorf("\"policies\" given twice (lines %d and %d)", listKey.Line, k.Line))
		default:
			listKey, list = k, v
		}
	}
	if list == nil || list.ShortTag() == "!!null" {
		return nil, nil, domains, unknown, errs
	}
	if list.Kind != yaml.SequenceNode {
		return nil, nil, domains, unknown, append(errs, fmt.Errorf("\"policies\" must be a list of {%s} entries, got %s at line %d", policyFields, kindOf(list), list.Line))
	}
	for i, item := range list.Content {
		e, shaky, bad := policyEntryOf(i, resolve(item))
		entries, skip, errs = append(entries, e), append(skip, shaky), append(errs, bad...)
	}
	return entries, skip, domains, unknown, errs
}

// policyEntryOf reads entry i of the policies list, and returns which of
// its fields had the wrong shape (shaky; "" when the entry is not a map).
func policyEntryOf(i int, n *yaml.Node) (e policyEntry, shaky map[string]bool, errs []error) {
	if n.Kind != yaml.MappingNode {
		return e, map[string]bool{"": true}, []error{fmt.Errorf("policies[%d] must be a map of {%s}, got %s at line %d", i, policyFields, kindOf(n), n.Line)}
	}
	shaky = map[string]bool{}
	seen := map[string]int{}
	for j := 0; j+1 < len(n.Content); j += 2 {
		k, v := n.Content[j], resolve(n.Content[j+1])
		bad := func(format string, a ...any) {
			shaky[k.Value] = true
			errs = append(errs, fmt.Errorf("policies[%d]: %s", i, fmt.Sprintf(format, a...)))
		}
		if line, dup := seen[k.Value]; dup {
			bad("field %q given twice (lines %d and %d)", k.Value, line, k.Line)
			continue
		}
		seen[k.Value] = k.Line
		var str *string
		switch k.Value {
		case "name":
			str = &e.Name
		case "window":
			str = &e.Window
		case "algorithm":
			str = &e.Algorithm
		case "on_unavailable":
			str = &e.OnUnavailable
		case "resolution":
			str = &e.Resolution
		case "replication":
			str = &e.Replication
		case "durability":
			str = &e.Durability
		case "zone":
			str = &e.Zone
		case "spread":
			str = &e.Spread
		case "spread_lease":
			str = &e.SpreadLease
		case "spread_threshold":
			if v.Kind != yaml.ScalarNode || v.Decode(&e.SpreadThresh) != nil {
				bad("spread_threshold must be a number (decisions per second at one node), got %s at line %d", kindOf(v), v.Line)
			}
		case "limit", "fallback_limit":
			var x int64
			if v.Kind != yaml.ScalarNode || v.Decode(&x) != nil {
				bad("%s must be a whole number, got %s at line %d", k.Value, kindOf(v), v.Line)
			} else if k.Value == "limit" {
				e.Limit = x
			} else {
				e.FallbackLimit = x
			}
		case "shadow":
			if v.Kind != yaml.ScalarNode || v.Decode(&e.Shadow) != nil {
				bad("shadow must be true or false, got %s at line %d", kindOf(v), v.Line)
			}
		case "overrides":
			if v.ShortTag() == "!!null" {
				break
			}
			if v.Kind != yaml.SequenceNode {
				bad("overrides must be a list of {%s} entries, got %s at line %d", overrideFields, kindOf(v), v.Line)
				break
			}
			for j, item := range v.Content {
				o, oerrs := overrideEntryOf(resolve(item))
				for _, err := range oerrs {
					bad("overrides[%d]: %v", j, err)
				}
				e.Overrides = append(e.Overrides, o)
			}
		default:
			bad("unknown field %q at line %d (want %s)", k.Value, k.Line, policyFields)
		}
		if str != nil {
			// Any scalar is text here: "window: 60" is then reported
			// as a duration without a unit, which says what to write.
			if v.Kind != yaml.ScalarNode {
				bad("%s must be a string, got %s at line %d", k.Value, kindOf(v), v.Line)
			} else if v.ShortTag() != "!!null" {
				*str = v.Value
			}
		}
	}
	return e, shaky, errs
}

// overrideEntryOf reads one entry of a policy's overrides list.
func overrideEntryOf(n *yaml.Node) (o overrideEntry, errs []error) {
	if n.Kind != yaml.MappingNode {
		return o, []error{fmt.Errorf("must be a map of {%s}, got %s at line %d", overrideFields, kindOf(n), n.Line)}
	}
	seen := map[string]int{}
	for j := 0; j+1 < len(n.Content); j += 2 {
		k, v := n.Content[j], resolve(n.Content[j+1])
		if line, dup := seen[k.Value]; dup {
			errs = append(errs, fmt.Errorf("field %q given twice (lines %d and %d)", k.Value, line, k.Line))
			continue
		}
		seen[k.Value] = k.Line
		switch k.Value {
		case "tenant", "subject":
			if v.Kind != yaml.ScalarNode || v.ShortTag() == "!!null" {
				errs = append(errs, fmt.Errorf("%s must be a string, got %s at line %d", k.Value, kindOf(v), v.Line))
			} else if k.Value == "tenant" {
				o.Tenant = v.Value
			} else {
				o.Subject = v.Value
			}
		case "limit":
			if v.Kind != yaml.ScalarNode || v.Decode(&o.Limit) != nil {
				errs = append(errs, fmt.Errorf("limit must be a whole number, got %s at line %d", kindOf(v), v.Line))
			}
		case "unlimited":
			if v.Kind != yaml.ScalarNode || v.Decode(&o.Unlimited) != nil {
				errs = append(errs, fmt.Errorf("unlimited must be true or false, got %s at line %d", kindOf(v), v.Line))
			}
		default:
			errs = append(errs, fmt.Errorf("unknown field %q at line %d (want %s)", k.Value, k.Line, overrideFields))
		}
	}
	return o, errs
}

// resolve follows a YAML alias to the node it names.
func resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// kindOf describes a node in the file's terms: "a map", "a list",
// "the number 5", "the string \"abc\"", "nothing".
func kindOf(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a map"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "nothing"
		case "!!str":
			return fmt.Sprintf("the string %q", n.Value)
		case "!!int", "!!float":
			return "the number " + n.Value
		default:
			return n.Value
		}
	}
	return "an empty document"
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
		if p.Spread != peer.SpreadOff {
			e.Spread, e.SpreadThresh = p.Spread.String(), p.SpreadThreshold
			if p.SpreadLease != 0 {
				e.SpreadLease = p.SpreadLease.String()
			}
		}
		if p.Algorithm == shard.Calendar {
			e.Window, e.Zone = p.Period.String(), p.Zone
		}
		for _, o := range p.Overrides {
			e.Overrides = append(e.Overrides, overrideEntry{Tenant: o.Tenant, Subject: o.Subject, Limit: o.Limit, Unlimited: o.Unlimited})
		}
		pf.Policies = append(pf.Policies, e)
	}
	return yaml.Marshal(&pf)
}
