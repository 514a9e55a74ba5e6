package console

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/peer"
)

// maxEvents bounds the timeline a node keeps: the oldest event goes first.
const maxEvents = 512

// Event is one line of the timeline: something this node saw change.
type Event struct {
	// At is when this node saw it (to the sampling period, a second).
	At time.Time `json:"at"`
	// Kind is one of join, leave, ignored, fail, back, takeover, move,
	// vacant, leader, lapse, policy, ready, start.
	Kind string `json:"kind"`
	// Member is the member it is about ("" for none).
	Member string `json:"member,omitempty"`
	// Text says what happened, for people.
	Text string `json:"text"`
	// Node is the node that saw it.
	Node string `json:"node"`
}

// timeline is a bounded ring of events, fed by diffing the node's status
// from one sample to the next: what gossip and the ownership log already
// log, kept where a page can read it. Safe for concurrent use.
type timeline struct {
	mu     sync.Mutex
	events []Event // ring, len ≤ maxEvents
	head   int     // next slot once full
	prev   *peer.Overview
	// counts, as Counters reports them.
	counts Counters
}

// Counters are what the console's sampling has counted since it started:
// for metrics an embedding application exports (serve: the
// ringlimit_log_leader_changes_total and ringlimit_liveness_lapses_total
// counters). They count changes between two samples, so two changes
// within one sampling period count once.
type Counters struct {
	// LeaderChanges counts the log leader changes this node saw (to none
	// included).
	LeaderChanges uint64
	// LivenessLapses counts the times this node's own liveness was found
	// lapsed after it had held.
	LivenessLapses uint64
}

func (t *timeline) add(e Event) {
	if len(t.events) < maxEvents {
		t.events = append(t.events, e)
		return
	}
	t.events[t.head] = e
	t.head = (t.head + 1) % maxEvents
}

// list returns the events, oldest first. The caller owns the slice.
func (t *timeline) list() []Event {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Event, 0, len(t.events))
	out = append(out, t.events[t.head:]...)
	return append(out, t.events[:t.head]...)
}

func (t *timeline) counters() Counters {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.counts
}

