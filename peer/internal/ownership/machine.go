package ownership

import (
	"slices"
	"time"
)

// Config is one member's ownership parameters. Members of one cluster
// must share Liveness: each counts its own lease and the others' expiry
// from it.
type Config struct {
	// ID names this member incarnation: unique per process start.
	ID string
	// Liveness is how long one applied extension keeps a member live, as
	// counted by every member from when it applied it. The member itself
	// counts HolderShare of it from when it sent the extension. Zero means
	// 2 s.
	Liveness time.Duration
	// ExtendEvery is how often the member extends its liveness. Zero means
	// Liveness/2.
	ExtendEvery time.Duration
	// KeepAliveRetry is how long an unanswered keep-alive waits before
	// the member sends another. Zero means Liveness/5. With the defaults
	// a member sends one keep-alive a second (Liveness 2 s) and, when one
	// or its answer is lost, another 0.4 s later, whose answer (a few
	// ticks) still comes before the lease of the one before ends
	// (0.9·Liveness from its send): one loss costs no decision, as with a
	// keep-alive every Liveness/3, for two thirds of the messages.
	KeepAliveRetry time.Duration
	// Retry is how long a fenced partition waits for its Move or SetBackup
	// to settle before proposing Keep (and again between Keeps), and how
	// long a copy may take at first. Zero means Liveness/2, at most
	// MaxRetry: a long lease must not make a lost proposal cost half of
	// it (a 1 min lease stalled a move for 30 s).
	Retry time.Duration
	// MaxCopyWait bounds how long a copy may take once copies have been
	// timing out: each copy that does not finish in time doubles the wait
	// for the next, up to this; each that does brings it back toward
	// twice its own duration, down to Retry. A loaded machine's copies
	// then finish instead of being begun again forever. Zero means
	// 16·Retry.
	MaxCopyWait time.Duration
	// EmptyAfter is how long a vacant partition waits for its Last member
	// (the one with its state) before the leader may grant it empty
	// while Last is only out of reach (an aged grant): at least the
	// longest window any of the partition's keys counts in, plus the
	// longest lease of a grant of rights, with the clock-rate margin.
	// Every admission Last made was made before its lease ended, and the
	// vacancy began after that, so once EmptyAfter has passed since, on
	// any member's clock, none of them counts in any window and empty is
	// the partition's state. Zero: never; the partition waits for Last
	// (or for Last to be gone for good: a later incarnation runs, or it
	// left). SetEmptyAfter changes it.
	EmptyAfter time.Duration
	// Mutation breaks one rule, for the simulator's mutation tests only.
	Mutation Mutation
}

// HolderShare is the part of Liveness a member counts on for itself,
// from when it sent the extension: 9/10. Every other member counts the
// whole Liveness from when it applied the extension, which happened after
// the send; so the holder's lease ends first in real time while the
// members' clock rates differ by less than 10 % (offsets never matter).
const HolderShare = 0.9

// MaxRetry caps the default Retry. Retrying sooner costs only a refused
// proposal: every command is checked when applied, so no timing here
// matters to safety.
const MaxRetry = time.Second

func (c *Config) defaults() {
	if c.Liveness == 0 {
		c.Liveness = 2 * time.Second
	}
	if c.ExtendEvery == 0 {
		c.ExtendEvery = c.Liveness / 2
	}
	if c.KeepAliveRetry == 0 {
		c.KeepAliveRetry = c.Liveness / 5
	}
	if c.Retry == 0 {
		c.Retry = min(c.Liveness/2, MaxRetry)
	}
	if c.MaxCopyWait == 0 {
		c.MaxCopyWait = 16 * c.Retry
	}
	c.MaxCopyWait = max(c.MaxCopyWait, c.Retry)
}

// fenceKind is why a held partition is not deciding.
type fenceKind uint8

const (
	fenceNone fenceKind = iota
	// fenceCopy: a copy for a move or a backup is under way; nothing was
	// proposed yet, so the fence may simply be lifted if it fails.
	fenceCopy
	// fenceProposed: a Move or SetBackup at epoch was proposed; only a
	// command applied at that epoch (it, or a Keep) lifts the fence.
	fenceProposed
)

