package policy

import (
	"errors"
	"fmt"
	"time"

	"github.com/ringlimit/ringlimit/shard"
)

// OnUnavailable says what a node does when a key's owner cannot be reached in
// time. Whatever it says, the outcome is reported as unavailability, never as
// over limit. peer re-exports it as peer.OnUnavailable.
type OnUnavailable uint8

const (
	// FailClosed (the default) refuses: Allow returns an error wrapping
	// peer.ErrUnavailable.
	FailClosed OnUnavailable = iota
	// FailOpen admits without a decision: Decision.Reason is
	// peer.ReasonFailedOpen.
	FailOpen
	// Fallback decides on a local log with a reduced limit
	// (Config.FallbackLimit): Decision.Reason is peer.ReasonFallback.
	Fallback
)

var onUnavailableNames = [...]string{"fail_closed", "fail_open", "fallback"}

// String returns fail_closed, fail_open or fallback.
func (o OnUnavailable) String() string {
	if int(o) < len(onUnavailableNames) {
		return onUnavailableNames[o]
	}
	return fmt.Sprintf("on_unavailable(%d)", uint8(o))
}

// Config is one entry of the server-side policy table. The owner's
// table decides: a request only names the policy. peer re-exports it as
// peer.PolicyConfig.
type Config struct {
	// Limit is the number of units per Window (for Concurrency, the units
	// held at once). Must be positive.
	Limit int64
	// Window is the rolling window (for Concurrency, the lease TTL: a lease
	// not released expires Window after it was taken). Must be positive,
	// except under Calendar, where it must be zero (Period sets the length).
	Window time.Duration
	// Algorithm is the limiting algorithm. Zero means SlidingLog.
	Algorithm shard.Algorithm
	// Resolution is the sliding log's timestamp granularity. Zero means 1 ms.
	Resolution time.Duration
	// Period is the calendar unit of a shard.Calendar policy (calendar day,
	// ISO week from Monday, month or year); required there, and must be
	// zero for every other algorithm.
	Period shard.Period
	// Zone is the IANA time zone ("Europe/Berlin") whose calendar a
	// Calendar policy follows. Empty means UTC. Only for Calendar. The zone
	// rules come from the host's zoneinfo, else from the copy embedded in
	// the binary (time/tzdata).
	Zone string
	// OnUnavailable is what to do when the owner cannot be reached. Zero
	// means FailClosed.
	OnUnavailable OnUnavailable
	// FallbackLimit is the local limit used by Fallback. Zero means Limit
	// divided by the number of members in the ring (at least 1), so the
	// members together stay near Limit.
	FallbackLimit int64
	// Shadow computes, records and reports decisions but admits every
	// request: a refusal comes back Allowed with ReasonShadow. Use it to try
	// a new limit on live traffic.
	Shadow bool
	// Replication says how the partition holder copies this policy's
	// admissions to the partition's backup before a crash can lose them.
	// Zero means ReplicateSync.
	Replication Replication
	// Durability says whether this policy's admissions are kept on the
	// holder's data directory (peer's dataDir) so that they survive a
	// restart of every member. Zero means DurabilityMemory.
	Durability Durability
	// Spread lets a hot key be decided by many nodes and stay exact: with
	// SpreadAuto, a node that forwards more than SpreadThreshold decisions
	// a second for one key asks the key's holder for rights and decides
	// from them locally (peer's package doc, "Spread keys"). Zero means
	// SpreadOff. Only for SlidingLog.
	Spread Spread
	// SpreadThreshold is the rate of one key's forwarded decisions, per
	// second at one node, above which the node asks for rights. Zero
	// means 1000.
	SpreadThreshold float64
	// SpreadLease is how long a grant of rights lasts; an unused right
	// holds its slot until the lease's end plus Window unless returned.
	// Zero means Window/10 bounded to [1 ms, 1 s]. At most Window.
	SpreadLease time.Duration
	// Overrides give exact tenants, or (tenant, subject) pairs, another
	// limit than Limit, or none. A (tenant, subject) override wins over a
	// tenant's. Everything else (window, algorithm, failure policy,
	// replication) is the policy's. They are part of the table and of its
	// version; the holder applies its own. Nil means none.
	Overrides []Override
}

// Override is one exception in a policy: the keys of Tenant (and, when
// Subject is set, of that subject only) are limited by Limit instead of
// the policy's, or not at all when Unlimited. An unlimited key is admitted
// without being recorded (Reason ReasonUnlimited, Limit 0). peer
// re-exports it as peer.Override.
type Override struct {
	// Tenant is the key's tenant, exactly. Required.
	Tenant string
	// Subject is the key's subject, exactly; "" means every subject of
	// Tenant.
	Subject string
	// Limit replaces the policy's limit. Must be positive unless
	// Unlimited.
	Limit int64
	// Unlimited admits every request of these keys without counting.
	// Limit must then be zero.
	Unlimited bool
}

