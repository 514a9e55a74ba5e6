package ownership

// Sessions (rule 2 of the package doc): a member activates its liveness
// at each epoch with one Extend command, then keeps it alive through a
// session with the log's leader, which the log never sees. Only what
// changes ownership is a command, so the log's traffic at rest no longer
// grows with the members times their extensions.
//
// The member sends KeepAlive requests (Tick's KeepAlive action) every
// ExtendEvery; the leader's driver confirms that it still leads after the
// request arrived (raft's ReadIndex: a quorum heard from it since) and
// that it has applied the log up to that read's index, then asks KeepAlive
// here, which answers from the applied table. The member counts
// HolderShare of Liveness from when it sent the request (KeptAlive); the
// leader counts the whole Liveness from when the request arrived, which
// is later. Why it holds:
//
//   - The same leader: it never grants a member whose End it proposed
//     (ending), and proposes an End only a whole Liveness after the
//     arrival of the last request it granted, which the member sent
//     earlier, so the member has stopped first, as with extensions
//     applied from the log.
//   - A later leader: the read that confirmed a grant was acknowledged by
//     a quorum after the request arrived, and a later leader's election
//     needs votes from a quorum, one of which acknowledged first; so the
//     request was sent before that voter last heard from a leader, which
//     it tells with its vote, and a new leader counts every record's
//     whole Liveness from the latest such instant among its voters and
//     itself (SetLeaderFrom; its election when a vote tells nothing)
//     before it ends anyone. An End proposed by an earlier
//     leader that commits later is in the log before any read the later
//     leader confirms, so it is applied before that leader grants: the
//     member's epoch moved on and the grant is refused.
//   - An isolated leader that still believes it leads cannot confirm a
//     read, so it grants nothing.
//   - Of at most three voters, the driver may take a voter's heartbeat
//     answer in the leader's term that carries requests as their read:
//     the voter sent it after them, and it and the leader are a quorum,
//     neither of which had voted for a later leader then (ownlog's
//     carrierConfirms). Of more voters they are not a quorum: a leader
//     cut off with one voter of five would grant on it
//     (MutCarrierIsQuorum).
//   - Of three voters without learners, the voters' keep-alives are the
//     log's heartbeats (ownlog's quiet.go), and the leader confirms its
//     own keep-alive without a read: a voter that acknowledges an answer
//     heard the leader after it was sent, so its contact, from which any
//     later leader counts, is no earlier; the leader counts its own lease
//     from that answer's send (KeptAliveFrom), never from the arrival of
//     a keep-alive that acknowledges an older one
//     (MutQuietOwnFromKeepAlive).

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// KeepAliveRequest is a member's request to extend its liveness at Epoch.
// Watch names members whose latest extension the member wants to know of
// (a leaver, the holders of what it backs: MayLeave).
type KeepAliveRequest struct {
	Member     string
	Epoch, Seq uint64
	Watch      []string
}

// KeepAliveAnswer is the leader's answer. Ages are, for the watched
// members the leader granted since it leads, how long before the answer
// it last did (ns, on the leader's clock).
type KeepAliveAnswer struct {
	Member     string
	Epoch, Seq uint64
	Granted    bool
	Ages       []WatchAge
	// Index is the leader's applied log index, set by its driver: a
	// member whose log is behind it asks to catch up.
	Index uint64
}

// WatchAge is one watched member's extension age.
type WatchAge struct {
	ID  string
	Age int64
}

