package peer

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// TestReplicationGathersWhileOneIsOut: while a replication message is out
// to the backup, the admissions decided meanwhile wait for its answer and
// leave together in one message, instead of taking the pipe's other
// in-flight slots one small message each. Without the gathering, the
// replicator sends three more messages (MaxInFlight 4) as soon as the
// admissions arrive, so fewer than admissions-1 ever wait in its queue and
// the wait below times out.
func TestReplicationGathersWhileOneIsOut(t *testing.T) {
	t.Parallel()
	const admissions = 16
	c := startCluster(t, 2, Config{
		MaxInFlight: 4,
		Policies: map[string]PolicyConfig{
			"s": {Limit: 1 << 20, Window: time.Hour, Replication: ReplicateSync},
		},
	})
	n0, n1 := c.nodes[0], c.nodes[1]
	n0.setGatherForTest(time.Minute) // no slot is taken for being slow
	key, _ := keyHeldWithBackup(t, n0, n1, "gather", "s")
	waitFor(t, 10*time.Second, "n0's replication pipe to n1", func() bool {
		admitN(t, n0, key, 1)
		return n0.replPipeForTest("n1") != ""
	})

	// n1 holds the first replication message from n0 until released, and
	// counts the messages that carry admissions.
	entered, out := make(chan struct{}), make(chan struct{})
	var armed atomic.Bool
	var held sync.Once
	var msgs atomic.Int64
	n1.setReplDropForTest(func(req *peerpb.ReplicateRequest) bool {
		if !armed.Load() || req.GetSender() != "n0" || len(req.GetAdmitsPacked()) == 0 && !hasAdmit(req) {
			return false
		}
		msgs.Add(1)
		held.Do(func() {
			close(entered)
			<-out
		})
		return false
	})
	var once sync.Once
	release := func() { once.Do(func() { close(out) }) }
	t.Cleanup(release)
	armed.Store(true)

	var wg sync.WaitGroup
	errs := make(chan error, admissions+1)
	admit := func() {
		defer wg.Done()
		d, err := n0.Allow(context.Background(), Request{Key: key})
		if err == nil && !d.Allowed {
			err = fmt.Errorf("refused: %+v", d)
		}
		errs <- err
	}
	wg.Add(1)
	go admit() // its copy is the message n1 holds
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("n1 never received n0's replication")
	}
	wg.Add(admissions)
	for range admissions {
		go admit()
	}
	// One admission is the batch the replicator took and holds back; the
	// others queue behind it.
	waitFor(t, 10*time.Second, "the admissions to gather in n0's replication queue", func() bool {
		return n0.replQueuedForTest("n1") >= admissions-1
	})
	release()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("admission: %v", err)
		}
	}
	// The held message, then everything gathered meanwhile in one.
	if got := msgs.Load(); got != 2 {
		t.Errorf("%d replication messages carried the admissions, want 2", got)
	}
}

// hasAdmit reports whether req carries an admission as an operation.
// isCopy reports whether req carries part of a partition copy (copies
// travel as unary Replicate calls, which the drop hook also sees).
func isCopy(req *peerpb.ReplicateRequest) bool {
	for _, op := range req.GetOps() {
		switch op.GetKind() {
		case peerpb.PartitionOp_KIND_SYNC_BEGIN, peerpb.PartitionOp_KIND_SYNC_CHUNK, peerpb.PartitionOp_KIND_SYNC_END:
			return true
		}
	}
	return false
}

func hasAdmit(req *peerpb.ReplicateRequest) bool {
	for _, op := range req.GetOps() {
		if op.GetKind() == peerpb.PartitionOp_KIND_ADMIT {
			return true
		}
	}
	return false
}
