package peer

// Client: a routing-aware client of a cluster's public RateLimiter
// service, for applications that do not embed a Node (sidecar use).
//
// The protocol, all of it in ringlimit.proto's RateLimiter service, so a
// client in another language can do the same:
//
//   - Placement (unary) returns a node's table: the live members with
//     their gRPC addresses, the partition count, and for every partition
//     the member that holds it. A key's partition is XXH64 (seed 0) of its
//     placement bytes — tenant and subject, each one length byte and its
//     bytes — modulo the partition count.
//   - AllowStream (bidirectional) carries requests, each with an id the
//     client chooses, and their results with the same ids, in any order.
//     One stream per member; the client sends each key's request on the
//     stream of its partition's holder, so the holder decides it without
//     a forward hop.
//   - Peek, Refund, Acquire and Release are the service's unary calls of
//     those names, sent to the key's holder the same way (Release carries
//     lease_id): they are rarer than checks and not batched.
//   - A table can be out of date (a member joined or left, a partition
//     moved): a request sent to a member that does not hold its key is
//     forwarded by that member, so the answer is right, only slower. The
//     answer's owner names the member that decided; when it is not the
//     member the table named, the client reads the table again. It also
//     reads it every RefreshInterval, and when a stream breaks.
//
// What the client keeps: one gRPC connection and stream per member, one
// goroutine sending on each (it gathers the requests waiting into one
// message) and one receiving; one goroutine refreshing the table. Close
// stops them all.
//
// When a holder fails (a crash, kill -9), the client follows the
// ownership table as a node does, and leaves the failure policy to a node:
//
//   - A member's table names each partition's holder as the ownership log
//     has it (the answering node's published state), not the ring's
//     target: after a crash the ring keeps the dead member until gossip
//     declares it dead (seconds), while the table names the backup as
//     soon as the takeover is applied.
//   - A member whose port refuses connections (gRPC reports its
//     connection in transient failure) is skipped, and a stream that
//     cannot be opened fails at once: its requests go to the next member
//     in the table, which forwards them to the holder its table names, or
//     applies the policy's failure choice when nobody can decide, as it
//     does for its own callers. Its answer names the member that decided,
//     so the client reads the table again and goes to the new holder
//     directly once the takeover is applied.
//   - A check (Allow) that was written to a stream that then broke is sent
//     once more, to another member: a node resends a forwarded check the
//     same way (resendable), because a check decided twice only counts
//     twice — the limiter refuses more, never less. Unary calls (refunds,
//     resets, leases, settlements) are never sent twice: a refund or a
//     reset applied twice would undo admissions.
//
// Why the failure choice (FailOpen, Fallback, FailClosed) is left to the
// node the request reaches rather than applied by the client from a copy
// of the policy table: the table is the cluster's (Config.Policies, with
// per-tenant overrides and a fallback limit shared among the ring's
// members), it changes while clients run, and a caller must not be able
// to choose its own limit or failure policy; a fallback decision needs a
// node's local log. So the client's part is to get a live node's answer
// in time: it never waits on a dead member, and its DecisionTimeout's
// default is twice a node's default ForwardTimeout, so a node's
// failed-open, fallback or unavailable answer arrives before the client
// gives up. What the client still answers with ErrUnavailable on its own:
// no member reachable at all, a request lost twice, and a deadline (the
// caller's, or DecisionTimeout) shorter than the cluster's ForwardTimeout
// plus a round trip. A caller with a fail-open policy should treat those
// as its own fail-open case.
//
// What it does not do: it never decides, and it never resends a request
// other than a check that may have reached a node (a request is resent, to
// another member, when it was never written to a stream, and a check once
// more when its stream broke after it was written).

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

