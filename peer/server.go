package peer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// server answers peers: it decides, as owner, the requests they forward.
type server struct {
	peerpb.UnimplementedLimiterServer
	n *Node
}

// Check decides each item independently. A receiver that is not the owner in
// its own ring view never decides: it answers STATUS_NOT_OWNER with the
// member it believes holds the key, so the sender retries there or after
// refreshing its ring.
func (s *server) Check(ctx context.Context, req *peerpb.CheckRequest) (*peerpb.CheckResponse, error) {
	n := s.n
	if len(req.GetItems()) > maxWireBatch {
		return nil, status.Errorf(codes.InvalidArgument, "peer: batch of %d requests exceeds %d", len(req.GetItems()), maxWireBatch)
	}
	if n.ctx.Err() != nil {
		return nil, status.Error(codes.Unavailable, ErrClosed.Error())
	}
	if h := n.checkHook.Load(); h != nil {
		(*h)(ctx)
	}
	v := n.view.Load()
	if v == nil {
		// Peers can see a joining node before its first ring is built.
		return nil, status.Error(codes.Unavailable, "peer: node starting")
	}
	resp := &peerpb.CheckResponse{Decisions: make([]*peerpb.Decision, len(req.GetItems()))}
	for i, it := range req.GetItems() {
		resp.Decisions[i] = n.decideWire(ctx, v, it)
	}
	return resp, nil
}

func (n *Node) decideWire(ctx context.Context, v *view, it *peerpb.CheckItem) *peerpb.Decision {
	bad := func(st peerpb.Status, err error) *peerpb.Decision {
		return &peerpb.Decision{Status: st, Error: err.Error(), Owner: n.name, RingVersion: v.snap.Version(), MembersHash: v.snap.MembersHash()}
	}
	pk := it.GetKey()
	key := Key{Tenant: pk.GetTenant(), Subject: pk.GetSubject(), Policy: pk.GetPolicy()}
	// The key is validated first, as in Allow: a malformed policy part is
	// an invalid key, not an unknown policy.
	var buf [shard.MaxEncodedKeyLen]byte
	ek, ok := key.AppendEncoded(buf[:0])
	if !ok {
		return bad(peerpb.Status_STATUS_INVALID_ARGUMENT, fmt.Errorf("%w: %w", ErrInvalidKey, key.Validate()))
	}
	p := n.policies[key.Policy]
	if p == nil {
		return bad(peerpb.Status_STATUS_UNKNOWN_POLICY, fmt.Errorf("%w: %q", ErrUnknownPolicy, key.Policy))
	}
	hits := it.GetHits()
	if hits == 0 {
		hits = 1
	}
	if hits < 0 || hits > p.sp.Limit {
		return bad(peerpb.Status_STATUS_INVALID_ARGUMENT, fmt.Errorf("%w: hits %d must be between 1 and the limit %d", ErrInvalidHits, hits, p.sp.Limit))
	}
	pid := v.snap.Partition(placement(ek))
	pt := &n.pt.parts[pid]
	// A receiver waits for a partition it holds or is about to hold (a
	// move in progress), within the sender's deadline and at most half a
	// forward timeout, so the sender can still act on the answer.
	until := time.Now().Add(n.cfg.ForwardTimeout / 2)
	if dl, ok := ctx.Deadline(); ok && dl.Before(until) {
		until = dl
	}
	for {
		d, st, ch, err := n.decideHere(ctx, v, pt, pid, key, ek, p, hits)
		switch st {
		case decided:
			if err != nil {
				if errors.Is(err, ErrInvalidHits) {
					return bad(peerpb.Status_STATUS_INVALID_ARGUMENT, err)
				}
				return bad(peerpb.Status_STATUS_UNAVAILABLE, err)
			}
			n.metrics.Decision(p.name, d.Reason, PathRemote)
			return &peerpb.Decision{
				Status: peerpb.Status_STATUS_OK, Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining,
				RetryAfterNs: int64(d.RetryAfter), ResetAfterNs: int64(d.ResetAfter),
				Owner: n.name, RingVersion: d.RingVersion, MembersHash: v.snap.MembersHash(), Reason: peerpb.Reason(d.Reason),
			}
		case waitHere:
			if err := n.waitPart(ctx, ch, until); err != nil {
				return bad(peerpb.Status_STATUS_UNAVAILABLE, fmt.Errorf("%w: partition %d is moving", ErrUnavailable, pid))
			}
			v = n.view.Load()
			continue
		}
		pt.mu.RLock()
		r, holder, epoch := pt.role, pt.holder, pt.epoch
		pt.mu.RUnlock()
		if (r == roleMoved || r == roleHint) && holder != n.name {
			return &peerpb.Decision{Status: peerpb.Status_STATUS_NOT_OWNER, Owner: holder, HolderEpoch: epoch, RingVersion: v.snap.Version(), MembersHash: v.snap.MembersHash()}
		}
		if t := v.snap.PartitionOwner(pid); t != n.name {
			return &peerpb.Decision{Status: peerpb.Status_STATUS_NOT_OWNER, Owner: t, RingVersion: v.snap.Version(), MembersHash: v.snap.MembersHash()}
		}
		// We are the target and hold nothing yet: wait for the transfer.
		if err := n.waitPart(ctx, ch, until); err != nil {
			return bad(peerpb.Status_STATUS_UNAVAILABLE, fmt.Errorf("%w: partition %d has no holder here yet", ErrUnavailable, pid))
		}
		v = n.view.Load()
	}
}

// publicServer is the RateLimiter service for clients: any node accepts any
// key and routes it like Node.Allow.
type publicServer struct {
	peerpb.UnimplementedRateLimiterServer
	n *Node
}

func (s *publicServer) Allow(ctx context.Context, req *peerpb.AllowRequest) (*peerpb.AllowResponse, error) {
	pk := req.GetKey()
	d, err := s.n.Allow(ctx, Request{Key: Key{Tenant: pk.GetTenant(), Subject: pk.GetSubject(), Policy: pk.GetPolicy()}, Hits: req.GetHits()})
	if err != nil {
		return nil, ToStatus(err)
	}
	return &peerpb.AllowResponse{
		Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining,
		RetryAfterNs: int64(d.RetryAfter), ResetAfterNs: int64(d.ResetAfter),
		Reason: peerpb.Reason(d.Reason), Owner: d.Owner, RingVersion: d.RingVersion,
	}, nil
}
