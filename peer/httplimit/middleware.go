package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ringlimit/ringlimit/peer"
)

// KeyFunc derives the quota key of a request from its AUTHENTICATED identity
// (a verified session, token or client certificate), never from a header or
// parameter the client chose alone: otherwise a client picks a fresh key per
// request and is never limited. Key.Policy names an entry of the node's
// policy table.
//
// ok == false means the request is not limited by this middleware: it is
// passed to the next handler untouched, with no RateLimit headers. Use it for
// routes the policy does not cover; note that an unauthenticated request for
// which KeyFunc returns false is NOT limited, so put authentication in front
// or limit anonymous traffic with its own key (for example the client
// address under an "anonymous" tenant).
//
// An invalid key (empty part, too long, bytes outside visible ASCII) is
// answered 400 with a JSON error naming the bad part: build Tenant and
// Subject from raw identities (an email, a UTF-8 name, an address) with
// shard.KeyPart, which maps any string to a valid part. An unknown policy is
// a server misconfiguration, answered 500.
type KeyFunc func(r *http.Request) (key peer.Key, ok bool)

// Limiter is what Middleware needs from a limiter. *peer.Node implements it.
type Limiter interface {
	// Allow decides one request, as peer.Node.Allow.
	Allow(ctx context.Context, req peer.Request) (peer.Decision, error)
	// Policies returns the policy table, as peer.Node.Policies.
	Policies() map[string]peer.PolicyConfig
}

// policyLooker is a Limiter whose table can change (as *peer.Node's, by
// SetPolicies): the middleware looks each request's policy up in it.
type policyLooker interface {
	Policy(name string) (peer.PolicyConfig, bool)
}

// MiddlewareConfig configures Middleware.
type MiddlewareConfig struct {
	// Limiter decides; usually the embedded *peer.Node. Required.
	Limiter Limiter
	// Key derives the quota key from the authenticated request. Required.
	Key KeyFunc
	// Hits returns the request's cost in units. Nil means 1 for every
	// request; a result outside 1..limit is a server bug, answered 500
	// (zero is taken as 1, as by peer.Node.Allow).
	Hits func(r *http.Request) int64
	// OnError writes the response when the key is invalid or the limiter
	// returns an error (the request is never passed on). For an unavailable
	// or closed limiter the middleware has already set Retry-After,
	// RateLimit-Policy and RateLimit-Reason when OnError is called; OnError
	// may replace them. Nil means the middleware's own answer, which is
	// DefaultOnError's plus the policy, its limit and retry_after_seconds in
	// the 503 body.
	OnError func(w http.ResponseWriter, r *http.Request, err error)
	// SettleAfter makes the cost known only after next has served the
	// request (an LLM call's tokens): the middleware reserves Hits, the
	// estimate, before next (the Limiter must implement Reserver, as *peer.Node
	// does, and the policy be a sliding_log policy) and, when next
	// returns, settles the reservation with the cost next reported with
	// ReportCost. A handler that reports nothing (or panics first) is
	// charged the estimate: the reservation stays pending until it
	// expires, and nothing more is sent.
	SettleAfter bool
	// Logger receives a line for the requests the middleware answers with
	// an error: Warn for an invalid key (the bad part named, never its
	// value), Error for an unknown policy, invalid hits or any other
	// server-side failure, and Debug for unavailability (the node logs the
	// cause). Each kind is throttled to one line a second; the next line
	// of that kind carries "suppressed", the number held back meanwhile,
	// so a mistyped policy logs once a second, not once a request. It is
	// called on the request's goroutine. Nil means slog.Default() as it is
	// when Middleware is called (as peer.Config.Logger), so a
	// misconfiguration answered 500 is never silent; to discard, pass
	// slog.New(slog.DiscardHandler).
	Logger *slog.Logger
}