// ClientConfig configures Dial. The zero value of every field but Addrs
// means its default.
type ClientConfig struct {
	// Addrs are gRPC addresses (host:port) of one or more members, to read
	// the first placement table from. Required. After that the client
	// reads the table from the members it names, and from Addrs when none
	// answers.
	Addrs []string
	// DialOptions are passed to grpc.NewClient for every member. Nil means
	// plaintext (insecure credentials); give TLS credentials and any
	// authentication here.
	DialOptions []grpc.DialOption
	// RefreshInterval is how often the table is read again even when no
	// answer suggests it changed. Zero means 1 s.
	RefreshInterval time.Duration
	// Timeout bounds one placement read and one stream opening. Zero
	// means 2 s.
	Timeout time.Duration
	// DecisionTimeout bounds one call (Allow and the other decisions)
	// whose context has no deadline; a context with a deadline is bounded
	// by it alone. A call that runs out returns an error wrapping both
	// ErrUnavailable and context.DeadlineExceeded. Zero (or negative)
	// means 1 s: twice a node's default Config.ForwardTimeout, so that
	// when a holder is down the answer of the node that applies the
	// policy's failure choice (after its ForwardTimeout) arrives first.
	// With a longer ForwardTimeout on the nodes, set it longer too.
	DecisionTimeout time.Duration
}

// Client decides requests on a ringlimit cluster, sending each to its
// key's holder. Safe for concurrent use; create one per process and share
// it (it keeps a connection per member).
type Client struct {
	cfg    ClientConfig
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	table   atomic.Pointer[clientTable]
	refresh chan struct{} // a table read is wanted (buffered: requests coalesce)

	mu      sync.RWMutex
	members map[string]*clientConn // by address
	closed  bool

	calls    sync.Pool // *clientCall
	timedOut error     // the cause of a call's DecisionTimeout running out
}

// clientTable is one placement table.
type clientTable struct {
	node    string // the member that answered
	version uint64
	count   uint64
	members []tableMember
	holders []uint32 // per partition, an index in members
}

type tableMember struct{ name, addr string }

