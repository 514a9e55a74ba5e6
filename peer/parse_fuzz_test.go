package peer

import (
	"errors"
	"strings"
	"testing"

	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// FuzzParseRequest feeds arbitrary requests, as a peer or a gRPC client
// could send them, to the validation every operation goes through. It must
// never panic; a rejection wraps one of the input sentinels; an accepted
// request names known policies, valid key parts and hits within every
// named policy's limit (for checks and peeks).
func FuzzParseRequest(f *testing.F) {
	n := &Node{}
	n.table.Store(policy.New(map[string]PolicyConfig{
		"a": {Limit: 5, Window: 1e9},
		"b": {Limit: 1 << 62, Window: 1e9},
	}))
	f.Add(int32(0), "t", "s", "a", "", int64(0))
	f.Add(int32(0), "t", "s", "", "a,b", int64(5))
	f.Add(int32(1), "t", "s", "b", "", int64(-1))
	f.Add(int32(2), "t", "s", "a", "", int64(1<<62))
	f.Add(int32(3), "t", "s", "", "a,a", int64(1))
	f.Add(int32(0), "t\x00", "sé", "a", "", int64(1))
	f.Add(int32(7), "", "", "zz", "a,,b", int64(0))
	f.Fuzz(func(t *testing.T, op int32, tenant, subject, pol, pols string, hits int64) {
		var policies []string
		if pols != "" {
			policies = strings.Split(pols, ",")
		}
		key := Key{Tenant: tenant, Subject: subject, Policy: pol}
		r, err := n.parseReq(opFromWire(peerpb.Op(op)), key, policies, hits)
		if err != nil {
			if !errors.Is(err, ErrInvalidKey) && !errors.Is(err, ErrInvalidHits) && !errors.Is(err, ErrUnknownPolicy) {
				t.Fatalf("parseReq(%d, %+v, %q, %d) = %v: not an input error", op, key, policies, hits, err)
			}
			return
		}
		if len(r.EK) == 0 || r.Hits < 1 || r.P == nil {
			t.Fatalf("accepted %+v: incomplete", r)
		}
		names := policies
		if len(names) == 0 {
			names = []string{pol}
		}
		for _, name := range names {
			p := n.table.Load().Lookup(name)
			if p == nil {
				t.Fatalf("accepted unknown policy %q", name)
			}
			if k := (Key{Tenant: tenant, Subject: subject, Policy: name}); k.Validate() != nil {
				t.Fatalf("accepted invalid key %+v", k)
			}
			if r.Op.Spec().Bounded && r.Hits > p.Shard.Limit {
				t.Fatalf("accepted hits %d above %q's limit %d", r.Hits, name, p.Shard.Limit)
			}
		}
	})
}