// Middleware limits next with the node's decisions. For each request it
// derives the key with cfg.Key and asks cfg.Limiter:
//
//   - admitted: RateLimit-Policy and RateLimit headers are set and next
//     serves the request;
//   - admitted without a normal decision (Reason failed_open, fallback or
//     shadow): as admitted, plus a RateLimit-Reason header naming the reason;
//   - refused (Allowed == false): 429 Too Many Requests with Retry-After (in
//     seconds, rounded up), the RateLimit headers and a JSON body
//     {"error":"rate limit exceeded","policy":...,"retry_after_seconds":...};
//     next is not called;
//   - invalid key (checked before the limiter is asked): 400 with
//     {"error":"invalid rate limit key: subject has byte 0xc3 at 3 outside
//     visible ASCII","reason":"invalid_key"}, logged at Warn;
//   - error: cfg.OnError (by default 503 for ErrUnavailable or ErrClosed,
//     never 429, with Retry-After (UnavailableRetryAfter, in seconds),
//     RateLimit-Policy and RateLimit-Reason: unavailable headers and a body
//     naming the policy, its limit and retry_after_seconds; 500 for
//     ErrUnknownPolicy, ErrInvalidHits and anything else, since policies and
//     costs come from server code).
//
// Requests for which cfg.Key returns ok == false pass through untouched.
// The RateLimit headers follow the IETF "RateLimit header fields for HTTP"
// draft (see RateLimitHeaders). If cfg.Limiter, cfg.Key or next is nil, the
// handler answers every request through OnError with an error wrapping
// ErrInvalidConfig (500 by default) rather than panicking.
//
// For a concurrency policy (Algorithm Concurrency) the middleware takes a
// lease instead (the Limiter must then implement Leaser, as *peer.Node does):
// admitted, next serves the request and the lease is released when next
// returns or panics; at the limit, 429 with {"error":"concurrency limit
// exceeded",...}; errors as above.
//
// The policy is looked up per request when the Limiter has a Policy(name)
// method (as *peer.Node has: its table can be replaced), else the table is read
// once, here. The returned handler is safe for concurrent use.
func Middleware(cfg MiddlewareConfig, next http.Handler) http.Handler {
	m := &middleware{cfg: cfg, next: next, log: cfg.Logger, now: time.Now}
	if m.log == nil {
		m.log = slog.Default()
	}
	var missing []string
	if cfg.Limiter == nil {
		missing = append(missing, "limiter")
	}
	if cfg.Key == nil {
		missing = append(missing, "key func")
	}
	if next == nil {
		missing = append(missing, "next handler")
	}
	if len(missing) > 0 {
		m.cfgErr = fmt.Errorf("%w: middleware without %s", peer.ErrInvalidConfig, strings.Join(missing, ", "))
		return m
	}
	if pl, ok := cfg.Limiter.(policyLooker); ok {
		m.lookup = pl
	} else {
		m.policies = cfg.Limiter.Policies()
	}
	return m
}

type middleware struct {
	cfg      MiddlewareConfig
	next     http.Handler
	lookup   policyLooker                 // per request, when the limiter has one
	policies map[string]peer.PolicyConfig // else read once
	log      *slog.Logger
	cfgErr   error
	// now is the throttle's clock (tests replace it); throttle holds, per
	// kind of failure line, when one was last logged and how many were
	// held back since.
	now      func() time.Time
	throttle [logKinds]struct{ last, held atomic.Int64 }
}

// The kinds of failure line Middleware throttles separately.
const (
	logUnavailable = iota
	logInvalidKey
	logUnknownPolicy
	logFailed
	logKinds
)

// logEvery is how often Middleware logs one kind of failure at most.
const logEvery = time.Second

// logThrottled logs msg at level unless a line of kind was logged less
// than logEvery ago; then it only counts it, and the next line of kind
// says how many were held back ("suppressed").
func (m *middleware) logThrottled(ctx context.Context, kind int, level slog.Level, msg string, args ...any) {
	if !m.log.Enabled(ctx, level) {
		return
	}
	t := &m.throttle[kind]
	now, last := m.now().UnixNano(), t.last.Load()
	if last != 0 && now-last < int64(logEvery) || !t.last.CompareAndSwap(last, now) {
		t.held.Add(1)
		return
	}
	if n := t.held.Swap(0); n > 0 {
		args = append(args, "suppressed", n)
	}
	m.log.Log(ctx, level, msg, args...)
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if m.cfgErr != nil {
		m.fail(w, r, peer.Key{}, m.cfgErr)
		return
	}
	key, ok := m.cfg.Key(r)
	if !ok {
		m.next.ServeHTTP(w, r)
		return
	}
	// Checked here rather than left to the limiter, whose error stacks the
	// peer and shard prefixes: the answer names the bad part once.
	if problem := key.Problem(); problem != "" {
		m.fail(w, r, key, &keyError{problem: problem})
		return
	}
	req := peer.Request{Key: key, Hits: 1}
	if m.cfg.Hits != nil {
		req.Hits = m.cfg.Hits(r)
	}
	if pc, ok := m.policy(key.Policy); ok && pc.Algorithm == peer.Concurrency {
		m.serveLeased(w, r, req, pc)
		return
	}
	if m.cfg.SettleAfter {
		m.serveReserved(w, r, req)
		return
	}
	d, err := m.cfg.Limiter.Allow(r.Context(), req)
	if err != nil {
		m.fail(w, r, key, err)
		return
	}
	pc, _ := m.policy(key.Policy)
	RateLimitHeaders(w.Header(), key.Policy, pc, d)
	if d.Allowed {
		m.next.ServeHTTP(w, r)
		return
	}
	writeJSON(w, http.StatusTooManyRequests, errorBody{
		Error:             "rate limit exceeded",
		Policy:            key.Policy,
		Reason:            d.Reason.String(),
		Limit:             d.Limit,
		RetryAfterSeconds: resetSeconds(pc, d),
	})
}

