package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer"
)

// TestRaftTraffic measures what the ownership log (log ownership, the
// default) costs a cluster of 3, 16 and 64 members started in one process
// (memberlist and gRPC on 127.0.0.1, the fast gossip profile, the default
// LeaseDuration): the raft messages, their bytes and the commands, per
// second and cluster-wide, over 10 s at rest once settled, and during
// churn, from the moment one member starts joining and another leaves
// gracefully until every member has settled again. The figures are the
// members' own counters (Node.RaftTraffic): messages sent and their
// marshalled bytes (gRPC framing aside), commands proposed (by all
// members) and applied (by one member: every member applies each
// committed command). Opt-in (RINGLIMIT_RAFT_TRAFFIC=1); sizes can be
// narrowed with RINGLIMIT_RAFT_TRAFFIC_MEMBERS=3,16. It takes a few
// minutes on two cores, most of it starting and closing 64 members.
func TestRaftTraffic(t *testing.T) {
	if os.Getenv("RINGLIMIT_RAFT_TRAFFIC") == "" {
		t.Skip("set RINGLIMIT_RAFT_TRAFFIC=1 to measure the ownership log's traffic")
	}
	sizes := []int{3, 16, 64}
	if s := os.Getenv("RINGLIMIT_RAFT_TRAFFIC_MEMBERS"); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 2 {
				t.Fatalf("RINGLIMIT_RAFT_TRAFFIC_MEMBERS: %q is not a member count of at least 2", f)
			}
			sizes = append(sizes, n)
		}
	}
	var rows []trafficRow
	for _, n := range sizes {
		t.Run(fmt.Sprintf("members=%d", n), func(t *testing.T) {
			measureRaftTraffic(t, n, func(r trafficRow) { rows = append(rows, r) })
		})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "ownership log traffic, cluster-wide (default LeaseDuration, fast gossip, one process on 127.0.0.1):\n")
	fmt.Fprintf(&b, "%7s  %-5s  %5s  %8s  %10s  %11s  %9s  %8s  %9s  %9s  %9s\n",
		"members", "phase", "secs", "msgs/s", "bytes/s", "proposals/s", "applied/s", "commands", "bytes/msg", "busiest/s", "dropped/s")
	for _, r := range rows {
		fmt.Fprintf(&b, "%7d  %-5s  %5.1f  %8.0f  %10.0f  %11.1f  %9.1f  %8.0f  %9.0f  %9.0f  %9.1f\n",
			r.members, r.phase, r.secs, r.msgs, r.bytes, r.proposals, r.applied, r.applied*r.secs, r.bytes/max(r.msgs, 1), r.busiest, r.dropped)
	}
	b.WriteString("msgs/s, bytes/s, proposals/s: summed over the members; applied/s: one member's (each applies every command);\n")
	b.WriteString("commands: applied over the phase; busiest/s: the most messages one member sent per second (the leader)\n")
	b.WriteString("rest!: the cluster had not settled within the deadline; measured anyway\n")
	t.Log("\n" + b.String())
}

// trafficRow is one line of the table: rates per second over secs.
type trafficRow struct {
	members int
	phase   string
	secs    float64
	// msgs, bytes and proposals are summed over the members; applied is
	// one member's (the most of any); busiest the most messages one
	// member sent (the leader, as a rule).
	msgs, bytes, proposals, applied, busiest float64
	// dropped is the messages dropped unsent, summed.
	dropped float64
}

const (
	restInterval   = 10 * time.Second
	settleDeadline = 3 * time.Minute
)

// trafficDelta is what changed between two readings of one member's
// counters (a member absent from a reading counts from or to zero).
func trafficDelta(from, to peer.RaftTraffic) peer.RaftTraffic {
	return peer.RaftTraffic{
		MessagesSent: to.MessagesSent - from.MessagesSent,
		BytesSent:    to.BytesSent - from.BytesSent,
		Proposals:    to.Proposals - from.Proposals,
		Applied:      to.Applied - from.Applied,

		MessagesDropped: to.MessagesDropped - from.MessagesDropped,
	}
}

// row sums the members' deltas over d into a table row.
func row(members int, phase string, d time.Duration, deltas []peer.RaftTraffic) trafficRow {
	s := d.Seconds()
	r := trafficRow{members: members, phase: phase, secs: s}
	for _, x := range deltas {
		r.msgs += float64(x.MessagesSent) / s
		r.bytes += float64(x.BytesSent) / s
		r.proposals += float64(x.Proposals) / s
		r.applied = max(r.applied, float64(x.Applied)/s)
		r.busiest = max(r.busiest, float64(x.MessagesSent)/s)
		r.dropped += float64(x.MessagesDropped) / s
	}
	return r
}

