package console

import (
	"slices"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer"
)

var t0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

func member(name, gossip string, epoch uint64) peer.MemberView {
	return peer.MemberView{Name: name, Gossip: gossip, LivenessEpoch: epoch, PolicyVersion: 1}
}

func parts(holders ...string) []peer.PartitionView {
	out := make([]peer.PartitionView, len(holders))
	for i, h := range holders {
		out[i] = peer.PartitionView{Partition: i, Holder: h, Target: h}
	}
	return out
}

// TestTimeline steps the timeline through pairs of statuses and checks
// the kinds of events each step adds.
func TestTimeline(t *testing.T) {
	base := peer.Overview{Name: "a", Leader: "a", Ready: true, LivenessLeft: time.Second, PolicyVersion: 1,
		Members: []peer.MemberView{member("a", "alive", 1), member("b", "alive", 1), member("c", "alive", 1)}, Partitions: parts("a", "b", "c", "c")}
	with := func(f func(*peer.Overview)) peer.Overview {
		s := base
		s.Members = slices.Clone(base.Members)
		s.Partitions = slices.Clone(base.Partitions)
		f(&s)
		return s
	}
	for _, tc := range []struct {
		name string
		next peer.Overview
		want []string
	}{
		{"nothing changed", base, nil},
		{"join", with(func(s *peer.Overview) { s.Members = append(s.Members, member("d", "alive", 1)) }), []string{"join"}},
		{"crash: log ends c, backups take over", with(func(s *peer.Overview) {
			s.Members[2].LivenessEpoch = 2
			s.Partitions[2].Holder, s.Partitions[3].Holder = "a", "b"
		}), []string{"fail", "takeover", "takeover"}},
		{"gossip declares c dead", with(func(s *peer.Overview) { s.Members[2].Gossip = "failed" }), []string{"fail"}},
		{"c gone without leaving", with(func(s *peer.Overview) { s.Members = s.Members[:2] }), []string{"fail"}},
		{"move to a live member", with(func(s *peer.Overview) { s.Partitions[0].Holder = "b" }), []string{"move"}},
		{"vacant", with(func(s *peer.Overview) { s.Partitions[1].Holder = "" }), []string{"vacant"}},
		{"leader change", with(func(s *peer.Overview) { s.Leader, s.Term = "b", 2 }), []string{"leader"}},
		{"policy reload here", with(func(s *peer.Overview) { s.PolicyVersion = 2 }), []string{"policy"}},
		{"another member's policy", with(func(s *peer.Overview) { s.Members[1].PolicyVersion = 7 }), []string{"policy"}},
		{"a failed member's version reads 0", with(func(s *peer.Overview) { s.Members[1].Gossip, s.Members[1].PolicyVersion = "failed", 0 }), []string{"fail"}},
		{"ignored", with(func(s *peer.Overview) {
			s.Members[1].Gossip, s.Members[1].Ignored = "ignored", "placement fingerprint differs"
		}), []string{"ignored"}},
		{"own liveness lapsed", with(func(s *peer.Overview) { s.LivenessLeft = 0 }), []string{"lapse"}},
		{"not ready", with(func(s *peer.Overview) { s.Ready, s.NotReady = false, "alone" }), []string{"ready"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tl timeline
			tl.observe(base, t0)
			tl.observe(tc.next, t0.Add(time.Second))
			var kinds []string
			for _, e := range tl.list()[1:] {
				kinds = append(kinds, e.Kind)
				if e.Node != "a" || !e.At.Equal(t0.Add(time.Second)) {
					t.Errorf("event %+v: want node a at t0+1s", e)
				}
			}
			if !slices.Equal(kinds, tc.want) {
				t.Errorf("events %v, want %v (%+v)", kinds, tc.want, tl.list())
			}
		})
	}
}

// TestTimelineBounded: the ring keeps the newest maxEvents, oldest first.
func TestTimelineBounded(t *testing.T) {
	var tl timeline
	for i := range maxEvents + 10 {
		tl.add(Event{At: t0.Add(time.Duration(i) * time.Second)})
	}
	l := tl.list()
	if len(l) != maxEvents || !l[0].At.Equal(t0.Add(10*time.Second)) || !l[len(l)-1].At.Equal(t0.Add(time.Duration(maxEvents+9)*time.Second)) {
		t.Errorf("%d events from %v to %v; want %d from t0+10s", len(l), l[0].At, l[len(l)-1].At, maxEvents)
	}
}

// TestRecorder: decisions are counted per policy and outcome in the
// second they were made; a peer's forwarded decision and non-decisions
// are not; the policy set is bounded.
func TestRecorder(t *testing.T) {
	r := NewRecorder(nil)
	r.Decision("api", peer.ReasonAdmitted, peer.PathLocal)
	r.Decision("api", peer.ReasonAdmitted, peer.PathForwarded)
	r.Decision("api", peer.ReasonOverLimit, peer.PathLocal)
	r.Decision("api", peer.ReasonAdmitted, peer.PathRemote) // the asker counts it
	r.Decision("api", peer.ReasonPeek, peer.PathLocal)      // not a decision
	r.Decision("login", peer.ReasonUnavailable, peer.PathLocal)
	r.Forward("b", "ok", 3*time.Millisecond)
	r.Tick(t0)
	r.Decision("api", peer.ReasonFailedOpen, peer.PathLocal)
	r.Tick(t0.Add(bucketSeconds * time.Second))
	tr := r.Traffic(t0.Add(bucketSeconds * time.Second))
	last := len(tr.Latency) - 1
	if got := tr.Policies["api"][last-1]; got != [nOutcomes]uint64{2, 1, 0} {
		t.Errorf("api in t0's bucket: %v, want [2 1 0]", got)
	}
	if got := tr.Policies["api"][last]; got != [nOutcomes]uint64{0, 0, 1} {
		t.Errorf("api in the next bucket: %v, want [0 0 1] (failed open counts as unavailable)", got)
	}
	if got := tr.Policies["login"][last-1]; got != [nOutcomes]uint64{0, 0, 1} {
		t.Errorf("login: %v, want [0 0 1]", got)
	}
	var fwd uint64
	for _, c := range tr.Latency[last-1] {
		fwd += c
	}
	if b := latBucket(3 * time.Millisecond); fwd != 1 || tr.Latency[last-1][b] != 1 || tr.LatencyBounds[b] < 0.003 || tr.LatencyBounds[b-1] >= 0.003 {
		t.Errorf("latency: %v in bucket %d of bounds %v; want one 3 ms forward in the bucket bounding it", tr.Latency[last-1], b, tr.LatencyBounds)
	}
	for i := range maxPolicies + 5 {
		r.Decision(string(rune('A'+i%26))+string(rune('a'+i/26)), peer.ReasonAdmitted, peer.PathLocal)
	}
	r.mu.RLock()
	n := len(r.pols)
	r.mu.RUnlock()
	if n > maxPolicies {
		t.Errorf("%d policies kept, at most %d", n, maxPolicies)
	}
}

// TestRecorderDecisionAllocs: counting a decision of a known policy
// allocates nothing (it runs on the decision path).
func TestRecorderDecisionAllocs(t *testing.T) {
	if raceOn {
		t.Skip("the race detector allocates")
	}
	r := NewRecorder(nil)
	r.Decision("api", peer.ReasonAdmitted, peer.PathLocal)
	if a := testing.AllocsPerRun(1000, func() { r.Decision("api", peer.ReasonAdmitted, peer.PathLocal) }); a != 0 {
		t.Errorf("Decision allocates %v times per call, want 0", a)
	}
}
