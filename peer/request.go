package peer

import (
	"fmt"

	"github.com/ringlimit/ringlimit/peer/internal/partition"
	"github.com/ringlimit/ringlimit/peer/internal/policy"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// Requests: what every entry point (the public API, the public gRPC and
// HTTP services, a peer's forward) turns its input into before routing.
// Parsing is here and nowhere else; what is true of each operation is
// internal/partition's operation table.

// parseReq validates a request from a caller or a peer; errors wrap
// ErrInvalidKey, ErrUnknownPolicy, ErrInvalidHits or ErrWrongAlgorithm.
func (n *Node) parseReq(op partition.Op, key Key, policies []string, hits int64) (*opReq, error) {
	r := &opReq{}
	ek, err := n.parseReqInto(r, op, key, policies, hits, nil)
	if err != nil {
		return nil, err
	}
	r.EK = ek
	return r, nil
}

// parseReqInto is parseReq into r, except that it returns the key's
// encoding (r.EK) for the caller to set: a single-policy key's is appended
// to ekBuf, so a caller with room there spares an allocation, and a store
// through r would make escape analysis move ekBuf to the heap.
func (n *Node) parseReqInto(r *opReq, op partition.Op, key Key, policies []string, hits int64, ekBuf []byte) (ek []byte, err error) {
	// Cleared, then set field by field: a composite literal is built
	// aside and copied in, and the copy stalls on the byte just written.
	*r = opReq{}
	r.Op, r.Key = op, key
	spec := op.Spec()
	if !op.Valid() {
		return nil, fmt.Errorf("%w: unknown operation %d", ErrInvalidKey, op)
	}
	tab := n.table.Load() // once per request
	if hits == 0 {
		hits = 1
	}
	if hits < 0 {
		return nil, fmt.Errorf("%w: hits %d must be at least 1", ErrInvalidHits, hits)
	}
	r.Hits = hits
	if len(policies) > 0 {
		if !spec.Multi {
			return nil, fmt.Errorf("%w: several policies are for checks and peeks only", ErrInvalidKey)
		}
		if key.Policy != "" {
			return nil, fmt.Errorf("%w: give the policy or the list of policies, not both", ErrInvalidKey)
		}
		if len(policies) > shard.MaxMulti {
			return nil, fmt.Errorf("%w: %d policies, at most %d", ErrInvalidKey, len(policies), shard.MaxMulti)
		}
		r.Multi = make([]*policy.Entry, 0, len(policies)) // one allocation, not append's growth
		for i, name := range policies {
			k := Key{Tenant: key.Tenant, Subject: key.Subject, Policy: name}
			if i == 0 {
				// The first policy's key places the request.
				var ok bool
				if ek, ok = k.AppendEncoded(nil); !ok {
					return nil, fmt.Errorf("%w: %w", ErrInvalidKey, k.Validate())
				}
			} else if err := k.Validate(); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrInvalidKey, err)
			}
			for _, prev := range policies[:i] {
				if prev == name {
					return nil, fmt.Errorf("%w: policy %q named twice", ErrInvalidKey, name)
				}
			}
			p := tab.Lookup(name)
			if p == nil {
				return nil, fmt.Errorf("%w: %q", ErrUnknownPolicy, name)
			}
			if p.Shard.Algorithm == shard.Concurrency {
				return nil, partition.ErrNeedsLease(name)
			}
			p = p.ForKey(key.Tenant, key.Subject)
			if hits > p.Shard.Limit && !p.Unlimited {
				return nil, fmt.Errorf("%w: hits %d exceed policy %q's limit %d", ErrInvalidHits, hits, name, p.Shard.Limit)
			}
			r.Multi = append(r.Multi, p)
		}
		r.Names = policies
		r.P = r.Multi[0]
		return ek, nil
	}
	ek, ok := key.AppendEncoded(ekBuf)
	if !ok {
		return nil, fmt.Errorf("%w: %w", ErrInvalidKey, key.Validate())
	}
	r.P = tab.Lookup(key.Policy)
	if r.P == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownPolicy, key.Policy)
	}
	if spec.Applies != nil {
		if err := spec.Applies(r.P); err != nil {
			return nil, err
		}
	}
	r.P = r.P.ForKey(key.Tenant, key.Subject)
	if spec.Bounded && hits > r.P.Shard.Limit && !r.P.Unlimited {
		return nil, fmt.Errorf("%w: hits %d must be between 1 and the limit %d", ErrInvalidHits, hits, r.P.Shard.Limit)
	}
	return ek, nil
}

// opFromWire is the operation a peer's message names; a value outside
// the table stays invalid (Op.Valid), never wraps onto another operation.
func opFromWire(op peerpb.Op) partition.Op {
	if op < 0 || op > 255 || !partition.Op(op).Valid() {
		return partition.Op(255)
	}
	return partition.Op(op)
}
