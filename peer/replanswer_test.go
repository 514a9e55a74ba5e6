package peer

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// fakeStream is a server-streaming call's side of a pipe: it hands the
// handler msgs in turn, then io.EOF, and calls onSend with what the
// handler sends (ReplicateStream's and AllowStream's server sides).
type fakeStream[Req, Resp any] struct {
	grpc.ServerStream
	ctx    context.Context
	msgs   []*Req
	next   int
	onSend func(*Resp)
}

func (f *fakeStream[Req, Resp]) Context() context.Context { return f.ctx }

func (f *fakeStream[Req, Resp]) Recv() (*Req, error) {
	if f.next == len(f.msgs) {
		return nil, io.EOF
	}
	f.next++
	return f.msgs[f.next-1], nil
}

func (f *fakeStream[Req, Resp]) Send(r *Resp) error {
	f.onSend(r)
	return nil
}

// TestDurableReplicaStreamAfterFsync: a backup's replication stream
// answers each message, in order, only once every record its operations
// logged is on disk (durability disk), while it goes on applying the
// messages after it: their records are appended during that fsync and
// share the next one (replAnswers), rather than each message waiting for
// its own fsync before the next is read.
func TestDurableReplicaStreamAfterFsync(t *testing.T) {
	base := logConfig(1000, time.Hour)
	base.Policies = map[string]PolicyConfig{"api": {Limit: 1000, Window: time.Hour, Durability: DurabilityDisk}}
	root := t.TempDir()
	c := startClusterWith(t, 2, base, func(i int, cfg *Config) { cfg.DataDir = filepath.Join(root, fmt.Sprint("n", i)) })
	var backup, holder *Node
	var pids []int
	for _, b := range c.nodes {
		for pid := range b.pt.parts {
			st := b.lo.run.Part(pid)
			if b.lo.run.AcceptReplica(pid, st.Holder, st.Epoch) && len(pids) < 5 {
				pids = append(pids, pid)
			}
		}
		if len(pids) > 0 {
			backup = b
			break
		}
	}
	if len(pids) < 5 {
		t.Fatalf("%d partitions backed with a replica accepted; want 5", len(pids))
	}
	for _, nd := range c.nodes {
		if nd != backup {
			holder = nd
		}
	}
	const msgs = 12
	reqs := make([]*peerpb.ReplicateRequest, msgs)
	for i := range reqs {
		reqs[i] = &peerpb.ReplicateRequest{Sender: holder.name, Id: uint64(i + 1)}
		for _, pid := range pids {
			st := backup.lo.run.Part(pid)
			reqs[i].Ops = append(reqs[i].Ops, &peerpb.PartitionOp{Kind: peerpb.PartitionOp_KIND_REPLACE, Partition: uint32(pid), Epoch: st.Epoch,
				Keys: []*peerpb.KeyState{{Key: &peerpb.Key{Tenant: "t", Subject: fmt.Sprint("s", i, "-", pid), Policy: "api"}, Runs: []*peerpb.Run{{AgeNs: 1, Count: 1}}}}})
		}
	}
	backup.dd.parts.timedOff.Store(true) // the stream's fsyncs are the only ones
	done := make(chan struct{})
	backup.dd.parts.flushNow <- done
	<-done
	log := backup.dd.parts.parts
	// applied[id] is the log's next record once message id is applied:
	// every record it logged comes before.
	var mu sync.Mutex
	applied := map[uint64]uint64{}
	hold := func(req *peerpb.ReplicateRequest) func() {
		return func() {
			mu.Lock()
			applied[req.GetId()] = log.Next()
			mu.Unlock()
		}
	}
	backup.hooks.replHold.Store(&hold)
	defer backup.hooks.replHold.Store(nil)
	var errs []error
	var sent []uint64
	fs := &fakeStream[peerpb.ReplicateRequest, peerpb.ReplicateResponse]{ctx: context.Background(), msgs: reqs, onSend: func(r *peerpb.ReplicateResponse) {
		mu.Lock()
		defer mu.Unlock()
		id := r.GetId()
		sent = append(sent, id)
		if r.GetCode() != 0 {
			errs = append(errs, fmt.Errorf("message %d: %s", id, r.GetError()))
			return
		}
		for i, res := range r.GetResults() {
			if res.GetStatus() != peerpb.OpStatus_OP_STATUS_OK {
				errs = append(errs, fmt.Errorf("message %d operation %d: %v", id, i, res))
			}
		}
		if next, ok := applied[id]; !ok || next == 0 || !log.Synced(next-1) {
			errs = append(errs, fmt.Errorf("message %d answered before its records (up to %d) were on disk", id, next))
		}
	}}
	syncs, next := log.Syncs(), log.Next()
	if err := (&limiterService{n: backup}).ReplicateStream(fs); err != nil {
		t.Fatal(err)
	}
	for _, err := range errs {
		t.Error(err)
	}
	if len(sent) != msgs {
		t.Fatalf("%d answers for %d messages", len(sent), msgs)
	}
	for i, id := range sent {
		if id != uint64(i+1) {
			t.Fatalf("answers in the order %v; want the messages' order", sent)
		}
	}
	if got := log.Next() - next; got < msgs*uint64(len(pids)) {
		t.Fatalf("%d records logged for %d operations", got, msgs*len(pids))
	}
	got := log.Syncs() - syncs
	if got < 1 || got > msgs {
		t.Fatalf("%d fsyncs for %d messages; want 1 to %d", got, msgs, msgs)
	}
	t.Logf("%d messages of disk replicas answered after %d fsyncs", msgs, got)
}