// clusterState summarises nodes for a failure: how many see how many
// members, are settled, are live in the log, and the leaders they know.
func clusterState(nodes []*peer.Node) string {
	seen, leaders, reasons := map[int]int{}, map[string]int{}, map[string]int{}
	settled, live := 0, 0
	var dropped uint64
	for _, nd := range nodes {
		seen[len(nd.Members())]++
		if nd.Settled() {
			settled++
		}
		o := nd.Ownership()
		if o.Live {
			live++
		}
		leaders[o.Leader]++
		_, why := nd.Ready()
		reasons[why]++
		dropped += nd.RaftTraffic().MessagesDropped
	}
	return fmt.Sprintf("%d nodes: member counts seen %v, %d settled, %d live in the log, leaders known %v, unready reasons %v, %d raft messages dropped in all",
		len(nodes), seen, settled, live, leaders, reasons, dropped)
}

func measureRaftTraffic(t *testing.T, members int, emit func(trafficRow)) {
	m := newMembers(t)
	settle := func(what string, nodes []*peer.Node) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), settleDeadline)
		defer cancel()
		if err := peer.WaitSettled(ctx, nodes, 0); err != nil {
			t.Fatalf("%s: %v; %s", what, err, clusterState(nodes))
		}
	}
	read := func(nodes []*peer.Node) []peer.RaftTraffic {
		out := make([]peer.RaftTraffic, len(nodes))
		for i, nd := range nodes {
			out[i] = nd.RaftTraffic()
		}
		return out
	}

	t0 := time.Now()
	nodes := m.startN(members)
	// Settled, and a few lease extensions on: the joins' moves and copies
	// are over before the interval starts.
	ctx, cancel := context.WithTimeout(context.Background(), settleDeadline)
	err := peer.WaitSettled(ctx, nodes, 2*time.Second)
	cancel()
	restPhase := "rest"
	if err != nil {
		// Still measured, marked: what an unsettled cluster of this size
		// costs is the figure that explains it.
		t.Errorf("start: %v; %s", err, clusterState(nodes))
		restPhase = "rest!"
	} else {
		t.Logf("%d members started and settled in %v", members, time.Since(t0).Round(time.Millisecond))
	}

	// At rest: a fixed interval.
	t.Logf("before the rest interval: %s", clusterState(nodes))
	before := read(nodes)
	r0 := time.Now()
	timer := time.NewTimer(restInterval)
	<-timer.C
	after := read(nodes)
	took := time.Since(r0)
	t.Logf("after the rest interval: %s", clusterState(nodes))
	deltas := make([]peer.RaftTraffic, members)
	for i := range nodes {
		deltas[i] = trafficDelta(before[i], after[i])
	}
	rest := row(members, restPhase, took, deltas)
	t.Logf("at rest: %+v", rest)
	emit(rest)
	if err != nil {
		return // no churn measured on an unsettled cluster
	}
	settle("still settled after the rest interval", nodes)

	// Churn: one member joins while another (neither the founder nor the
	// first to join) leaves gracefully, until every member has settled.
	leaver := nodes[members/2]
	before = read(nodes)
	c0 := time.Now()
	var joiner *peer.Node
	joined := make(chan struct{})
	go func() {
		defer close(joined)
		joiner = m.start("joiner", []string{nodes[0].GossipAddr()})
	}()
	ctx, cancel = context.WithTimeout(context.Background(), 60*time.Second)
	err = leaver.Close(ctx)
	cancel()
	if err != nil {
		t.Errorf("leave: %v after %v; %s", err, time.Since(c0).Round(time.Millisecond), clusterState(nodes))
	} else {
		t.Logf("leave: Close took %v", time.Since(c0).Round(time.Millisecond))
	}
	leaverDone := leaver.RaftTraffic() // its counters stop with it
	<-joined
	if joiner == nil {
		t.FailNow()
	}
	var now []*peer.Node
	for _, nd := range nodes {
		if nd != leaver {
			now = append(now, nd)
		}
	}
	now = append(now, joiner)
	settle("churn", now)
	took = time.Since(c0)
	deltas = deltas[:0]
	for i, nd := range nodes {
		if nd == leaver {
			deltas = append(deltas, trafficDelta(before[i], leaverDone))
			continue
		}
		deltas = append(deltas, trafficDelta(before[i], nd.RaftTraffic()))
	}
	deltas = append(deltas, joiner.RaftTraffic())
	churn := row(members, "churn", took, deltas)
	t.Logf("churn (join + leave, %v until settled): %+v", took.Round(time.Millisecond), churn)
	emit(churn)
}