// KeepAlive is the leader's side of a session: the driver calls it once
// it has confirmed, after the request arrived (at arrived, on this
// member's clock: when the driver took it in, at most now), that it leads
// the log, and has applied the log up to that confirmation. It grants the
// extension while the table names the member active at the request's
// epoch and no End of it proposed here is pending, and counts the
// member's whole Liveness from when the request arrived: after the member
// sent it, which is what the member counts from. Counting from the grant,
// a read later, only put off a crashed holder's End by that read.
func (m *Machine) KeepAlive(r KeepAliveRequest, arrived, now int64) KeepAliveAnswer {
	a := KeepAliveAnswer{Member: r.Member, Epoch: r.Epoch, Seq: r.Seq}
	rec := m.table.Members[r.Member]
	if rec == nil || rec.Ended || !rec.Active || rec.Epoch != r.Epoch {
		return a
	}
	if e, ok := m.ending[r.Member]; ok && e == [2]uint64{rec.Epoch, rec.Version} && m.cfg.Mutation != MutKeepAliveWhileEnding {
		return a
	}
	a.Granted = true
	s := m.seen[r.Member]
	if s == nil {
		s = &seen{version: rec.Version, epoch: rec.Epoch}
		m.seen[r.Member] = s
	}
	arrived = min(arrived, now)
	from := arrived
	if m.cfg.Mutation == MutLeaderFromEarlier && s.arrived > 0 {
		// The broken rule: from the arrival of the member's previous
		// keep-alive, sent before the one granted.
		from = s.arrived
	}
	s.at, s.extended, s.arrived = max(s.at, from), now, arrived
	if s.heard <= arrived {
		s.heard = 0 // answered: the grant counts now, not Heard
	}
	for _, id := range r.Watch {
		if w := m.seen[id]; w != nil && w.extended > 0 {
			a.Ages = append(a.Ages, WatchAge{ID: id, Age: now - w.extended})
		}
	}
	return a
}

// KeptAliveFrom is the leader's own side of a session confirmed without
// a read (ownlog's quiet.go): a voter's contact with this leader, which
// it tells a later leader with its vote, was at or after from (on this
// member's clock, at most now), and the voter and this leader are a
// quorum. Any later leader's election needs the vote of one of them, so
// it counts every record's whole Liveness from from or later: this
// member may count its own lease, HolderShare of Liveness, from from.
// It grants r, this member's own keep-alive, as KeepAlive does (arrived
// at from), and extends its lease from from rather than from r's send;
// from must be after r was sent, so that r's epoch was still current
// then (the driver passes the requests sent by from). It reports whether
// the lease was extended.
func (m *Machine) KeptAliveFrom(r KeepAliveRequest, from, now int64) bool {
	if !m.leader || r.Member != m.cfg.ID {
		return false
	}
	at, ok := m.sent[r.Seq]
	from = min(from, now)
	if !ok || at > from {
		return false
	}
	if a := m.KeepAlive(r, from, now); !a.Granted {
		return false
	}
	m.extendFrom(r.Seq, from, now)
	return true
}

// Heard tells the leader, at now, that keep-alive r arrived and waits for
// the read that confirms it: a member whose keep-alive waits in the
// leader's hands is alive, so the leader ends it for no lapse until a
// whole Liveness after it heard it (the read is then long lost; the
// member asks again before). Without it, a leader whose reads took long
// (a starved machine: every read waits for a heartbeat's quorum) ended
// members, at start-up too, whose keep-alive it held unanswered, and
// their partitions were taken over from live holders. It lasts until a
// grant answers a keep-alive that arrived as late (the grant counts then,
// rule 2). Waiting longer is always safe; an End already pending stays
// pending, and the member is not made fit for a partition by it (only a
// grant does that).
func (m *Machine) Heard(r KeepAliveRequest, now int64) {
	rec, s := m.table.Members[r.Member], m.seen[r.Member]
	if !m.leader || rec == nil || s == nil || rec.Ended || !rec.Active || rec.Epoch != r.Epoch {
		return
	}
	s.heard = max(s.heard, now)
}

// KeptAlive is the member's side of an answer, at now: a granted
// extension at the member's current epoch extends its lease to
// HolderShare of Liveness from when the request was sent; watched ages
// tell it when the watched members extended, at the latest.
func (m *Machine) KeptAlive(a KeepAliveAnswer, now int64) {
	at, ok := m.sent[a.Seq]
	if !ok || !a.Granted || a.Member != m.cfg.ID {
		return
	}
	for _, w := range a.Ages {
		// The leader granted w when it answered less w.Age; it answered
		// after the request was sent, and its clock may run up to 10 %
		// slow: w extended after at - 1.1·Age on ours.
		if s := m.seen[w.ID]; s != nil {
			s.extended = max(s.extended, at-w.Age*11/10)
		}
	}
	rec := m.table.Members[m.cfg.ID]
	if rec == nil || rec.Ended || rec.Epoch != a.Epoch {
		// Ended here already: the epoch's holdings are over.
		return
	}
	m.extendFrom(a.Seq, at, now)
}