// local is the member's own knowledge of one partition beside the table.
type local struct {
	fence fenceKind
	epoch uint64 // the partition epoch the fence was taken at
	to    string // the copy's receiver
	move  bool   // the copy is for a Move (else a SetBackup)
	seq   uint64 // the copy's sequence
	since int64  // when the fence (or its last Keep) began
	wait  int64  // how long the copy may take: the machine's wait at its start
	// retryAt: after a copy failed, no new copy begins before it.
	retryAt int64
	// have: the member's local state of the partition is complete for its
	// holding (set when it was granted, moved or handed the partition).
	have bool
	// recopy: the partition's replication became stronger (Raise), or an
	// async replica did not reach the backup (Recopy), after its backup's
	// copy was made, so the
	// copy may lack admissions that were never replicated. The holder does
	// not decide until a copy begun after recopyAfter is the backup's.
	recopy      bool
	recopyAfter uint64
	// copy is the newest copy installed here (from, epoch, seq).
	copyFrom  string
	copyEpoch uint64
	copySeq   uint64
}

// seen is when this member applied a member's latest record change.
type seen struct {
	version, epoch uint64
	at             int64
	// extended is when this member applied the record's latest Join or
	// extension (0: not since its table was restored): proof of life,
	// unlike at, which a restored table also sets.
	extended int64
	// arrived is when the latest keep-alive granted here arrived.
	arrived int64
	// heard is when the latest keep-alive not yet granted arrived (Heard).
	heard int64
	ended int64 // when the record's latest End was applied here (othersLive)
}

// Machine is one member's side of the ownership protocol: it takes events
// (Tick, Apply, SetView, CopyAcked) and returns actions, and answers the
// decision path's question (MayDecide) from memory. It starts no
// goroutine, reads no clock (every event carries the member's monotonic
// time, in ns) and touches no socket. Not safe for concurrent use.
type Machine struct {
	cfg    Config
	table  *Table
	leader bool
	view   View

	seq       uint64
	sent      map[uint64]int64 // outstanding extensions: seq → send time
	liveUntil int64            // own lease, monotonic ns
	extendAt  int64
	joinAt    int64
	// leaving: Leave was asked for; the member no longer extends its
	// liveness, so that its End (a compare-and-set on the record's
	// version) is not refused by its own extensions committed first.
	leaving bool
	// draining: MayLeave was asked; keep-alives watch the holders of
	// what this member backs.
	draining bool
	// ending is, while this member leads, the record (epoch, version) of
	// each member whose End it proposed: it grants that record no
	// keep-alive, so that the End never lands after a grant it did not
	// wait out.
	ending map[string][2]uint64

	seen map[string]*seen
	// gen counts calls that may change the table or a partition's
	// local state (Gen).
	gen   uint64
	parts []local
	count Counters
	// copyWait is how long a copy may take now, ns (see MaxCopyWait).
	copyWait int64
	// proposed is when the leader last proposed a command, so that it
	// proposes each at most once per Retry.
	proposed map[Command]int64
	// vacantAt is, per partition, when this member applied the command
	// that left it vacant (or restored a table in which it was): the
	// start of the wait for an aged grant (EmptyAfter).
	vacantAt []int64
	// emptyAfter is Config.EmptyAfter, ns, as SetEmptyAfter last set it.
	emptyAfter int64
}

// New returns the machine of one member for a table of partitions.
func New(cfg Config, partitions int) *Machine {
	cfg.defaults()
	t := NewTable(partitions)
	t.mut = cfg.Mutation
	return &Machine{
		cfg:    cfg,
		table:  t,
		sent:   map[uint64]int64{},
		seen:   map[string]*seen{},
		ending: map[string][2]uint64{},
		parts:  make([]local, partitions),

		proposed:   map[Command]int64{},
		vacantAt:   make([]int64, partitions),
		emptyAfter: int64(cfg.EmptyAfter),
		copyWait:   int64(cfg.Retry),
	}
}

// SetEmptyAfter changes Config.EmptyAfter (the driver's longest window
// or grant lease changed with its policy table).
func (m *Machine) SetEmptyAfter(d time.Duration) { m.emptyAfter = int64(d) }

