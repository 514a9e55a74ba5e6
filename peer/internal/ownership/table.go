package ownership

import (
	"errors"
	"fmt"
	"slices"
)

// Liveness is one member incarnation's record in the table.
type Liveness struct {
	// Epoch is the liveness epoch. Ending a liveness increments it, and
	// every partition held at the old epoch ends with it, in one command.
	Epoch uint64
	// Version counts the Extend commands applied at any epoch. An End
	// names the version its proposer saw expire, so an Extend applied in
	// between makes the End fail.
	Version uint64
	// Active is set by an Extend at the current epoch and cleared by an
	// End: the member has shown, through the log, that it is alive at
	// this epoch, and extends it since through its session with the
	// log's leader (KeepAlive), which the log never sees. A member is
	// fit to be given a partition only while active; the leader ends an
	// active member whose session lapsed, so that every member's table
	// tells who is active within about one Liveness.
	Active bool
	// Ended is set when the incarnation is gone for good (restarted as a
	// new incarnation, left, or removed by an operator); it never extends
	// again.
	Ended bool
}

// Partition is one partition's entry in the table.
type Partition struct {
	// Holder is the member that decides for the partition while its
	// liveness at HolderEpoch lasts; "" while the partition is vacant.
	Holder      string
	HolderEpoch uint64
	// Backup is the member holding the partition's replica; "" when none.
	Backup string
	// Epoch grows with every change of holder or backup and every Keep. A
	// copy and each replicated admission carry it; a backup refuses any
	// other.
	Epoch uint64
	// Last is, while the partition is vacant, the member whose state is
	// its newest: the holder that ended with no live backup to take it.
	// Only Last may be granted the partition with its state; when Last is
	// gone for good, the partition is granted empty and Restarts grows.
	Last string
	// Restarts counts the times the partition was restarted empty after
	// its last state was lost (both its holder and its backup gone: a
	// double fault). The founding grant does not count.
	Restarts uint64
	// Aged counts the times the partition was restarted empty while its
	// Last member was only out of reach, once the vacancy had lasted
	// longer than any of its state could count in a window (an aged
	// grant, see Grant): nothing was lost.
	Aged uint64
	// Fresh: the current holding (or, while vacant, the last one) began
	// with an empty grant, possibly ended and granted back to the same
	// member since, and no state was handed to another member. A member
	// that holds such a partition, or is its Last, but never had its
	// state (it learned of the grant from a snapshot, so it never decided
	// for it) knows the state is empty.
	Fresh bool
	// CopyFrom, CopyEpoch and CopySeq name the copy the current backup
	// (after a SetBackup) or the current holder (after a Move) was made
	// with, so that a member learning of the command from a snapshot can
	// tell whether the copy it installed is that one.
	CopyFrom  string
	CopyEpoch uint64
	CopySeq   uint64
}

// Table is the replicated ownership table: the state machine every member
// applies, in log order, to the same commands. It is deterministic: Apply
// reads no clock and no randomness, and iterates members in sorted order.
// Not safe for concurrent use; the driver applies and reads it on one
// goroutine (or copies it).
type Table struct {
	Members map[string]*Liveness
	Parts   []Partition
	// mut breaks one rule for the simulator's mutation tests (never set
	// in a real member; not part of the replicated state).
	mut Mutation
}

// NewTable returns an empty table of n partitions, all vacant.
func NewTable(n int) *Table {
	return &Table{Members: map[string]*Liveness{}, Parts: make([]Partition, n)}
}

// Clone returns a deep copy.
func (t *Table) Clone() *Table {
	c := &Table{Members: make(map[string]*Liveness, len(t.Members)), Parts: slices.Clone(t.Parts), mut: t.mut}
	for id, l := range t.Members {
		lc := *l
		c.Members[id] = &lc
	}
	return c
}

// Live reports whether id has a record that has not ended, and its epoch.
func (t *Table) Live(id string) (uint64, bool) {
	l := t.Members[id]
	if l == nil || l.Ended {
		return 0, false
	}
	return l.Epoch, true
}

// Holds reports whether the table names id as p's holder at id's current
// liveness epoch. It says nothing about whether that liveness has expired.
func (t *Table) Holds(id string, p int) bool {
	pt := &t.Parts[p]
	if pt.Holder != id {
		// Most partitions, for most members: no map lookup (every
		// member asks this of every partition every tick).
		return false
	}
	e, ok := t.Live(id)
	return ok && pt.HolderEpoch == e
}

// Kind names a command.
type Kind uint8