// extendFrom extends the member's own lease from the send time at of
// extension seq (an Extend applied, or a KeepAlive granted).
func (m *Machine) extendFrom(seq uint64, at, now int64) {
	share := HolderShare
	switch m.cfg.Mutation {
	case MutHolderShareWhole:
		share = 1
	case MutHolderLeaseTriple:
		share = 3
	case MutLeaseFromApply:
		at = now
	case MutLeaseFromLatestSend:
		for _, t := range m.sent {
			at = max(at, t)
		}
	}
	m.liveUntil = max(m.liveUntil, at+int64(float64(m.cfg.Liveness)*share))
	for s := range m.sent {
		if s <= seq {
			delete(m.sent, s)
		}
	}
}

// watch is what a member's keep-alive asks about: while it drains
// (MayLeave was asked), the holders of the partitions it backs.
func (m *Machine) watch() []string {
	if !m.draining {
		return nil
	}
	var ids []string
	for p := range m.parts {
		if _, b := m.DependsOn(p); b {
			if h := m.table.Parts[p].Holder; h != "" && !slices.Contains(ids, h) {
				ids = append(ids, h)
			}
		}
	}
	return ids
}

// sessionVersion is the first byte of an encoded keep-alive.
const sessionVersion = 1

// Encode appends r's wire form to b.
func (r KeepAliveRequest) Encode(b []byte) []byte {
	b = append(b, sessionVersion)
	b = appendString(b, r.Member)
	b = binary.AppendUvarint(b, r.Epoch)
	b = binary.AppendUvarint(b, r.Seq)
	b = binary.AppendUvarint(b, uint64(len(r.Watch)))
	for _, id := range r.Watch {
		b = appendString(b, id)
	}
	return b
}

// DecodeKeepAliveRequest parses a request written by Encode.
func DecodeKeepAliveRequest(b []byte) (KeepAliveRequest, error) {
	d := decoder{b: b}
	var r KeepAliveRequest
	if v := d.byte(); v != sessionVersion {
		return r, fmt.Errorf("%w: keep-alive version %d", ErrBadCommand, v)
	}
	r.Member = d.string()
	r.Epoch = d.uvarint()
	r.Seq = d.uvarint()
	n := d.uvarint()
	if n > 1<<16 {
		return KeepAliveRequest{}, fmt.Errorf("%w: %d watched", ErrBadCommand, n)
	}
	for range n {
		r.Watch = append(r.Watch, d.string())
	}
	if d.err != nil || len(d.b) != 0 {
		return KeepAliveRequest{}, fmt.Errorf("%w: malformed keep-alive", ErrBadCommand)
	}
	return r, nil
}

// Encode appends a's wire form to b.
func (a KeepAliveAnswer) Encode(b []byte) []byte {
	b = append(b, sessionVersion)
	b = appendString(b, a.Member)
	b = binary.AppendUvarint(b, a.Epoch)
	b = binary.AppendUvarint(b, a.Seq)
	if a.Granted {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(a.Ages)))
	for _, w := range a.Ages {
		b = appendString(b, w.ID)
		b = binary.AppendUvarint(b, uint64(max(w.Age, 0)))
	}
	return binary.AppendUvarint(b, a.Index)
}

// DecodeKeepAliveAnswer parses an answer written by Encode.
func DecodeKeepAliveAnswer(b []byte) (KeepAliveAnswer, error) {
	d := decoder{b: b}
	var a KeepAliveAnswer
	if v := d.byte(); v != sessionVersion {
		return a, fmt.Errorf("%w: keep-alive version %d", ErrBadCommand, v)
	}
	a.Member = d.string()
	a.Epoch = d.uvarint()
	a.Seq = d.uvarint()
	g := d.byte()
	n := d.uvarint()
	if n > 1<<16 || g > 1 {
		return KeepAliveAnswer{}, fmt.Errorf("%w: malformed keep-alive answer", ErrBadCommand)
	}
	for range n {
		id := d.string()
		a.Ages = append(a.Ages, WatchAge{ID: id, Age: int64(d.uvarint())})
	}
	a.Index = d.uvarint()
	if d.err != nil || len(d.b) != 0 {
		return KeepAliveAnswer{}, fmt.Errorf("%w: malformed keep-alive answer", ErrBadCommand)
	}
	a.Granted = g == 1
	return a, nil
}