// Validate checks the override's own fields and reports every problem,
// joined with errors.Join, one error per problem, so that a caller can
// unwrap them (Unwrap() []error) and put where the override stands in
// front of each. It returns nil for a usable override. The problems are:
// "tenant is missing" when Tenant is empty; "tenant must be ..." when it is
// not a valid key part (1 to shard.MaxKeyPartLen bytes of visible ASCII);
// "subject must be ..." when Subject is neither empty nor a valid key
// part; "not both" when Unlimited comes with a non-zero Limit; and "must
// be positive" when a limited override has no positive Limit. The errors
// wrap nothing: SetPolicies wraps them in ErrInvalidConfig. Validate does
// not check the override against its policy (whether the policy is valid
// with the override's limit, or whether another override has the same
// tenant and subject); SetPolicies does.
func (o Override) Validate() error {
	var errs []error
	switch {
	case o.Tenant == "":
		errs = append(errs, errors.New("tenant is missing"))
	case (shard.Key{Tenant: o.Tenant, Subject: "s", Policy: "p"}).Validate() != nil:
		errs = append(errs, fmt.Errorf("tenant must be 1 to %d bytes of visible ASCII", shard.MaxKeyPartLen))
	}
	if o.Subject != "" && (shard.Key{Tenant: "t", Subject: o.Subject, Policy: "p"}).Validate() != nil {
		errs = append(errs, fmt.Errorf("subject must be empty (every subject) or 1 to %d bytes of visible ASCII", shard.MaxKeyPartLen))
	}
	switch {
	case o.Unlimited && o.Limit != 0:
		errs = append(errs, errors.New("give a limit or unlimited, not both"))
	case !o.Unlimited && o.Limit <= 0:
		errs = append(errs, fmt.Errorf("limit %d must be positive (or set unlimited)", o.Limit))
	}
	return errors.Join(errs...)
}

// Spread is whether a policy's hot keys are spread over the nodes that
// decide them. peer re-exports it as peer.Spread.
type Spread uint8

const (
	// SpreadOff: every decision of a key is made by its holder.
	SpreadOff Spread = iota
	// SpreadAuto: a node that forwards a key often asks for rights and
	// decides from them.
	SpreadAuto
)

// String returns "off" or "auto".
func (s Spread) String() string {
	switch s {
	case SpreadOff:
		return "off"
	case SpreadAuto:
		return "auto"
	}
	return fmt.Sprintf("Spread(%d)", uint8(s))
}

// DefaultSpreadThreshold is SpreadThreshold's zero value.
const DefaultSpreadThreshold = 1000

// Lease returns the policy's spread lease (SpreadLease or its default).
func (c Config) Lease() time.Duration {
	if c.SpreadLease > 0 {
		return c.SpreadLease
	}
	return min(max(c.Window/10, time.Millisecond), time.Second, c.Window)
}

// Threshold returns SpreadThreshold or its default.
func (c Config) Threshold() float64 {
	if c.SpreadThreshold > 0 {
		return c.SpreadThreshold
	}
	return DefaultSpreadThreshold
}

// Replication is how a policy's admissions reach the partition's backup.
// peer re-exports it as peer.Replication.
type Replication uint8

const (
	// ReplicateSync answers an admission only after the backup has it: a
	// crash of the holder loses nothing. Costs one batched round trip per
	// admission (refusals record nothing and are not replicated).
	ReplicateSync Replication = iota
	// ReplicateAsync answers at once and sends the admission to the backup
	// in the next batch: a crash of the holder loses at most the
	// admissions the backup had not yet acknowledged. A batch that fails,
	// is refused or is never sent makes the holder copy the partition to
	// its backup again before it decides again (unavailable for that
	// copy), so a blip's loss lasts until that copy, not the window.
	ReplicateAsync
	// ReplicateOff never copies admissions: a crash of the holder resets
	// the policy's keys of its partitions. A graceful move still keeps them.
	ReplicateOff
)

var replicationNames = [...]string{"sync", "async", "off"}

// Durability is whether a policy's admissions are kept on disk. peer
// re-exports it as peer.Durability.
type Durability uint8

const (
	// DurabilityMemory keeps admissions in memory only (and on the
	// backup, by Replication): a restart of every member loses them.
	DurabilityMemory Durability = iota
	// DurabilityDisk answers an admission only after the key's state is
	// on the holder's disk (fsynced; concurrent admissions share one
	// fsync). Without a data directory it is DurabilityMemory.
	DurabilityDisk
	// DurabilityDiskAsync answers at once; the holder writes and fsyncs
	// its log every DiskFlushInterval: a restart of every member loses at
	// most the admissions of the last interval.
	DurabilityDiskAsync
)

var durabilityNames = [...]string{"memory", "disk", "disk_async"}

// String returns "memory", "disk" or "disk_async".
func (d Durability) String() string {
	if int(d) < len(durabilityNames) {
		return durabilityNames[d]
	}
	return fmt.Sprintf("Durability(%d)", d)
}

// String returns "sync", "async" or "off".
func (r Replication) String() string {
	if int(r) < len(replicationNames) {
		return replicationNames[r]
	}
	return fmt.Sprintf("Replication(%d)", r)
}

// For returns the entry that applies to the keys of tenant and subject:
// p with the limit of the override that covers them (a (tenant, subject)
// override before a tenant's), or p itself; Limit is 0 for an Unlimited
// override. Overrides is nil in the result. It scans the overrides: for
// error and unavailability answers, not for the decision path (which uses
// the node's prepared table, Entry.ForKey).
func (p Config) For(tenant, subject string) Config {
	var hit *Override
	for i := range p.Overrides {
		o := &p.Overrides[i]
		if o.Tenant != tenant {
			continue
		}
		if o.Subject == subject {
			hit = o
			break
		}
		if o.Subject == "" {
			hit = o
		}
	}
	p.Overrides = nil
	if hit != nil {
		p.Limit = hit.Limit
	}
	return p
}

func (p Config) shard() shard.Policy {
	sp := shard.Policy{Limit: p.Limit, Window: p.Window, Algorithm: p.Algorithm, Resolution: p.Resolution, Period: p.Period}
	if p.Algorithm == shard.Calendar {
		// An unknown zone is reported by Validate; here it leaves UTC.
		sp.Zone, _ = LoadZone(p.Zone)
	}
	return sp
}
