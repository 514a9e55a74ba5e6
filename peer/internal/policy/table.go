package policy

import (
	"fmt"
	"sort"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ringlimit/ringlimit/shard"
)

// Table is a compiled policy table: immutable once New returns, so it is
// safe for concurrent use without locks. A new table is built whole and
// swapped in by the caller; a reader holding the old one finishes with it.
type Table struct {
	// version identifies the table's content (see Version); 53 bits, so
	// that a float gauge and JSON carry it exactly.
	version uint64
	byName  map[string]*Entry
}

// Entry is a table entry with its shard form precomputed, or the effective
// entry of an override (Config.Limit and Shard.Limit are then the
// override's, and it has no overrides of its own). Entries reached through
// a Table are never mutated; a caller may build a standalone Entry (for
// example to answer with a policy's limits alone).
type Entry struct {
	// Name is the policy's name in the table.
	Name string
	// Config is the entry as configured (for an override's entry: the
	// policy's, with the override's limit and no Overrides).
	Config Config
	// Shard is Config in shard's form, for shard.Store.
	Shard shard.Policy
	// Unlimited marks an Unlimited override: admitted without a decision
	// (Shard is the policy's, for refunds and resets).
	Unlimited bool
	// over holds the policy's overrides by tenant; nil without any.
	over map[string]*tenantOverrides
}

// tenantOverrides are one tenant's overrides of a policy.
type tenantOverrides struct {
	all      *Entry            // every subject of the tenant, or nil
	subjects map[string]*Entry // by exact subject, or nil
}

// New compiles pols, which must have passed Validate, into a Table. It
// keeps no reference to pols' map (an entry's Overrides slice is shared).
func New(pols map[string]Config) *Table {
	t := &Table{version: version(pols), byName: make(map[string]*Entry, len(pols))}
	for name, p := range pols {
		t.byName[name] = newEntry(name, p)
	}
	return t
}

// Version returns the table's version: a hash of what changes a holder's
// decision, 53 bits and never zero (zero means "unknown" in gossip from
// older members). Two tables that decide alike have one version and two
// that do not differ. It covers:
//   - name, Limit, Window and Algorithm;
//   - Resolution, normalized (zero is shard.DefaultResolution) and only for
//     the sliding log, the one algorithm that reads it: 0 and an explicit
//     1ms are the same table;
//   - Shadow: a shadow-mode holder admits every request;
//   - for Calendar only, Period and Zone (empty and "UTC" are one zone):
//     holders counting other days or in other zones are told apart;
//   - Overrides, in a canonical order (the same set in any order is the
//     same table).
//
// It leaves out OnUnavailable, FallbackLimit, Replication and Durability: they are
// applied by the node that cannot reach the holder, or are how the holder
// keeps its state, never what it decides.
func (t *Table) Version() uint64 { return t.version }

// Lookup returns the entry named name, or nil. It neither locks nor
// allocates.
func (t *Table) Lookup(name string) *Entry { return t.byName[name] }

// Len returns the number of policies in the table.
func (t *Table) Len() int { return len(t.byName) }

// Configs returns a copy of the table as configured, by name. The caller
// owns the map.
func (t *Table) Configs() map[string]Config {
	out := make(map[string]Config, len(t.byName))
	for k, p := range t.byName {
		out[k] = p.Config
	}
	return out
}

// newEntry builds a table entry with its overrides resolved.
func newEntry(name string, pc Config) *Entry {
	p := &Entry{Name: name, Config: pc, Shard: pc.shard()}
	if len(pc.Overrides) == 0 {
		return p
	}
	p.over = make(map[string]*tenantOverrides)
	for _, o := range pc.Overrides {
		ocfg := pc
		ocfg.Overrides = nil
		q := &Entry{Name: name, Unlimited: o.Unlimited}
		if !o.Unlimited {
			ocfg.Limit = o.Limit
			if pc.FallbackLimit > 0 {
				// Keep the fallback's share of the limit.
				ocfg.FallbackLimit = max(1, int64(float64(pc.FallbackLimit)*float64(o.Limit)/float64(pc.Limit)))
			}
		}
		q.Config, q.Shard = ocfg, ocfg.shard()
		to := p.over[o.Tenant]
		if to == nil {
			to = &tenantOverrides{}
			p.over[o.Tenant] = to
		}
		if o.Subject == "" {
			to.all = q
			continue
		}
		if to.subjects == nil {
			to.subjects = make(map[string]*Entry)
		}
		to.subjects[o.Subject] = q
	}
	return p
}

// ForKey returns the entry that applies to the key of tenant and subject:
// an override's, else p. Two map lookups with string keys: it neither
// locks nor allocates.
func (p *Entry) ForKey(tenant, subject string) *Entry {
	if p.over == nil {
		return p
	}
	to := p.over[tenant]
	if to == nil {
		return p
	}
	if q := to.subjects[subject]; q != nil {
		return q
	}
	if to.all != nil {
		return to.all
	}
	return p
}

