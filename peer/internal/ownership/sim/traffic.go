package sim

import (
	"fmt"
	"slices"
	"strings"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
)

// This file counts the simulated network's messages by category, so that
// what ownership costs (the log's messages, and whatever else keeps
// members' liveness) is reported apart from the data plane (forwards,
// replicas, copies, rights). Every message goes through sim.send (or,
// for a raft snapshot or a held-back proposal, through sent and
// received directly): sending counts for the sender when it sends, lost
// or not, and receiving for the receiver when it runs the message. A
// member that leads the log when it sends or receives counts in the
// leader's share, not its own, so that per-member figures are those of
// the followers and learners and the leader's are apart.

// Category names a kind of simulated message. A new kind is one line
// here and one in categories.
type Category uint8

const (
	// Raft is a message of the ownership log: appends, heartbeats,
	// votes, proposals forwarded to the leader, snapshots, and their
	// answers. Its bytes are the marshalled raft message.
	Raft Category = iota
	// KeepAlive is a member's keep-alive to the log's leader, a voter's
	// relayed batch of them, or their answers: raft messages that never
	// enter the log (ownership sessions).
	KeepAlive
	// Forward is a request forwarded to a partition's holder, or its
	// answer.
	Forward
	// Replica is an admission (or a spread key's update) replicated to a
	// partition's backup, or its answer.
	Replica
	// Copy is a partition's state copied to a new holder or backup, or
	// its answer.
	Copy
	// Rights is a spread key's grant request or its answer.
	Rights
	numCategories
)

// categories names each category and says whether it is ownership
// traffic (the rest is the data plane, whose bytes the simulator does
// not model: they count 0).
var categories = [numCategories]struct {
	name      string
	ownership bool
}{
	Raft:      {"raft", true},
	KeepAlive: {"keep-alive", true},
	Forward:   {"forward", false},
	Replica:   {"replica", false},
	Copy:      {"copy", false},
	Rights:    {"rights", false},
}

func (c Category) String() string { return categories[c].name }

// Ownership reports whether c is ownership traffic.
func (c Category) Ownership() bool { return categories[c].ownership }

// Flow is messages and their bytes.
type Flow struct {
	Msgs, Bytes int64
}

func (f *Flow) add(size int) { f.Msgs++; f.Bytes += int64(size) }

// Sub returns f minus g.
func (f Flow) Sub(g Flow) Flow { return Flow{f.Msgs - g.Msgs, f.Bytes - g.Bytes} }

// Counts are one party's messages, by category, sent and received.
type Counts struct {
	Sent, Received [numCategories]Flow
	// AsVoter is how many of its ownership messages it sent or received
	// while it voted in the log (without leading it): a relay of
	// learners' keep-alives.
	AsVoter int64
}

// Ownership sums the ownership categories, sent and received.
func (c *Counts) Ownership() Flow {
	var f Flow
	for k := range numCategories {
		if k.Ownership() {
			f.Msgs += c.Sent[k].Msgs + c.Received[k].Msgs
			f.Bytes += c.Sent[k].Bytes + c.Received[k].Bytes
		}
	}
	return f
}

// Data sums the data plane's categories' messages, sent and received.
func (c *Counts) Data() int64 {
	var n int64
	for k := range numCategories {
		if !k.Ownership() {
			n += c.Sent[k].Msgs + c.Received[k].Msgs
		}
	}
	return n
}

func (c *Counts) sub(d *Counts) Counts {
	var r Counts
	for k := range numCategories {
		r.Sent[k], r.Received[k] = c.Sent[k].Sub(d.Sent[k]), c.Received[k].Sub(d.Received[k])
	}
	r.AsVoter = c.AsVoter - d.AsVoter
	return r
}

// traffic is the run's counts: the whole network's (each message once,
// as sent), the leader's, and each member's (by name: a restarted
// member's incarnations count as one member, as one machine's do).
type traffic struct {
	total  [numCategories]Flow
	types  map[pb.MessageType]Flow // raft messages sent, by type
	leader Counts
	slot   map[string]int
	byName []Counts
}

