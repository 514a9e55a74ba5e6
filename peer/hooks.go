package peer

import (
	"context"
	"sync/atomic"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// faultHooks are the faults and waits tests inject into a node, through
// export_test.go's *ForTest methods and a few tests of their own. In
// production every one is nil or false and costs one atomic load where it
// is consulted.
type faultHooks struct {
	// portDead, when set, answers portDead: gRPC reports a connection its
	// peer closed as idle or failed depending on timing.
	portDead atomic.Pointer[func(member string) bool]
	// check runs at the start of every Check.
	check atomic.Pointer[func(context.Context)]
	// streamDrop makes CheckStream swallow every request it returns true
	// for: received, never answered.
	streamDrop atomic.Pointer[func(*peerpb.CheckRequest) bool]
	// replDrop is streamDrop for ReplicateStream (the request is neither
	// applied nor answered) and for unary Replicate (it fails
	// Unavailable, unapplied).
	replDrop atomic.Pointer[func(*peerpb.ReplicateRequest) bool]
	// replHold runs before each replication request is applied (a pipe's
	// or a unary one); it may block, and the func it returns, if any,
	// runs once the request is applied.
	replHold atomic.Pointer[func(*peerpb.ReplicateRequest) func()]
	// copyUnsent fails every copy of a partition this node would send
	// that it returns true for, unsent.
	copyUnsent atomic.Pointer[func(pid int, to string) bool]
	// freshLost makes the log's freshness of members gossip declared
	// failed read as lapsed: what a runner that answers after a lapsed
	// liveness (a log that applies late) reports.
	freshLost atomic.Bool
	// freshLate makes the log's answer on that freshness not come in time
	// (a loaded runner).
	freshLate atomic.Bool
	// decide runs in decideHere between the lease check and the decision,
	// and in spreader.decide between spending rights and the check of their
	// deadline.
	decide atomic.Pointer[func()]
	// refuseFramed refuses framed pipes as Unavailable (set from
	// Config.refuseFramed at start).
	refuseFramed atomic.Bool
}
