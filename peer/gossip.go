package peer

import (
	"fmt"
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
