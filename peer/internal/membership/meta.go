package membership

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
)

// Meta is what a node gossips about itself.
type Meta struct {
	// Fingerprint is the placement fingerprint: members with different
	// ones cannot share a ring.
	Fingerprint uint64
	// RPCAddr is the member's gRPC address (host:port).
	RPCAddr string
	// Draining is set by a node that is leaving gracefully, just before it
	// hands off its keys, so peers can tell a leave from a failure.
	Draining bool
	// Start identifies the process (random, fixed for the node's life), so
	// peers can tell a restart on the same address from the same process.
	// Zero from a version 2 member.
	Start uint64
	// Cluster identifies the cluster the member belongs to: chosen at
	// random by the node that founded it, adopted by every node that
	// joins. Zero while a joiner has not adopted one yet, and from older
	// members.
	Cluster uint64
	// Policies is the version of the member's policy table; zero from
	// members older than version 5. It is reported, never compared.
	Policies uint64
	// RaftID is the member's ID in the ownership log. A member without a
	// data directory uses its Start; one with a data directory keeps the
	// raft ID its directory was first given, across restarts (its log on
	// disk is that raft member's). Zero from members older than version
	// 6, which use their Start.
	RaftID uint64
	// Heir is the start id of this member's previous incarnation, whose
	// data directory this process restarted with (zero for none): the
	// ownership machine's heir rule gives it what the log kept for that
	// incarnation. Zero from members older than version 6.
	Heir uint64
}

// Raft is the member's raft ID: RaftID, or Start from a member that
// gossips none.
func (m Meta) Raft() uint64 {
	if m.RaftID != 0 {
		return m.RaftID
	}
	return m.Start
}

// MetaVersion 6 is: version, flags, fingerprint (placement only), start
// id, cluster id, policy table version, raft id, heir's start id, rpc
// address (8-byte big-endian numbers). Version 5 (without raft id and
// heir), 4 (without the policy version), 3 (without the
// cluster id either) and 2 (without start and cluster ids) are still
// decoded, so a rolling upgrade can read older members; their fingerprint
// also covered the policy table, so they match only members of their own
// version.
const MetaVersion = 6

// Encode is m in the current version.
func (m Meta) Encode() []byte {
	b := make([]byte, 0, 50+len(m.RPCAddr))
	b = append(b, MetaVersion)
	var flags byte
	if m.Draining {
		flags |= 1
	}
	b = append(b, flags)
	b = binary.BigEndian.AppendUint64(b, m.Fingerprint)
	b = binary.BigEndian.AppendUint64(b, m.Start)
	b = binary.BigEndian.AppendUint64(b, m.Cluster)
	b = binary.BigEndian.AppendUint64(b, m.Policies)
	b = binary.BigEndian.AppendUint64(b, m.RaftID)
	b = binary.BigEndian.AppendUint64(b, m.Heir)
	return append(b, m.RPCAddr...)
}

// DecodeMeta decodes a member's metadata of any version it knows; the
// RPC address must be a host:port.
func DecodeMeta(b []byte) (Meta, error) {
	addrAt := 50
	switch {
	case len(b) >= 50 && b[0] == MetaVersion:
	case len(b) >= 34 && b[0] == 5:
		addrAt = 34
	case len(b) >= 26 && b[0] == 4:
		addrAt = 26
	case len(b) >= 18 && b[0] == 3:
		addrAt = 18
	case len(b) >= 10 && b[0] == 2:
		addrAt = 10
	default:
		return Meta{}, errors.New("peer: unrecognised member metadata")
	}
	m := Meta{Draining: b[1]&1 != 0, Fingerprint: binary.BigEndian.Uint64(b[2:10]), RPCAddr: string(b[addrAt:])}
	if addrAt >= 18 {
		m.Start = binary.BigEndian.Uint64(b[10:18])
	}
	if addrAt >= 26 {
		m.Cluster = binary.BigEndian.Uint64(b[18:26])
	}
	if addrAt >= 34 {
		m.Policies = binary.BigEndian.Uint64(b[26:34])
	}
	if addrAt >= 50 {
		m.RaftID = binary.BigEndian.Uint64(b[34:42])
		m.Heir = binary.BigEndian.Uint64(b[42:50])
	}
	if _, _, err := net.SplitHostPort(m.RPCAddr); err != nil {
		return Meta{}, fmt.Errorf("peer: member metadata rpc address: %w", err)
	}
	return m, nil
}
