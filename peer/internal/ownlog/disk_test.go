package ownlog

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/peer/internal/durable"
	"github.com/ringlimit/ringlimit/peer/internal/ownership"
)

// newDiskCluster is newCluster with member i's log in dirs[i-1] and
// ownership ID ids[i-1]; gone are earlier incarnations (gossip: a later
// one runs). A member whose directory holds a log resumes it.
func newDiskCluster(t *testing.T, dirs, ids, gone []string) *cluster {
	t.Helper()
	n := len(dirs)
	cs := &pb.ConfState{}
	for i := 1; i <= n; i++ {
		cs.Voters = append(cs.Voters, uint64(i))
	}
	c := &cluster{t: t, members: map[uint64]*Member{}, down: map[uint64]bool{}}
	for i := 1; i <= n; i++ {
		m, err := New(diskConfig(t, dirs[i-1], uint64(i), ids[i-1], cs))
		if err != nil {
			t.Fatal(err)
		}
		c.members[uint64(i)] = m
	}
	c.view(ids, gone)
	return c
}

func diskConfig(t *testing.T, dir string, raftID uint64, id string, cs *pb.ConfState) Config {
	t.Helper()
	d, err := OpenDisk(dir, "c1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return Config{RaftID: raftID, Ownership: ownership.Config{ID: id}, Partitions: 4, Bootstrap: cs, Disk: d, SnapshotEvery: 16}
}

// view gives every member the view of members ids (raft IDs 1…) with the
// incarnations gone.
func (c *cluster) view(ids, gone []string) {
	var roster []Peer
	for j, id := range ids {
		roster = append(roster, Peer{RaftID: uint64(j + 1), Member: id})
	}
	n := len(ids)
	for _, m := range c.members {
		m.SetView(ownership.View{Members: ids, Gone: gone, Target: []string{ids[0], ids[1%n], ids[2%n], ids[0]}}, roster)
	}
}

func tableJSON(t *testing.T, m *Member) string {
	t.Helper()
	b, err := json.Marshal(m.Own().Table())
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// deciders counts, per partition, the members that may decide for it,
// failing the test when two may.
func (c *cluster) deciders() (decided int) {
	c.t.Helper()
	for p := range 4 {
		n := 0
		for _, m := range c.members {
			if m.Own().MayDecide(p, c.now) {
				n++
			}
		}
		if n > 1 {
			c.t.Fatalf("p%d: %d members decide", p, n)
		}
		decided += n
	}
	return decided
}

// TestWholeLogRestarts: three members with their logs on disk all stop at
// once (files abandoned as a kill -9 leaves them, mid-run) and start
// again, each as the same raft member under a new incarnation. Each
// resumes the table it had applied; the log elects a leader among the
// old voters (the only ones it has) and commits; the old incarnations
// are ended and their partitions restart empty, counted in Restarts;
// and at no step do two members decide for one partition. Resuming
// under the old ID is refused, with the directory unchanged.
func TestWholeLogRestarts(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	old := []string{"m1", "m2", "m3"}
	c := newDiskCluster(t, dirs, old, nil)
	c.run(5 * time.Second)
	if c.deciders() != 4 {
		t.Fatalf("before the crash not every partition is decided: %s", tableJSON(t, c.members[1]))
	}
	before := map[uint64]string{}
	for id, m := range c.members {
		before[id] = tableJSON(t, m)
	}
	if commit := c.members[1].rn.Status().HardState.GetCommit(); commit < 16 {
		t.Fatalf("commit %d before the crash: want at least one snapshot (16 entries) taken", commit)
	}
	// Every member stops at once; nothing is flushed or closed.
	sum := dirSum(t, dirs[0])
	d, err := OpenDisk(dirs[0], "c1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{RaftID: 1, Ownership: ownership.Config{ID: "m1"}, Partitions: 4, Disk: d}); !errors.Is(err, ErrConfig) {
		t.Fatalf("resuming the log under the ID already in it: %v, want ErrConfig", err)
	}
	d.Close()
	if got := dirSum(t, dirs[0]); got != sum {
		t.Fatalf("the refused resume changed the directory:\n%s\nwas\n%s", got, sum)
	}
	next := []string{"m1b", "m2b", "m3b"}
	c2 := newDiskCluster(t, dirs, next, old)
	c2.now = c.now + int64(time.Minute) // monotonic clocks restart anywhere
	for id, m := range c2.members {
		c2.carry(id, m.Tick(c2.now))
		if got := tableJSON(t, m); got != before[id] {
			t.Fatalf("raft %d resumed the table\n%s\nwant the one it had applied\n%s", id, got, before[id])
		}
	}
	for end := c2.now + int64(20*time.Second); c2.deciders() < 4; c2.run(100 * time.Millisecond) {
		if c2.now > end {
			t.Fatalf("partitions not all decided 20 s after the restart: %s\n%s", c2.members[1].Describe(), tableJSON(t, c2.members[1]))
		}
	}
	tab := c2.members[1].Own().Table()
	restarts := 0
	for _, m := range c2.members {
		restarts += m.Own().Counters().Restarts
	}
	for _, id := range old {
		if r := tab.Members[id]; r == nil || !r.Ended {
			t.Errorf("old incarnation %s not ended for good: %+v", id, r)
		}
	}
	if restarts != 4 {
		t.Errorf("%d partitions counted as restarted empty, want 4 (every holder and backup restarted)", restarts)
	}
}

// TestMemberRestartsAlone: one member of three restarts with its log, as
// a new incarnation, while the others run on: it catches up, stays a
// voter, and its old incarnation's partitions go to their backups.
func TestMemberRestartsAlone(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	c := newDiskCluster(t, dirs, []string{"m1", "m2", "m3"}, nil)
	c.run(5 * time.Second)
	r, err := New(diskConfig(t, dirs[2], 3, "m3b", nil))
	if err != nil {
		t.Fatal(err)
	}
	if !r.Voter() {
		t.Fatalf("m3 restarted without its voter configuration: %s", r.Describe())
	}
	c.members[3] = r
	c.view([]string{"m1", "m2", "m3b"}, []string{"m3"})
	for end := c.now + int64(20*time.Second); c.deciders() < 4 || r.Own().Table().Members["m3b"] == nil; c.run(100 * time.Millisecond) {
		if c.now > end {
			t.Fatalf("partitions not all decided 20 s after m3 restarted: %s\n%s", r.Describe(), tableJSON(t, c.members[1]))
		}
	}
	c.run(time.Second)
	if got, want := tableJSON(t, r), tableJSON(t, c.members[1]); got != want {
		t.Fatalf("restarted m3 applied\n%s\nm1\n%s", got, want)
	}
	takeovers, restarts := 0, 0
	for _, m := range c.members {
		takeovers += m.Own().Counters().Takeovers
		restarts += m.Own().Counters().Restarts
	}
	if takeovers == 0 || restarts != 0 {
		t.Fatalf("m3's partitions: %d taken over by backups, %d restarted empty; want backups to take them, none restarted", takeovers, restarts)
	}
}

func dirSum(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s %x", e.Name(), sha256.Sum256(b)))
	}
	return strings.Join(out, "\n")
}

// TestBadRaftDir: a damaged raft log is refused with the file named,
// before the member starts.
func TestBadRaftDir(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	c := newDiskCluster(t, dirs, []string{"m1", "m2", "m3"}, nil)
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
	return err != nil && strings.Contains(err.Error(), path)
}

// TestDiskFailureStopsMember: once a write to the raft log fails, the
// member sends nothing more (an answer whose term or vote is not on disk
// must not go out) and reports why.
func TestDiskFailureStopsMember(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "raft")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDisk(dir, "c1")
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{RaftID: 2, Ownership: ownership.Config{ID: "m2"}, Partitions: 4, Disk: d})
	if err != nil {
		t.Fatal(err)
	}
	// The directory goes away before the first write (a disk pulled, a
	// volume unmounted): the first segment cannot be created.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	hb := &pb.Message{Type: pb.MsgHeartbeat.Enum(), From: proto.Uint64(1), To: proto.Uint64(2), Term: proto.Uint64(5)}
	out := m.Step(hb, int64(time.Second))
	if len(out.Messages) != 0 || d.Err() == nil {
		t.Fatalf("after a failed write: %d messages out, Err %v; want none out and the error", len(out.Messages), d.Err())
	}
	if !errors.Is(d.Err(), durable.ErrFailed) {
		t.Fatalf("Err = %v, want it to wrap durable.ErrFailed", d.Err())
	}
	out = m.Tick(int64(2 * time.Second))
	out2 := m.Step(hb, int64(3*time.Second))
	if len(out.Messages)+len(out2.Messages) != 0 {
		t.Fatalf("a stopped member sent %d messages", len(out.Messages)+len(out2.Messages))
	}
}