// observe records what changed between the previous status and st, seen
// at now.
func (t *timeline) observe(st peer.Overview, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ev := func(kind, member, format string, args ...any) {
		t.add(Event{At: now, Kind: kind, Member: member, Text: fmt.Sprintf(format, args...), Node: st.Name})
	}
	prev := t.prev
	t.prev = &st
	if prev == nil {
		ev("start", st.Name, "console started: %d members, %d partitions, leader %s", len(st.Members), len(st.Partitions), orNone(st.Leader))
		return
	}
	was := map[string]peer.MemberView{}
	for _, m := range prev.Members {
		was[m.Name] = m
	}
	now2 := map[string]peer.MemberView{}
	for _, m := range st.Members {
		now2[m.Name] = m
		p, ok := was[m.Name]
		switch {
		case !ok:
			ev("join", m.Name, "%s joined (%s)", m.Name, m.Gossip)
		case p.Gossip == m.Gossip:
		case m.Gossip == "failed":
			ev("fail", m.Name, "%s failed: gossip declared it dead (it stays on the ring while its liveness holds)", m.Name)
		case m.Gossip == "ignored":
			ev("ignored", m.Name, "%s is left out of the ring: %s", m.Name, m.Ignored)
		case m.Gossip == "leaving":
			ev("leave", m.Name, "%s is leaving", m.Name)
		case p.Gossip == "failed" || p.Gossip == "ignored":
			ev("back", m.Name, "%s is %s again", m.Name, m.Gossip)
		}
		// A member out of gossip says no version (0): not a change.
		if ok && p.PolicyVersion != m.PolicyVersion && p.PolicyVersion != 0 && m.PolicyVersion != 0 && m.Name != st.Name {
			ev("policy", m.Name, "%s runs policy table version %d (was %d)", m.Name, m.PolicyVersion, p.PolicyVersion)
		}
		if ok && !p.LivenessEnded && m.LivenessEnded {
			ev("fail", m.Name, "%s's liveness ended for good (incarnation %s)", m.Name, m.Incarnation)
		} else if ok && m.LivenessEpoch > p.LivenessEpoch && p.LivenessEpoch != 0 {
			ev("fail", m.Name, "%s's liveness ended at epoch %d: every partition it held is taken over", m.Name, p.LivenessEpoch)
		}
	}
	for _, p := range prev.Members {
		if _, ok := now2[p.Name]; ok {
			continue
		}
		if p.Gossip == "leaving" || p.LivenessEnded {
			ev("leave", p.Name, "%s left the member list", p.Name)
		} else {
			ev("fail", p.Name, "%s failed: gossip declared it dead and it left the ring", p.Name)
		}
	}
	if prev.LivenessLeft > 0 && st.LivenessLeft == 0 {
		t.counts.LivenessLapses++
		ev("lapse", st.Name, "%s's own liveness lapsed: it decides for no partition until the log extends it", st.Name)
	}
	if prev.Leader != st.Leader {
		t.counts.LeaderChanges++
		ev("leader", st.Leader, "ownership log leader: %s (was %s), term %d", orNone(st.Leader), orNone(prev.Leader), st.Term)
	}
	if prev.PolicyVersion != st.PolicyVersion {
		ev("policy", st.Name, "policy table reloaded here: version %d (was %d)", st.PolicyVersion, prev.PolicyVersion)
	}
	if prev.Ready != st.Ready {
		if st.Ready {
			ev("ready", st.Name, "%s is ready", st.Name)
		} else {
			ev("ready", st.Name, "%s is not ready: %s", st.Name, st.NotReady)
		}
	}
	// Holder changes, summed per (kind, from, to): a failure moves dozens
	// of partitions at once.
	type change struct{ kind, from, to string }
	counts := map[change][]int{}
	if len(prev.Partitions) == len(st.Partitions) {
		for i, p := range st.Partitions {
			old := prev.Partitions[i]
			if old.Holder == p.Holder {
				continue
			}
			kind := "move"
			switch {
			case p.Holder == "":
				kind = "vacant"
			case old.Holder == "":
				kind = "grant"
			case failed(was[old.Holder], now2[old.Holder]):
				kind = "takeover"
			}
			c := change{kind, old.Holder, p.Holder}
			counts[c] = append(counts[c], p.Partition)
		}
	}
	keys := make([]change, 0, len(counts))
	for c := range counts {
		keys = append(keys, c)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		return a.kind+a.from+a.to < b.kind+b.from+b.to
	})
	for _, c := range keys {
		ps := counts[c]
		switch c.kind {
		case "takeover":
			ev("takeover", c.from, "%s took over %s from failed %s", orNone(c.to), partList(ps), c.from)
		case "vacant":
			ev("vacant", c.from, "%s vacant (held by %s)", partList(ps), c.from)
		case "grant":
			ev("move", c.to, "%s granted to %s", partList(ps), c.to)
		default:
			ev("move", c.to, "%s moved from %s to %s", partList(ps), c.from, c.to)
		}
	}
}

// failed reports whether a holder, was then and now now (zero when
// gone), failed in between or is failed: its liveness epoch grew (the
// log ended it: its partitions go to their backups), or gossip finds it
// dead, or it is gone without having left.
func failed(was, now peer.MemberView) bool {
	if now.Name == "" {
		return was.Gossip != "leaving" && !was.LivenessEnded
	}
	return now.LivenessEpoch > was.LivenessEpoch && was.LivenessEpoch != 0 || now.Gossip == "failed"
}

// partList says "3 partitions (4, 17, 90)", listing at most 8.
func partList(ps []int) string {
	var b strings.Builder
	if len(ps) == 1 {
		return fmt.Sprintf("partition %d", ps[0])
	}
	fmt.Fprintf(&b, "%d partitions (", len(ps))
	for i, p := range ps {
		if i == 8 {
			b.WriteString(", …")
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprint(&b, p)
	}
	b.WriteString(")")
	return b.String()
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
