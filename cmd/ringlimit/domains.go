package main

import (
	"fmt"
	"math"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ringlimit/ringlimit/cmd/ringlimit/envoyrls"
	"github.com/ringlimit/ringlimit/peer"
)

// domainsUsage documents the policy file's "domains" section.
const domainsUsage = `Envoy domains (the policy file's optional "domains" list; serve answers
Envoy's RateLimitService/ShouldRateLimit on its gRPC port; see envoyrls):

  domains:
    - domain: edge            # the domain of Envoy's ratelimit filter
      response_headers: true  # add RateLimit-Policy and RateLimit (optional)
      replication: sync       # sync (default) | async | off, as a policy's
      descriptors:            # as envoyproxy/ratelimit: matched by key and,
        - key: remote_address #   if given, value; no value = any value
          rate_limit: {unit: second, requests_per_unit: 10}
        - key: path
          value: /login
          descriptors:
            - key: remote_address
              rate_limit: {window: 1m30s, requests: 5}  # any Go duration
              shadow_mode: true    # decide and count, always answer OK
        - key: client
          value: internal
          rate_limit: {unlimited: true}

  unknown_domain: error      # top level: the answer to a domain not listed
                             #   error (default): gRPC NotFound, so Envoy's
                             #   failure_mode_deny decides; deny: OVER_LIMIT;
                             #   allow: OK, unlimited (envoyproxy/ratelimit's)
                             #   each counted and logged (throttled)

  unit is second, minute, hour or day (unit_multiplier: N multiplies it).
  Each leaf with a limit becomes policy "envoy:<domain>:<key>[=<value>]/...";
  names starting with "envoy:" are reserved. Not supported: replaces,
  name, detailed_metric, value_to_metric, share_threshold, quota_mode,
  wildcard values, units month and year.
`

// Field lists, in the order the docs give them.
const (
	domainFields     = "domain, descriptors, response_headers, replication"
	descriptorFields = "key, value, rate_limit, shadow_mode, descriptors"
	rateLimitFields  = "unit, requests_per_unit, unit_multiplier, window, requests, unlimited"
)

// unsupportedFields are envoyproxy/ratelimit fields ringlimit knows but
// does not implement: naming them says so instead of "unknown field".
var unsupportedFields = map[string]bool{
	"detailed_metric": true, "value_to_metric": true, "share_threshold": true,
	"quota_mode": true, "replaces": true, "name": true,
}

// unitDurations are the units rate_limit accepts.
var unitDurations = map[string]time.Duration{
	"second": time.Second, "minute": time.Minute, "hour": time.Hour, "day": 24 * time.Hour,
}

// parseUnknownDomain reads the top-level "unknown_domain" field.
func parseUnknownDomain(n *yaml.Node) (envoyrls.UnknownDomain, error) {
	if n.Kind != yaml.ScalarNode {
		return 0, fmt.Errorf("\"unknown_domain\" must be error, deny or allow, got %s at line %d", kindOf(n), n.Line)
	}
	u, err := envoyrls.ParseUnknownDomain(n.Value)
	if err != nil {
		return 0, fmt.Errorf("%w (line %d)", err, n.Line)
	}
	return u, nil
}

// parseDomains reads the "domains" list and compiles it. Errors carry the
// path (domains[0].descriptors[1].rate_limit) and line numbers.
func parseDomains(list *yaml.Node) (*envoyrls.Table, []error) {
	if list.ShortTag() == "!!null" {
		return nil, nil
	}
	if list.Kind != yaml.SequenceNode {
		return nil, []error{fmt.Errorf("\"domains\" must be a list of {%s} entries, got %s at line %d", domainFields, kindOf(list), list.Line)}
	}
	var domains []envoyrls.Domain
	seen := map[string]int{}
	errs := mapItems("domains", list, domainFields, func(where string, item *yaml.Node, fields []field) (errs []error) {
		var d envoyrls.Domain
		for _, f := range fields {
			switch f.k.Value {
			case "domain":
				d.Name, errs = str(where, f, errs)
			case "response_headers":
				d.ResponseHeaders, errs = boolean(where, f, errs)
			case "replication":
				var r string
				if r, errs = str(where, f, errs); r != "" {
					var err error
					if d.Replication, err = peer.ParseReplication(r); err != nil {
						errs = append(errs, fmt.Errorf("%s: replication %q at line %d: want sync, async or off", where, r, f.v.Line))
					}
				}
			case "descriptors":
				var derrs []error
				d.Descriptors, derrs = parseDescriptors(where+".descriptors", f.v)
				errs = append(errs, derrs...)
			default:
				errs = append(errs, unknownField(where, f.k, domainFields))
			}
		}
		switch line, dup := seen[d.Name]; {
		case d.Name == "":
			errs = append(errs, fmt.Errorf("%s at line %d: domain is missing", where, item.Line))
		case dup:
			errs = append(errs, fmt.Errorf("%s: domain %q given twice (lines %d and %d)", where, d.Name, line, item.Line))
		default:
			seen[d.Name] = item.Line
			domains = append(domains, d)
		}
		return errs
	})
	if len(errs) > 0 {
		return nil, errs
	}
	t, err := envoyrls.Compile(domains)
	if err != nil {
		return nil, []error{err}
	}
	return t, nil
}

