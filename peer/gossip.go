package peer

import (
	"fmt"
	"math"
	"time"

	"github.com/hashicorp/memberlist"
)

// GossipProfile names a set of memberlist timings: how often members probe
// and gossip, and how long a silent member is suspected before it is
// declared failed. Config.GossipProfile selects one; Config.Gossip can then
// adjust single knobs. The failure-detection times below are medians of
// TestGossipProfileDetection (a 3-member loopback cluster, one member
// killed without leaving, time until both others have removed it from
// their ring); larger clusters suspect a little longer (memberlist scales
// the suspicion timeout with log10 of the member count).
type GossipProfile string

const (
	// GossipLAN is memberlist's LAN defaults: probe every 1 s with a
	// 500 ms timeout, suspicion 4 probe intervals. A killed member is
	// declared failed in about 5.8 s (median of 3 runs: 5.8, 5.8, 6.8 s).
	// The default.
	GossipLAN GossipProfile = "lan"
	// GossipFast is for one data centre with sub-millisecond round trips
	// (and for tests on loopback): probe every 200 ms with a 100 ms timeout,
	// gossip every 20 ms, suspicion 3 probe intervals. A killed member is
	// declared failed in about 1.2 s (median of 3 runs: 1.0, 1.2, 1.2 s;
	// race detector on). Round trips above ~50 ms, or hosts
	// whose CPU is starved for 100 ms at a time, cause false failures.
	GossipFast GossipProfile = "fast"
	// GossipWAN is memberlist's WAN defaults: probe every 5 s with a 3 s
	// timeout, suspicion 6 probe intervals. A killed member is declared
	// failed in about 40 to 45 s (2 runs: 39.5, 44.5 s).
	GossipWAN GossipProfile = "wan"
)

// GossipProfiles lists the valid profiles, the default first.
var GossipProfiles = []GossipProfile{GossipLAN, GossipFast, GossipWAN}

// ParseGossipProfile maps "lan", "fast" or "wan" (or "", meaning lan) to
// its profile. Anything else wraps ErrInvalidConfig.
func ParseGossipProfile(s string) (GossipProfile, error) {
	if s == "" {
		return GossipLAN, nil
	}
	for _, p := range GossipProfiles {
		if string(p) == s {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: unknown gossip profile %q (want lan, fast or wan)", ErrInvalidConfig, s)
}

// Apply sets mc's timing knobs (probe, gossip, suspicion, push-pull, TCP
// timeout) to the profile's values and leaves every other field alone. An
// unknown profile leaves mc unchanged; New rejects it before this is
// called.
func (p GossipProfile) Apply(mc *memberlist.Config) {
	var src *memberlist.Config
	switch p {
	case GossipLAN, "":
		src = memberlist.DefaultLANConfig()
	case GossipWAN:
		src = memberlist.DefaultWANConfig()
	case GossipFast:
		// The values that kept loopback test clusters on a loaded 2-core
		// machine running the race detector free of false failures; the
		// tighter 50 ms probe timeout and 2-interval suspicion did not.
		src = memberlist.DefaultLANConfig()
		src.ProbeInterval = 200 * time.Millisecond
		src.ProbeTimeout = 100 * time.Millisecond
		src.GossipInterval = 20 * time.Millisecond
		src.GossipToTheDeadTime = 2 * time.Second
		src.SuspicionMult = 3
		src.SuspicionMaxTimeoutMult = 2
		src.PushPullInterval = 500 * time.Millisecond
		src.TCPTimeout = time.Second
		src.IndirectChecks = 2
		src.RetransmitMult = 2
		src.DeadNodeReclaimTime = 100 * time.Millisecond
	default:
		return
	}
	mc.ProbeInterval = src.ProbeInterval
	mc.ProbeTimeout = src.ProbeTimeout
	mc.GossipInterval = src.GossipInterval
	mc.GossipNodes = src.GossipNodes
	mc.GossipToTheDeadTime = src.GossipToTheDeadTime
	mc.SuspicionMult = src.SuspicionMult
	mc.SuspicionMaxTimeoutMult = src.SuspicionMaxTimeoutMult
	mc.PushPullInterval = src.PushPullInterval
	mc.TCPTimeout = src.TCPTimeout
	mc.IndirectChecks = src.IndirectChecks
	mc.RetransmitMult = src.RetransmitMult
	mc.DeadNodeReclaimTime = src.DeadNodeReclaimTime
}

// reconnectInterval is the profile's default Config.ReconnectInterval:
// about one failure-detection time, so a healed partition merges within
// one or two of them.
func (p GossipProfile) reconnectInterval() time.Duration {
	switch p {
	case GossipFast:
		return time.Second
	case GossipWAN:
		return 30 * time.Second
	default:
		return 10 * time.Second
	}
}

// Sizing gossip for the cluster. memberlist already scales some timings
// with the member count N it sees: the suspicion timeout is SuspicionMult
// × log10(N) probe intervals (at least one), a suspicion nobody confirms
// lasts SuspicionMaxTimeoutMult times that, each message is retransmitted
// RetransmitMult × ceil(log10(N+1)) times, and push-pull syncs space out
// by log2(N/32)+1 above 32 members. It leaves three things fixed: the
// independent confirmations that shrink a suspicion to its minimum
// (SuspicionMult − 2: one under fast, two under lan), how much longer an
// unconfirmed suspicion lasts, and the retransmission base (fast halves
// lan's 4). A member is probed about once a probe interval whatever N is,
// so each member's chance of being suspected falsely stays the same, but
// the cluster has N of them: at 64 members 64 times as many false
// suspicions a second as at one, and under fast a single confirming
// prober (itself starved, on a loaded host) declares a live member failed
// at the minimum timeout. ApplySized raises the three with N, so a false
// suspicion needs more independent probers to agree and a lone one has
// longer to be refuted, while a real failure (every prober agrees) is
// still declared at memberlist's minimum. Holders are not taken over on
// gossip's word (their liveness in the ownership log expires first), so a
// slower verdict at size delays where partitions are aimed, not how soon a
// crashed holder's keys come back.

// sizedFrom is the member count above which ApplySized changes anything:
// the ring's own threshold for more partitions (ring.PartitionsFor).
const sizedFrom = 16

// ApplySized is Apply for a cluster expected to reach members members.
// Up to 16 members (and for 0) it is Apply. Beyond, it keeps at least
// 2 + ceil(log10(members)) as SuspicionMult (confirmations: 2 up to 100
// members, 3 up to 1 000, 4 beyond), ceil(log2(members/8)) as
// SuspicionMaxTimeoutMult (64 members: 3, 1 024: 7) and 4 as
// RetransmitMult (lan's); a profile that has more keeps its own. With
// fast at 64 members: suspicion 1.44 s (was 1.08), unconfirmed 4.3 s
// (was 2.2), 8 retransmissions (was 4).
func (p GossipProfile) ApplySized(mc *memberlist.Config, members int) {
	p.Apply(mc)
	if members <= sizedFrom {
		return
	}
	n := float64(members)
	mc.SuspicionMult = max(mc.SuspicionMult, 2+int(math.Ceil(math.Log10(n))))
	mc.SuspicionMaxTimeoutMult = max(mc.SuspicionMaxTimeoutMult, int(math.Ceil(math.Log2(n/8))))
	mc.RetransmitMult = max(mc.RetransmitMult, 4)
}
