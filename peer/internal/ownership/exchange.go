package ownership

// What the machine and its driver exchange: the gossip view in, actions
// out, and the tallies the driver reads.

// View is the member's gossip view, as the driver last computed it: each
// partition's target (the ring's owner) and second choice (the backup the
// holder should pick). Members not in the table are ignored. Gossip gives
// hints only; no rule of safety reads it.
type View struct {
	Target []string
	Second []string
	// Members are the members gossip lists, for Join proposals by the
	// leader.
	Members []string
	// Gone are incarnations known to be gone for good: they left, or a
	// later incarnation of the same member runs. Their records are ended
	// for good once expired.
	Gone []string
	// Failed are incarnations gossip has given up on (failed for longer
	// than its FailedMemberTimeout) with no later incarnation running.
	// They may only be cut off, with the state of partitions that wait
	// for them: a long split is one fault. They are never ended for good
	// on that account (ended when they matter, as any expired member); a
	// vacancy waits for them until EmptyAfter.
	Failed []string
	// Heirs maps an incarnation to the earlier one whose data directory
	// it restarted with (inherit.go): a vacancy kept for the earlier one
	// goes to its heir.
	Heirs map[string]string
}

// ActionKind names what the driver must do.
type ActionKind uint8

const (
	// Propose: append Cmd to the log (through the leader). Proposals may
	// be lost; the machine proposes again when it matters.
	Propose ActionKind = iota + 1
	// SendCopy: export partition P's whole state and send it to To,
	// tagged (Epoch, Seq); call CopyAcked when To confirms it installed it,
	// CopyFailed when it refuses or the copy fails.
	SendCopy
	// Reset: partition P's local state becomes empty (a grant).
	Reset
	// KeepAlive: send KeepAlive to the log's leader (this member itself
	// when it leads) and hand its answer to KeptAlive. Lost requests
	// and answers cost nothing but the extension.
	KeepAlive
)

// Action is one step for the driver. Actions are returned in the order
// they must be carried out.
type Action struct {
	Kind  ActionKind
	Cmd   Command
	P     int
	To    string
	Epoch uint64
	Seq   uint64
	// KeepAlive is the request, for a KeepAlive action.
	KeepAlive KeepAliveRequest
}

// Counters are the machine's tallies, for metrics and for the simulator's
// invariants.
type Counters struct {
	// MissingCopy counts holdings this member was handed without the
	// state the command names (must stay 0).
	MissingCopy int
	Moves       int // moves this member completed as the old holder
	Takeovers   int // partitions this member took as a backup when a holder ended
	Restarts    int // partitions granted to this member empty after being lost
	// CopyTimeouts counts copies this member gave up waiting for.
	CopyTimeouts int
	// Aged counts partitions granted to this member empty by an aged
	// grant: their Last was out of reach for longer than EmptyAfter, so
	// nothing was lost.
	Aged int
}
