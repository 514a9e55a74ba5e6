package peer

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/ringlimit/ringlimit/shard"
)

// Policy tables: live, per node, decided by the holder.
//
// The rule: a key's holder decides with its own table. A forwarded request
// carries only the policy's name; the holder looks the name up in the table
// it runs at that moment. So members may run different tables for a while
// (a rolling change): membership only needs the same placement (ring
// parameters and placement scheme, Config.fingerprint); the table's
// version is gossiped beside it and reported, never compared.
//
// The table on the decision path is an immutable policyTable behind an
// atomic pointer, loaded once per request: no lock, no allocation. A new
// table is built whole and swapped in (SetPolicies); requests already
// holding the old one finish with it.
//
// What a key's state means when its policy changes: the state stays. For
// the sliding log the new limit and window apply from the change on to the
// admissions already logged (a lower limit refuses until the log has
// drained below it; a higher one admits at once up to it), so every
// admission respects the limit in force when it was decided. For the token
// bucket and the fixed window the stored level is read with the new limit
// and rate from the change on. An algorithm change starts the key fresh
// (shard.Store resets a key whose state belongs to another algorithm), and
// a partition copy or replicated admission whose algorithm differs from
// the receiver's table is skipped by the receiver (see decodeState).
//
// The node that receives a request still validates it with its own table
// (unknown policy, hits above the limit) and applies its own
// OnUnavailable when the holder cannot be reached: those are the caller's
// side, never the holder's decision.
type policyTable struct {
	// version identifies the table's content (policyVersion); 53 bits, so
	// that a float gauge and JSON carry it exactly.
	version uint64
	byName  map[string]*policy
}

// newPolicyTable builds the immutable table for pols (already validated).
func newPolicyTable(pols map[string]PolicyConfig) *policyTable {
	t := &policyTable{version: policyVersion(pols), byName: make(map[string]*policy, len(pols))}
	for name, p := range pols {
		t.byName[name] = newPolicy(name, p)
	}
	return t
}

// newPolicy builds a table entry with its overrides resolved.
func newPolicy(name string, pc PolicyConfig) *policy {
	p := &policy{name: name, cfg: pc, sp: pc.shard()}
	if len(pc.Overrides) == 0 {
		return p
	}
	p.over = make(map[string]*tenantOverrides)
	for _, o := range pc.Overrides {
		ocfg := pc
		ocfg.Overrides = nil
		q := &policy{name: name, unlimited: o.Unlimited}
		if !o.Unlimited {
			ocfg.Limit = o.Limit
			if pc.FallbackLimit > 0 {
				// Keep the fallback's share of the limit.
				ocfg.FallbackLimit = max(1, int64(float64(pc.FallbackLimit)*float64(o.Limit)/float64(pc.Limit)))
			}
		}
		q.cfg, q.sp = ocfg, ocfg.shard()
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
			to.subjects = make(map[string]*policy)
		}
		to.subjects[o.Subject] = q
	}
	return p
}

// policyVersion hashes what changes a holder's decision, so that two tables
// that decide alike have one version and two that do not differ:
//   - name, Limit, Window and Algorithm;
//   - Resolution, normalized (zero is shard.DefaultResolution) and only for
//     the sliding log, the one algorithm that reads it: 0 and an explicit
//     1ms are the same table;
//   - Shadow: a shadow-mode holder admits every request.
//
// It leaves out OnUnavailable, FallbackLimit and Replication: they are
// applied by the node that cannot reach the holder, or are how the holder
// keeps its state, never what it decides. The result is 53 bits and never
// zero (zero means "unknown" in gossip from older members).
func policyVersion(pols map[string]PolicyConfig) uint64 {
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

// validatePolicies reports every problem of a policy table, each wrapping
// ErrInvalidConfig.
func validatePolicies(pols map[string]PolicyConfig) []error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, a...)...))
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
		if p.OnUnavailable > Fallback {
			bad("policy %q: unknown on_unavailable %d", name, p.OnUnavailable)
		}
		if p.Replication > ReplicateOff {
			bad("policy %q: unknown replication %d", name, p.Replication)
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

// SetPolicies replaces the node's policy table with a copy of pols, at
// once, for every request that starts afterwards (requests in progress
// finish with the table they started with). An invalid table returns an
// error wrapping ErrInvalidConfig, naming every problem, and the node
// keeps its table. Either way the outcome is reported to
// Metrics.PolicyTable. The new table's version is gossiped to the other
// members, which keep using this node as a holder whatever table they run
// (see the comment on policyTable for what a change does to a key's
// state). Safe for concurrent use; calls are applied one at a time.
func (n *Node) SetPolicies(pols map[string]PolicyConfig) error {
	n.policyMu.Lock()
	defer n.policyMu.Unlock()
	if n.stopped.Load() {
		return ErrClosed
	}
	cp := make(map[string]PolicyConfig, len(pols))
	for k, v := range pols {
		cp[k] = v
	}
	if errs := validatePolicies(cp); len(errs) > 0 {
		n.metrics.PolicyTable(n.table.Load().version, false)
		return errors.Join(errs...)
	}
	t := newPolicyTable(cp)
	old := n.table.Swap(t)
	n.metrics.PolicyTable(t.version, true)
	if old.version != t.version {
		n.log.Info("policy table changed", "policy_version", t.version, "previous_version", old.version, "policies", len(t.byName))
	}
	// Gossip the new version. Best effort: it also travels with the next
	// push/pull of our metadata.
	n.delegate.setMeta(n.meta(n.closing.Load()))
	_ = n.ml.UpdateNode(200 * time.Millisecond)
	return nil
}

// PolicyVersion returns the version of the node's current policy table: a
// hash of what changes a holder's decision (53 bits, never zero). Two
// members with the same version decide alike.
func (n *Node) PolicyVersion() uint64 { return n.table.Load().version }

// Policy returns the current table's entry for name. Safe for concurrent
// use; it neither locks nor allocates.
func (n *Node) Policy(name string) (PolicyConfig, bool) {
	p := n.table.Load().byName[name]
	if p == nil {
		return PolicyConfig{}, false
	}
	return p.cfg, true
}

// MemberPolicyVersions returns the policy table version each live member
// gossips, by member name (this node included); 0 for a member that does
// not gossip one (an older version). The caller owns the map.
func (n *Node) MemberPolicyVersions() map[string]uint64 {
	m := n.memberPolicies.Load()
	out := make(map[string]uint64, 1)
	if m != nil {
		for k, v := range *m {
			out[k] = v
		}
	}
	out[n.name] = n.PolicyVersion()
	return out
}

// notePolicyVersions publishes the policy versions the live members gossip
// and logs, once per change, a member whose version differs from ours (a
// rolling change in progress, or a node left behind). Rebuild goroutine
// only.
func (n *Node) notePolicyVersions(pvs map[string]uint64) {
	prev := n.memberPolicies.Load()
	mine := n.PolicyVersion()
	for name, v := range pvs {
		if name == n.name || v == mine {
			continue
		}
		if prev != nil && (*prev)[name] == v {
			continue
		}
		n.log.Info("member runs another policy table", "peer", name, "policy_version", v, "want", mine)
	}
	n.memberPolicies.Store(&pvs)
}