// version hashes what changes a holder's decision; see Table.Version.
func version(pols map[string]Config) uint64 {
	h := xxhash.New()
	names := make([]string, 0, len(pols))
	for n := range pols {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := pols[n]
		res := time.Duration(0)
		if p.Algorithm == shard.SlidingLog {
			res = p.Resolution
			if res == 0 {
				res = shard.DefaultResolution
			}
		}
		fmt.Fprintf(h, "%q=%d/%d/%d/%d/%t;", n, p.Limit, p.Window, p.Algorithm, res, p.Shadow)
		if p.Spread != SpreadOff {
			// Only when set, so every other table keeps its version.
			fmt.Fprintf(h, "s%d/%d;", p.Spread, p.Lease())
		}
		if p.Algorithm == shard.Calendar {
			// Only for Calendar, so every other table keeps the version
			// it had before calendars existed. "" and "UTC" are one zone.
			zone := p.Zone
			if zone == "" {
				zone = "UTC"
			}
			fmt.Fprintf(h, "c%d/%q;", p.Period, zone)
		}
		// Overrides in a canonical order: the same set in any order is
		// the same table.
		ov := append([]Override(nil), p.Overrides...)
		sort.Slice(ov, func(i, j int) bool {
			if ov[i].Tenant != ov[j].Tenant {
				return ov[i].Tenant < ov[j].Tenant
			}
			return ov[i].Subject < ov[j].Subject
		})
		for _, o := range ov {
			fmt.Fprintf(h, "o%q/%q=%d/%t;", o.Tenant, o.Subject, o.Limit, o.Unlimited)
		}
	}
	v := h.Sum64() & (1<<53 - 1)
	if v == 0 {
		v = 1
	}
	return v
}

// Validate reports every problem of a policy table, one error each, in no
// particular order; nil or empty means New may compile it. The errors wrap
// nothing (their text names the policy, and the override where one is at
// fault): the caller wraps each in its own sentinel, as peer does with
// ErrInvalidConfig.
func Validate(pols map[string]Config) []error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf(format, a...))
	}
	if len(pols) == 0 {
		bad("the policy table is empty")
	}
	for name, p := range pols {
		if err := (shard.Key{Tenant: "t", Subject: "s", Policy: name}).Validate(); err != nil {
			bad("policy name %q: must be 1 to %d bytes of visible ASCII", name, shard.MaxKeyPartLen)
		}
		if err := p.shard().Validate(); err != nil {
			bad("policy %q: %v", name, err)
		}
		if p.Algorithm == shard.Calendar {
			if _, err := LoadZone(p.Zone); err != nil {
				bad("policy %q: %v", name, err)
			}
		} else if p.Zone != "" {
			bad("policy %q: zone %q applies to algorithm calendar only; remove it or use a calendar window", name, p.Zone)
		}
		if p.OnUnavailable > Fallback {
			bad("policy %q: unknown on_unavailable %d", name, p.OnUnavailable)
		}
		if p.Replication > ReplicateOff {
			bad("policy %q: unknown replication %d", name, p.Replication)
		}
		if p.Durability > DurabilityDiskAsync {
			bad("policy %q: unknown durability %d", name, p.Durability)
		}
		switch {
		case p.Spread > SpreadAuto:
			bad("policy %q: unknown spread %d", name, p.Spread)
		case p.Spread != SpreadOff && p.Algorithm != shard.SlidingLog:
			bad("policy %q: spread needs a sliding_log policy, not %v", name, p.Algorithm)
		case p.SpreadThreshold < 0 || p.SpreadThreshold != p.SpreadThreshold:
			bad("policy %q: spread threshold %v must not be negative", name, p.SpreadThreshold)
		case p.SpreadLease < 0 || p.SpreadLease > p.Window || p.SpreadLease > shard.MaxGrantLease:
			bad("policy %q: spread lease %v must be between 0 and the window %v", name, p.SpreadLease, p.Window)
		}
		if p.FallbackLimit < 0 {
			bad("policy %q: fallback limit %d must not be negative", name, p.FallbackLimit)
		}
		type ts struct{ tenant, subject string }
		seen := make(map[ts]bool, len(p.Overrides))
		for i, o := range p.Overrides {
			where := fmt.Sprintf("policy %q override %d (tenant %q, subject %q)", name, i, o.Tenant, o.Subject)
			if err := o.Validate(); err != nil {
				for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
					bad("%s: %v", where, e)
				}
			}
			if !o.Unlimited && o.Limit > 0 {
				op := p
				op.Limit = o.Limit
				if err := op.shard().Validate(); err != nil {
					bad("%s: %v", where, err)
				}
			}
			if seen[ts{o.Tenant, o.Subject}] {
				bad("%s: given twice", where)
			}
			seen[ts{o.Tenant, o.Subject}] = true
		}
	}
	return errs
}
