package ownlog

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/ringlimit/ringlimit/peer/internal/durable"
	"github.com/ringlimit/ringlimit/peer/internal/ownership"
)

// newDiskCluster is newCluster with each member's log in dirs[i-1]: a
// member whose directory holds a log resumes it.
func newDiskCluster(t *testing.T, dirs []string, snapEvery uint64) (*cluster, []*Disk) {
	t.Helper()
	n := len(dirs)
	cs := &pb.ConfState{}
	var ids []string
	for i := 1; i <= n; i++ {
		cs.Voters = append(cs.Voters, uint64(i))
		ids = append(ids, fmt.Sprintf("m%d", i))
	}
	c := &cluster{t: t, members: map[uint64]*Member{}, down: map[uint64]bool{}}
	var disks []*Disk
	for i := 1; i <= n; i++ {
		d, err := OpenDisk(dirs[i-1], "c1")
		if err != nil {
			t.Fatal(err)
		}
		disks = append(disks, d)
		m, err := New(Config{RaftID: uint64(i), Ownership: ownership.Config{ID: ids[i-1]}, Partitions: 4, Bootstrap: cs, Disk: d, SnapshotEvery: snapEvery})
		if err != nil {
			t.Fatal(err)
		}
		var roster []Peer
		for j, id := range ids {
			roster = append(roster, Peer{RaftID: uint64(j + 1), Member: id})
		}
		m.SetView(ownership.View{Members: ids, Target: []string{ids[0], ids[1%n], ids[2%n], ids[0]}}, roster)
		c.members[uint64(i)] = m
	}
	return c, disks
}

func tableJSON(t *testing.T, m *Member) string {
	t.Helper()
	b, err := json.Marshal(m.Own().Table())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestWholeLogRestarts: three members with their logs on disk all stop at
// once (their files abandoned as a kill -9 leaves them, mid-run) and
// start again as the same raft members: each resumes the table it had
// applied, the log elects a leader and commits again (no new member
// could have: the old voters are the only ones), and at no step do two
// members decide for one partition.
func TestWholeLogRestarts(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	c, _ := newDiskCluster(t, dirs, 16)
	c.run(5 * time.Second)
	before := map[uint64]string{}
	commits := map[uint64]uint64{}
	for id, m := range c.members {
		before[id] = tableJSON(t, m)
		commits[id] = m.rn.Status().HardState.GetCommit()
	}
	if commits[1] < 16 {
		t.Fatalf("commit %d before the crash: want at least one snapshot (16 entries) taken", commits[1])
	}
	// Every member stops at once; nothing is flushed or closed.
	c2, _ := newDiskCluster(t, dirs, 16)
	c2.now = c.now + int64(time.Minute) // monotonic clocks restart anywhere
	for id, m := range c2.members {
		c2.carry(id, m.Tick(c2.now))
		if got := tableJSON(t, m); got != before[id] {
			t.Fatalf("m%d resumed the table\n%s\nwant the one it had applied\n%s", id, got, before[id])
		}
	}
	for end := c2.now + int64(10*time.Second); ; {
		c2.run(100 * time.Millisecond)
		for p := range 4 {
			deciders := 0
			for _, m := range c2.members {
				if m.Own().MayDecide(p, c2.now) {
					deciders++
				}
			}
			if deciders > 1 {
				t.Fatalf("p%d: %d members decide after the restart", p, deciders)
			}
		}
		leaderCommit := uint64(0)
		for _, m := range c2.members {
			if m.Leader() {
				leaderCommit = m.rn.Status().HardState.GetCommit()
			}
		}
		if leaderCommit > commits[1]+3 {
			break
		}
		if c2.now > end {
			t.Fatalf("no leader committing past %d within 10 s of the restart: %s", commits[1], c2.members[1].Describe())
		}
	}
}

// TestMemberRestartsAlone: one member of three restarts with its log
// while the others run on; it catches up and the log keeps its
// majority when another member then stops.
func TestMemberRestartsAlone(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	c, _ := newDiskCluster(t, dirs, 16)
	c.run(5 * time.Second)
	d, err := OpenDisk(dirs[2], "c1")
	if err != nil {
		t.Fatal(err)
	}
	m3 := c.members[3]
	r, err := New(Config{RaftID: 3, Ownership: ownership.Config{ID: "m3"}, Partitions: 4, Disk: d, SnapshotEvery: 16})
	if err != nil {
		t.Fatal(err)
	}
	r.SetView(ownership.View{Members: []string{"m1", "m2", "m3"}, Target: []string{"m1", "m2", "m3", "m1"}}, c.roster())
	if !r.Voter() {
		t.Fatalf("m3 restarted without its voter configuration: %s", r.Describe())
	}
	c.members[3] = r
	c.run(3 * time.Second)
	if got, want := tableJSON(t, r), tableJSON(t, c.members[1]); got != want {
		t.Fatalf("restarted m3 applied\n%s\nm1\n%s", got, want)
	}
	_ = m3
	c.leaveThenCheckMajority(c.leaderOtherThan(3), 3)
}

func (c *cluster) leaderOtherThan(id uint64) uint64 {
	if l := c.leader(); l != id {
		return l
	}
	for o := range c.members {
		if o != id {
			return o
		}
	}
	return 0
}

// TestBadRaftDir: a damaged raft log is refused with the file named,
// before the member starts.
func TestBadRaftDir(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	c, _ := newDiskCluster(t, dirs, 16)
	c.run(3 * time.Second)
	snap := filepath.Join(dirs[0], RaftSnapshot)
	b, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	os.WriteFile(snap, b, 0o600)
	if _, err := OpenDisk(dirs[0], "c1"); !errors.Is(err, durable.ErrCorrupt) || !errorNames(err, snap) {
		t.Fatalf("OpenDisk of a flipped snapshot: %v, want ErrCorrupt naming %s", err, snap)
	}
	if _, err := OpenDisk(dirs[1], "c2"); !errors.Is(err, durable.ErrOtherCluster) {
		t.Fatalf("OpenDisk for another cluster: %v, want ErrOtherCluster", err)
	}
}

func errorNames(err error, path string) bool {
	return err != nil && len(path) > 0 && contains(err.Error(), path)
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