// CopyWait returns how long a copy may take now.
func (m *Machine) CopyWait() time.Duration { return time.Duration(m.copyWait) }

// ID returns the member's ID.
func (m *Machine) ID() string { return m.cfg.ID }

// Table returns the applied table. The caller must not change it.
func (m *Machine) Table() *Table { return m.table }

// Counters returns the machine's tallies.
func (m *Machine) Counters() Counters { return m.count }

// LiveUntil returns the end of the member's own lease (monotonic ns).
func (m *Machine) LiveUntil() int64 { return m.liveUntil }

// Gen counts the calls that may have changed the table's partitions or
// a partition's Standing (what MayDecide, its lease aside, Has and
// DependsOn answer): while Gen is unchanged, so are they, and a driver
// that publishes them need not look again. Extensions, leadership and
// most ticks do not move it.
func (m *Machine) Gen() uint64 { return m.gen }

// SetLeader tells the machine, at now, whether its member leads the log;
// the leader proposes Joins, Ends and Grants. Safety never depends on it.
// A member that has just become leader counts every record's whole
// Liveness from now: while no leader committed anything (an election)
// nobody could extend, and ending everyone then would only churn.
func (m *Machine) SetLeader(leader bool, now int64) { m.SetLeaderFrom(leader, now, now) }

// SetLeaderFrom is SetLeader, but a member that has just become leader
// counts every record's whole Liveness from from (at most now): the
// latest instant at which any keep-alive an earlier leader granted can
// have been sent. That is what makes sessions safe across leaders: an
// earlier leader's grant was confirmed by a quorum of voters after the
// request was sent, and one of them voted for this member, which its
// driver counts from the latest time any of its voters (itself
// included) last heard from a leader (ownlog's votes.go). It ends nobody
// within ExtendEvery of now all the same: a member that could reach no
// leader through a long election is alive if it checks in by then (its
// keep-alives go out as soon as it learns of the new leader), and ending
// it would only hand its partitions on and back.
func (m *Machine) SetLeaderFrom(leader bool, now, from int64) {
	from = min(max(from, now-int64(m.cfg.Liveness-m.cfg.ExtendEvery)), now)
	if leader && !m.leader && m.cfg.Mutation != MutRestoredNoWait && m.cfg.Mutation != MutLeaderNoWait {
		for _, s := range m.seen {
			s.at = max(s.at, from)
		}
	}
	if !leader {
		clear(m.ending)
	}
	m.leader = leader
}

// Stalled tells the leader that it ran nothing for a while (its process
// starved of CPU, or paused) until now: keep-alives may wait unread in its
// inbox, so it ends nobody for a lapse before grace has passed, time to
// read them. Waiting longer is always safe; its pending Ends stay pending
// (ending is kept: it still grants none of those records).
func (m *Machine) Stalled(now, grace int64) {
	if !m.leader {
		return
	}
	for _, s := range m.seen {
		s.at = max(s.at, now+grace-int64(m.cfg.Liveness))
	}
}

// SetView replaces the gossip view.
func (m *Machine) SetView(v View) { m.gen++; m.view = v }

// MayDecide reports whether the member may decide for partition p at now:
// the table names it holder at its current liveness epoch, its own lease
// (counted from the extension's send) has not ended, the partition's state
// is here and complete, and no move or backup change is under way. It
// allocates nothing and is the only question the decision path asks.
func (m *Machine) MayDecide(p int, now int64) bool {
	l := &m.parts[p]
	if m.cfg.Mutation != MutNone {
		return m.mutMayDecide(l, now) && m.table.Holds(m.cfg.ID, p)
	}
	return now < m.liveUntil && l.have && l.fence == fenceNone && !l.recopy && m.table.Holds(m.cfg.ID, p)
}

// mutMayDecide is MayDecide's own part (the table's aside) with the
// rule Config.Mutation breaks left out.
func (m *Machine) mutMayDecide(l *local, now int64) bool {
	lease := now < m.liveUntil || m.cfg.Mutation == MutLeaseIgnored
	settled := l.fence == fenceNone && !l.recopy || m.cfg.Mutation == MutFenceIgnored
	return lease && l.have && settled
}

