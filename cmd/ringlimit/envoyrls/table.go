package envoyrls

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/shard"
)

// PolicyPrefix starts every generated policy name; serve refuses
// user-written policies with it.
const PolicyPrefix = "envoy:"

// Domain is one Envoy rate limit domain: what envoyproxy/ratelimit keeps in
// one configuration file.
type Domain struct {
	// Name is the domain Envoy sends (the filter's domain); not empty.
	Name string
	// Descriptors are the top-level descriptors.
	Descriptors []Descriptor
	// ResponseHeaders adds RateLimit-Policy and RateLimit header fields
	// to the response (response_headers_to_add).
	ResponseHeaders bool
	// Replication is how its limits copy admissions to their backup
	// (peer.PolicyConfig.Replication; the zero value is sync).
	Replication peer.Replication
}

// Descriptor is one node of a domain's descriptor tree.
type Descriptor struct {
	// Key is the entry's key; not empty.
	Key string
	// Value is the entry's value; empty matches any value of Key (each
	// value then has its own counter).
	Value string
	// Limit is the leaf's limit; nil means this node limits nothing.
	Limit *Limit
	// Unlimited marks a node that matches but never limits (Limit must
	// be nil).
	Unlimited bool
	// Shadow decides and counts, but always answers OK (shadow_mode).
	Shadow bool
	// Descriptors are the nested descriptors, matched by the next entry.
	Descriptors []Descriptor
}

// Limit is Requests per rolling Window.
type Limit struct {
	// Requests is the limit, 1 to 2^32-1 (Envoy's requests_per_unit is
	// 32 bits).
	Requests int64
	// Window is the rolling window, > 0.
	Window time.Duration
}

// Table is a compiled set of domains. It is immutable and safe for
// concurrent use.
type Table struct {
	domains  map[string]*domainTable
	policies map[string]peer.PolicyConfig
	unknown  UnknownDomain // the answer for a domain not in domains
}

type domainTable struct {
	name    string
	tenant  string
	root    *node
	headers bool
}

// entry matches one descriptor entry; anyValue for a node without Value.
type entry struct {
	key, value string
	anyValue   bool
}

type node struct {
	children  map[entry]*node
	policy    string // "" unless limit != nil
	limit     *Limit
	unlimited bool
	shadow    bool
}

// Compile checks the domains and builds their table: every problem is
// reported, joined (paths are given as domain/key=value/...). Domain
// names must be unique and not empty, keys not empty, siblings unique by
// key and value, and a node is either Unlimited or has a Limit, not both.
func Compile(domains []Domain) (*Table, error) {
	t := &Table{domains: make(map[string]*domainTable), policies: make(map[string]peer.PolicyConfig)}
	var errs []error
	for _, d := range domains {
		if d.Name == "" {
			errs = append(errs, errors.New("envoy domain: name is empty"))
			continue
		}
		if _, dup := t.domains[d.Name]; dup {
			errs = append(errs, fmt.Errorf("envoy domain %q: given twice", d.Name))
			continue
		}
		dt := &domainTable{name: d.Name, tenant: shard.KeyPart(d.Name), root: &node{}, headers: d.ResponseHeaders}
		t.domains[d.Name] = dt
		errs = append(errs, t.add(d, dt.root, nil, d.Descriptors)...)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return t, nil
}

func (t *Table) add(dom Domain, parent *node, path []entry, ds []Descriptor) []error {
	domain := dom.Name
	var errs []error
	for _, d := range ds {
		e := entry{key: d.Key, value: d.Value, anyValue: d.Value == ""}
		p := append(path[:len(path):len(path)], e)
		where := pathString(domain, p)
		if d.Key == "" {
			errs = append(errs, fmt.Errorf("envoy descriptor %s: key is empty", where))
			continue
		}
		if parent.children == nil {
			parent.children = make(map[entry]*node)
		}
		if _, dup := parent.children[e]; dup {
			errs = append(errs, fmt.Errorf("envoy descriptor %s: given twice", where))
			continue
		}
		n := &node{unlimited: d.Unlimited, shadow: d.Shadow}
		parent.children[e] = n
		switch {
		case d.Unlimited && d.Limit != nil:
			errs = append(errs, fmt.Errorf("envoy descriptor %s: unlimited and rate_limit exclude each other", where))
		case d.Limit != nil:
			if d.Limit.Requests <= 0 || d.Limit.Requests > math.MaxUint32 {
				errs = append(errs, fmt.Errorf("envoy descriptor %s: requests %d must be 1 to %d", where, d.Limit.Requests, uint32(math.MaxUint32)))
			}
			if d.Limit.Window <= 0 {
				errs = append(errs, fmt.Errorf("envoy descriptor %s: window %v must be positive", where, d.Limit.Window))
			}
			l := *d.Limit
			n.limit = &l
			n.policy = PolicyName(domain, keysOf(p))
			if _, dup := t.policies[n.policy]; dup {
				errs = append(errs, fmt.Errorf("envoy descriptor %s: generated policy name %q is taken", where, n.policy))
			}
			t.policies[n.policy] = peer.PolicyConfig{Limit: l.Requests, Window: l.Window, Shadow: d.Shadow, Replication: dom.Replication}
		}
		errs = append(errs, t.add(dom, n, p, d.Descriptors)...)
	}
	return errs
}

// keysOf turns a path into [key, value] pairs for PolicyName ("" value for
// any).
func keysOf(p []entry) [][2]string {
	out := make([][2]string, len(p))
	for i, e := range p {
		out[i] = [2]string{e.key, e.value}
	}
	return out
}

func pathString(domain string, p []entry) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, e := range p {
		b.WriteString("/" + e.key)
		if !e.anyValue {
			b.WriteString("=" + e.value)
		}
	}
	return b.String()
}