// party returns the counts m's traffic goes to now.
func (t *traffic) party(m *member) *Counts {
	if m.log.Leader() {
		return &t.leader
	}
	if t.slot == nil {
		t.slot = map[string]int{}
	}
	i, ok := t.slot[m.name]
	if !ok {
		i = len(t.byName)
		t.slot[m.name] = i
		t.byName = append(t.byName, Counts{})
	}
	return &t.byName[i]
}

// raftSent counts a raft message of type t sent.
func (t *traffic) raftSent(typ pb.MessageType, size int) {
	if t.types == nil {
		t.types = map[pb.MessageType]Flow{}
	}
	f := t.types[typ]
	f.add(size)
	t.types[typ] = f
}

// sent counts a message of size bytes that from sends.
func (s *sim) sent(c Category, from *member, size int) {
	s.tr.total[c].add(size)
	p := s.tr.party(from)
	p.Sent[c].add(size)
	s.tr.asVoter(p, c, from)
}

// asVoter counts in p.AsVoter an ownership message of m's while it votes
// and does not lead.
func (t *traffic) asVoter(p *Counts, c Category, m *member) {
	if c.Ownership() && p != &t.leader && m.log.Voter() {
		p.AsVoter++
	}
}

// received counts a message of size bytes that to runs.
func (s *sim) received(c Category, to *member, size int) {
	p := s.tr.party(to)
	p.Received[c].add(size)
	s.tr.asVoter(p, c, to)
}

// Traffic is the network's use over a stretch of virtual time: rates
// per second of it.
type Traffic struct {
	Seconds float64
	// Total is every message once (as sent), by category.
	Total [numCategories]Flow
	// Commands is the ownership commands the log applied.
	Commands int64
	// RaftTypes is the raft messages sent, by type.
	RaftTypes map[pb.MessageType]Flow
	// Leader is what the log's leader sent and received.
	Leader Counts
	// Members is what each other member sent and received, by name
	// (only members that ran in the stretch).
	Members []Counts
	// Running is how many members ran at the end of the stretch.
	Running int
}

// snapshot is the counts so far, for a later Since.
type snapshot struct {
	at       int64
	total    [numCategories]Flow
	commands int64
	types    map[pb.MessageType]Flow
	leader   Counts
	byName   []Counts
}

func (s *sim) snap() snapshot {
	types := make(map[pb.MessageType]Flow, len(s.tr.types))
	for k, f := range s.tr.types {
		types[k] = f
	}
	return snapshot{at: s.now, total: s.tr.total, commands: int64(s.commands), types: types, leader: s.tr.leader, byName: append([]Counts(nil), s.tr.byName...)}
}

// since is the traffic from snapshot a to now.
func (s *sim) since(a snapshot) Traffic {
	t := Traffic{Seconds: time.Duration(s.now - a.at).Seconds(), Commands: int64(s.commands) - a.commands, Leader: s.tr.leader.sub(&a.leader), Running: len(s.members)}
	for k := range numCategories {
		t.Total[k] = s.tr.total[k].Sub(a.total[k])
	}
	t.RaftTypes = map[pb.MessageType]Flow{}
	for k, f := range s.tr.types {
		if d := f.Sub(a.types[k]); d.Msgs > 0 {
			t.RaftTypes[k] = d
		}
	}
	for i := range s.tr.byName {
		var before Counts
		if i < len(a.byName) {
			before = a.byName[i]
		}
		d := s.tr.byName[i].sub(&before)
		if d.Ownership().Msgs > 0 || d.Data() > 0 {
			t.Members = append(t.Members, d)
		}
	}
	return t
}

