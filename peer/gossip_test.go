package peer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/ringlimit/ringlimit/ring"
)

func TestGossipProfileParse(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    GossipProfile
		wantErr bool
	}{
		{"", GossipLAN, false},
		{"lan", GossipLAN, false},
		{"fast", GossipFast, false},
		{"wan", GossipWAN, false},
		{"LAN", "", true},
		{"moon", "", true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseGossipProfile(tc.in)
			if tc.wantErr {
				if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "lan, fast or wan") {
					t.Fatalf("ParseGossipProfile(%q) = %v, %v; want ErrInvalidConfig listing lan, fast or wan", tc.in, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseGossipProfile(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}

// TestGossipProfileConfig checks that New rejects an unknown profile and
// that a profile's timings reach memberlist before Config.Gossip runs.
func TestGossipProfileConfig(t *testing.T) {
	_, err := New(context.Background(), Config{GossipProfile: "moon"})
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), `"moon"`) {
		t.Fatalf("New with profile moon = %v, want ErrInvalidConfig naming it", err)
	}
	for _, tc := range []struct {
		profile GossipProfile
		probe   time.Duration
	}{{"", time.Second}, {GossipLAN, time.Second}, {GossipFast, 200 * time.Millisecond}, {GossipWAN, 5 * time.Second}} {
		t.Run(fmt.Sprintf("profile=%s", tc.profile), func(t *testing.T) {
			var probe, gossipNodes time.Duration
			nd, err := New(context.Background(), Config{GossipProfile: tc.profile, Logger: testLogger(t), Gossip: func(mc *memberlist.Config) {
				probe, gossipNodes = mc.ProbeInterval, time.Duration(mc.GossipNodes)
				mc.GossipNodes = 7 // Gossip runs after the profile
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer nd.Close(context.Background())
			if probe != tc.probe || gossipNodes == 0 {
				t.Fatalf("probe interval seen by Config.Gossip = %v, want %v", probe, tc.probe)
			}
		})
	}
}

// TestGossipProfileDetection measures each profile's failure-detection
// time: in a 3-member cluster one member is killed (no leave), and the
// time until both others have removed it from their ring is recorded. The
// fast profile runs always and must detect within 3 s (one run; the 3
// runs of a median only when measuring); lan and wan take seconds to a
// minute per run and only run with RINGLIMIT_MEASURE_GOSSIP=1. The
// medians are documented on GossipLAN, GossipFast and GossipWAN. Measuring wan trips the package's leak check:
// memberlist's probe goroutine outlives Shutdown by up to one probe
// interval (5 s for wan), longer than goleak waits.
func TestGossipProfileDetection(t *testing.T) {
	measure := os.Getenv("RINGLIMIT_MEASURE_GOSSIP") != ""
	for _, tc := range []struct {
		profile GossipProfile
		runs    int
		bound   time.Duration
	}{{GossipFast, 3, 3 * time.Second}, {GossipLAN, 3, 20 * time.Second}, {GossipWAN, 2, 3 * time.Minute}} {
		t.Run(fmt.Sprintf("profile=%s", tc.profile), func(t *testing.T) {
			if tc.profile != GossipFast && !measure {
				t.Skip("set RINGLIMIT_MEASURE_GOSSIP=1 to measure this profile")
			}
			runs := tc.runs
			if !measure {
				// Each run checks the bound alike; one is the check,
				// more only sharpen the median.
				runs = 1
			}
			var ds []time.Duration
			for run := range runs {
				ds = append(ds, detectionTime(t, tc.profile, run, tc.bound))
			}
			slices.Sort(ds)
			t.Logf("profile %s: failure detected in median %v (runs %v)", tc.profile, ds[len(ds)/2], ds)
		})
	}
}

// detectionTime starts a 3-member cluster with profile, kills one member
// and returns the time until both others have removed it from their ring.
func detectionTime(t *testing.T, profile GossipProfile, run int, bound time.Duration) time.Duration {
	t.Helper()
	c := &cluster{t: t, base: Config{GossipProfile: profile, Gossip: func(*memberlist.Config) {}}}
	for i := range 3 {
		c.add(fmt.Sprintf("d%d-%d", run, i))
	}
	c.waitMembers(3)
	victim := c.nodes[2]
	start := time.Now()
	victim.KillForTest()
	for _, nd := range c.nodes[:2] {
		waitView(t, nd, bound, fmt.Sprintf("%s to drop %s", nd.Name(), victim.Name()), func() bool { return len(nd.Members()) == 2 })
	}
	d := time.Since(start)
	for _, nd := range c.nodes[:2] {
		_ = nd.Close(context.Background())
	}
	return d
}

// waitView waits until cond holds, re-checking it each time nd publishes a
// new ring view, and fails naming what did not happen after d.
func waitView(t testing.TB, nd *Node, d time.Duration, what string, cond func() bool) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		ch := nd.gossiper.viewChanged()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-timer.C:
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
	}
}

// TestGossipApplySized checks ApplySized's rule: the profile unchanged up
// to 16 members; beyond, at least 2 + ceil(log10 N) as SuspicionMult,
// ceil(log2(N/8)) as SuspicionMaxTimeoutMult and 4 as RetransmitMult,
// a profile's larger values kept; the other timings untouched.
func TestGossipApplySized(t *testing.T) {
	for _, tc := range []struct {
		profile                   GossipProfile
		members                   int
		mult, maxMult, retransmit int
	}{
		{GossipFast, 0, 3, 2, 2},
		{GossipFast, 16, 3, 2, 2},
		{GossipFast, 17, 4, 2, 4},
		{GossipFast, 64, 4, 3, 4},
		{GossipFast, 256, 5, 5, 4},
		{GossipFast, 1024, 6, 7, 4},
		{GossipLAN, 64, 4, 6, 4},
		{GossipLAN, 1024, 6, 7, 4},
		{GossipWAN, 1024, 6, 7, 4},
	} {
		var plain, sized memberlist.Config
		tc.profile.Apply(&plain)
		tc.profile.ApplySized(&sized, tc.members)
		got := [3]int{sized.SuspicionMult, sized.SuspicionMaxTimeoutMult, sized.RetransmitMult}
		if want := [3]int{tc.mult, tc.maxMult, tc.retransmit}; got != want {
			t.Errorf("%s at %d members: SuspicionMult, SuspicionMaxTimeoutMult, RetransmitMult = %v, want %v", tc.profile, tc.members, got, want)
		}
		if sized.ProbeInterval != plain.ProbeInterval || sized.ProbeTimeout != plain.ProbeTimeout || sized.GossipInterval != plain.GossipInterval {
			t.Errorf("%s at %d members: probe and gossip timings changed", tc.profile, tc.members)
		}
	}
}

// TestExpectedMembersConfig: ExpectedMembers sets the partition count
// when none is given, keeps a given one, and is checked.
func TestExpectedMembersConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want int
	}{
		{Config{}, 271},
		{Config{ExpectedMembers: 16}, 271},
		{Config{ExpectedMembers: 64}, 1031},
		{Config{ExpectedMembers: 1024}, 16411},
		{Config{ExpectedMembers: 1024, Ring: ring.Config{PartitionCount: 4099}}, 4099},
	} {
		if got := tc.cfg.withDefaults().Ring.PartitionCount; got != tc.want {
			t.Errorf("ExpectedMembers %d, PartitionCount %d: %d partitions, want %d", tc.cfg.ExpectedMembers, tc.cfg.Ring.PartitionCount, got, tc.want)
		}
	}
	for _, bad := range []int{-1, ring.MaxExpectedMembers + 1} {
		err := Config{ExpectedMembers: bad}.withDefaults().validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "expected members") {
			t.Errorf("ExpectedMembers %d: validate = %v, want ErrInvalidConfig naming expected members", bad, err)
		}
	}
}
