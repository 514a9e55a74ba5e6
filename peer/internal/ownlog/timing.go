package ownlog

import "time"

// Timing is the raft timing for members whose liveness (the ownership
// Liveness, peer's LeaseDuration) is liveness, in ticks of tick: a
// heartbeat every Liveness/10 and an election timeout of Liveness/4
// (raft draws each follower's from one to two of them), at 2 s a
// heartbeat every 200 ms and an election after 0.5-1 s; never faster than
// a heartbeat every MinHeartbeat and an election after MinElection, what
// a node ran before whatever its lease (a shorter lease than 2 s keeps
// that timing: a faster election on a loaded machine is a needless one).
// What bounds them is the lease, not raft's habit of ten heartbeats an
// election: a new leader makes every member extend at once, so an
// election must end well within a holder's lease (9/10 of Liveness from
// its last keep-alive, sent every half of it), and a crashed leader's own
// partitions wait for an election and then what is left of a Liveness
// from when its successor's voters last heard it (votes.go). A keep-alive
// is answered within a few heartbeats (a relay's batch, then the leader's
// read: session.go), well within the lease's margin. Faster heartbeats
// cost every voter and the leader messages at rest for nothing: at 2 s, a
// heartbeat every 100 ms was most of what a small fleet exchanged.
//
// It does not slow down in a small cluster. Below 13 members the leader's
// heartbeats to its voters and their answers cost more than 2 messages a
// second per member (issue 54's target), and a heartbeat slow enough
// (2/N s at N members with 3 voters) makes the election as slow. At three
// members the voters' keep-alives are the heartbeats instead (quiet.go):
// 6 messages a second at the leader, with raft's clock slowed and the
// crashed leader found by the unanswered keep-alives, not by this
// timing's election.
func Timing(liveness, tick time.Duration) (heartbeatTicks, electionTicks int) {
	if tick <= 0 || liveness <= 0 {
		return 1, 10
	}
	ticks := func(d time.Duration) int { return int((d + tick/2) / tick) }
	heartbeatTicks = max(ticks(max(liveness/10, MinHeartbeat)), 1)
	electionTicks = max(ticks(max(liveness/4, MinElection)), 2*heartbeatTicks)
	return heartbeatTicks, electionTicks
}

// MinHeartbeat and MinElection are Timing's floors.
const (
	MinHeartbeat = 100 * time.Millisecond
	MinElection  = 500 * time.Millisecond
)
