package peer

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// closeGrace is how long Close waits for the node's goroutines before the
// caller's deadline counts (their RPCs have just been cut short).
const closeGrace = 2 * time.Second

// leaveLinger is how long a leaving node keeps serving redirects after
// announcing its leave; a few gossip rounds at LAN timings.
const leaveLinger = 200 * time.Millisecond

// Close leaves the cluster gracefully: it announces that it is leaving (no
// partition targets it any more), transfers every partition it holds to
// its new holder within ctx's deadline (calls made meanwhile are still
// routed: they wait for the move or go to the new holder), leaves gossip,
// stops the gRPC server and waits for every goroutine the node started;
// from then on calls return ErrClosed. It is idempotent and safe while Allow calls
// are in flight; later calls return the first call's result.
func (n *Node) Close(ctx context.Context) error {
	n.closeOnce.Do(func() {
		n.closeErr = n.close(ctx)
		close(n.closed)
	})
	<-n.closed
	return n.closeErr
}

func (n *Node) close(ctx context.Context) error {
	n.closing.Store(true)
	n.ops.ready.update() // not serving from here on
	var errs []error
	// Announce the drain first, so peers log our departure as a leave,
	// not a failure. Best effort: a slow gossip only changes the log line.
	n.gossiper.delegate.SetMeta(n.meta(true))
	_ = n.gossiper.ml.UpdateNode(200 * time.Millisecond)
	n.gossiper.announceLeave()
	drainErr := n.lo.drain(ctx)
	if drainErr != nil {
		errs = append(errs, drainErr)
	}
	leaveTimeout := 2 * time.Second
	if n.view.Load().stopping || errors.Is(drainErr, errNoLeader) {
		// Every member is leaving: the broadcast is a courtesy to
		// members that are going too. Or the log has no leader: most
		// members are unreachable, and the leave is not graceful anyway.
		leaveTimeout = 200 * time.Millisecond
	}
	if dl, ok := ctx.Deadline(); ok {
		leaveTimeout = max(min(time.Until(dl), leaveTimeout), 10*time.Millisecond)
	}
	if err := n.gossiper.ml.Leave(leaveTimeout); err != nil {
		if n.view.Load().stopping {
			// Every member is leaving: nobody is left to hear it.
			n.log.Debug("leave not broadcast: every member is leaving", "err", err)
		} else {
			// Not an error of Close: the drain has moved everything off
			// and ended this member's liveness in the log, and its
			// metadata already says it is draining. Peers that miss the
			// broadcast log the departure as a failure instead.
			n.log.Warn("leave not broadcast in time: peers may log this node as failed rather than left", "err", err)
		}
	}
	if v := n.view.Load(); v.snap.Len() > 1 && !v.stopping && !errors.Is(drainErr, errNoLeader) {
		// Peers learn of the leave by gossip, a little later. Until then
		// they still forward to us; keep answering (with "not owner, ask
		// <new holder>") for a moment rather than refuse their connections.
		t := time.NewTimer(leaveLinger)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	if err := n.gossiper.ml.Shutdown(); err != nil {
		errs = append(errs, fmt.Errorf("peer: shut down gossip: %w", err))
	}
	n.stopped.Store(true)
	n.lo.shutdown()
	n.cancel()
	stopped := make(chan struct{})
	go func() { n.grpcSrv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		n.grpcSrv.Stop()
		<-stopped
	}
	n.links.stopAll()
	// Every goroutine the node started stops on n.ctx; wait for them, but
	// never forever: a goroutine stuck past the deadline (plus a grace for
	// RPCs cut short just now) is a bug to report, not a reason to hang the
	// caller's shutdown.
	waited := make(chan struct{})
	go func() { n.wg.Wait(); close(waited) }()
	grace := time.NewTimer(closeGrace)
	defer grace.Stop()
	select {
	case <-waited:
	case <-grace.C:
		select {
		case <-waited:
		case <-ctx.Done():
			n.log.Error("node goroutines did not stop by the close deadline")
			errs = append(errs, fmt.Errorf("peer: goroutines still running at the close deadline: %w", ctx.Err()))
		}
	}
	// After every goroutine and call that could write to it.
	n.closeDataDir()
	n.gossiper.mlLog.Close()
	n.log.Info("node closed")
	return errors.Join(errs...)
}
