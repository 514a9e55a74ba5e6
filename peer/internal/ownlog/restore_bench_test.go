package ownlog

import (
	"fmt"
	"testing"

	"go.etcd.io/raft/v3/confchange"
	pb "go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// BenchmarkConfRestore is what etcd raft does with a configuration of 5
// voters and the rest learners each time a member starts from one or
// applies a snapshot (confchange.Restore: one change at a time, each
// copying the whole configuration, so members² work). A fleet's
// simulator pays it once per member at the founding and once per
// restarted member after, which is why it is not done more often
// (compactTo, snapshots at a configuration change on the leader only).
func BenchmarkConfRestore(b *testing.B) {
	for _, n := range []int{64, 256, 1024} {
		cs := &pb.ConfState{}
		for i := 1; i <= n; i++ {
			if i <= 5 {
				cs.Voters = append(cs.Voters, uint64(i))
			} else {
				cs.Learners = append(cs.Learners, uint64(i))
			}
		}
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			for b.Loop() {
				chg := confchange.Changer{Tracker: tracker.MakeProgressTracker(256, 0), LastIndex: 1}
				if _, _, err := confchange.Restore(chg, cs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
