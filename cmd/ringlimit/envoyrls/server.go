package envoyrls

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/peer/httplimit"
)

// maxDescriptors bounds one request's descriptors (Envoy sends one per
// matching rate_limits action: a handful).
const maxDescriptors = 256

// maxMulti is peer.Request.Policies' limit.
const maxMulti = 16

// Limiter is what the service needs from a node; *peer.Node has it.
type Limiter interface {
	Allow(ctx context.Context, req peer.Request) (peer.Decision, error)
	Peek(ctx context.Context, req peer.Request) (peer.Decision, error)
	Refund(ctx context.Context, req peer.Request) (peer.Decision, error)
}

// Server implements RateLimitService on a Limiter with a Table. It is safe
// for concurrent use and starts no goroutine of its own beyond one per
// group of descriptors while a call runs. It is a prometheus.Collector of
// its unknown-domain counter (unknown.go): register it on the caller's
// registry.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	l   Limiter
	t   atomic.Pointer[Table] // replaced whole by SetTable
	log *slog.Logger
	// authorizeRefund, when not nil, is asked before a request with a
	// negative-hits descriptor is decided (GuardRefunds).
	authorizeRefund func(ctx context.Context) error
	// unknown counts requests for a domain the table lacks, by answer
	// (unknown.go); lastUnknownLog throttles their Warn to one a second.
	unknown        [len(unknownDomainNames)]atomic.Uint64
	lastUnknownLog atomic.Int64
	unknownDesc    *prometheus.Desc
}

// New returns a server deciding with l by table t; log may be nil
// (discard).
func New(l Limiter, t *Table, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{l: l, log: log, unknownDesc: newUnknownDesc()}
	s.t.Store(t)
	return s
}

// GuardRefunds makes every request with an is_negative_hits descriptor
// ask authorize first: a non-nil error (a gRPC status, such as
// Unauthenticated) is the request's answer, and nothing of it is
// decided. Nil lets anyone refund. Call it before the server serves.
func (s *Server) GuardRefunds(authorize func(ctx context.Context) error) {
	s.authorizeRefund = authorize
}

// SetTable replaces the table for every call that starts afterwards (a
// policy reload); calls in progress finish with the old one.
func (s *Server) SetTable(t *Table) { s.t.Store(t) }

// Register registers the service on s.
func (s *Server) Register(r grpc.ServiceRegistrar) {
	rlsv3.RegisterRateLimitServiceServer(r, s)
}

// item is one limited descriptor of a request.
type item struct {
	idx     int
	n       *node
	subject string
	hits    int64
	st      *statusBlock // where its status is built
}

// statusBlock is one limited descriptor's status together with the
// messages it points to, so that a request's statuses are one allocation
// instead of three or four each.
type statusBlock struct {
	st   rlsv3.RateLimitResponse_DescriptorStatus
	cl   rlsv3.RateLimitResponse_RateLimit
	mult wrapperspb.UInt32Value
	dur  durationpb.Duration
}