// Leaser is what Middleware needs from a limiter for a concurrency
// policy. *peer.Node implements it.
type Leaser interface {
	// Acquire takes a lease, as peer.Node.Acquire.
	Acquire(ctx context.Context, req peer.Request) (peer.Lease, error)
	// Release ends a lease, as peer.Node.Release.
	Release(ctx context.Context, key peer.Key, id uint64) (peer.Decision, error)
}

// serveLeased serves a request of a concurrency policy: it takes a lease
// before next and releases it when next returns, also when next panics
// (the release runs in a deferred call, before net/http's recovery). The
// release does not use the request's context, which ends with the
// request: a cancelled release would keep the lease until its TTL.
func (m *middleware) serveLeased(w http.ResponseWriter, r *http.Request, req peer.Request, pc peer.PolicyConfig) {
	key := req.Key
	lz, ok := m.cfg.Limiter.(Leaser)
	if !ok {
		m.fail(w, r, key, fmt.Errorf("%w: policy %q is a concurrency policy and the limiter has no Acquire", peer.ErrWrongAlgorithm, key.Policy))
		return
	}
	l, err := lz.Acquire(r.Context(), req)
	if err != nil {
		m.fail(w, r, key, err)
		return
	}
	RateLimitHeaders(w.Header(), key.Policy, pc, l.Decision)
	if !l.Allowed {
		writeJSON(w, http.StatusTooManyRequests, errorBody{
			Error:             "concurrency limit exceeded",
			Policy:            key.Policy,
			Reason:            l.Reason.String(),
			Limit:             l.Limit,
			RetryAfterSeconds: resetSeconds(pc, l.Decision),
		})
		return
	}
	defer func() {
		if _, err := lz.Release(context.WithoutCancel(r.Context()), key, l.ID); err != nil {
			m.log.DebugContext(r.Context(), "lease release failed; it expires after its ttl", "policy", key.Policy, "err", err)
		}
	}()
	m.next.ServeHTTP(w, r)
}

// Reserver is what Middleware needs from a limiter with SettleAfter.
// *peer.Node implements it.
type Reserver interface {
	// Reserve admits an estimate, as peer.Node.Reserve.
	Reserve(ctx context.Context, req peer.Request) (peer.Reservation, error)
	// Settle replaces it with the actual cost, as peer.Node.Settle.
	Settle(ctx context.Context, key peer.Key, id uint64, actual int64) (peer.Settlement, error)
}

// costKey is the context key of a request's reported cost (ReportCost).
type costKey struct{}

// reportedCost is where ReportCost writes; read once next has returned.
type reportedCost struct {
	units int64
	set   bool
}

// ReportCost tells a Middleware with SettleAfter what serving the
// request cost, in the policy's units (0 or more). Call it from the
// handler with the request's context; the last report counts. It does
// nothing for a request the middleware did not reserve for.
func ReportCost(ctx context.Context, units int64) {
	if c, ok := ctx.Value(costKey{}).(*reportedCost); ok {
		c.units, c.set = units, true
	}
}

