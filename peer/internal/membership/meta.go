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
}

// MetaVersion 5 is: version, flags, fingerprint (placement only), start
// id, cluster id, policy table version, rpc address (8-byte big-endian
// numbers). Versions 4 (without the policy version), 3 (without the
// cluster id either) and 2 (without start and cluster ids) are still
// decoded, so a rolling upgrade can read older members; their fingerprint
// also covered the policy table, so they match only members of their own
// version.
const MetaVersion = 5

// Encode is m in the current version.
func (m Meta) Encode() []byte {
	b := make([]byte, 0, 34+len(m.RPCAddr))
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
	return append(b, m.RPCAddr...)
}

// DecodeMeta decodes a member's metadata of any version it knows; the
// RPC address must be a host:port.
func DecodeMeta(b []byte) (Meta, error) {
	addrAt := 34
	switch {
	case len(b) >= 34 && b[0] == MetaVersion:
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
	if _, _, err := net.SplitHostPort(m.RPCAddr); err != nil {
		return Meta{}, fmt.Errorf("peer: member metadata rpc address: %w", err)
	}
	return m, nil
}
