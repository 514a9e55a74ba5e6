package peer

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// TestDurableStreamAnswerAfterFsync: the holder answers an AllowStream
// admission of a disk policy under sync replication only once its own
// record and its backup's are on disk. The timed flushes are off on both
// nodes, so the answer's own waits are the only fsyncs, and the backup
// applies the message only once an answer was sent or holdBackup passed:
// an answer sent before the holder's fsync (await skipped), before the
// backup's answer (not waited for) or before the backup's fsync finds a
// record not yet on disk and fails here.
func TestDurableStreamAnswerAfterFsync(t *testing.T) {
	const holdBackup = 200 * time.Millisecond
	base := logConfig(1000, time.Hour)
	base.Policies = map[string]PolicyConfig{"api": {Limit: 1000, Window: time.Hour, Durability: DurabilityDisk, Replication: ReplicateSync}}
	root := t.TempDir()
	c := startClusterWith(t, 2, base, func(i int, cfg *Config) { cfg.DataDir = filepath.Join(root, fmt.Sprint("n", i)) })
	// Keys of partitions one node holds and the other backs, with the
	// replica accepted.
	const items = 12
	var holder, backup *Node
	var keys []*peerpb.Key
	find := func() bool {
		for h := range c.nodes {
			holder, backup = c.nodes[h], c.nodes[1-h]
			v := holder.view.Load()
			keys = keys[:0]
			for i := 0; len(keys) < items && i < 10000; i++ {
				k := Key{Tenant: "t", Subject: fmt.Sprint("s", i), Policy: "api"}
				ek, ok := k.AppendEncoded(nil)
				if !ok {
					t.Fatalf("key %v does not encode", k)
				}
				pid := v.snap.PartitionOfHash(shard.Place(ek).Hash())
				pt := &holder.pt.parts[pid]
				pt.Mu.RLock()
				role := pt.Role
				pt.Mu.RUnlock()
				st := backup.lo.run.Part(pid)
				if role == partition.RoleHolder && backup.lo.run.AcceptReplica(pid, st.Holder, st.Epoch) {
					keys = append(keys, &peerpb.Key{Tenant: k.Tenant, Subject: k.Subject, Policy: k.Policy})
				}
			}
			if len(keys) == items {
				return true
			}
		}
		return false
	}
	waitFor(t, 20*time.Second, fmt.Sprintf("%d keys held by one node and backed by the other", items), find)
	// Only the answers' waits fsync from here on.
	for _, nd := range c.nodes {
		nd.dd.parts.timedOff.Store(true)
		done := make(chan struct{})
		nd.dd.parts.flushNow <- done
		<-done
	}
	hlog, blog := holder.dd.parts.parts, backup.dd.parts.parts
	msg := &peerpb.AllowStreamRequest{}
	for i, k := range keys {
		msg.Items = append(msg.Items, &peerpb.AllowStreamItem{Id: uint64(i + 1), Request: &peerpb.AllowRequest{Key: k, Hits: 1}})
	}
	defer backup.hooks.replHold.Store(nil)
	for round := range 3 {
		h0, b0 := hlog.Next(), blog.Next()
		// The backup applies the message only once an answer has been
		// sent, or after holdBackup: an answer that does not wait for
		// the backup leaves before the backup's records exist, every
		// time; a right one waits out holdBackup.
		sent := make(chan struct{})
		var sentOnce sync.Once
		hold := func(*peerpb.ReplicateRequest) func() {
			select {
			case <-sent:
			case <-time.After(holdBackup):
			}
			return nil
		}
		backup.hooks.replHold.Store(&hold)
		var mu sync.Mutex
		var errs []error
		answered := 0
		fs := &fakeStream[peerpb.AllowStreamRequest, peerpb.AllowStreamResponse]{ctx: context.Background(), msgs: []*peerpb.AllowStreamRequest{msg}, onSend: func(r *peerpb.AllowStreamResponse) {
			defer sentOnce.Do(func() { close(sent) })
			mu.Lock()
			defer mu.Unlock()
			// The message's records are the holder's from h0 and the
			// backup's from b0: every one of them on disk before any
			// answer leaves.
			if hn := hlog.Next(); hn < h0+items || !hlog.Synced(h0+items-1) {
				errs = append(errs, fmt.Errorf("answered before the holder's %d records (from %d; %d logged) were on disk", items, h0, hn-h0))
			}
			if bn := blog.Next(); bn <= b0 || !blog.Synced(bn-1) {
				errs = append(errs, fmt.Errorf("answered before the backup's records (from %d; %d logged) were on disk", b0, bn-b0))
			}
			for _, res := range r.GetResults() {
				answered++
				if res.GetCode() != 0 || !res.GetResponse().GetAllowed() {
					errs = append(errs, fmt.Errorf("item %d: code %d %q, %v", res.GetId(), res.GetCode(), res.GetError(), res.GetResponse()))
				}
			}
		}}
		if err := (&publicService{n: holder}).AllowStream(fs); err != nil {
			t.Fatal(err)
		}
		for _, err := range errs {
			t.Errorf("round %d: %v", round, err)
		}
		if answered != items {
			t.Fatalf("round %d: %d answers for %d items", round, answered, items)
		}
	}
}
