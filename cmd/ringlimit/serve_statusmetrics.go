package main

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/peer/console"
)

// statusCollector exports, at each scrape, what the node's overview and
// its console's sampling say about ownership: the log's term, leader and
// lag, this node's liveness, and the partitions by state. They are what
// the Grafana dashboard and the alert rules (deploy/mixin) read beside
// peer/prommetrics' series.
type statusCollector struct {
	node *peer.Node
	cons *console.Console

	term, leader, voter, lag, liveness, parts, leaderChanges, lapses *prometheus.Desc
}

func newStatusCollector(node *peer.Node, cons *console.Console) *statusCollector {
	return &statusCollector{
		node: node, cons: cons,
		term:          prometheus.NewDesc("ringlimit_log_term", "The ownership log's term as this node knows it (it grows with every election).", nil, nil),
		leader:        prometheus.NewDesc("ringlimit_log_leader", "1 when this node leads the ownership log, else 0.", nil, nil),
		voter:         prometheus.NewDesc("ringlimit_log_voter", "1 when this node votes in the ownership log, 0 for a learner.", nil, nil),
		lag:           prometheus.NewDesc("ringlimit_log_apply_lag_entries", "The ownership log's commit index minus the index this node applied.", nil, nil),
		liveness:      prometheus.NewDesc("ringlimit_liveness_remaining_seconds", "How long this node's own liveness lease still holds, on its own clock; 0 once lapsed.", nil, nil),
		parts:         prometheus.NewDesc("ringlimit_partitions", "Partitions by state as this node's applied table says: vacant (no holder, cluster-wide), no_backup (cluster-wide), moving (holder is not the ring's target, cluster-wide), and this node's deciding and fenced.", []string{"state"}, nil),
		leaderChanges: prometheus.NewDesc("ringlimit_log_leader_changes_total", "Ownership log leader changes this node saw (sampled each second).", nil, nil),
		lapses:        prometheus.NewDesc("ringlimit_liveness_lapses_total", "Times this node found its own liveness lapsed after it had held (sampled each second).", nil, nil),
	}
}

func (c *statusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.term, c.leader, c.voter, c.lag, c.liveness, c.parts, c.leaderChanges, c.lapses} {
		ch <- d
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (c *statusCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	st := c.node.Overview(ctx)
	cancel()
	ch <- prometheus.MustNewConstMetric(c.term, prometheus.GaugeValue, float64(st.Term))
	ch <- prometheus.MustNewConstMetric(c.leader, prometheus.GaugeValue, b2f(st.Leader == st.Name))
	ch <- prometheus.MustNewConstMetric(c.voter, prometheus.GaugeValue, b2f(st.Voter))
	lag := 0.0
	if st.Commit > st.Applied {
		lag = float64(st.Commit - st.Applied)
	}
	ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, lag)
	ch <- prometheus.MustNewConstMetric(c.liveness, prometheus.GaugeValue, st.LivenessLeft.Seconds())
	var vacant, noBackup, moving, deciding, fenced float64
	for _, p := range st.Partitions {
		switch {
		case p.Holder == "":
			vacant++
		case p.Backup == "":
			noBackup++
		}
		if p.Holder != "" && p.Target != "" && p.Holder != p.Target {
			moving++
		}
		deciding += b2f(p.Deciding)
		fenced += b2f(p.Fenced)
	}
	for state, v := range map[string]float64{"vacant": vacant, "no_backup": noBackup, "moving": moving, "deciding": deciding, "fenced": fenced} {
		ch <- prometheus.MustNewConstMetric(c.parts, prometheus.GaugeValue, v, state)
	}
	n := c.cons.Counters()
	ch <- prometheus.MustNewConstMetric(c.leaderChanges, prometheus.CounterValue, float64(n.LeaderChanges))
	ch <- prometheus.MustNewConstMetric(c.lapses, prometheus.CounterValue, float64(n.LivenessLapses))
}