// serveReserved serves a request whose cost is known only afterwards:
// reserve the estimate, serve, settle with the reported cost.
func (m *middleware) serveReserved(w http.ResponseWriter, r *http.Request, req peer.Request) {
	key := req.Key
	rz, ok := m.cfg.Limiter.(Reserver)
	if !ok {
		m.fail(w, r, key, fmt.Errorf("%w: SettleAfter and the limiter has no Reserve", peer.ErrInvalidConfig))
		return
	}
	res, err := rz.Reserve(r.Context(), req)
	if err != nil {
		m.fail(w, r, key, err)
		return
	}
	pc, _ := m.policy(key.Policy)
	RateLimitHeaders(w.Header(), key.Policy, pc, res.Decision)
	if !res.Allowed {
		writeJSON(w, http.StatusTooManyRequests, errorBody{
			Error:             "rate limit exceeded",
			Policy:            key.Policy,
			Reason:            res.Reason.String(),
			Limit:             res.Limit,
			RetryAfterSeconds: resetSeconds(pc, res.Decision),
		})
		return
	}
	cost := &reportedCost{}
	m.next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), costKey{}, cost)))
	if !cost.set || res.ID == 0 {
		return // the estimate stands (or nothing was recorded: fail open, shadow)
	}
	// Not the request's context, which ends with the request: a cancelled
	// settlement would leave the estimate charged.
	if _, err := rz.Settle(context.WithoutCancel(r.Context()), key, res.ID, cost.units); err != nil {
		m.log.DebugContext(r.Context(), "settlement failed; the estimate stands until it expires", "policy", key.Policy, "err", err)
	}
}

// policy returns the limiter's current entry for name.
func (m *middleware) policy(name string) (peer.PolicyConfig, bool) {
	if m.lookup != nil {
		return m.lookup.Policy(name)
	}
	pc, ok := m.policies[name]
	return pc, ok
}

// fail logs err and answers it through OnError, or with the middleware's own
// body when OnError is nil.
func (m *middleware) fail(w http.ResponseWriter, r *http.Request, key peer.Key, err error) {
	status := ErrorStatus(err)
	ctx := r.Context()
	switch {
	case status == http.StatusServiceUnavailable:
		m.logThrottled(ctx, logUnavailable, slog.LevelDebug, "rate limiter unavailable", "policy", key.Policy, "err", err)
	case errors.Is(err, peer.ErrInvalidKey):
		var ke *keyError
		problem := "invalid key"
		if errors.As(err, &ke) {
			problem = ke.problem
		}
		// The key came from the embedder's KeyFunc: tell its author the fix.
		m.logThrottled(ctx, logInvalidKey, slog.LevelWarn, "invalid rate limit key", "problem", problem, "path", r.URL.Path,
			"hint", "build Tenant and Subject from raw identities with shard.KeyPart, which maps any string to a valid part")
	case errors.Is(err, peer.ErrUnknownPolicy):
		m.logThrottled(ctx, logUnknownPolicy, slog.LevelError, "unknown rate limit policy", "policy", key.Policy, "path", r.URL.Path)
	default:
		m.logThrottled(ctx, logFailed, slog.LevelError, "rate limit check failed", "policy", key.Policy, "path", r.URL.Path, "err", err)
	}
	// A 503 tells the client what a 429 would: when to retry and which
	// quota applies. The policy is unknown only if the node closed before
	// looking it up.
	pc, known := m.policy(key.Policy)
	pc = pc.For(key.Tenant, key.Subject)
	unavailable := status == http.StatusServiceUnavailable
	switch {
	case unavailable && known && pc.Limit > 0:
		UnavailableHeaders(w.Header(), key.Policy, pc)
	case unavailable:
		w.Header().Set("Retry-After", strconv.FormatInt(RetryAfterSeconds(UnavailableRetryAfter), 10))
	}
	if m.cfg.OnError != nil {
		m.cfg.OnError(w, r, err)
		return
	}
	body := errorBodyFor(err)
	if unavailable {
		body.RetryAfterSeconds = RetryAfterSeconds(UnavailableRetryAfter)
		if known {
			body.Policy, body.Limit = key.Policy, pc.Limit
		}
	}
	writeJSON(w, status, body)
}

// keyError is an invalid key found by the middleware: problem names the bad
// part in the user's terms (Key.Problem) and never holds its value, so it
// may be sent to the client.
type keyError struct{ problem string }

func (e *keyError) Error() string        { return peer.ErrInvalidKey.Error() + ": " + e.problem }
func (e *keyError) Is(target error) bool { return target == peer.ErrInvalidKey }