// Standing is what one partition's record and this member's own state of
// it come to for this member: Has, MayDecide and DependsOn together.
type Standing struct {
	Have, May, Held, Backed bool
}

// Standings calls fn for every partition in order, with its table entry
// (read only, valid until the machine's next event) and its Standing,
// May taken at now: what Has(p), MayDecide(p, now) and DependsOn(p) report,
// in one pass that looks this member's liveness up once and copies no
// entry. A driver that publishes every partition after every change (the
// runner does, hundreds of times while members join) asks this instead
// of the three per partition.
func (m *Machine) Standings(now int64, fn func(p int, pt *Partition, s Standing)) {
	self := m.cfg.ID
	e, live := m.table.Live(self)
	lease := now < m.liveUntil
	for p := range m.parts {
		pt, l := &m.table.Parts[p], &m.parts[p]
		holds := live && pt.Holder == self && pt.HolderEpoch == e
		held := holds || pt.Holder == "" && pt.Last == self
		copy := l.copyFrom != "" && l.copyFrom != self && l.copyEpoch == pt.Epoch && pt.Holder != self && pt.Backup != self
		may := lease && l.have && l.fence == fenceNone && !l.recopy && holds
		if m.cfg.Mutation != MutNone {
			may = m.mutMayDecide(l, now) && holds
		}
		fn(p, pt, Standing{
			Have:   l.have,
			May:    may,
			Held:   held,
			Backed: !held && (pt.Backup == self || copy),
		})
	}
}

// ExtendSoon makes the next Tick extend the member's liveness: the log
// has a new leader, and extensions proposed during the election were
// lost.
func (m *Machine) ExtendSoon() { m.extendAt = 0 }

// Has reports whether this member's local state of p is the one the
// table counts on: set when p was granted, moved or handed here, or when
// a copy the table names this member backup with was installed.
func (m *Machine) Has(p int) bool { return m.parts[p].have }

// Owes reports what this member may still be counted on for in p beyond
// the table's holder and backup: copy, a copy it installed at p's current
// epoch, which the holder's SetBackup or Move may yet commit (naming this
// member backup or holder); last, p vacant and kept for this member's
// state, to be granted back to it. A member leaving gracefully waits for
// both to resolve: ending its liveness while a holding can still arrive,
// or while a vacancy waits for its state, would leave the partition
// without state.
func (m *Machine) Owes(p int) (copy, last bool) {
	pt, l := m.table.Parts[p], m.parts[p]
	self := m.cfg.ID
	copy = l.copyFrom != "" && l.copyFrom != self && l.copyEpoch == pt.Epoch && pt.Holder != self && pt.Backup != self
	return copy, pt.Holder == "" && pt.Last == self
}

// DependsOn reports whether p still depends on this member: held, the
// table names it holder, or p is vacant kept for its state (Owes' last);
// backed, it is p's backup, or holds a copy a holder may yet name it
// backup with (Owes' copy). A member leaving gracefully ends its liveness
// (Leave) only once no partition depends on it; the driver bounds how
// long it waits for backed ones.
func (m *Machine) DependsOn(p int) (held, backed bool) {
	copy, last := m.Owes(p)
	held = m.table.Holds(m.cfg.ID, p) || last
	return held, !held && (m.table.Parts[p].Backup == m.cfg.ID || copy)
}

// Depends counts the partitions DependsOn reports held and backed.
func (m *Machine) Depends() (held, backed int) {
	for p := range m.parts {
		h, b := m.DependsOn(p)
		if h {
			held++
		}
		if b {
			backed++
		}
	}
	return held, backed
}

// Backup returns the member to replicate p's admissions to and the epoch
// to tag them with ("" when the partition has no backup).
func (m *Machine) Backup(p int) (string, uint64) {
	pt := m.table.Parts[p]
	return pt.Backup, pt.Epoch
}

// Holder returns where p's requests go, as the applied table says.
func (m *Machine) Holder(p int) string { return m.table.Parts[p].Holder }