const (
	// Join adds Member's liveness record at epoch 1. A member joins once
	// per incarnation; a second Join is refused.
	Join Kind = iota + 1
	// Extend activates Member's liveness at Epoch (Seq identifies the
	// proposal to its proposer, who counts its lease from when it sent
	// it): a member's first extension at each epoch. Later extensions
	// are keep-alives answered by the log's leader (Machine.KeepAlive),
	// not commands. Refused when the epoch is not current.
	Extend
	// End ends Member's liveness at (Epoch, Version): its epoch grows by
	// one, each partition it held at Epoch goes to its backup (or is left
	// vacant, counted as a restart, when it has none), and it stops being
	// anyone's backup. Ended set in the command also ends the incarnation
	// for good. Refused when the record moved on (an extension was applied
	// after the proposer saw Version expire).
	End
	// Move hands partition P at Epoch from its holder Member to To, at
	// To's liveness epoch ToEpoch; the old holder becomes the backup (its
	// state is the copy it just gave To). Seq names the copy To must have.
	Move
	// Keep bumps P's epoch, keeping holder Member: it settles a fenced
	// partition whose Move or SetBackup may never commit.
	Keep
	// SetBackup makes To the backup of P at Epoch, held by Member.
	SetBackup
	// Grant gives vacant partition P (at Epoch) to To at ToEpoch: to its
	// Last member with that member's state, or, when Last is "" (the
	// founding) or gone for good, empty (a restart, counted). With Ended
	// set it is an aged grant: empty, to anyone, while Last is only out
	// of reach, once the vacancy outlasted every window its state could
	// count in; Version names Last's record version its proposer saw
	// expire, so an extension of Last applied in between refuses it (Last
	// came back with its state: it is granted the partition instead).
	Grant
)

var kindNames = [...]string{"?", "join", "extend", "end", "move", "keep", "set-backup", "grant"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", k)
}

// Command is one entry of the ownership log. Which fields matter depends
// on Kind (see each Kind's doc).
type Command struct {
	Kind    Kind
	Member  string
	Epoch   uint64 // liveness epoch (Extend, End) or partition epoch (Move, Keep, SetBackup, Grant)
	Version uint64 // End: the record version seen expired
	Seq     uint64 // Extend: proposer's sequence; Move: the copy's sequence
	P       int
	To      string
	ToEpoch uint64
	Ended   bool // End: the incarnation is gone for good; Grant: an aged grant
}

func (c Command) String() string {
	switch c.Kind {
	case Join:
		return fmt.Sprintf("join %s", c.Member)
	case Extend:
		return fmt.Sprintf("extend %s@%d #%d", c.Member, c.Epoch, c.Seq)
	case End:
		return fmt.Sprintf("end %s@%d v%d ended=%v", c.Member, c.Epoch, c.Version, c.Ended)
	case Move:
		return fmt.Sprintf("move p%d@%d %s→%s@%d copy#%d", c.P, c.Epoch, c.Member, c.To, c.ToEpoch, c.Seq)
	case Keep:
		return fmt.Sprintf("keep p%d@%d %s", c.P, c.Epoch, c.Member)
	case SetBackup:
		return fmt.Sprintf("set-backup p%d@%d %s backup %s", c.P, c.Epoch, c.Member, c.To)
	case Grant:
		if c.Ended {
			return fmt.Sprintf("aged grant p%d@%d to %s@%d (last v%d)", c.P, c.Epoch, c.To, c.ToEpoch, c.Version)
		}
		return fmt.Sprintf("grant p%d@%d to %s@%d", c.P, c.Epoch, c.To, c.ToEpoch)
	}
	return c.Kind.String()
}

// ErrRefused is returned by Apply for a command that does not match the
// current record: it changed nothing. Refusals are normal (two members
// raced, a duplicate was committed); the proposer learns from them.
var ErrRefused = errors.New("ownership: command refused")

// ErrBadCommand is returned by Apply and Decode for a command no correct
// member proposes (unknown kind, partition out of range): it changed
// nothing.
var ErrBadCommand = errors.New("ownership: bad command")

func refused(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrRefused}, a...)...)
}