// parseDescriptors reads a "descriptors" list at where.
func parseDescriptors(where string, list *yaml.Node) ([]envoyrls.Descriptor, []error) {
	if list.ShortTag() == "!!null" {
		return nil, nil
	}
	if list.Kind != yaml.SequenceNode {
		return nil, []error{fmt.Errorf("%s must be a list of {%s} entries, got %s at line %d", where, descriptorFields, kindOf(list), list.Line)}
	}
	var out []envoyrls.Descriptor
	seen := map[[2]string]int{}
	errs := mapItems(where, list, descriptorFields, func(w string, item *yaml.Node, fields []field) (errs []error) {
		var d envoyrls.Descriptor
		for _, f := range fields {
			switch f.k.Value {
			case "key":
				d.Key, errs = str(w, f, errs)
			case "value":
				d.Value, errs = str(w, f, errs)
			case "shadow_mode":
				d.Shadow, errs = boolean(w, f, errs)
			case "rate_limit":
				var rerrs []error
				d.Limit, d.Unlimited, rerrs = parseRateLimit(w+".rate_limit", f.v)
				errs = append(errs, rerrs...)
			case "descriptors":
				var derrs []error
				d.Descriptors, derrs = parseDescriptors(w+".descriptors", f.v)
				errs = append(errs, derrs...)
			default:
				errs = append(errs, unknownField(w, f.k, descriptorFields))
			}
		}
		k := [2]string{d.Key, d.Value}
		switch line, dup := seen[k]; {
		case d.Key == "":
			errs = append(errs, fmt.Errorf("%s at line %d: key is missing", w, item.Line))
		case dup:
			errs = append(errs, fmt.Errorf("%s: key %q with value %q given twice (lines %d and %d)", w, d.Key, d.Value, line, item.Line))
		default:
			seen[k] = item.Line
			out = append(out, d)
		}
		return errs
	})
	return out, errs
}

// parseRateLimit reads a rate_limit map: {unit, requests_per_unit,
// unit_multiplier}, {window, requests} or {unlimited: true}.
func parseRateLimit(where string, n *yaml.Node) (*envoyrls.Limit, bool, []error) {
	if n.Kind != yaml.MappingNode {
		return nil, false, []error{fmt.Errorf("%s must be a map of {%s}, got %s at line %d", where, rateLimitFields, kindOf(n), n.Line)}
	}
	fields, errs := fieldsOf(where, n, rateLimitFields)
	var unit, window string
	var perUnit, requests, mult int64
	var unlimited bool
	has := map[string]bool{}
	for _, f := range fields {
		has[f.k.Value] = true
		switch f.k.Value {
		case "unit":
			unit, errs = str(where, f, errs)
		case "window":
			window, errs = str(where, f, errs)
		case "requests_per_unit":
			perUnit, errs = whole(where, f, errs)
		case "requests":
			requests, errs = whole(where, f, errs)
		case "unit_multiplier":
			mult, errs = whole(where, f, errs)
		case "unlimited":
			unlimited, errs = boolean(where, f, errs)
		default:
			errs = append(errs, unknownField(where, f.k, rateLimitFields))
		}
	}
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s at line %d: %s", where, n.Line, fmt.Sprintf(format, a...)))
	}
	if len(errs) > 0 {
		return nil, false, errs
	}
	unitForm := has["unit"] || has["requests_per_unit"] || has["unit_multiplier"]
	windowForm := has["window"] || has["requests"]
	switch {
	case unlimited:
		if unitForm || windowForm {
			bad("unlimited: true takes no other field")
		}
		return nil, true, errs
	case unitForm && windowForm:
		bad("give either unit and requests_per_unit, or window and requests, not both")
	case unitForm:
		u, ok := unitDurations[strings.ToLower(unit)]
		switch {
		case unit == "":
			bad("unit is missing (second, minute, hour or day)")
		case !ok:
			bad("unit %q: want second, minute, hour or day (for longer windows write window: 720h)", unit)
		}
		if !has["requests_per_unit"] {
			bad("requests_per_unit is missing")
		} else if perUnit <= 0 || perUnit > math.MaxUint32 {
			bad("requests_per_unit %d must be 1 to %d", perUnit, uint32(math.MaxUint32))
		}
		if !has["unit_multiplier"] {
			mult = 1
		} else if mult <= 0 || mult > math.MaxUint32 {
			bad("unit_multiplier %d must be 1 to %d", mult, uint32(math.MaxUint32))
		}
		if len(errs) == 0 {
			if time.Duration(mult) > math.MaxInt64/u {
				bad("unit_multiplier %d: window too long", mult)
			} else {
				return &envoyrls.Limit{Requests: perUnit, Window: time.Duration(mult) * u}, false, errs
			}
		}
	case windowForm:
		w, err := time.ParseDuration(window)
		switch {
		case window == "":
			bad("window is missing (a Go duration such as 1m30s or 500ms)")
		case err != nil || w <= 0:
			bad("window %q must be a positive Go duration such as 1m30s or 500ms", window)
		}
		if !has["requests"] {
			bad("requests is missing")
		} else if requests <= 0 || requests > math.MaxUint32 {
			bad("requests %d must be 1 to %d", requests, uint32(math.MaxUint32))
		}
		if len(errs) == 0 {
			return &envoyrls.Limit{Requests: requests, Window: w}, false, errs
		}
	default:
		bad("want {unit, requests_per_unit}, {window, requests} or {unlimited: true}")
	}
	return nil, false, errs
}