// Dial reads the placement table from cfg.Addrs (bounded by ctx) and
// returns a Client. It fails when no address answers; the error says why.
func Dial(ctx context.Context, cfg ClientConfig) (*Client, error) {
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("peer: Dial needs at least one member address in ClientConfig.Addrs")
	}
	cfg.Addrs = append([]string(nil), cfg.Addrs...)
	if cfg.DialOptions == nil {
		cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	if cfg.RefreshInterval <= 0 {
		cfg.RefreshInterval = time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.DecisionTimeout <= 0 {
		cfg.DecisionTimeout = defaultDecisionTimeout
	}
	c := &Client{cfg: cfg, refresh: make(chan struct{}, 1), members: map[string]*clientConn{},
		timedOut: fmt.Errorf("no answer within the client's DecisionTimeout %v: %w", cfg.DecisionTimeout, context.DeadlineExceeded)}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.calls.New = func() any { return &clientCall{done: make(chan clientResult, 1)} }
	t, err := c.readTable(ctx, cfg.Addrs)
	if err != nil {
		c.cancel()
		c.closeMembers()
		c.wg.Wait()
		return nil, err
	}
	c.table.Store(t)
	c.wg.Add(1)
	go c.refreshLoop()
	return c, nil
}

// Close stops the client: calls in flight and later return ErrClosed or an
// error wrapping ErrUnavailable. It waits for the client's goroutines.
func (c *Client) Close() error {
	c.cancel()
	c.closeMembers()
	c.wg.Wait()
	return nil
}

// closeMembers stops every member's connection and forbids new ones.
func (c *Client) closeMembers() {
	c.mu.Lock()
	c.closed = true
	ms := c.members
	c.members = map[string]*clientConn{}
	c.mu.Unlock()
	for _, m := range ms {
		m.stop()
	}
}

// Allow decides one request at its key's holder, like Node.Allow: over
// limit is a Decision with Allowed false and a nil error. Invalid input
// returns an error wrapping ErrInvalidKey or ErrInvalidHits (before
// anything is sent, or as the node answered); an unknown policy
// ErrUnknownPolicy; a concurrency policy ErrWrongAlgorithm (its units are
// taken with Acquire and given back with Release). A holder that cannot
// decide gets the policy's failure choice from the node the request
// reached, as Node.Allow does: a Decision with ReasonFailedOpen or
// ReasonFallback, or (failing closed) an error wrapping ErrUnavailable.
// No member reachable, a request lost twice with its stream, or an expired
// ctx is an error wrapping ErrUnavailable (and ctx's error, or
// context.DeadlineExceeded when DecisionTimeout ran out). After Close it
// returns ErrClosed.
func (c *Client) Allow(ctx context.Context, req Request) (Decision, error) {
	t, at, err := c.route(req)
	if err != nil {
		return Decision{}, err
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	// A request never written to a stream may go elsewhere: to the next
	// member, which forwards it; so may a check lost with its stream,
	// once (see the type's doc).
	resent := false
	var cause error
	for try := range len(t.members) {
		tm := t.members[(at+try)%len(t.members)]
		m, err := c.member(tm.addr)
		if err != nil {
			return Decision{}, err
		}
		if m.down() {
			cause = fmt.Errorf("%s: connection failed", tm.addr)
			continue
		}
		d, out, err := m.allow(ctx, req)
		switch {
		case out == notSent:
			cause = fmt.Errorf("%s: no stream", tm.addr)
			c.kickRefresh()
			continue
		case out == lost && !resent && ctx.Err() == nil:
			resent, cause = true, err
			c.kickRefresh()
			continue
		}
		if err == nil && d.Owner != tm.name {
			c.kickRefresh()
		}
		return d, err
	}
	return Decision{}, fmt.Errorf("%w: no member could take the request: %w", ErrUnavailable, cause)
}

// Peek answers at the key's holder what Allow would decide now, recording
// nothing, like Node.Peek: Reason is ReasonPeek. Its errors are Allow's.
func (c *Client) Peek(ctx context.Context, req Request) (Decision, error) {
	resp, err := c.unary(ctx, req, 0, peerpb.RateLimiterClient.Peek)
	if err != nil {
		return Decision{}, err
	}
	return decisionFromWire(resp), nil
}

// Refund gives back up to req.Hits units (zero means 1) of the key's
// admissions still in the window, at its holder, like Node.Refund: the
// Decision is the key's new state (Reason ReasonRefunded; Allowed reports
// whether anything was given back). An error wrapping ErrUnavailable
// leaves the refund's outcome unknown: do not refund again on it. A
// concurrency policy is ErrWrongAlgorithm (use Release), hits above the
// policy's limit ErrInvalidHits. A node that guards refunds
// (Config.AuthorizeRefund; serve's --admin-token-file) refuses a call
// without the credential it asks for with an Unauthenticated or
// PermissionDenied status error, returned as it is: nothing was given
// back. Send the credential with ClientConfig.DialOptions (for a bearer
// token, grpc.WithPerRPCCredentials). Other errors are Allow's.
func (c *Client) Refund(ctx context.Context, req Request) (Decision, error) {
	resp, err := c.unary(ctx, req, 0, peerpb.RateLimiterClient.Refund)
	if err != nil {
		return Decision{}, err
	}
	return decisionFromWire(resp), nil
}

// Acquire takes a lease of req.Hits units (zero means 1) of a concurrency
// policy at the key's holder, like Node.Acquire: at the limit it returns
// Allowed false with a nil error and a RetryAfter; a granted lease has an
// ID to pass to Release and lasts until then or its TTL. Any other policy
// is ErrWrongAlgorithm; other errors are Allow's (a policy that fails open
// or falls back answers as Node.Acquire does, from the node the call
// reached).
func (c *Client) Acquire(ctx context.Context, req Request) (Lease, error) {
	resp, err := c.unary(ctx, req, 0, peerpb.RateLimiterClient.Acquire)
	if err != nil {
		return Lease{}, err
	}
	return Lease{Decision: decisionFromWire(resp), ID: resp.GetLeaseId(), TTL: time.Duration(resp.GetLeaseTtlNs())}, nil
}

// Release ends lease id of key at the key's holder, like Node.Release:
// Reason is ReasonReleased and Allowed reports whether a live lease was
// ended (an unknown, released or expired id is Allowed false with a nil
// error). An error wrapping ErrUnavailable leaves the lease to expire at
// its TTL. Other errors are Allow's.
func (c *Client) Release(ctx context.Context, key Key, id uint64) (Decision, error) {
	resp, err := c.unary(ctx, Request{Key: key}, id, peerpb.RateLimiterClient.Release)
	if err != nil {
		return Decision{}, err
	}
	return decisionFromWire(resp), nil
}

// Reserve admits req.Hits units (zero means 1) of req.Key, a sliding_log
// policy, as an estimate at the key's holder, like Node.Reserve: the
// reservation's ID goes to Settle. Other errors are Allow's.
func (c *Client) Reserve(ctx context.Context, req Request) (Reservation, error) {
	resp, err := c.unary(ctx, req, 0, peerpb.RateLimiterClient.Reserve)
	if err != nil {
		return Reservation{}, err
	}
	return Reservation{Decision: decisionFromWire(resp), ID: resp.GetLeaseId(), TTL: time.Duration(resp.GetLeaseTtlNs())}, nil
}

// Settle replaces reservation id's estimate with actual at the key's
// holder, like Node.Settle: an id not pending is Allowed false with a nil
// error, so a retry is harmless. An error wrapping ErrUnavailable leaves
// the estimate standing. Other errors are Allow's.
func (c *Client) Settle(ctx context.Context, key Key, id uint64, actual int64) (Settlement, error) {
	if actual < 0 {
		return Settlement{}, fmt.Errorf("%w: actual cost %d must not be negative", ErrInvalidHits, actual)
	}
	settle := func(cl peerpb.RateLimiterClient, ctx context.Context, req *peerpb.AllowRequest, opts ...grpc.CallOption) (*peerpb.AllowResponse, error) {
		req.Actual = actual
		return cl.Settle(ctx, req, opts...)
	}
	resp, err := c.unary(ctx, Request{Key: key}, id, settle)
	if err != nil {
		return Settlement{}, err
	}
	return Settlement{Decision: decisionFromWire(resp), Estimate: resp.GetEstimate(), Overage: resp.GetOverage()}, nil
}

// Reset clears key at its holder, like Node.Reset (an operator action):
// the node's Config.AuthorizeReset, if set, judges the call, so give ctx
// the credentials it expects (for serve: metadata "authorization: Bearer
// <admin token>", with metadata.AppendToOutgoingContext). A refused call
// is an error carrying the node's gRPC status (PermissionDenied or
// Unauthenticated). Other errors are Allow's.
func (c *Client) Reset(ctx context.Context, key Key) (Decision, error) {
	resp, err := c.unary(ctx, Request{Key: key}, 0, peerpb.RateLimiterClient.Reset)
	if err != nil {
		return Decision{}, err
	}
	return decisionFromWire(resp), nil
}

// BatchResult is one request's outcome in AllowBatch: its Decision, or
// the error Allow would have returned for it alone.
type BatchResult struct {
	Decision
	Err error
}

// AllowBatch decides reqs independently, as that many Allow calls: each
// goes to its key's holder, on the holder's stream, where requests in
// flight together travel in one message. One bad request fails alone;
// results[i] is reqs[i]'s. At most MaxBatch requests (more: every result
// is an error wrapping ErrInvalidKey).
func (c *Client) AllowBatch(ctx context.Context, reqs []Request) []BatchResult {
	out := make([]BatchResult, len(reqs))
	if len(reqs) > MaxBatch {
		err := fmt.Errorf("%w: batch of %d requests exceeds %d", ErrInvalidKey, len(reqs), MaxBatch)
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, batchParallel)
	for i := range reqs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			out[i].Decision, out[i].Err = c.Allow(ctx, reqs[i])
		})
	}
	wg.Wait()
	return out
}