// ShouldRateLimit decides a request as the package doc describes.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	descs := req.GetDescriptors()
	if len(descs) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	if len(descs) > maxDescriptors {
		return nil, status.Errorf(codes.InvalidArgument, "%d descriptors: at most %d", len(descs), maxDescriptors)
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(descs))}
	t := s.t.Load()
	dt := t.domains[req.GetDomain()]
	if dt == nil {
		// Answered as the table says (UnknownDomain), counted and
		// logged: envoyproxy/ratelimit's silent OK let a typo turn
		// limiting off unseen.
		return s.unknownDomain(t, req.GetDomain(), resp)
	}
	// A request has a handful of descriptors: their items stay on the
	// stack unless there are more.
	var refundBuf, allowBuf [4]item
	refunds, allows := refundBuf[:0], allowBuf[:0]
	for i, d := range descs {
		entries := d.GetEntries()
		if len(entries) == 0 {
			continue
		}
		n := dt.match(entries)
		if n == nil || n.limit == nil {
			continue // unmatched or unlimited: OK, no limit
		}
		hits := uint64(req.GetHitsAddend())
		if d.GetHitsAddend() != nil {
			hits = d.GetHitsAddend().GetValue()
		}
		it := item{idx: i, n: n, subject: subject(entries), hits: int64(min(max(hits, 1), math.MaxInt64))}
		if d.GetIsNegativeHits() {
			refunds = append(refunds, it)
		} else {
			allows = append(allows, it)
		}
	}
	if len(refunds) > 0 && s.authorizeRefund != nil {
		// Before anything is decided: a refused request changes nothing.
		if err := s.authorizeRefund(ctx); err != nil {
			return nil, err
		}
	}
	// The limited descriptors' statuses, built by allow and refund; the
	// others are OK without a limit (okStatuses, below).
	blocks := make([]statusBlock, len(refunds)+len(allows))
	for i := range refunds {
		refunds[i].st = &blocks[i]
	}
	for i := range allows {
		allows[i].st = &blocks[len(refunds)+i]
	}

	var err error
	switch {
	case len(refunds) == 0 && len(allows) == 1:
		// The common request, one limited descriptor: one call on this
		// goroutine, no groups.
		err = s.allow(ctx, dt, allows, resp.Statuses)
	case len(refunds) > 0 || len(allows) > 0:
		err = s.decideAll(ctx, dt, refunds, allows, resp.Statuses)
	}
	if err != nil {
		return nil, s.grpcError(err)
	}
	okStatuses(resp.Statuses)
	for _, st := range resp.Statuses {
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
	if dt.headers {
		resp.ResponseHeadersToAdd = headers(resp.Statuses)
	}
	return resp, nil
}

