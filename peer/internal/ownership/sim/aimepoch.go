package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/history"
	"github.com/ringlimit/ringlimit/peer/internal/ownership"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// FaultLateSetBackup aims one late proposal at the SetBackup rule (a
// SetBackup commits only at the partition epoch it was proposed at): a
// member joins, so the ring's second choice for some partitions changes
// and their holders copy to it and propose a SetBackup replacing a
// backup that works. The first such proposal a follower sends the leader
// for a partition with a sync key is held back in the network (a message
// delayed, as FaultLate delays every Move and SetBackup, but aimed): the
// holder's fence times out after Retry, it proposes a Keep, and the
// proposal goes on the instant the holder has applied that Keep, so that
// it commits behind it. The holder begins a new copy to the same member
// at its next step, a millisecond or less later, and is fenced from then
// on; a client beside it asks for the sync key in between (a request at
// any instant is the promise's to survive), so the holder decides again
// after the Keep, its backup still the old one. Its copies to the new
// backup from then on are lost, and 0.3-1 s after the Keep it crashes
// (windows of 5 s outlast its liveness). The rule kept, the late
// SetBackup is refused and the old backup, which has the admission,
// takes over; broken, the new backup takes over with the copy the
// SetBackup named, without it (an acknowledged sync admission lost).
// Without the aimed request 2 of 300 schedules had the holder decide in
// that gap; FaultLate, unaimed, reached it in 0 of 200.

// LateSetBackup is what FaultLateSetBackup brought about.
type LateSetBackup struct {
	// Behind: the held SetBackup went on after its holder applied a Keep
	// at its epoch, still holding the partition.
	Behind bool
	// Admitted counts the holder's admissions on the partition between
	// applying the Keep and its next copy to the SetBackup's member: the
	// state the fault is for when not 0.
	Admitted int
}

// lateSetBackup is FaultLateSetBackup's aim and what came of it.
type lateSetBackup struct {
	holder *member // the follower whose SetBackup is held back
	to     *member // the leader it was sent to
	p      int
	epoch  uint64 // the SetBackup's partition epoch
	wire   []byte // the held proposal
	// newBackup is the member the SetBackup names; lost: a copy to it
	// was lost.
	newBackup string
	lost      bool
	// keptAt is when the holder applied the Keep, on its clock.
	released bool
	keptAt   int64
	res      LateSetBackup
}

// lateSetBackupFault starts FaultLateSetBackup: a member joins. If no
// SetBackup replacing a working backup is proposed within 6 s, nothing
// more happens.
func (s *sim) lateSetBackupFault() {
	m := s.start(fmt.Sprintf("n%d", len(s.all)), 1, s.newRaftID(), nil)
	s.note("join %s; the first SetBackup replacing a working backup is held back until its holder applies a Keep", m.id)
	s.lsb = &lateSetBackup{}
	s.extendEnd(int64(10 * time.Second))
}