// unaryRPC is one of the RateLimiter service's unary calls.
type unaryRPC func(peerpb.RateLimiterClient, context.Context, *peerpb.AllowRequest, ...grpc.CallOption) (*peerpb.AllowResponse, error)

// unary sends req (and lease, for Release) as one unary call to the key's
// holder. Unlike Allow it never tries another member: a unary call that
// failed may have reached the node, and a refund or a lease must not be
// decided twice. A member that does not hold the key forwards it.
func (c *Client) unary(ctx context.Context, req Request, lease uint64, call unaryRPC) (*peerpb.AllowResponse, error) {
	t, at, err := c.route(req)
	if err != nil {
		return nil, err
	}
	ctx, cancel := c.bound(ctx)
	defer cancel()
	tm, m, err := c.pick(t, at)
	if err != nil {
		return nil, err
	}
	k := req.Key
	resp, err := call(m.stub, ctx, &peerpb.AllowRequest{Key: &peerpb.Key{Tenant: k.Tenant, Subject: k.Subject, Policy: k.Policy},
		Hits: req.Hits, Policies: req.Policies, LeaseId: lease})
	if err != nil {
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			// The deadline travels with the call, and the node may act on
			// it (a cancelled stream) before ctx's own timer fires, which
			// is due now: wait for it so the error says why.
			<-ctx.Done()
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrUnavailable, tm.addr, ctxErr(ctx))
		}
		if c := status.Code(err); c == codes.Unauthenticated || c == codes.PermissionDenied {
			// A refused reset: the node decided, and said no. Not
			// unavailability, which a caller would retry.
			return nil, err
		}
		return nil, FromStatus(err)
	}
	if resp.GetOwner() != tm.name {
		c.kickRefresh()
	}
	return resp, nil
}

