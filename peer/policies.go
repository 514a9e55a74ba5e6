package peer

import (
	"errors"
	"iter"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// Policy tables: live, per node, decided by the holder. The table itself
// (entries, validation, the compiled lookup and its version) is
// peer/internal/policy; this file drives it: it swaps tables, reports them
// to Metrics, logs a change, and puts the version into gossip metadata.
//
// The rule: a key's holder decides with its own table. A forwarded request
// carries only the policy's name; the holder looks the name up in the table
// it runs at that moment. So members may run different tables for a while
// (a rolling change): membership only needs the same placement (ring
// parameters and placement scheme, Config.fingerprint); the table's
// version is gossiped beside it and reported, never compared.
//
// The table on the decision path is an immutable policy.Table behind an
// atomic pointer (Node.table's Load), loaded once per request: no lock, no
// allocation. A new table is built whole and swapped in (SetPolicies);
// requests already holding the old one finish with it.
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
// A policy removed from the table: its keys' state stays too, in the
// holder's store (and the backup's copy) until each key has been idle for
// its window and is swept; requests naming the policy are refused as
// unknown meanwhile. A partition copy carries only the keys its sender's
// table can decide (a receiver refuses a copy carrying keys it cannot
// record), so a backup that got its copy while the policy was absent
// lacks those keys. Adding the policy back, with async or sync
// replication, is therefore a raise (replicationRaised: a policy the old
// table lacks, or has with another algorithm, counts as replicated off):
// every held partition is copied to its backup again, the keys included,
// before it decides again, and the keys are decided again from the state
// the holder kept. A partition that moved to another holder while the
// policy was absent does not bring them along (its copy left them out):
// there they start again from nothing (TODO(issue 52), see SendCopy).
//
// The node that receives a request still validates it with its own table
// (unknown policy, hits above the limit) and applies its own
// OnUnavailable when the holder cannot be reached: those are the caller's
// side, never the holder's decision.

// policyEnv is what a node's policy table takes of the node, set once in
// New.
type policyEnv struct {
	self    string // this node's name
	log     *slog.Logger
	metrics Metrics
	lease   time.Duration // Config.LeaseDuration, in emptyAfter
	stopped func() bool   // Close has stopped the node
	// raise has the ownership log copy every held partition to its
	// backup again before it decides again, within ForwardTimeout.
	raise func()
	// setEmptyAfter gives the ownership log a new EmptyAfter.
	setEmptyAfter func(time.Duration)
	// gossip puts the node's metadata, with the table's version, into
	// gossip (best effort).
	gossip func()
}

// policyTable is the node's policy table and what goes with it: the
// table in force, the policy versions the members gossip, and the wait
// for a vacancy's last holder that the table's windows set.
type policyTable struct {
	env policyEnv
	cur atomic.Pointer[policy.Table]
	// mu serializes SetPolicies; emptyWait is the log's EmptyAfter as
	// SetPolicies last set it (under mu): it only grows.
	mu        sync.Mutex
	emptyWait time.Duration
	// members maps live members to the policy version they gossip
	// (rebuild goroutine writes, readers copy).
	members atomic.Pointer[map[string]uint64]
}

// Load returns the table in force: no lock, no allocation.
func (t *policyTable) Load() *policy.Table { return t.cur.Load() }

// Store puts tab in force (New; SetPolicies swaps).
func (t *policyTable) Store(tab *policy.Table) { t.cur.Store(tab) }

// set replaces the table with a copy of pols (SetPolicies says how).
func (t *policyTable) set(pols map[string]PolicyConfig) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	env := &t.env
	if env.stopped() {
		return ErrClosed
	}
	cp := make(map[string]PolicyConfig, len(pols))
	for k, v := range pols {
		cp[k] = v
	}
	if errs := validatePolicies(cp); len(errs) > 0 {
		env.metrics.PolicyTable(t.Load().Version(), false)
		return errors.Join(errs...)
	}
	tab := policy.New(cp)
	raised := replicationRaised(t.Load(), tab)
	if raised {
		// Log ownership: a policy replicated more strongly than before
		// must not be answered as such while the backup's copy lacks the
		// admissions made under the weaker one. Every held partition
		// stops until a copy begun after this point is its backup's; the
		// second Raise, after the swap, covers decisions made under the
		// old table between the first copy and the swap.
		env.raise()
	}
	old := t.cur.Swap(tab)
	// A longer window (or spread lease) makes vacancies wait longer for
	// their last holder before an aged grant; a shorter one never
	// shortens the wait (emptyAfter).
	env.setEmptyAfter(t.growEmptyWait(tab))
	if raised {
		env.raise()
	}
	env.metrics.PolicyTable(tab.Version(), true)
	if old.Version() != tab.Version() {
		env.log.Info("policy table changed", "policy_version", tab.Version(), "previous_version", old.Version(), "policies", tab.Len())
	}
	// Gossip the new version. Best effort: it also travels with the next
	// push/pull of our metadata.
	env.gossip()
	return nil
}