// aimLateSetBackup, under FaultLateSetBackup, looks at the raft messages
// m is about to send and returns those to send: it holds back the first
// proposal carrying a SetBackup that replaces a working backup of a
// partition with a sync key, and sends it on once its holder has applied
// a Keep at the SetBackup's epoch, when a client asks the holder for
// that key.
func (s *sim) aimLateSetBackup(m *member, msgs []*pb.Message) []*pb.Message {
	a := s.lsb
	if a.wire != nil && !a.released && m == a.holder {
		pt := m.own.Table().Parts[a.p]
		if pt.Epoch > a.epoch {
			a.released, a.keptAt = true, m.mono()
			a.res.Behind = pt.Epoch == a.epoch+1 && pt.Holder == m.id
			s.requestAt(m, a.p)
			s.note("%s applied p%d's Keep (epoch %d); its SetBackup at epoch %d goes on to %s", m.id, a.p, pt.Epoch, a.epoch, a.to.id)
			wire, to := a.wire, a.to
			s.send(Raft, len(wire), m, to, func() {
				in := &pb.Message{}
				if err := proto.Unmarshal(wire, in); err != nil {
					panic(err)
				}
				to.carry(to.log.Step(in, to.mono()))
			})
			d := int64(300*time.Millisecond) + s.rng.Int64N(int64(700*time.Millisecond))
			s.extendEnd(d + int64(2*time.Second) + s.endedWithin())
			s.at(d, func() {
				if !m.crashed {
					s.note("crash %s, p%d's holder", m.id, a.p)
					s.crash(m, false)
				}
			})
		}
	}
	if a.wire != nil || m.crashed || m.log.Leader() {
		return msgs
	}
	i := slices.IndexFunc(msgs, func(msg *pb.Message) bool { return s.replacesBackup(m, msg) })
	if i < 0 {
		return msgs
	}
	wire, err := proto.Marshal(msgs[i])
	if err != nil {
		panic(err)
	}
	to := s.byRaft[msgs[i].GetTo()]
	if to == nil {
		return msgs
	}
	c := setBackupIn(msgs[i])
	a.holder, a.to, a.p, a.epoch, a.wire, a.newBackup = m, to, c.P, c.Epoch, wire, c.To
	s.note("%s's SetBackup of p%d to %s at epoch %d is held back", m.id, c.P, c.To, c.Epoch)
	return slices.Delete(slices.Clone(msgs), i, i+1)
}

// replacesBackup reports whether msg is m's proposal of a SetBackup for
// a partition with a sync key whose backup works (m's table names one).
func (s *sim) replacesBackup(m *member, msg *pb.Message) bool {
	c := setBackupIn(msg)
	if c == nil || c.Member != m.id {
		return false
	}
	pt := m.own.Table().Parts[c.P]
	if pt.Backup == "" || pt.Backup == c.To || pt.Epoch != c.Epoch {
		return false
	}
	return s.syncKey(c.P) != ""
}

// syncKey returns a key of partition p whose policy replicates
// synchronously, the first in order ("": none).
func (s *sim) syncKey(p int) string {
	for i, k := range s.keys {
		if s.partition(k) == p && s.o.mode(i) == ModeSync {
			return k
		}
	}
	return ""
}

// requestAt has a client beside m ask m for p's sync key at once (a
// client of its own, Options.Clients + 1, so that the others' requests
// keep their order): m, the holder, decides the instant it applied the
// Keep, before its next copy fences it.
func (s *sim) requestAt(m *member, p int) {
	key := s.syncKey(p)
	i, finish := s.record(key, s.o.Clients+1, func() {})
	m.handle(key, i, 0, func(out history.Outcome, owner string, epoch uint64) {
		s.deliver(m, func() { finish(out, owner, epoch) })
	})
}

// setBackupIn returns the SetBackup a proposal carries (nil: none).
func setBackupIn(msg *pb.Message) *ownership.Command {
	if msg.GetType() != pb.MsgProp {
		return nil
	}
	for _, e := range msg.GetEntries() {
		if c, err := ownership.Decode(e.GetData()); err == nil && c.Kind == ownership.SetBackup {
			return &c
		}
	}
	return nil
}

// losesCopy, under FaultLateSetBackup, reports whether the copy a (of
// FaultLateSetBackup's partition, from m to the backup its SetBackup
// named) sent after the held SetBackup went on is lost: copies from
// then until the holder crashes. The first notes whether m admitted on
// the partition since it applied the Keep.
func (s *sim) losesCopy(m, to *member, a ownership.Action) bool {
	l := s.lsb
	if !l.released || m != l.holder || a.P != l.p || to.id != l.newBackup {
		return false
	}
	if !l.lost {
		l.lost = true
		n := 0
		for _, es := range m.stores[a.P] {
			for _, e := range es {
				if e.ts >= l.keptAt {
					n++
				}
			}
		}
		l.res.Admitted = n
		s.note("%s admitted %d on p%d since its Keep; its copy to %s (epoch %d) is lost, as are the next until it crashes", m.id, n, a.P, to.id, a.Epoch)
	}
	s.messages++
	s.sent(Copy, m, 0)
	return true
}
