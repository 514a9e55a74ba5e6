package peer

// Ownership as one node sees it, for status pages (Node.Ownership).

// OwnershipInfo is ownership as one node sees it, for status pages.
type OwnershipInfo struct {
	Mode OwnershipMode // always OwnershipLog
	// Member is this node's member ID in the log (name@start).
	Member string
	// Leader is the log's leader this node knows of (a member name, ""
	// for none); Voters the log's voter count.
	Leader string
	Voters int
	// Live reports whether this node's own liveness lease holds.
	Live bool
	// Partitions is every partition as this node's records say.
	Partitions []PartitionInfo
}

// PartitionInfo is one partition in OwnershipInfo.
type PartitionInfo struct {
	Partition int
	Holder    string // member name of the holder this node knows of; "" for none
	Backup    string // member name of the backup the table names; "" for none
	Epoch     uint64
	// Deciding: this node holds the partition and may decide for it now.
	Deciding bool
}

// Ownership returns ownership as this node sees it: the applied table as
// last published (every member's agrees once it has applied the same
// commands).
func (n *Node) Ownership() OwnershipInfo { return n.lo.info() }

// info is Node.Ownership.
func (lo *logOwner) info() OwnershipInfo {
	e := lo.env
	mono := e.mono()
	info := OwnershipInfo{Mode: OwnershipLog, Member: lo.self, Voters: lo.run.Voters(), Live: mono < lo.run.LiveUntil()}
	if id := lo.run.Lead(); id != 0 {
		info.Leader = lo.peers.Load().raft[id]
		if id == e.start {
			info.Leader = e.name
		}
	}
	for p := range e.parts {
		st := lo.run.Part(p)
		info.Partitions = append(info.Partitions, PartitionInfo{
			Partition: p, Holder: memberName(st.Holder), Backup: memberName(st.Backup), Epoch: st.Epoch,
			Deciding: st.Holder == lo.self && lo.run.MayDecide(p, mono),
		})
	}
	return info
}

// RaftTraffic returns what the ownership log has cost this node so far.
// Lock-free and cheap: fine to poll.
func (n *Node) RaftTraffic() RaftTraffic {
	return n.lo.traffic()
}

// Settled reports whether ownership on this node matches its ring: it
// holds, not fenced, every partition its ring names it the target of, each
// with its backup copy in place when the ring has another member, and
// holds none that belong to another member. A cluster whose members are
// all settled (and agree on the members) has finished moving partitions.
func (n *Node) Settled() bool {
	return n.lo.settled(n.view.Load())
}
