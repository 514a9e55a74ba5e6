package peer

import (
	"fmt"
	"time"

	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// stateToWire converts an exported key state to its wire form.
func stateToWire(st shard.KeyState) *peerpb.KeyState {
	out := &peerpb.KeyState{
		Key:       &peerpb.Key{Tenant: st.Key.Tenant, Subject: st.Key.Subject, Policy: st.Key.Policy},
		Algorithm: int32(st.Algorithm),
		Runs:      make([]*peerpb.Run, len(st.Runs)),
	}
	for i, r := range st.Runs {
		out.Runs[i] = &peerpb.Run{AgeNs: int64(r.Age), Count: r.Count, LeaseId: r.ID}
	}
	if len(st.Reservations) > 0 {
		out.Reservations = make([]*peerpb.Run, len(st.Reservations))
		for i, r := range st.Reservations {
			out.Reservations[i] = &peerpb.Run{AgeNs: int64(r.Age), Count: r.Count, LeaseId: r.ID}
		}
	}
	for _, g := range st.Grants {
		out.Grants = append(out.Grants, &peerpb.Run{AgeNs: int64(g.Age), Count: g.Count, LeaseId: g.ID})
	}
	return out
}

// stateFromWire converts and validates a key state from the wire.
func stateFromWire(ks *peerpb.KeyState) (shard.KeyState, error) {
	pk := ks.GetKey()
	if ks.GetAlgorithm() < 0 || ks.GetAlgorithm() > 255 {
		return shard.KeyState{}, fmt.Errorf("%w: algorithm %d", shard.ErrInvalidState, ks.GetAlgorithm())
	}
	st := shard.KeyState{
		Key:       Key{Tenant: pk.GetTenant(), Subject: pk.GetSubject(), Policy: pk.GetPolicy()},
		Algorithm: shard.Algorithm(ks.GetAlgorithm()),
		Runs:      make([]shard.Run, len(ks.GetRuns())),
	}
	for i, r := range ks.GetRuns() {
		st.Runs[i] = shard.Run{Age: time.Duration(r.GetAgeNs()), Count: r.GetCount(), ID: r.GetLeaseId()}
	}
	if rs := ks.GetReservations(); len(rs) > 0 {
		st.Reservations = make([]shard.Run, len(rs))
		for i, r := range rs {
			st.Reservations[i] = shard.Run{Age: time.Duration(r.GetAgeNs()), Count: r.GetCount(), ID: r.GetLeaseId()}
		}
	}
	for _, g := range ks.GetGrants() {
		st.Grants = append(st.Grants, shard.Run{Age: time.Duration(g.GetAgeNs()), Count: g.GetCount(), ID: g.GetLeaseId()})
	}
	return st, st.Validate()
}

// decodeState decodes a pushed key state and finds the local policy it
// belongs to. A malformed state is an error; a state whose policy is
// unknown here or uses another algorithm comes back with a nil policy, for
// the caller to refuse or skip.
func (t *policyTable) decodeState(ks *peerpb.KeyState) (shard.KeyState, *policy.Entry, error) {
	st, err := stateFromWire(ks)
	if err != nil {
		return st, nil, err
	}
	p := t.Load().Lookup(st.Key.Policy)
	if p == nil || p.Shard.Algorithm != st.Algorithm {
		return st, nil, nil
	}
	// The key's own limit (an override's), so an import keeps what the
	// holder kept.
	p = p.ForKey(st.Key.Tenant, st.Key.Subject)
	return st, p, nil
}