// Apply applies one committed command to the table, at now (this
// member's monotonic time), and returns the actions it implies here. A
// command the table refuses changes nothing but may still settle a fence.
func (m *Machine) Apply(c Command, now int64) []Action {
	if c.Kind != Extend {
		// An extension changes a record's version and, for this
		// member's own, its lease: no partition, no Standing (the lease
		// is read apart: LiveUntil).
		m.gen++
	}
	before := m.table.Parts
	var snapshot []Partition
	if c.Kind == End {
		snapshot = slices.Clone(before)
	}
	var lastBefore string
	if c.Kind == Grant && c.P >= 0 && c.P < len(before) {
		lastBefore = before[c.P].Last
	}
	err := m.table.Apply(c)
	var acts []Action
	switch c.Kind {
	case Join:
		if err == nil {
			m.noteRecord(c.Member, now)
			m.seen[c.Member].extended = now
		}
	case Extend:
		if err != nil {
			break
		}
		m.noteRecord(c.Member, now)
		m.seen[c.Member].extended = now
		if c.Member == m.cfg.ID {
			if at, ok := m.sent[c.Seq]; ok {
				m.extendFrom(c.Seq, at, now)
			}
		}
	case End:
		if err != nil {
			break
		}
		// An End is no sign of life: the member's expiry keeps counting
		// from its last extension (else the leader would find it fresh
		// and grant its partitions straight back).
		m.noteEnd(c.Member, now)
		delete(m.ending, c.Member)
		if c.Member == m.cfg.ID {
			// Every holding at the old epoch ended; extensions sent at it
			// are refused when applied.
			m.liveUntil = 0
			clear(m.sent)
		}
		for p := range m.table.Parts {
			old, cur := snapshot[p], m.table.Parts[p]
			if old == cur {
				continue
			}
			l := &m.parts[p]
			if cur.Holder == m.cfg.ID && old.Holder != m.cfg.ID {
				// Handed to us as the backup: our replica is the state,
				// complete for every admission replicated synchronously.
				// Our replica is complete; or we hold a copy the holder
				// made at the partition's epoch for a move or a backup
				// change that never committed: the holder was fenced from
				// that copy on, and after a failed copy to its backup it
				// decides again only once a new copy is the backup's.
				// The copy may also be from an earlier epoch of the same
				// holding: a re-copy whose SetBackup lost to a Keep. A
				// holder copies to its current backup only when it owes
				// a re-copy, and decides again only once a SetBackup
				// names a newer copy (which would have made it ours); so
				// it decided nothing since but what the backup refused
				// (answered unavailable under sync; in flight under
				// async, within that policy's bound; off never counts).
				if old.Backup == m.cfg.ID && (l.have || l.copyFrom == old.Holder) {
					l.have = true
					m.count.Takeovers++
				} else {
					m.count.MissingCopy++
					l.have = false
				}
			}
			if old.Holder != "" && cur.Holder == "" {
				m.vacantAt[p] = now
			}
			if old.Holder == m.cfg.ID && cur.Holder != m.cfg.ID {
				// Vacant with us as its Last: our state is kept for a
				// grant back.
				l.have = cur.Holder == "" && cur.Last == m.cfg.ID && l.have
				l.fence = fenceNone
			}
			if l.fence != fenceNone && cur.Epoch != l.epoch {
				l.fence = fenceNone
			}
		}
	case Move, Keep, SetBackup, Grant:
		l := &m.parts[c.P]
		if l.fence == fenceProposed && c.Epoch == l.epoch {
			// The CAS at our fence's epoch resolved, whoever won.
			l.fence = fenceNone
		}
		if err != nil {
			break
		}
		switch c.Kind {
		case Move:
			if c.To == m.cfg.ID {
				switch {
				case l.copyFrom == c.Member && l.copyEpoch == c.Epoch && l.copySeq == c.Seq:
					l.have = true
				case l.copyEpoch > c.Epoch:
					// A copy from a later holding replaced the one this
					// Move names (we apply the log behind its sender):
					// that holding ended this one; the log says so next.
					l.have = false
				default:
					m.count.MissingCopy++
					l.have = false
				}
			}
			if c.Member == m.cfg.ID {
				// Our state is the copy we gave: we are the backup now.
				m.count.Moves++
				l.copyFrom, l.copyEpoch, l.copySeq = c.Member, c.Epoch, c.Seq
			}
		case SetBackup:
			if c.To == m.cfg.ID {
				l.have = l.copyFrom == c.Member && l.copyEpoch == c.Epoch && l.copySeq == c.Seq
			}
			if c.Member == m.cfg.ID && c.Seq > l.recopyAfter {
				l.recopy = false
			}
		case Grant:
			if c.To == m.cfg.ID {
				if c.Member == m.cfg.ID {
					// Granted back with our own state (we were Last).
					if !l.have && m.emptyFresh(m.table, c.P) {
						// Never had it, in a chain that began empty:
						// empty is the state.
						l.have = true
						acts = append(acts, Action{Kind: Reset, P: c.P})
					} else if !l.have {
						m.count.MissingCopy++
					}
					break
				}
				l.have = true
				l.copyFrom, l.copyEpoch, l.copySeq = "", 0, 0
				switch {
				case c.Ended:
					m.count.Aged++
				case c.Epoch > 0:
					m.count.Restarts++
				}
				acts = append(acts, Action{Kind: Reset, P: c.P})
			} else if err == nil && lastBefore == m.cfg.ID {
				// Granted to another (aged, or after this incarnation
				// ended for good): what we kept is no one's state now.
				l.have = false
			}
		}
	}
	return acts
}

