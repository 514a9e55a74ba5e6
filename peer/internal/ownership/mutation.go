package ownership

// Mutation deliberately breaks one rule of the protocol (Config.Mutation).
// It exists for one purpose: a simulator that cannot see a broken rule
// proves nothing, so the simulator's tests switch each of these on in
// turn and fail when no schedule catches it (mutation testing). A real
// member never sets one; the zero value breaks nothing.
//
// The catalogue holds the rules whose loss alone lets two members decide
// for one partition at once or lets a window count too little. Rules
// that guard only availability (a new leader counting every record from
// its election, say) are not in it: breaking them costs churn, never
// the promise, and no checker of the promise could see them.
type Mutation uint8

const (
	MutNone Mutation = iota
	// MutLeaseIgnored: a holder decides while the table names it,
	// whether or not its own lease has run out (rule 2 dropped from
	// MayDecide and Standings).
	MutLeaseIgnored
	// MutHolderShareWhole: the holder counts the whole Liveness for
	// itself, as the others do: no margin for clock rates.
	MutHolderShareWhole
	// MutHolderLeaseTriple: the holder counts three Livenesses.
	MutHolderLeaseTriple
	// MutLeaseFromApply: the holder counts its lease from when it
	// applied its extension, not from when it sent it.
	MutLeaseFromApply
	// MutLeaderEndsEarly: the leader ends a member after 0.8·Liveness,
	// before the member's own lease (0.9·Liveness from an earlier
	// instant) has run out.
	MutLeaderEndsEarly
	// MutRestoredNoWait: a member whose table was restored wholesale (a
	// snapshot) counts every record as expired at once instead of
	// counting a whole Liveness from the restore, and a member that
	// becomes leader does not count every record anew either (each
	// covers the other: a restored member ends anyone only once it
	// leads).
	MutRestoredNoWait
	// MutEndIgnoresVersion: End is applied even when an extension was
	// applied after its proposer saw the record expire.
	MutEndIgnoresVersion
	// MutEndKeepsEpoch: End hands the partitions on but leaves the
	// member's liveness epoch as it was, so its holdings seem current.
	MutEndKeepsEpoch
	// MutMoveIgnoresEpoch: Move is applied at any partition epoch (a
	// late Move after the holder's Keep lifted its fence).
	MutMoveIgnoresEpoch
	// MutSetBackupIgnoresEpoch: SetBackup is applied at any partition
	// epoch (a late SetBackup naming a copy older than what the holder
	// decided since).
	MutSetBackupIgnoresEpoch
	// MutGrantIgnoresLast: a vacant partition is granted empty to anyone
	// while its Last member, with its state, is still live.
	MutGrantIgnoresLast
	// MutReplicaAnyEpoch: a backup applies a replicated admission tagged
	// with any partition epoch.
	MutReplicaAnyEpoch
	// MutCopyAnyEpoch: a member accepts a copy older than one it has or
	// than the partition's epoch.
	MutCopyAnyEpoch
	// MutFenceIgnored: a holder decides while its partition is fenced
	// for a copy, or owes a re-copy.
	MutFenceIgnored
	// MutAgedGrantEarly: the leader grants a vacancy empty as soon as
	// its Last is not fresh, without waiting EmptyAfter.
	MutAgedGrantEarly
	// MutAgedGrantIgnoresVersion: an aged grant is applied even when
	// Last extended its liveness after the proposer saw it expire.
	MutAgedGrantIgnoresVersion
	// MutLeaderNoWait: a member that becomes leader counts no record's
	// Liveness anew, so it may end a member whose keep-alive an earlier
	// leader granted just before.
	MutLeaderNoWait
	// MutKeepAliveWhileEnding: the leader grants keep-alives to a member
	// whose End it has proposed and not yet applied.
	MutKeepAliveWhileEnding
	// MutKeepAliveUnconfirmed: the leader's driver answers keep-alives
	// without confirming that it still leads (no ReadIndex): a leader cut
	// off from the other voters grants until it notices.
	MutKeepAliveUnconfirmed
	// MutHeirIgnored: a vacancy kept for an incarnation that ended goes
	// to any fresh member, not to the heir that restarted with its data
	// directory (rule 10, inherit.go): after a restart of every member,
	// a partition comes back empty or from a member whose copy is not
	// the last one.
	MutHeirIgnored
	// MutLeaseFromLatestSend: a granted keep-alive extends the lease from
	// when the member sent its latest keep-alive (a retry of one still
	// unanswered, say), not from when it sent the one granted.
	MutLeaseFromLatestSend
	// MutRestoredForgetsTakeover: a member caught up by a snapshot across
	// its takeover of a partition, as the backup, does not count the copy
	// it installed from the ended holder (restored.go's tookOver): it
	// holds the partition without its state for good.
	MutRestoredForgetsTakeover
	// MutLeaderFromEarlier: the leader counts a granted keep-alive's
	// Liveness from when the member's previous keep-alive arrived, not
	// the one granted: from before the member sent it.
	MutLeaderFromEarlier
	// MutAloneLeaverCountsHolders: a leaver alone in gossip goes when no
	// other member holds or backs a partition, though others are active
	// in the table (or were ended a moment ago) and hold nothing only
	// because the leader ended their lapsed sessions: it goes with the
	// only copy, and the log restarts the partitions empty.
	MutAloneLeaverCountsHolders
	// MutCarrierIsQuorum: the leader grants a keep-alive carried by a
	// voter's heartbeat answer at once whatever the voter count, as if
	// the carrier and the leader were a quorum (they are of at most
	// three voters: ownlog's session.go): a leader cut off with one voter
	// of five grants it until CheckQuorum steps it down.
	MutCarrierIsQuorum
	// MutLeaderOwnContact: a member that becomes leader counts every
	// record's Liveness from when it last heard from a leader itself,
	// not from the latest of that and its voters' (ownlog's votes.go):
	// a voter cut off from the leader for a while, elected once the
	// leader crashed, ends a member whose keep-alive the crashed leader
	// granted, confirmed by the other voter, just before.
	MutLeaderOwnContact
	// MutRemovedLeaderLeads: a leader that applies a configuration
	// without itself keeps leading (ownlog's raft without
	// StepDownOnRemoval): raft drops all its proposals while its
	// heartbeats keep the others from electing another, so nothing
	// commits again (a crashed holder is never ended).
	MutRemovedLeaderLeads
	// MutQuietOwnFromKeepAlive: the leader of three voters without
	// learners (ownlog's quiet.go) counts its own lease from the arrival
	// of a voter's keep-alive, not from the send of an answer the voter
	// acknowledged: the voter last heard from it a keep-alive interval
	// before, and a new leader that those voters elect once it is cut
	// off counts from then, and ends it while it still decides.
	MutQuietOwnFromKeepAlive
	numMutations
)

var mutationNames = [...]string{"none", "lease ignored", "holder counts the whole liveness", "holder counts three livenesses",
	"lease counted from apply", "leader ends early", "restored table counts nothing", "end ignores the version",
	"end keeps the epoch", "move ignores the epoch", "set-backup ignores the epoch", "grant ignores last",
	"replica of any epoch", "copy of any epoch", "fence ignored", "aged grant early", "aged grant ignores the version",
	"new leader counts nothing", "keep-alive while ending", "keep-alive unconfirmed", "heir ignored",
	"lease counted from the latest keep-alive", "restored forgets the takeover", "leader counts from an earlier keep-alive",
	"alone leaver counts only holders", "a carrier counts as a quorum", "new leader counts from its own contact",
	"removed leader keeps leading", "quiet leader counts from a keep-alive"}

func (m Mutation) String() string {
	if int(m) < len(mutationNames) {
		return mutationNames[m]
	}
	return "mutation?"
}

// Mutations lists every mutation of the catalogue (MutNone excluded).
func Mutations() []Mutation {
	ms := make([]Mutation, 0, numMutations-1)
	for m := MutNone + 1; m < numMutations; m++ {
		ms = append(ms, m)
	}
	return ms
}