// member returns the connection to the member at addr, creating it.
func (c *Client) member(addr string) (*clientConn, error) {
	c.mu.RLock()
	m, closed := c.members[addr], c.closed
	c.mu.RUnlock()
	if m != nil {
		return m, nil
	}
	if closed {
		return nil, ErrClosed
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if m := c.members[addr]; m != nil {
		return m, nil
	}
	conn, err := grpc.NewClient(addr, c.cfg.DialOptions...)
	if err != nil {
		return nil, fmt.Errorf("peer: client for %s: %w", addr, err)
	}
	m = &clientConn{c: c, addr: addr, conn: conn, stub: peerpb.NewRateLimiterClient(conn),
		queue: make(chan *clientCall, queueLen), quit: make(chan struct{}), stopped: make(chan struct{})}
	c.members[addr] = m
	c.wg.Add(1)
	go m.sendLoop()
	return m, nil
}

// pick returns the member at index at of t, or when its connection has
// failed (see clientConn.down) the next one whose has not, which forwards
// what it does not hold; the member at at when every one has failed.
func (c *Client) pick(t *clientTable, at int) (tableMember, *clientConn, error) {
	for try := range len(t.members) {
		tm := t.members[(at+try)%len(t.members)]
		m, err := c.member(tm.addr)
		if err != nil {
			return tableMember{}, nil, err
		}
		if !m.down() {
			return tm, m, nil
		}
	}
	tm := t.members[at]
	m, err := c.member(tm.addr)
	return tm, m, err
}

// route checks req before anything is sent and returns the table and the
// index in it of the key's holder.
func (c *Client) route(req Request) (*clientTable, int, error) {
	if c.ctx.Err() != nil {
		return nil, 0, ErrClosed
	}
	if req.Hits < 0 {
		return nil, 0, fmt.Errorf("%w: hits %d must be at least 1", ErrInvalidHits, req.Hits)
	}
	k := req.Key
	if len(req.Policies) > 0 && k.Policy == "" {
		k.Policy = req.Policies[0] // placement ignores the policy; validate the rest
	}
	var buf [shard.MaxEncodedKeyLen]byte
	pb, ok := k.AppendPlacement(buf[:0])
	if !ok {
		return nil, 0, fmt.Errorf("%w: %w", ErrInvalidKey, k.Validate())
	}
	t := c.table.Load()
	return t, int(t.holders[xxhash.Sum64(pb)%t.count]), nil
}

// defaultDecisionTimeout is ClientConfig.DecisionTimeout's zero value:
// twice a node's default ForwardTimeout (see DecisionTimeout's doc).
const defaultDecisionTimeout = 2 * defaultForwardTimeout

// bound gives a ctx without a deadline the client's DecisionTimeout, whose
// cause names it (see ctxErr). A call must never block: through a takeover
// the node the request reached answers within its ForwardTimeout (with the
// policy's failure choice), and the client waits a little longer than
// that, no more.
func (c *Client) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	// One timer per call without a deadline: the price of never blocking.
	return context.WithTimeoutCause(ctx, c.cfg.DecisionTimeout, c.timedOut)
}