// TestDiskSnapshotReplacesSuffix: entries a follower logged that a
// leader's snapshot then replaced (an uncommitted suffix of an old term)
// do not come back after the snapshot when the member restarts.
func TestDiskSnapshotReplacesSuffix(t *testing.T) {
	dir := t.TempDir()
	d, err := OpenDisk(dir, "c1")
	if err != nil {
		t.Fatal(err)
	}
	ent := func(i, term uint64) *pb.Entry {
		return &pb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(term), Type: pb.EntryNormal.Enum()}
	}
	var old []*pb.Entry
	for i := uint64(1); i <= 10; i++ {
		old = append(old, ent(i, 1))
	}
	if err := d.save(raft.Ready{HardState: &pb.HardState{Term: proto.Uint64(1), Commit: proto.Uint64(3)}, Entries: old}); err != nil {
		t.Fatal(err)
	}
	snap := &pb.Snapshot{Metadata: &pb.SnapshotMetadata{Index: proto.Uint64(5), Term: proto.Uint64(2), ConfState: &pb.ConfState{Voters: []uint64{1, 2, 3}}}}
	if err := d.save(raft.Ready{HardState: &pb.HardState{Term: proto.Uint64(2), Commit: proto.Uint64(5)}, Snapshot: snap}); err != nil {
		t.Fatal(err)
	}
	d.Close()
	d, err = OpenDisk(dir, "c1")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var got []string
	for _, e := range d.stored.entries {
		got = append(got, fmt.Sprintf("%d@%d", e.GetIndex(), e.GetTerm()))
	}
	if len(got) != 0 || d.stored.snap.GetMetadata().GetIndex() != 5 || d.stored.hs.GetTerm() != 2 {
		t.Fatalf("after the restart: entries %v, snapshot at %d, term %d; want none after the snapshot at 5, term 2", got, d.stored.snap.GetMetadata().GetIndex(), d.stored.hs.GetTerm())
	}
}