// PolicyName is the stable name of the policy generated for the descriptor
// at path (pairs of key and value; an empty value for a descriptor without
// one) in domain: "envoy:" + domain + ":" + the path's keys, each followed
// by "=" + its value when it has one, joined by "/"; the domain, keys and
// values each passed through shard.KeyPart (which escapes ':', '=' and '/'),
// so different paths give different names. A name longer than 128 bytes
// keeps its first 95 bytes, then '~' and 32 hex digits of its SHA-256.
func PolicyName(domain string, path [][2]string) string {
	var b strings.Builder
	b.WriteString(PolicyPrefix + shard.KeyPart(domain) + ":")
	for i, kv := range path {
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(shard.KeyPart(kv[0]))
		if kv[1] != "" {
			b.WriteString("=" + shard.KeyPart(kv[1]))
		}
	}
	name := b.String()
	if len(name) <= shard.MaxKeyPartLen {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return name[:shard.MaxKeyPartLen-33] + "~" + hex.EncodeToString(sum[:16])
}

// Policies returns the generated policies by name, a new map each call.
func (t *Table) Policies() map[string]peer.PolicyConfig {
	out := make(map[string]peer.PolicyConfig, len(t.policies))
	for k, v := range t.policies {
		out[k] = v
	}
	return out
}

// match walks domain's tree along a request descriptor's entries and
// returns the node reached, or nil if some entry matches no child. An exact
// value wins over a descriptor without value.
func (dt *domainTable) match(entries []*ratelimitv3.RateLimitDescriptor_Entry) *node {
	n := dt.root
	for _, e := range entries {
		c := n.children[entry{key: e.GetKey(), value: e.GetValue()}]
		if c == nil {
			c = n.children[entry{key: e.GetKey(), anyValue: true}]
		}
		if c == nil {
			return nil
		}
		n = c
	}
	return n
}

// subject is the key subject for a descriptor's entry values (see the
// package doc).
func subject(entries []*ratelimitv3.RateLimitDescriptor_Entry) string {
	if len(entries) == 1 {
		// The join of one value is its KeyPart, which is at most
		// MaxKeyPartLen bytes and, when nothing needs escaping, the value
		// itself: no copy.
		return shard.KeyPart(entries[0].GetValue())
	}
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteByte('|')
		}
		b.WriteString(shard.KeyPart(e.GetValue()))
	}
	s := b.String()
	if len(s) > shard.MaxKeyPartLen {
		return shard.KeyPart(s)
	}
	return s
}