// Apply applies one command. It returns nil when the command took effect,
// an error wrapping ErrRefused when the current record refused it, or
// ErrBadCommand; in both error cases the table is unchanged.
func (t *Table) Apply(c Command) error {
	switch c.Kind {
	case Move, Keep, SetBackup, Grant:
		if c.P < 0 || c.P >= len(t.Parts) {
			return fmt.Errorf("%w: partition %d of %d", ErrBadCommand, c.P, len(t.Parts))
		}
	}
	switch c.Kind {
	case Join:
		if c.Member == "" {
			return fmt.Errorf("%w: join without a member", ErrBadCommand)
		}
		if t.Members[c.Member] != nil {
			return refused("%s joined before", c.Member)
		}
		t.Members[c.Member] = &Liveness{Epoch: 1}
	case Extend:
		l := t.Members[c.Member]
		if l == nil || l.Ended || l.Epoch != c.Epoch {
			return refused("extend %s at epoch %d: not current", c.Member, c.Epoch)
		}
		l.Version++
		l.Active = true
	case End:
		l := t.Members[c.Member]
		if l == nil || l.Ended || l.Epoch != c.Epoch || l.Version != c.Version && t.mut != MutEndIgnoresVersion {
			return refused("end %s at epoch %d version %d: the record moved on", c.Member, c.Epoch, c.Version)
		}
		if t.mut != MutEndKeepsEpoch {
			l.Epoch++
			l.Active = false
		}
		l.Ended = c.Ended
		for p := range t.Parts {
			pt := &t.Parts[p]
			switch {
			case pt.Holder == c.Member && pt.HolderEpoch == c.Epoch:
				pt.Epoch++
				if e, ok := t.Live(pt.Backup); ok && pt.Backup != c.Member {
					pt.Fresh = false
					pt.Holder, pt.HolderEpoch = pt.Backup, e
				} else {
					// Nobody else has the state: keep the partition for
					// its holder, who may only be cut off. A split that
					// leaves a holder and its backup on the small side
					// makes their partitions unavailable, never empty.
					pt.Holder, pt.HolderEpoch, pt.Last = "", 0, c.Member
				}
				pt.Backup = ""
			case pt.Backup == c.Member:
				pt.Epoch++
				pt.Backup = ""
			}
		}
	case Move:
		pt := &t.Parts[c.P]
		if pt.Epoch != c.Epoch && t.mut != MutMoveIgnoresEpoch || !t.Holds(c.Member, c.P) {
			return refused("move p%d at epoch %d: the partition moved on", c.P, c.Epoch)
		}
		if e, ok := t.Live(c.To); !ok || e != c.ToEpoch || c.To == c.Member {
			return refused("move p%d to %s at epoch %d: not current", c.P, c.To, c.ToEpoch)
		}
		pt.Holder, pt.HolderEpoch, pt.Backup = c.To, c.ToEpoch, c.Member
		pt.CopyFrom, pt.CopyEpoch, pt.CopySeq = c.Member, c.Epoch, c.Seq
		pt.Epoch++
		pt.Fresh = false
	case Keep:
		pt := &t.Parts[c.P]
		if pt.Epoch != c.Epoch || !t.Holds(c.Member, c.P) {
			return refused("keep p%d at epoch %d: the partition moved on", c.P, c.Epoch)
		}
		pt.Epoch++
	case SetBackup:
		pt := &t.Parts[c.P]
		if pt.Epoch != c.Epoch && t.mut != MutSetBackupIgnoresEpoch || !t.Holds(c.Member, c.P) {
			return refused("set-backup p%d at epoch %d: the partition moved on", c.P, c.Epoch)
		}
		if _, ok := t.Live(c.To); !ok || c.To == c.Member {
			return refused("set-backup p%d: %s is not live", c.P, c.To)
		}
		pt.Backup = c.To
		pt.CopyFrom, pt.CopyEpoch, pt.CopySeq = c.Member, c.Epoch, c.Seq
		pt.Epoch++
	case Grant:
		pt := &t.Parts[c.P]
		if pt.Epoch != c.Epoch || pt.Holder != "" {
			return refused("grant p%d at epoch %d: not vacant", c.P, c.Epoch)
		}
		if e, ok := t.Live(c.To); !ok || e != c.ToEpoch {
			return refused("grant p%d to %s at epoch %d: not current", c.P, c.To, c.ToEpoch)
		}
		last := t.Members[pt.Last]
		live := last != nil && !last.Ended
		switch {
		case c.Ended:
			if pt.Last == "" || !live || c.Member != "" || last.Version != c.Version && t.mut != MutAgedGrantIgnoresVersion {
				return refused("aged grant p%d: its last member %s moved on", c.P, pt.Last)
			}
			pt.Aged++
		case pt.Last == "":
		case live && (c.To != pt.Last || c.Member != pt.Last) && t.mut != MutGrantIgnoresLast:
			return refused("grant p%d to %s: its state is on %s", c.P, c.To, pt.Last)
		case c.To != pt.Last:
			pt.Restarts++
		}
		pt.Fresh = c.Member == "" || pt.Fresh && c.Member == pt.Last
		pt.Holder, pt.HolderEpoch, pt.Backup, pt.Last = c.To, c.ToEpoch, "", ""
		pt.Epoch++
	default:
		return fmt.Errorf("%w: kind %d", ErrBadCommand, c.Kind)
	}
	return nil
}