// field is one key and value of a YAML map.
type field struct{ k, v *yaml.Node }

// mapItems reads the sequence list at where item by item: an item that is
// not a map is reported; for a map, fieldsOf's problems are reported and
// each is called with the item's path (where[i]), the item and its
// fields. It returns the problems in the order of the items, each item's
// own (from each) after those of its fields.
func mapItems(where string, list *yaml.Node, want string, each func(where string, item *yaml.Node, fields []field) []error) []error {
	var errs []error
	for i, item := range list.Content {
		w := fmt.Sprintf("%s[%d]", where, i)
		item = resolve(item)
		if item.Kind != yaml.MappingNode {
			errs = append(errs, fmt.Errorf("%s must be a map of {%s}, got %s at line %d", w, want, kindOf(item), item.Line))
			continue
		}
		fields, ferrs := fieldsOf(w, item, want)
		errs = append(errs, ferrs...)
		errs = append(errs, each(w, item, fields)...)
	}
	return errs
}

// fieldsOf lists a map's fields, reporting repeated ones and the
// envoyproxy/ratelimit fields ringlimit does not support (both left out).
func fieldsOf(where string, n *yaml.Node, want string) ([]field, []error) {
	var out []field
	var errs []error
	seen := map[string]int{}
	for j := 0; j+1 < len(n.Content); j += 2 {
		k, v := n.Content[j], resolve(n.Content[j+1])
		if line, dup := seen[k.Value]; dup {
			errs = append(errs, fmt.Errorf("%s: field %q given twice (lines %d and %d)", where, k.Value, line, k.Line))
			continue
		}
		seen[k.Value] = k.Line
		if unsupportedFields[k.Value] {
			errs = append(errs, fmt.Errorf("%s: field %q at line %d is not supported by ringlimit (supported: %s)", where, k.Value, k.Line, want))
			continue
		}
		out = append(out, field{k, v})
	}
	return out, errs
}

func unknownField(where string, k *yaml.Node, want string) error {
	return fmt.Errorf("%s: unknown field %q at line %d (want %s)", where, k.Value, k.Line, want)
}

// str reads a scalar field as text.
func str(where string, f field, errs []error) (string, []error) {
	if f.v.Kind != yaml.ScalarNode {
		return "", append(errs, fmt.Errorf("%s: %s must be a string, got %s at line %d", where, f.k.Value, kindOf(f.v), f.v.Line))
	}
	if f.v.ShortTag() == "!!null" {
		return "", errs
	}
	return f.v.Value, errs
}

// boolean reads a true/false field.
func boolean(where string, f field, errs []error) (bool, []error) {
	var b bool
	if f.v.Kind != yaml.ScalarNode || f.v.ShortTag() != "!!bool" || f.v.Decode(&b) != nil {
		return false, append(errs, fmt.Errorf("%s: %s must be true or false, got %s at line %d", where, f.k.Value, kindOf(f.v), f.v.Line))
	}
	return b, errs
}

// whole reads a whole-number field.
func whole(where string, f field, errs []error) (int64, []error) {
	var x int64
	if f.v.Kind != yaml.ScalarNode || f.v.ShortTag() != "!!int" || f.v.Decode(&x) != nil {
		return 0, append(errs, fmt.Errorf("%s: %s must be a whole number, got %s at line %d", where, f.k.Value, kindOf(f.v), f.v.Line))
	}
	return x, errs
}
