package peer

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// TestQuorumLossWarns runs the two-member cluster of issue 27: both
// members warn once the cluster has stayed two for twoMemberGrace, naming
// the member whose loss stops decisions; that member is killed, and the survivor, which used to
// say only "readiness changed", warns that it has no majority, for how
// many partitions, and until when at the latest; once the failed member
// ages out (FailedMemberTimeout) it says decisions resume.
func TestQuorumLossWarns(t *testing.T) {
	ownByGossip(t)
	const failedTimeout = 3 * time.Second
	tap, log := newLogTap(t)
	two := tap.on("cluster of two members: losing the lower-named one stops every decision (no majority without it); run three or more",
		func(a map[string]string) bool { return a["node"] == "n1" })
	c := startClusterWith(t, 2, Config{
		Gossip:              hoCrashGossip,
		LeaseDuration:       500 * time.Millisecond,
		FailedMemberTimeout: failedTimeout,
		Policies:            map[string]PolicyConfig{"p": {Limit: 5, Window: time.Minute}},
	}, func(i int, cfg *Config) { cfg.Logger = log })
	if a := waitLog(t, two, 20*time.Second, "n1's warning about a two-member cluster"); a["stops_if_lost"] != "n0" || a["members"] != "2" {
		t.Errorf("two-member warning %v: want stops_if_lost=n0 members=2", a)
	}
	survivor := c.nodes[1]
	waitFor(t, 10*time.Second, "n1 to hold partitions with n0 as backup", func() bool {
		held, _ := survivor.heldPartitions()
		return held > 0 && survivor.Settled()
	})
	lost := tap.on("no majority of members: partitions without a live backup stop deciding until failed members return or age out",
		func(a map[string]string) bool { return a["node"] == "n1" })
	back := tap.on("majority of members regained: decisions resume", func(a map[string]string) bool { return a["node"] == "n1" })
	killed := time.Now()
	c.nodes[0].KillForTest()
	a := waitLog(t, lost, 15*time.Second, "n1's warning that it has no majority")
	held, _ := survivor.heldPartitions()
	if n, err := strconv.Atoi(a["partitions"]); err != nil || n == 0 || n > held {
		t.Errorf("no-majority warning %v: partitions %q, want 1 to the %d n1 holds", a, a["partitions"], held)
	}
	if a["members_alive"] != "1" || a["members_failed"] != "1" || a["failed"] != "[n0]" {
		t.Errorf("no-majority warning %v: want members_alive=1 members_failed=1 failed=[n0]", a)
	}
	until, err := time.Parse(time.RFC3339, a["until"])
	if err != nil || until.Before(killed.Add(failedTimeout).Truncate(time.Second)) || until.After(time.Now().Add(failedTimeout+time.Second)) {
		t.Errorf("no-majority warning until %q (%v): want about %v after the kill at %v", a["until"], err, failedTimeout, killed.UTC())
	}
	waitLog(t, back, failedTimeout+10*time.Second, "n1 to say decisions resume once n0 aged out")
}

// TestQuorumNoWarningWhenThreeBecomeTwo starts three members (two for a
// moment, while the third joins) and closes one (a rolling restart's
// step): the survivors are two, but never stayed two after growing to
// two, and do not warn about a two-member cluster; nobody, the leaver
// included, warns about a lost majority. (Both used to warn: the demo's
// cluster printed two such warnings as it formed.)
func TestQuorumNoWarningWhenThreeBecomeTwo(t *testing.T) {
	ownByGossip(t)
	tap, log := newLogTap(t)
	warned := tap.on("cluster of two members: losing the lower-named one stops every decision (no majority without it); run three or more", nil)
	c := startClusterWith(t, 3, Config{Policies: map[string]PolicyConfig{"p": {Limit: 5, Window: time.Minute}}},
		func(i int, cfg *Config) { cfg.Logger = log })
	lost := tap.on("no majority of members: partitions without a live backup stop deciding until failed members return or age out", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.nodes[2].Close(ctx); err != nil {
		t.Fatal(err)
	}
	size := func(n *Node) int {
		// storeQuorum logs under the same lock it sets size under: once
		// size is 2, its line (if any) is out.
		n.quorumWatch.mu.Lock()
		defer n.quorumWatch.mu.Unlock()
		return n.quorumWatch.size
	}
	waitFor(t, 15*time.Second, "the survivors to count two members", func() bool {
		return size(c.nodes[0]) == 2 && size(c.nodes[1]) == 2
	})
	select {
	case a := <-warned:
		t.Fatalf("a member that left a three-member cluster gave a two-member warning: %v", a)
	case a := <-lost:
		t.Fatalf("a graceful leave gave a no-majority warning: %v", a)
	default:
	}
}
