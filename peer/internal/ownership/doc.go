// Package ownership is ringlimit's ownership protocol: who may decide for
// each partition, changed only through a replicated log, with leases that
// come from each member's liveness record rather than from any member's
// gossip view.
//
// It has two parts, both free of goroutines, clock reads and sockets, so
// that a simulator can drive them through any schedule:
//
//   - Table, the state machine every member applies in log order: per
//     member incarnation a liveness record (epoch, version, ended), per
//     partition (holder, holder's liveness epoch, backup, partition epoch,
//     last member with its state while vacant). Every change is a Command
//     checked against the current record (compare-and-set), so two members
//     can never hold one partition at one epoch, and a refused command
//     changes nothing.
//   - Machine, one member's side: events in (Tick, Apply, SetView,
//     CopyAcked, CopyFailed, OfferCopy), actions out (Propose, SendCopy, Reset), and
//     the decision path's one question, MayDecide, answered from memory
//     without allocating; a leaver's one question, MayLeave.
//
// The rules:
//
//  1. A member decides for partition p only while the table names it p's
//     holder at its current liveness epoch, the partition's state is here
//     and complete, no move or backup change is under way, and its own
//     lease has not ended.
//  2. A member activates its liveness at each epoch with one Extend
//     command, then keeps it alive through a session with the log's
//     leader: a KeepAlive every ExtendEvery (Liveness/2), and again
//     KeepAliveRetry (Liveness/5) after one still unanswered, which the
//     log never sees.
//     The leader answers only once it has confirmed, after the request
//     arrived, that it still leads (a read a quorum acknowledged) and has
//     applied the log to that read; or, of at most three voters, once a
//     voter's heartbeat answer in the leader's term carried the request
//     (its own, or a learner's it relays), the leader having applied the
//     log to its commit index, an entry of its term committed: the carrier
//     acknowledged the term after the request was sent, and the leader and
//     it are a quorum (ownlog's carrierConfirms); it grants while the
//     table names the member active at that epoch and no End of it that
//     it proposed is pending. Of three voters without learners the
//     voters' keep-alives are the log's heartbeats (ownlog's quiet.go),
//     and the leader confirms its own without a read, counting its lease
//     from the send of an answer a voter's next keep-alive acknowledged:
//     that voter heard it after, and a later leader counts from that
//     voter's contact or its own. A member's lease is HolderShare (9/10) of Liveness counted
//     from when it *sent* the extension that was then applied or granted
//     (that one, by its sequence number: a retry sent after it may be
//     lost, and then no leader counts from it).
//     The leader counts the whole Liveness from when the keep-alive it
//     granted *arrived* (its driver took it in: directly, or carried by a
//     voter's heartbeat answer, or relayed) or the extension was applied,
//     which happened later in real time; so the holder stops first while
//     clock rates differ by less than 10 %. (Not from the grant, a read
//     later: that only put off a crashed holder's End by the read.) Offsets never
//     matter: each member measures durations on its own monotonic clock.
//     A member that becomes leader counts a whole Liveness for every
//     record, before it ends anyone, from the latest instant at which it
//     or any member that voted for it last heard from a leader (or led,
//     or started), as each voter tells with its vote (nine tenths of its
//     age: its clock may be fast), and from its election when a vote
//     tells nothing: any keep-alive an earlier leader granted was
//     confirmed by a quorum, each of whose members had heard from that
//     leader after the keep-alive was sent, and one of whom voted for the
//     new leader (ownlog's votes.go). That instant is a heartbeat or two
//     before a crashed leader stopped, where the election came an
//     election timeout or more after. A
//     leader that ran nothing for several ticks (Stalled: starved or
//     paused, keep-alives perhaps unread in its inbox) ends nobody for a
//     lapse until it had a few ticks to read them; waiting longer is
//     always safe. Nor does a leader end a member for a lapse within a
//     Liveness of a keep-alive of it, at its epoch, that arrived and waits
//     for the read that confirms it (Heard: the member is alive, however
//     long reads take on a starved machine), until a grant answers it. A
//     member that replaced its table wholesale (a snapshot, a restart)
//     counts a whole Liveness for every record from then. Members other
//     than the leader hear no keep-alives: to them a member is fit to be
//     given a partition while the table names it active, and the leader
//     ends every active member whose session lapsed (not itself: its own
//     lapse means it was paused or could not confirm a read, and then a
//     later leader ends it), so the table tells who is active within
//     about one Liveness. Only what changes ownership is a command: the
//     log is quiet at rest, whatever the number of members.
//  3. Ending a member's liveness (End) names the version its proposer saw
//     expire; an Extend applied in between refuses it. It increments
//     the liveness epoch, which ends all of that member's holdings at once,
//     and hands each of its partitions to the backup, whose replica has
//     every synchronously replicated admission. A member cut off from the
//     log's majority cannot extend, so it stops by rule 2 before anyone
//     can end it: whatever its gossip view says. The backup's state is its
//     replica, or a copy it installed from the same holder (a re-copy
//     whose SetBackup lost to a Keep, at an earlier epoch): a holder
//     copies to its current backup only when it owes a re-copy, and
//     decides again only once a SetBackup names a newer copy.
//  4. A holder moves a partition to its ring target itself: it fences the
//     partition, copies it, and only once the target confirms the copy
//     proposes Move at the partition's epoch. A copy that fails (refused,
//     or its connection lost: CopyFailed) lifts the fence at once (nothing
//     was proposed, and the receiver acts on a copy only when a command
//     names it with that copy's epoch and sequence); a copy that times out
//     doubles the wait for later ones, up to MaxCopyWait, so that slow
//     copies finish rather than restart forever. A
//     proposed Move may commit late: the holder stays fenced until some
//     command at that epoch applies, proposing Keep after Retry; whichever
//     commits first wins, the other is refused. The old holder becomes the
//     backup: its state is the copy.
//  5. A holder without a live backup copies the partition to one (fenced,
//     as in rule 4) and proposes SetBackup. Replicated admissions carry
//     the partition epoch; a backup applies one only while the table names
//     it the backup of that holder at exactly that epoch. A copy tagged
//     with an epoch older than the partition's is refused, even a
//     duplicate of the one a SetBackup named (installed again, it would
//     erase what was replicated since). A replica that did not reach the
//     backup without being waited for (async: the batch failed, timed out
//     or was refused) makes its holder copy the partition to the backup
//     again before it decides again (Recopy), so that a blip's loss lasts
//     until that copy, not the window: a crash loses at most what was in
//     flight. A policy whose replication is raised, or that is added
//     (absent counts as off), does the same for every held partition
//     (Raise).
//  6. When a holder ends with no live backup, the partition becomes vacant
//     and remembers the member with its state (Last). It is granted back to
//     that member with its state when it is live again; when Last is gone
//     for good (a later incarnation runs, or it left) the partition is
//     granted empty, counted in Restarts. Gossip giving up on a member
//     (FailedMemberTimeout: View.Failed) is not gone for good: it may be
//     cut off with the state, or come back to hold again, so it is never
//     ended for good on that account. A vacancy waits for it until EmptyAfter
//     has passed since the vacancy began, on the leader's clock: longer
//     than any window its state counts in (plus a grant's lease, with the
//     rate margin), after which empty is the state; then an aged grant
//     (naming Last's record version, so that Last extending first refuses
//     it) restarts it empty, counted in Aged, not Restarts. A 2 | 3 split
//     that leaves a holder and its backup on the small side therefore
//     makes their partitions unavailable until it heals or their windows
//     have passed, never empty while anything in them counts.
//  7. The log's leader reconciles: it ends liveness that expired in its
//     view, grants vacant partitions, and proposes Joins for members gossip
//     lists. Safety never depends on who leads: every command is checked
//     when applied. A member is granted, moved or handed a partition, or
//     made a backup, only once it has extended its liveness at least once:
//     before that it is not in the log yet (it joins as a learner once the
//     table lists it) and could not keep a holding.
//  8. A member that learns of commands from a snapshot rather than by
//     applying them still knows what it has: the table records the copy
//     that made the current backup or holder (CopyFrom, CopyEpoch,
//     CopySeq), which the member compares with the copy it installed (a
//     member the snapshot names holder, after a takeover, also has the
//     state in a later copy from the holder that named it backup: a move's
//     or a re-copy that never committed, as an applied End accepts); and
//     a chain of holdings that began with an empty grant, granted back to
//     the same member since (Fresh), starts empty on a member that never
//     had its state (any copy it installed is older than the chain, or it
//     would not be one chain), since deciding needs the state, so nobody
//     decided. A holder the snapshot leaves without its state counts in
//     MissingCopy, as an applied command would: it never decides or moves
//     the partition.
//  9. A member leaving gracefully ends its own liveness, for good, only
//     once nothing depends on it (Depends): it holds nothing, no vacancy
//     waits for its state, it backs nothing and no copy it installed at a
//     partition's current epoch can still be committed by the holder's
//     SetBackup (which a failure of that holder would then hand on to it).
//     MayLeave says when: besides that, only when every partition it
//     still backs has a holder that extended its liveness since the drain
//     began (its keep-alives ask the leader when those holders last
//     extended: Watch) and had time to pick another backup, or when no
//     other member is left that holds anything, is active, or was ended
//     (not for good) within two Liveness (a member whose liveness lapsed
//     on a loaded log and was ended extends again at its next epoch,
//     holding nothing yet: it can take what the leaver holds). Its gossip view is never a reason: a
//     leaver whose view lost every member may have the only copy of a
//     restarted holder's state. It refuses new copies, and holders pick
//     as backups and the leader grants vacancies to members gossip lists
//     (not leaving) first.
//  10. A member restarted with its data directory is a new incarnation,
//     the heir of the one whose directory it has (View.Heirs). A vacancy
//     kept for an incarnation that has ended goes to its heir, once the
//     heir extends (and waits for it, until EmptyAfter, while gossip
//     lists it): an empty grant to the table, from which the driver
//     restores the state the directory holds. Only admissions that were
//     made are restored, from one member's state, so it refuses no less
//     than starting empty; and nothing acknowledged under `disk` is lost,
//     since Last was the last member with the state and nobody decided
//     for the partition while it was vacant (inherit.go).
//
// The prices: a crashed holder's partitions are unavailable for about one
// Liveness plus one commit; losing the log's majority stops every holder
// within one Liveness (fail closed) until a majority is back: the log has
// 3 voters at 3 and 4 members and from 13 to 63, so it survives one
// voter's failure there, and 5 from 5 to 12 members and from 64 on, two
// (ownlog.VotersFor: five voters exchange twice the heartbeats, which
// from 13 to 63 members made more than a member's share of the traffic
// at rest); and a split keeps the log on the side with a majority of
// the voters, even the smaller one (16 members split 7 | 9 may keep it
// on the 7 with two of the three voters, and the 9's holders stop); losing a
// holder and its backup at once makes the partition unavailable for
// EmptyAfter (then restarted empty by an aged grant: nothing it held
// still counts), or loses its state when one of them is known gone for
// good sooner (a later incarnation without its state runs: restarted
// empty by command, counted in Restarts). So does a holder that leaves (or stops at
// its close deadline) while its backup is paused past its own liveness:
// the log ends the paused backup too, and the backup's copy is not
// trusted after its liveness ended, since the holder may have decided
// unreplicated meanwhile (the simulator's TestLeaveWhileBackupPauses
// counts it). A holder whose backup failed decides
// without replication until a new backup has a copy.
//
// Mutation (Config.Mutation) breaks one of these rules on purpose, for the
// simulator's mutation tests: a simulator that cannot see a broken rule
// proves nothing. A real member never sets it.
//
// What it does not do: it does not run raft (package ownlog joins the
// machine to an etcd raft node, package sim drives ownlog members in
// virtual time, and peer drives one in each Node in OwnershipLog mode),
// move data (the driver exports, sends and installs copies
// and replicas), or read gossip (the driver passes a View).
//
// It imports neither peer nor any network, gossip or raft package; a test
// pins that.
package ownership