func (m *Machine) noteRecord(id string, now int64) {
	l := m.table.Members[id]
	if l == nil {
		return
	}
	s := m.seen[id]
	if s == nil {
		s = &seen{}
		m.seen[id] = s
	}
	s.version, s.epoch, s.at = l.Version, l.Epoch, now
}

func (m *Machine) noteEnd(id string, now int64) {
	l, s := m.table.Members[id], m.seen[id]
	if l == nil || s == nil {
		return
	}
	s.version, s.epoch, s.ended = l.Version, l.Epoch, now
}

// Restored tells the machine that its table was replaced wholesale (a
// snapshot, or a restarted member catching up): it counts every record's
// whole Liveness from now, since it cannot tell when the latest
// extension was applied.
func (m *Machine) Restored(t *Table, now int64) []Action {
	m.gen++
	var acts []Action
	for p := range t.Parts {
		pt := t.Parts[p]
		if m.emptyFresh(t, p) {
			// An empty grant this member learned of from the snapshot.
			l := &m.parts[p]
			l.have, l.fence = true, fenceNone
			acts = append(acts, Action{Kind: Reset, P: p})
			continue
		}
		// A SetBackup naming this member, or a Move to it, that came
		// inside the snapshot: the copy installed here is the one it
		// names, or this member has nothing the table counts on.
		l := &m.parts[p]
		// So does one the snapshot names holder, or Last of a vacancy
		// (it held since: taken over, then ended), outside a Fresh chain.
		mine := (t.Holds(m.cfg.ID, p) || pt.Holder == "" && pt.Last == m.cfg.ID) && !pt.Fresh
		named := pt.Backup == m.cfg.ID || mine
		if named && !l.have && pt.CopyFrom != "" && l.copyFrom == pt.CopyFrom && l.copyEpoch == pt.CopyEpoch && l.copySeq == pt.CopySeq {
			l.have = true
		}
		if mine && !l.have && m.cfg.Mutation != MutRestoredForgetsTakeover && m.tookOver(pt, l) {
			l.have = true
		}
		if t.Holds(m.cfg.ID, p) && !l.have && (l.copyFrom == "" || l.copyEpoch < pt.Epoch) {
			// Held without its state, and no copy from a later holding
			// says the log has moved on past the snapshot: as Apply
			// counts a holding handed without its state.
			m.count.MissingCopy++
		}
		if pt.Backup == m.cfg.ID && pt.CopyFrom == m.cfg.ID && l.fence == fenceProposed && l.move && l.epoch == pt.CopyEpoch && l.seq == pt.CopySeq {
			// Our own Move: our state is the copy we gave.
			l.have = true
			l.copyFrom, l.copyEpoch, l.copySeq = pt.CopyFrom, pt.CopyEpoch, pt.CopySeq
		}
		if l.fence != fenceNone && pt.Epoch != l.epoch {
			l.fence = fenceNone
		}
	}
	m.table = t.Clone()
	m.table.mut = m.cfg.Mutation
	clear(m.seen)
	for id := range m.table.Members {
		m.noteRecord(id, now)
		if m.cfg.Mutation == MutRestoredNoWait {
			m.seen[id].at = now - int64(m.cfg.Liveness)
		}
	}
	for p, pt := range m.table.Parts {
		if pt.Holder == "" {
			// When it became vacant is not in the table: count from
			// now, which is later.
			m.vacantAt[p] = now
		}
	}
	return acts
}