// ctxErr is why ctx ended, for a call's error: ctx's cause, which is
// c.timedOut when DecisionTimeout ran out (it wraps
// context.DeadlineExceeded), else ctx.Err().
func ctxErr(ctx context.Context) error {
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return ctx.Err()
}

// Placement returns the client's current table as (partition → holder
// name) and the ring version of the member that answered it, for
// diagnostics and tests.
func (c *Client) Placement() (holders []string, version uint64) {
	t := c.table.Load()
	holders = make([]string, len(t.holders))
	for i, h := range t.holders {
		holders[i] = t.members[h].name
	}
	return holders, t.version
}

// kickRefresh asks the refresher to read the table now.
func (c *Client) kickRefresh() {
	select {
	case c.refresh <- struct{}{}:
	default:
	}
}

// refreshLoop reads the table when asked and every RefreshInterval, and
// stops the connections to members that left.
func (c *Client) refreshLoop() {
	defer c.wg.Done()
	tick := time.NewTicker(c.cfg.RefreshInterval)
	defer tick.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-tick.C:
		case <-c.refresh:
		}
		old := c.table.Load()
		addrs := make([]string, 0, len(old.members)+len(c.cfg.Addrs))
		for _, m := range old.members {
			addrs = append(addrs, m.addr)
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.cfg.Timeout)
		t, err := c.readTable(ctx, append(addrs, c.cfg.Addrs...))
		cancel()
		if err != nil {
			continue // keep the old table; the next tick tries again
		}
		c.table.Store(t)
		keep := make(map[string]bool, len(t.members))
		for _, m := range t.members {
			keep[m.addr] = true
		}
		c.mu.Lock()
		var gone []*clientConn
		for addr, m := range c.members {
			if !keep[addr] {
				gone = append(gone, m)
				delete(c.members, addr)
			}
		}
		c.mu.Unlock()
		for _, m := range gone {
			m.stop()
		}
	}
}

// readTable reads a placement table from the first of addrs that answers
// with a valid one, asking the members whose connection has failed last.
func (c *Client) readTable(ctx context.Context, addrs []string) (*clientTable, error) {
	var errs []error
	seen := map[string]bool{}
	var up, down []*clientConn
	for _, addr := range addrs {
		if seen[addr] {
			continue
		}
		seen[addr] = true
		m, err := c.member(addr)
		if err != nil {
			return nil, err
		}
		if m.down() {
			down = append(down, m)
		} else {
			up = append(up, m)
		}
	}
	for _, m := range append(up, down...) {
		addr := m.addr
		resp, err := m.stub.Placement(ctx, &peerpb.PlacementRequest{})
		if err == nil {
			var t *clientTable
			if t, err = tableFromWire(resp); err == nil {
				return t, nil
			}
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("%w: no member answered with a placement table: %w", ErrUnavailable, errors.Join(errs...))
}

// tableFromWire checks a PlacementResponse and converts it.
func tableFromWire(resp *peerpb.PlacementResponse) (*clientTable, error) {
	n := resp.GetPartitionCount()
	if n == 0 || len(resp.GetHolders()) != int(n) || len(resp.GetMembers()) == 0 {
		return nil, fmt.Errorf("malformed placement: %d partitions, %d holders, %d members", n, len(resp.GetHolders()), len(resp.GetMembers()))
	}
	t := &clientTable{node: resp.GetNode(), version: resp.GetRingVersion(), count: uint64(n), holders: resp.GetHolders()}
	for _, m := range resp.GetMembers() {
		t.members = append(t.members, tableMember{name: m.GetName(), addr: m.GetAddr()})
	}
	for p, h := range t.holders {
		if int(h) >= len(t.members) {
			return nil, fmt.Errorf("malformed placement: partition %d names member %d of %d", p, h, len(t.members))
		}
	}
	return t, nil
}
