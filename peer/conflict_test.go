package peer

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestDuplicateNameRefused starts a second node under a live member's name.
// New must fail with ErrDuplicateName naming the other address, and the
// established member must keep its place, address and service. The cases
// run in turn on one cluster: each checks that the ring is unchanged and
// every member serves after its refused duplicate, so the next starts from
// the cluster as started (after a failed case the rest do not run).
func TestDuplicateNameRefused(t *testing.T) {
	t.Parallel()
	pols := map[string]PolicyConfig{"p": {Limit: 100, Window: time.Minute}}
	c := startCluster(t, 2, Config{Policies: pols})
	for _, tc := range []struct {
		name string
		seed int // node the duplicate joins through
		dup  int // node whose name it takes
	}{
		{"name of the seed", 0, 0},
		{"name of another member", 0, 1},
	} {
		// A case that fails leaves the cluster as it found it, or not:
		// the next case would only report that again.
		if !t.Run(tc.name, func(t *testing.T) {
			victim := c.nodes[tc.dup]
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cfg := Config{Name: victim.Name(), Policies: pols, GossipProfile: GossipFast,
				Join: []string{c.nodes[tc.seed].GossipAddr()}, Logger: testLogger(t)}
			withTestPartitions(&cfg)
			nd, err := New(ctx, cfg)
			if err == nil {
				_ = nd.Close(context.Background())
				t.Fatalf("New under the name %q of a live member succeeded", victim.Name())
			}
			if !errors.Is(err, ErrDuplicateName) || !strings.Contains(err.Error(), victim.GossipAddr()) {
				t.Fatalf("New under a live member's name = %v; want ErrDuplicateName naming %s", err, victim.GossipAddr())
			}
			for _, o := range c.nodes {
				if got := o.Members(); !slices.Equal(got, []string{"n0", "n1"}) {
					t.Fatalf("%s ring = %v after the refused duplicate, want [n0 n1]", o.Name(), got)
				}
				key := pmKeyOwnedBy(t, o, "p", victim.Name())
				if d, err := o.Allow(context.Background(), Request{Key: key}); err != nil || d.Owner != victim.Name() {
					t.Fatalf("Allow via %s after the refused duplicate = %+v, %v; want a decision by %s", o.Name(), d, err, victim.Name())
				}
			}
		}) {
			return
		}
	}
}

// TestDuplicateNameOfUnreachableMember starts a second node under the name
// of a live member that the seed cannot reach: first while the seed only
// suspects it, then once the seed has declared it dead. memberlist reports
// a second claimant only when the claim it merges is alive; a suspect or
// dead one merged as a rumour about the joiner, which refuted it and
// joined (seen under load: the seed's probes of a starved member timed
// out). New must fail with ErrDuplicateName naming the member's address
// in both states: the member's gossip port still accepts connections.
// TestOwnershipCrashAndRestart restarts a killed member under its name at
// another address, which must still join.
func TestDuplicateNameOfUnreachableMember(t *testing.T) {
	t.Parallel()
	pols := map[string]PolicyConfig{"p": {Limit: 100, Window: time.Minute}}
	split := &gossipSplit{}
	tap, log := newLogTap(t)
	c := startClusterWith(t, 2, Config{Policies: pols, Gossip: split.gossip(t)}, func(i int, cfg *Config) {
		if i == 0 {
			cfg.Logger = log
		}
	})
	n0, victim := c.nodes[0], c.nodes[1]
	// memberlist's words as the seed suspects the victim, then the seed's
	// when gossip declares it dead.
	suspected := tap.on("Suspect "+victim.Name()+" has failed, no acks received", nil)
	dead := tap.on("gossip membership: member declared dead stays on the ring while its liveness holds", func(a map[string]string) bool {
		return a["event"] == "failed" && a["member"] == victim.Name()
	})
	// The seed and the victim no longer reach each other; the duplicate,
	// outside the split's transports, reaches both.
	split.small.Store(&map[string]bool{victim.GossipAddr(): true})
	for _, tc := range []struct {
		name  string
		state <-chan map[string]string
	}{
		{"suspected by the seed", suspected},
		{"declared dead by the seed", dead},
	} {
		if !t.Run(tc.name, func(t *testing.T) {
			waitLog(t, tc.state, 15*time.Second, "the seed to find the victim "+tc.name[:strings.Index(tc.name, " by")])
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			cfg := Config{Name: victim.Name(), Policies: pols, GossipProfile: GossipFast,
				Join: []string{n0.GossipAddr()}, Logger: testLogger(t)}
			withTestPartitions(&cfg)
			nd, err := New(ctx, cfg)
			if err == nil {
				_ = nd.Close(context.Background())
				t.Fatalf("New under the name %q of a live member %s succeeded", victim.Name(), tc.name)
			}
			if !errors.Is(err, ErrDuplicateName) || !strings.Contains(err.Error(), victim.GossipAddr()) {
				t.Fatalf("New under a live member's name = %v; want ErrDuplicateName naming %s", err, victim.GossipAddr())
			}
		}) {
			return
		}
	}
}