// UnavailableRetryAfter is the wait Middleware and the ringlimit server
// suggest when the limiter could not decide (Retry-After on a 503): about
// the time a forward to a live owner, or gossip's verdict on a dead one,
// takes to settle.
const UnavailableRetryAfter = time.Second

// UnavailableHeaders sets the header fields of a 503 answer for policy pc,
// named policy, when the limiter could not decide: Retry-After
// (UnavailableRetryAfter in seconds), RateLimit-Policy as RateLimitHeaders
// writes it with the policy's configured limit, and RateLimit-Reason:
// unavailable. RateLimit is removed: nothing is known of the key's state.
func UnavailableHeaders(h http.Header, policy string, pc peer.PolicyConfig) {
	h.Set("Retry-After", strconv.FormatInt(RetryAfterSeconds(UnavailableRetryAfter), 10))
	h.Set("RateLimit-Policy", policyField(policy, pc, pc.Limit))
	h.Del("RateLimit")
	h.Set("RateLimit-Reason", peer.ReasonUnavailable.String())
}

// policyField is the RateLimit-Policy value for policy pc with quota limit.
func policyField(policy string, pc peer.PolicyConfig, limit int64) string {
	var buf [128]byte
	return string(appendPolicyField(buf[:0], policy, pc, limit))
}

// appendPolicyField appends policyField's value to b.
func appendPolicyField(b []byte, policy string, pc peer.PolicyConfig, limit int64) []byte {
	b = appendSFString(b, policy)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, limit, 10)
	if pc.Window > 0 {
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, RetryAfterSeconds(pc.Window), 10)
	}
	return b
}

// The canonical forms of the RateLimit fields' names, which Header.Set
// and Header.Del would compute (and, since the draft's spelling is not
// canonical, allocate) on every call.
var (
	hdrRateLimitPolicy = textproto.CanonicalMIMEHeaderKey("RateLimit-Policy")
	hdrRateLimit       = textproto.CanonicalMIMEHeaderKey("RateLimit")
	hdrRateLimitReason = textproto.CanonicalMIMEHeaderKey("RateLimit-Reason")
)

// RateLimitHeaders sets the RateLimit header fields of the IETF draft
// "RateLimit header fields for HTTP" (draft-ietf-httpapi-ratelimit-headers)
// for decision d on policy pc, named policy:
//
//	RateLimit-Policy: "<policy>";q=<limit>;w=<window seconds>
//	RateLimit: "<policy>";r=<remaining>;t=<seconds>
//
// q is d.Limit (the reduced limit for a fallback decision), or pc.Limit when
// d.Limit is zero. w is pc.Window in seconds, rounded up, and omitted when
// pc.Window is zero. For an admitted request t is d.ResetAfter rounded up:
// the time until the whole quota is free again. For a refused one t is
// d.RetryAfter rounded up (at least 1), so a client that waits t seconds is
// not refused again for the same cost. t never exceeds w: the owner rounds
// admission times up to the policy's resolution, so a key's state can
// outlast the window by less than one resolution step (10.0004 s for a
// 10 s window), and that step is not reported as a whole extra second.
// For a refused decision Retry-After is set to the same t, so the two
// headers and the body agree. A failed-open decision carries no
// knowledge of the key's state, so RateLimit is omitted. For reasons other
// than admitted and over_limit, RateLimit-Reason names the reason
// (failed_open, fallback or shadow). The quota is the decision's Limit,
// which is an override's when one covers the key; a key an unlimited
// override covers gets only "RateLimit-Reason: unlimited". Existing values of these fields are
// replaced; Retry-After is left alone on an admitted decision.
func RateLimitHeaders(h http.Header, policy string, pc peer.PolicyConfig, d peer.Decision) {
	if d.Reason == peer.ReasonUnlimited {
		// No quota applies to the key: nothing to advertise.
		h.Del("RateLimit-Policy")
		h.Del("RateLimit")
		h.Set("RateLimit-Reason", d.Reason.String())
		return
	}
	limit := d.Limit
	if limit == 0 {
		limit = pc.Limit
	}
	// Each value is built in buf and copied out once; the fields are set
	// as Header.Set and Header.Del would, with their canonical names.
	var buf [128]byte
	h[hdrRateLimitPolicy] = []string{string(appendPolicyField(buf[:0], policy, pc, limit))}
	if d.Reason != peer.ReasonFailedOpen {
		t := resetSeconds(pc, d)
		b := appendSFString(buf[:0], policy)
		b = append(b, ";r="...)
		b = strconv.AppendInt(b, max(d.Remaining, 0), 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, t, 10)
		h[hdrRateLimit] = []string{string(b)}
		if !d.Allowed {
			h["Retry-After"] = []string{strconv.FormatInt(t, 10)}
		}
	} else {
		delete(h, hdrRateLimit)
	}
	switch d.Reason {
	case peer.ReasonFailedOpen, peer.ReasonFallback, peer.ReasonShadow:
		h[hdrRateLimitReason] = []string{d.Reason.String()}
	default:
		delete(h, hdrRateLimitReason)
	}
}