// RaftMix is the raft messages sent per second by type, the most first,
// on one line.
func (t Traffic) RaftMix() string {
	type kv struct {
		k pb.MessageType
		f Flow
	}
	var kvs []kv
	for k, f := range t.RaftTypes {
		kvs = append(kvs, kv{k, f})
	}
	slices.SortFunc(kvs, func(a, b kv) int { return int(b.f.Msgs - a.f.Msgs) })
	sec := max(t.Seconds, 1e-9)
	parts := make([]string, len(kvs))
	for i, x := range kvs {
		parts[i] = fmt.Sprintf("%s %.0f/s %s/s", x.k, float64(x.f.Msgs)/sec, bytesize(float64(x.f.Bytes)/sec))
	}
	return strings.Join(parts, ", ")
}

// Rates are a Traffic's figures per second.
type Rates struct {
	// OwnMsgs and OwnBytes: every ownership message once, the whole
	// network's; DataMsgs the data plane's.
	OwnMsgs, OwnBytes, DataMsgs float64
	Commands                    float64
	// LeaderMsgs and LeaderBytes: what the leader sent and received.
	LeaderMsgs, LeaderBytes float64
	// MemberMsgs and MemberBytes: what a member other than the leader
	// sent and received, the mean over the members and the most any
	// sent and received (Max...).
	MemberMsgs, MemberBytes, MaxMemberMsgs, MaxMemberBytes float64
	// MaxLearnerMsgs and MaxLearnerBytes: the most a member that never
	// voted in the stretch sent and received (the others are the voters
	// that relay learners' keep-alives); Voters is how many did vote.
	MaxLearnerMsgs, MaxLearnerBytes float64
	Voters                          int
	// Members is how many members the per-member figures are over.
	Members int
}

// Rates returns t's figures per second.
func (t Traffic) Rates() Rates {
	sec := max(t.Seconds, 1e-9)
	var r Rates
	for k := range numCategories {
		if k.Ownership() {
			r.OwnMsgs += float64(t.Total[k].Msgs) / sec
			r.OwnBytes += float64(t.Total[k].Bytes) / sec
		} else {
			r.DataMsgs += float64(t.Total[k].Msgs) / sec
		}
	}
	r.Commands = float64(t.Commands) / sec
	lo := t.Leader.Ownership()
	r.LeaderMsgs, r.LeaderBytes = float64(lo.Msgs)/sec, float64(lo.Bytes)/sec
	r.Members = len(t.Members)
	for i := range t.Members {
		f := t.Members[i].Ownership()
		m, b := float64(f.Msgs)/sec, float64(f.Bytes)/sec
		r.MemberMsgs += m
		r.MemberBytes += b
		r.MaxMemberMsgs = max(r.MaxMemberMsgs, m)
		r.MaxMemberBytes = max(r.MaxMemberBytes, b)
		if t.Members[i].AsVoter > 0 {
			r.Voters++
		} else {
			r.MaxLearnerMsgs = max(r.MaxLearnerMsgs, m)
			r.MaxLearnerBytes = max(r.MaxLearnerBytes, b)
		}
	}
	if r.Members > 0 {
		r.MemberMsgs /= float64(r.Members)
		r.MemberBytes /= float64(r.Members)
	}
	return r
}

// String is the rates on one line.
func (r Rates) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ownership %.1f msgs/s %s/s, %.1f commands/s; leader %.1f msgs/s %s/s; per member %.1f msgs/s %s/s (max %.1f msgs/s %s/s; a learner's max %.1f msgs/s %s/s; %d members, %d voting); data plane %.0f msgs/s",
		r.OwnMsgs, bytesize(r.OwnBytes), r.Commands, r.LeaderMsgs, bytesize(r.LeaderBytes), r.MemberMsgs, bytesize(r.MemberBytes), r.MaxMemberMsgs, bytesize(r.MaxMemberBytes),
		r.MaxLearnerMsgs, bytesize(r.MaxLearnerBytes), r.Members, r.Voters, r.DataMsgs)
	return b.String()
}

// bytesize writes n bytes with a decimal unit.
func bytesize(n float64) string {
	switch {
	case n >= 1e6:
		return fmt.Sprintf("%.2f MB", n/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1f kB", n/1e3)
	}
	return fmt.Sprintf("%.0f B", n)
}