// Tick runs the member's periodic steps at now and returns their actions:
// join and extend its own liveness; as a holder, move partitions toward
// their targets and keep each one backed up; settle fences; as the
// leader, end expired liveness, grant vacant partitions and propose Joins
// for members gossip lists.
func (m *Machine) Tick(now int64) []Action {
	var acts []Action
	self := m.cfg.ID
	rec, joined := m.table.Members[self]
	switch {
	case !joined:
		if m.joinAt == 0 || now-m.joinAt >= int64(m.cfg.Liveness) {
			m.joinAt = now
			acts = append(acts, Action{Kind: Propose, Cmd: Command{Kind: Join, Member: self}})
		}
	case !rec.Ended && !m.leaving && (m.extendAt == 0 || now-m.extendAt >= m.extendInterval(rec.Active, now)):
		m.extendAt = now
		m.seq++
		m.sent[m.seq] = now
		if rec.Active {
			// Active at this epoch: the session keeps it so.
			acts = append(acts, Action{Kind: KeepAlive, KeepAlive: KeepAliveRequest{Member: self, Epoch: rec.Epoch, Seq: m.seq, Watch: m.watch()}})
		} else {
			acts = append(acts, Action{Kind: Propose, Cmd: Command{Kind: Extend, Member: self, Epoch: rec.Epoch, Seq: m.seq}})
		}
	}
	for p := range m.parts {
		// Of what Tick changes, only a fence begun or lifted and a
		// re-copy owed or done change a Standing (Gen): most ticks
		// change none, and a runner need not rebuild what it publishes.
		l := &m.parts[p]
		fenced, recopy := l.fence != fenceNone, l.recopy
		acts = m.tickPartition(p, now, acts)
		if (l.fence != fenceNone) != fenced || l.recopy != recopy {
			m.gen++
		}
	}
	if m.leader {
		acts = m.lead(now, acts)
	}
	return acts
}

// extendInterval is ExtendEvery while the member sees its extensions
// applied, and KeepAliveRetry after a keep-alive (active: its session
// keeps it) that is still unanswered: a lost one is sent again soon
// rather than every keep-alive often. Once its oldest outstanding
// extension is a whole Liveness old (it can send to the log but not hear
// from it: an asymmetric cut) it extends only every 2·Liveness, so that
// the others see it expire and hand its partitions on instead of waiting
// for a holder that cannot decide.
func (m *Machine) extendInterval(active bool, now int64) int64 {
	oldest := now
	for _, at := range m.sent {
		oldest = min(oldest, at)
	}
	if now-oldest >= int64(m.cfg.Liveness) {
		return 2 * int64(m.cfg.Liveness)
	}
	if _, unanswered := m.sent[m.seq]; active && unanswered {
		return min(int64(m.cfg.KeepAliveRetry), int64(m.cfg.ExtendEvery))
	}
	return int64(m.cfg.ExtendEvery)
}

// propose appends a proposal unless the same command was proposed less
// than Retry ago.
func (m *Machine) propose(acts []Action, c Command, now int64) []Action {
	if at, ok := m.proposed[c]; ok && now-at < int64(m.cfg.Retry) {
		return acts
	}
	if len(m.proposed) > 4*len(m.parts)+64 {
		for k, at := range m.proposed {
			if now-at >= int64(m.cfg.Retry) {
				delete(m.proposed, k)
			}
		}
	}
	m.proposed[c] = now
	return append(acts, Action{Kind: Propose, Cmd: c})
}