// resetSeconds is RateLimit's t for d (see RateLimitHeaders): ResetAfter
// when admitted, RetryAfter (at least 1) when refused, in seconds rounded
// up, and never more than the window in seconds.
func resetSeconds(pc peer.PolicyConfig, d peer.Decision) int64 {
	t := RetryAfterSeconds(d.ResetAfter)
	if !d.Allowed {
		t = max(RetryAfterSeconds(d.RetryAfter), 1)
	}
	if w := RetryAfterSeconds(pc.Window); w > 0 {
		t = min(t, w)
	}
	return t
}

// RetryAfterSeconds returns d in whole seconds, rounded up, so that waiting
// that long is never too short; zero or negative d gives 0.
func RetryAfterSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// ErrorStatus maps an error from peer.Node.Allow or Middleware to an HTTP status:
// 503 Service Unavailable for ErrUnavailable and ErrClosed (the limiter
// could not decide; never 429), 400 Bad Request for peer.ErrInvalidKey (the
// identity the key was built from cannot be a key part), 500 Internal
// Server Error for everything else, including ErrInvalidHits and
// ErrUnknownPolicy (costs and policy names come from server code, so those
// are server bugs).
func ErrorStatus(err error) int {
	switch {
	case errors.Is(err, peer.ErrUnavailable) || errors.Is(err, peer.ErrClosed):
		return http.StatusServiceUnavailable
	case errors.Is(err, peer.ErrInvalidKey):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// DefaultOnError writes ErrorStatus(err) with a JSON body
// {"error":...,"reason":...}. The body names the class of failure only:
// err's text, which may carry key parts or addresses, is not sent to the
// client, except for the bad part Middleware names in an invalid key
// ("invalid rate limit key: subject has byte 0xc3 at 3 outside visible
// ASCII"), which never quotes the part's value. A 503 carries Retry-After
// (UnavailableRetryAfter) unless the header is already set.
func DefaultOnError(w http.ResponseWriter, r *http.Request, err error) {
	status := ErrorStatus(err)
	if status == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "" {
		w.Header().Set("Retry-After", strconv.FormatInt(RetryAfterSeconds(UnavailableRetryAfter), 10))
	}
	writeJSON(w, status, errorBodyFor(err))
}

// errorBodyFor is DefaultOnError's body for err.
func errorBodyFor(err error) errorBody {
	var ke *keyError
	switch {
	case errors.Is(err, peer.ErrUnavailable):
		return errorBody{Error: "rate limiter unavailable", Reason: peer.ReasonUnavailable.String()}
	case errors.Is(err, peer.ErrClosed):
		return errorBody{Error: "rate limiter shutting down", Reason: peer.ReasonUnavailable.String()}
	case errors.As(err, &ke):
		return errorBody{Error: "invalid rate limit key: " + ke.problem, Reason: "invalid_key"}
	case errors.Is(err, peer.ErrInvalidKey):
		return errorBody{Error: "invalid rate limit key", Reason: "invalid_key"}
	}
	return errorBody{Error: "internal error", Reason: "internal"}
}

// errorBody is the JSON body of 429, 503 and 500 answers.
type errorBody struct {
	Error             string `json:"error"`
	Policy            string `json:"policy,omitempty"`
	Reason            string `json:"reason,omitempty"`
	Limit             int64  `json:"limit,omitempty"`
	RetryAfterSeconds int64  `json:"retry_after_seconds,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, body errorBody) {
	b, err := json.Marshal(body)
	if err != nil {
		// errorBody holds only strings and integers; Marshal cannot fail.
		b = []byte(`{"error":"internal error"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// appendSFString appends s quoted as a structured-field string (RFC 8941 §3.3.3):
// backslash and double quote are escaped; bytes outside printable ASCII,
// which validated policy names never hold, are replaced by '?'.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
