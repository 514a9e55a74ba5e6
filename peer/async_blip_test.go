package peer

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// blipForwardTimeout is the ForwardTimeout of TestAsyncBlipRecopied's
// nodes: a swallowed replication message breaks its stream after twice
// this, so the blip lasts about a second.
const blipForwardTimeout = 500 * time.Millisecond

// TestAsyncBlipRecopied is hole 1 of issue 52. Under async replication the
// backup swallows the holder's replication while the holder admits the
// key's whole limit; the stream breaks, is dialled again, and replication
// works again. Before, the failed batch's admissions were forgotten: the
// backup never had them, and a holder crash seconds later admitted the
// limit again, 10 in one window of 5. Now the holder copies the partition
// to its backup again once an async batch fails, so the loss lasts until
// that copy, not the window.
func TestAsyncBlipRecopied(t *testing.T) {
	t.Parallel()
	const limit = 5
	// One instant for every decision: whatever the test's pace, all of
	// them fall in one window.
	clk := &hoClock{}
	c := startCluster(t, 3, Config{
		Clock:          clk.Now,
		Gossip:         hoGossip,
		ForwardTimeout: blipForwardTimeout,
		Policies: map[string]PolicyConfig{
			"p": {Limit: limit, Window: time.Minute, Replication: ReplicateAsync},
			// "w" keeps replication flowing with no limit in sight.
			"w": {Limit: 1 << 20, Window: time.Minute, Replication: ReplicateAsync},
		},
	})
	n0, n1, n2 := c.nodes[0], c.nodes[1], c.nodes[2]
	key, pid := keyHeldWithBackup(t, n0, n1, "blip", "p")
	warm, wpid := keyHeldWithBackup(t, n0, n1, "warm", "w")
	var warmed int64
	// replicated admits warm once and reports whether n1's copy has every
	// admission of warm so far (the replication in flight answered).
	replicated := func() bool {
		admitN(t, n0, warm, 1)
		warmed++
		ctx, cancel := context.WithTimeout(context.Background(), 4*blipForwardTimeout)
		defer cancel()
		return n0.links.replBarrier(ctx, n1.Name()) == nil && copyUnits(n1, n0, wpid, warm) == warmed
	}
	// Replication goes on a stream once one is open; until then, on
	// unary calls.
	waitFor(t, 10*time.Second, "n0's replication stream to n1 to open", func() bool {
		return replicated() && n0.replPipeForTest(n1.Name()) != ""
	})

	// The blip: n1 swallows every message of n0's that carries
	// admissions (received, neither applied nor answered). Copies pass.
	var blip atomic.Bool
	var swallowed atomic.Int64
	blip.Store(true)
	n1.setReplDropForTest(func(req *peerpb.ReplicateRequest) bool {
		if blip.Load() && req.GetSender() == n0.Name() && !isCopy(req) && (len(req.GetAdmitsPacked()) > 0 || hasAdmit(req)) {
			swallowed.Add(1)
			return true
		}
		return false
	})
	breaks := n0.pipeBreaksForTest()
	admitted := admitN(t, n0, key, limit) // async: answered at once
	// Every admission's replication is answered: failed, once the
	// stream's watchdog gives up on the swallowed messages.
	bctx, bcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer bcancel()
	if err := n0.links.replBarrier(bctx, n1.Name()); err != nil {
		t.Fatalf("n0's replication to n1 still unanswered after the blip: %v", err)
	}
	blip.Store(false)
	if swallowed.Load() == 0 {
		t.Fatal("no replication message of n0's reached n1 during the blip")
	}
	if n0.pipeBreaksForTest() == breaks {
		t.Fatal("n0's replication stream to n1 did not break over the swallowed messages")
	}
	waitFor(t, 10*time.Second, "n0's replication to reach n1 again after the blip", replicated)

	// The holder copies the partition to n1 again. Without that copy the
	// crash below shows the loss; the wait gives up after a while so the
	// failure says what the window came to.
	recopied := pollUntil(context.Background(), 10*time.Second, func() bool { return copyUnits(n1, n0, pid, key) >= limit })
	held := copyUnits(n1, n0, pid, key)

	after, unknown := admittedAfterCrash(t, n0, []*Node{n1, n2}, key, limit)
	if admitted+after > limit || admitted+after+unknown < limit {
		t.Fatalf("%d admitted in one window of %d across an async replication blip and a holder crash (%d before, %d after; %d more of unknown outcome); n1's copy held %d of the %d admissions lost in the blip when the holder crashed",
			admitted+after, limit, admitted, after, unknown, held, admitted)
	}
	if !recopied {
		t.Fatalf("n1's copy held %d of the %d admissions lost in the blip 10 s after it: n0 did not copy the partition again", held, admitted)
	}
}