func (m *Machine) tickPartition(p int, now int64, acts []Action) []Action {
	l := &m.parts[p]
	pt := m.table.Parts[p]
	self := m.cfg.ID
	if !m.table.Holds(self, p) {
		// A partition we do not hold needs no re-copy from us: whoever
		// holds it copies from its own state.
		l.fence, l.recopy = fenceNone, false
		return acts
	}
	switch l.fence {
	case fenceCopy:
		if now-l.since >= l.wait {
			// Nothing was proposed: the copy's receiver cannot act on it.
			// The next copy may take longer: twice what this one had
			// (copies begun together and timing out together double the
			// wait once, not once each).
			l.fence = fenceNone
			m.count.CopyTimeouts++
			m.copyWait = max(m.copyWait, min(2*l.wait, int64(m.cfg.MaxCopyWait)))
			if l.to == pt.Backup {
				// But the backup may have installed it, and a backup
				// holding a copy no command names refuses replicas (a
				// delayed copy must never overwrite admissions replicated
				// after it): make it the backup again, with a new copy,
				// before deciding.
				l.recopy, l.recopyAfter = true, l.seq
			}
		}
		return acts
	case fenceProposed:
		if now-l.since >= int64(m.cfg.Retry) {
			l.since = now
			acts = append(acts, Action{Kind: Propose, Cmd: Command{Kind: Keep, Member: self, P: p, Epoch: l.epoch}})
		}
		return acts
	}
	if !l.have || now >= m.liveUntil || now < l.retryAt {
		return acts
	}
	if p < len(m.view.Target) {
		if t := m.view.Target[p]; t != "" && t != self && m.fresh(t, now) {
			return m.startCopy(p, t, true, now, acts)
		}
	}
	if pt.Backup == "" || !m.fresh(pt.Backup, now) || !m.listed(pt.Backup) {
		// No backup, one whose liveness lapsed, or one gossip no longer
		// lists (it is leaving, or gone): copy to another. The old one
		// stays the backup until the SetBackup commits.
		if b := m.pickBackup(p, now); b != "" && b != pt.Backup {
			return m.startCopy(p, b, false, now, acts)
		}
	} else if p < len(m.view.Second) {
		// A backup that works but is not the ring's second choice (the
		// old holder after a move, say): move the copy there, so that
		// backups spread as the ring spreads them and one member's crash
		// does not leave most partitions without theirs.
		if b := m.view.Second[p]; b != "" && b != self && b != pt.Backup && m.fresh(b, now) && m.listed(b) {
			return m.startCopy(p, b, false, now, acts)
		}
	}
	if l.recopy {
		if pt.Backup == "" {
			// Nothing to bring up to date: decisions are unreplicated
			// until a backup has a copy, as after a backup's failure.
			l.recopy = false
			return acts
		}
		return m.startCopy(p, pt.Backup, false, now, acts)
	}
	return acts
}

// listed reports whether the gossip view lists id as a member (one that
// may be a target: live, not leaving). Before the first view every
// member counts as listed.
func (m *Machine) listed(id string) bool {
	return m.view.Members == nil || slices.Contains(m.view.Members, id)
}

// Leave returns the command that ends this member's liveness for good, for
// a member leaving gracefully once it holds and backs up nothing: its
// record stops mattering at once instead of after it expires. From the
// first call on the member proposes no more extensions: each one applied
// first moved the record's version on, and the End, proposed with the
// version before it, was refused. On a loaded log that race went on for
// the four leases a leave may take (TestLogTwoMembersVoterLeaves, beside
// two busy loops). If the End never applies, the liveness expires.
func (m *Machine) Leave() (Command, bool) {
	m.gen++
	rec := m.table.Members[m.cfg.ID]
	if rec == nil || rec.Ended {
		return Command{}, false
	}
	m.leaving = true
	return Command{Kind: End, Member: m.cfg.ID, Epoch: rec.Epoch, Version: rec.Version, Ended: true}, true
}