// decideAll gives back each of refunds and decides each atomic group of
// allows, filling their statuses; concurrently when there is more than
// one call to make.
func (s *Server) decideAll(ctx context.Context, dt *domainTable, refunds, allows []item, sts []*rlsv3.RateLimitResponse_DescriptorStatus) error {
	gs := groups(allows)
	switch {
	case len(refunds) == 0 && len(gs) == 1:
		return s.allow(ctx, dt, gs[0], sts)
	case len(refunds) == 1 && len(gs) == 0:
		return s.refund(ctx, dt, refunds[0], sts)
	}
	errs := make([]error, len(refunds)+len(gs))
	var wg sync.WaitGroup
	for i, it := range refunds {
		wg.Go(func() { errs[i] = s.refund(ctx, dt, it, sts) })
	}
	nr := len(refunds) // not refunds in the closure: it would escape
	for i, g := range gs {
		wg.Go(func() { errs[nr+i] = s.allow(ctx, dt, g, sts) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// okStatuses fills the nil entries of sts with OK statuses without a
// limit, allocated together.
func okStatuses(sts []*rlsv3.RateLimitResponse_DescriptorStatus) {
	n := 0
	for _, st := range sts {
		if st == nil {
			n++
		}
	}
	if n == 0 {
		return
	}
	oks := make([]rlsv3.RateLimitResponse_DescriptorStatus, n)
	for i := range sts {
		if sts[i] == nil {
			oks[0].Code = rlsv3.RateLimitResponse_OK
			sts[i], oks = &oks[0], oks[1:]
		}
	}
}

// groups splits items into atomic groups: same subject, cost and shadow
// mode, distinct policies, at most maxMulti each; in request order.
func groups(items []item) [][]item {
	type gk struct {
		subject string
		hits    int64
		shadow  bool
	}
	var out [][]item
	open := map[gk]int{} // the group still accepting items of gk
	for _, it := range items {
		k := gk{it.subject, it.hits, it.n.shadow}
		if gi, ok := open[k]; ok && len(out[gi]) < maxMulti && !hasPolicy(out[gi], it.n.policy) {
			out[gi] = append(out[gi], it)
			continue
		}
		open[k] = len(out)
		out = append(out, []item{it})
	}
	return out
}

func hasPolicy(g []item, policy string) bool {
	for _, it := range g {
		if it.n.policy == policy {
			return true
		}
	}
	return false
}

// allow decides one atomic group and fills its statuses.
func (s *Server) allow(ctx context.Context, dt *domainTable, g []item, sts []*rlsv3.RateLimitResponse_DescriptorStatus) error {
	req := peer.Request{Key: peer.Key{Tenant: dt.tenant, Subject: g[0].subject}, Hits: g[0].hits}
	oversize := false
	for _, it := range g {
		oversize = oversize || it.hits > it.n.limit.Requests
	}
	if oversize {
		// A cost above a limit can never fit: the group is refused
		// without recording; report each key's state as it is.
		req.Hits = 1
	}
	if len(g) == 1 {
		req.Key.Policy = g[0].n.policy
	} else {
		req.Policies = make([]string, len(g))
		for j, it := range g {
			req.Policies[j] = it.n.policy
		}
	}
	var d peer.Decision
	var err error
	if oversize {
		d, err = s.l.Peek(ctx, req)
	} else {
		d, err = s.l.Allow(ctx, req)
	}
	if err != nil {
		return err
	}
	for j, it := range g {
		pd := peer.PolicyDecision{Policy: it.n.policy, Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining, RetryAfter: d.RetryAfter, ResetAfter: d.ResetAfter}
		if len(d.Limits) == len(g) {
			pd = d.Limits[j]
		}
		if oversize {
			pd.Allowed = it.hits <= it.n.limit.Requests
		}
		sts[it.idx] = it.status(pd)
	}
	return nil
}

// refund gives back one descriptor's hits and fills its status.
func (s *Server) refund(ctx context.Context, dt *domainTable, it item, sts []*rlsv3.RateLimitResponse_DescriptorStatus) error {
	// Giving back more than the limit is giving back everything.
	hits := min(it.hits, it.n.limit.Requests)
	d, err := s.l.Refund(ctx, peer.Request{Key: peer.Key{Tenant: dt.tenant, Subject: it.subject, Policy: it.n.policy}, Hits: hits})
	if err != nil {
		return err
	}
	sts[it.idx] = it.status(peer.PolicyDecision{Policy: it.n.policy, Allowed: true, Limit: d.Limit, Remaining: d.Remaining, ResetAfter: d.ResetAfter})
	return nil
}

// status builds the item's status for pd in its block.
func (it item) status(pd peer.PolicyDecision) *rlsv3.RateLimitResponse_DescriptorStatus {
	b, n := it.st, it.n
	st := &b.st
	st.Code = rlsv3.RateLimitResponse_OK
	st.CurrentLimit = currentLimit(&b.cl, &b.mult, n.policy, *n.limit)
	st.LimitRemaining = uint32(min(max(pd.Remaining, 0), math.MaxUint32))
	reset := pd.ResetAfter
	if !pd.Allowed && !n.shadow {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		reset = pd.RetryAfter
	}
	// As durationpb.New.
	reset = max(reset, 0)
	b.dur.Seconds, b.dur.Nanos = int64(reset/time.Second), int32(reset%time.Second)
	st.DurationUntilReset = &b.dur
	return st
}

// CurrentLimit describes l as Envoy's RateLimit: requests_per_unit =
// Requests, and the window as unit × unit_multiplier with the largest of
// day, hour, minute and second that divides it exactly (1m30s is SECOND ×
// 90, 2h is HOUR × 2). A window that is not a whole number of seconds is
// reported as SECOND × its seconds rounded up (500ms is SECOND × 1):
// Envoy has no smaller unit. unit_multiplier is omitted when it is 1.
func CurrentLimit(name string, l Limit) *rlsv3.RateLimitResponse_RateLimit {
	return currentLimit(&rlsv3.RateLimitResponse_RateLimit{}, &wrapperspb.UInt32Value{}, name, l)
}

// currentLimit is CurrentLimit written into rl, with its multiplier (if
// any) in mult; both zero on entry.
func currentLimit(rl *rlsv3.RateLimitResponse_RateLimit, mult *wrapperspb.UInt32Value, name string, l Limit) *rlsv3.RateLimitResponse_RateLimit {
	rl.Name, rl.RequestsPerUnit = name, uint32(min(l.Requests, math.MaxUint32))
	m := int64(0)
	for _, u := range [...]struct {
		d    time.Duration
		unit rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
		{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
		{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
	} {
		if l.Window%u.d == 0 {
			rl.Unit, m = u.unit, int64(l.Window/u.d)
			break
		}
	}
	if m == 0 {
		rl.Unit, m = rlsv3.RateLimitResponse_RateLimit_SECOND, int64((l.Window+time.Second-1)/time.Second)
	}
	if m != 1 {
		mult.Value = uint32(min(m, math.MaxUint32))
		rl.UnitMultiplier = mult
	}
	return rl
}

// grpcError maps an error from the node to a gRPC status: Unavailable when
// the limiter could not decide (Envoy's failure_mode_deny then applies),
// Canceled or DeadlineExceeded for the caller's context, Internal
// otherwise (a generated key or policy the node refused: a bug).
func (s *Server) grpcError(err error) error {
	switch {
	case errors.Is(err, peer.ErrCapacity):
		s.log.Debug("envoy rls at capacity", "err", err)
		return status.Error(codes.ResourceExhausted, "ringlimit: key capacity reached: the key's holder refuses new keys (serve --max-keys)")
	case errors.Is(err, peer.ErrUnavailable), errors.Is(err, peer.ErrClosed):
		s.log.Debug("envoy rls unavailable", "err", err)
		return status.Error(codes.Unavailable, "ringlimit: rate limiter unavailable: could not get a decision from the key's owner")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, "ringlimit: request canceled")
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, "ringlimit: deadline exceeded")
	default:
		s.log.Error("envoy rls failed", "err", err)
		return status.Error(codes.Internal, "ringlimit: internal error")
	}
}

// headers builds RateLimit-Policy and RateLimit for the limited
// descriptors, one item each, in request order.
func headers(sts []*rlsv3.RateLimitResponse_DescriptorStatus) []*corev3.HeaderValue {
	var pols, states []string
	for _, st := range sts {
		cl := st.GetCurrentLimit()
		if cl == nil {
			continue
		}
		h := http.Header{}
		window := unitDuration(cl)
		d := peer.Decision{Allowed: st.Code == rlsv3.RateLimitResponse_OK, Limit: int64(cl.RequestsPerUnit), Remaining: int64(st.LimitRemaining)}
		if d.Allowed {
			d.ResetAfter = st.GetDurationUntilReset().AsDuration()
		} else {
			d.RetryAfter = st.GetDurationUntilReset().AsDuration()
			d.ResetAfter = d.RetryAfter
		}
		httplimit.RateLimitHeaders(h, cl.Name, peer.PolicyConfig{Limit: int64(cl.RequestsPerUnit), Window: window}, d)
		pols = append(pols, h.Get("RateLimit-Policy"))
		states = append(states, h.Get("RateLimit"))
	}
	if len(pols) == 0 {
		return nil
	}
	return []*corev3.HeaderValue{
		{Key: "RateLimit-Policy", Value: strings.Join(pols, ", ")},
		{Key: "RateLimit", Value: strings.Join(states, ", ")},
	}
}

// unitDuration is the window a RateLimit describes.
func unitDuration(cl *rlsv3.RateLimitResponse_RateLimit) time.Duration {
	var u time.Duration
	switch cl.Unit {
	case rlsv3.RateLimitResponse_RateLimit_DAY:
		u = 24 * time.Hour
	case rlsv3.RateLimitResponse_RateLimit_HOUR:
		u = time.Hour
	case rlsv3.RateLimitResponse_RateLimit_MINUTE:
		u = time.Minute
	default:
		u = time.Second
	}
	m := time.Duration(1)
	if cl.UnitMultiplier != nil {
		m = time.Duration(cl.UnitMultiplier.GetValue())
	}
	return u * m
}