// replicationRaised reports whether some policy of next replicates more
// strongly than the same policy in prev (off < async < sync). A policy
// prev lacks, or has with another algorithm, counts there as replicated
// off: its keys may still hold state from before (a removed policy's keys
// stay in the holder's store, see the top of this file) that no copy made
// under prev carried, since a copy carries only the keys its sender's
// table can decide. So adding a policy, or adding one back, with async or
// sync replication is a raise, and Raise copies every held partition to
// its backup again, with those keys, before it decides again: under
// async the backup must lack only what is in flight, under sync nothing.
func replicationRaised(prev, next *policy.Table) bool {
	strength := func(r Replication) int {
		switch r {
		case ReplicateOff:
			return 0
		case ReplicateAsync:
			return 1
		}
		return 2
	}
	for name, c := range next.Configs() {
		was := 0
		if p := prev.Lookup(name); p != nil && p.Shard.Algorithm == next.Lookup(name).Shard.Algorithm {
			was = strength(p.Config.Replication)
		}
		if strength(c.Replication) > was {
			return true
		}
	}
	return false
}

// noteMembers publishes the policy versions the live members gossip and
// logs, once per change, a member whose version differs from ours (a
// rolling change in progress, or a node left behind). Rebuild goroutine
// only.
func (t *policyTable) noteMembers(pvs map[string]uint64) {
	prev := t.members.Load()
	mine := t.Load().Version()
	for name, v := range pvs {
		if name == t.env.self || v == mine {
			continue
		}
		if prev != nil && (*prev)[name] == v {
			continue
		}
		t.env.log.Info("member runs another policy table", "peer", name, "policy_version", v, "want", mine)
	}
	t.members.Store(&pvs)
}

// memberVersions returns the policy table version each live member
// gossips, this node's included (Node.MemberPolicyVersions).
func (t *policyTable) memberVersions() map[string]uint64 {
	m := t.members.Load()
	out := make(map[string]uint64, 1)
	if m != nil {
		for k, v := range *m {
			out[k] = v
		}
	}
	out[t.env.self] = t.Load().Version()
	return out
}

// stamp sets req's policy version and windows (see windowsFor) from one
// reading of the table; req goes to member.
func (t *policyTable) stamp(req *peerpb.ReplicateRequest, member string, names iter.Seq[string]) {
	tab := t.Load()
	req.PolicyVersion = tab.Version()
	req.WindowsPacked = t.windowsFor(tab, member, names)
}

// windowsFor returns the windows_packed field of a replication message to
// member naming the policies names yields: this node's windows (table tab)
// for them while member's policy table may differ from this node's (it
// gossips another version, or none yet), else nil.
func (t *policyTable) windowsFor(tab *policy.Table, member string, names iter.Seq[string]) []byte {
	if m := t.members.Load(); m != nil {
		if v, ok := (*m)[member]; ok && v == tab.Version() {
			return nil
		}
	}
	return packWindows(tab, names)
}

// growEmptyWait sets the log's EmptyAfter for table tab (emptyAfter) and
// returns it: a longer window (or spread lease) makes vacancies wait
// longer for their last holder before an aged grant; a shorter one never
// shortens the wait. Called by newLogOwner, then under mu.
func (t *policyTable) growEmptyWait(tab *policy.Table) time.Duration {
	t.emptyWait = t.emptyAfter(tab, t.emptyWait)
	return t.emptyWait
}

// emptyAfter is how long a vacant partition waits for the member with
// its state (cut off, or paused) before the log's leader may restart it
// empty (ownership.Config.EmptyAfter): the longest window a key of any
// policy in t counts admissions in (a calendar policy's longest period),
// plus that policy's spread lease, a tenth more for clock rates, plus one
// LeaseDuration; and never less than was (a policy removed may be added
// back with its keys' state, which must not have been restarted early).
func (t *policyTable) emptyAfter(tab *policy.Table, was time.Duration) time.Duration {
	var longest time.Duration
	for _, c := range tab.Configs() {
		w := c.Window
		switch c.Period {
		case shard.CalendarDay:
			w = 25 * time.Hour
		case shard.CalendarWeek:
			w = 7*24*time.Hour + time.Hour
		case shard.CalendarMonth:
			w = 31*24*time.Hour + time.Hour
		case shard.CalendarYear:
			w = 366*24*time.Hour + time.Hour
		}
		longest = max(longest, w+c.Lease())
	}
	return max(was, longest+longest/10+t.env.lease)
}
