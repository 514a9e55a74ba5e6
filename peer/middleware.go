package peer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
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
// An invalid key (empty part, too long, bytes outside visible ASCII) or an
// unknown policy is a bug in server code, answered 500.
type KeyFunc func(r *http.Request) (key Key, ok bool)

// Limiter is what Middleware needs from a limiter. *Node implements it.
type Limiter interface {
	// Allow decides one request, as Node.Allow.
	Allow(ctx context.Context, req Request) (Decision, error)
	// Policies returns the policy table, as Node.Policies.
	Policies() map[string]PolicyConfig
}

// MiddlewareConfig configures Middleware.
type MiddlewareConfig struct {
	// Limiter decides; usually the embedded *Node. Required.
	Limiter Limiter
	// Key derives the quota key from the authenticated request. Required.
	Key KeyFunc
	// Hits returns the request's cost in units. Nil means 1 for every
	// request; a result outside 1..limit is a server bug, answered 500
	// (zero is taken as 1, as by Node.Allow).
	Hits func(r *http.Request) int64
	// OnError writes the response when the limiter returns an error (the
	// request is never passed on). Nil means DefaultOnError: 503 with a JSON
	// body when the limiter is unavailable or closed, 500 otherwise.
	OnError func(w http.ResponseWriter, r *http.Request, err error)
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
//   - error: cfg.OnError (by default 503 for ErrUnavailable or ErrClosed,
//     never 429, and 500 for ErrInvalidKey, ErrInvalidHits, ErrUnknownPolicy
//     and anything else, since the key comes from server code).
//
// Requests for which cfg.Key returns ok == false pass through untouched.
// The RateLimit headers follow the IETF "RateLimit header fields for HTTP"
// draft (see RateLimitHeaders). If cfg.Limiter, cfg.Key or next is nil, the
// handler answers every request through OnError with an error wrapping
// ErrInvalidConfig (500 by default) rather than panicking.
//
// The policy table is read once, here; the returned handler is safe for
// concurrent use.
func Middleware(cfg MiddlewareConfig, next http.Handler) http.Handler {
	m := &middleware{cfg: cfg, next: next}
	if m.cfg.OnError == nil {
		m.cfg.OnError = DefaultOnError
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
		m.cfgErr = fmt.Errorf("%w: middleware without %s", ErrInvalidConfig, strings.Join(missing, ", "))
		return m
	}
	m.policies = cfg.Limiter.Policies()
	return m
}

type middleware struct {
	cfg      MiddlewareConfig
	next     http.Handler
	policies map[string]PolicyConfig // read once: the table is fixed for a node's life
	cfgErr   error
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if m.cfgErr != nil {
		m.cfg.OnError(w, r, m.cfgErr)
		return
	}
	key, ok := m.cfg.Key(r)
	if !ok {
		m.next.ServeHTTP(w, r)
		return
	}
	req := Request{Key: key, Hits: 1}
	if m.cfg.Hits != nil {
		req.Hits = m.cfg.Hits(r)
	}
	d, err := m.cfg.Limiter.Allow(r.Context(), req)
	if err != nil {
		m.cfg.OnError(w, r, err)
		return
	}
	h := w.Header()
	RateLimitHeaders(h, key.Policy, m.policies[key.Policy], d)
	if d.Allowed {
		m.next.ServeHTTP(w, r)
		return
	}
	retry := max(RetryAfterSeconds(d.RetryAfter), 1)
	h.Set("Retry-After", strconv.FormatInt(retry, 10))
	writeJSON(w, http.StatusTooManyRequests, errorBody{
		Error:             "rate limit exceeded",
		Policy:            key.Policy,
		Reason:            d.Reason.String(),
		Limit:             d.Limit,
		RetryAfterSeconds: retry,
	})
}

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
// not refused again for the same cost. A failed-open decision carries no
// knowledge of the key's state, so RateLimit is omitted. For reasons other
// than admitted and over_limit, RateLimit-Reason names the reason
// (failed_open, fallback or shadow). Existing values of these fields are
// replaced. Retry-After is the caller's choice (Middleware sets it on 429).
func RateLimitHeaders(h http.Header, policy string, pc PolicyConfig, d Decision) {
	name := sfString(policy)
	limit := d.Limit
	if limit == 0 {
		limit = pc.Limit
	}
	pv := name + ";q=" + strconv.FormatInt(limit, 10)
	if pc.Window > 0 {
		pv += ";w=" + strconv.FormatInt(RetryAfterSeconds(pc.Window), 10)
	}
	h.Set("RateLimit-Policy", pv)
	if d.Reason != ReasonFailedOpen {
		t := RetryAfterSeconds(d.ResetAfter)
		if !d.Allowed {
			t = max(RetryAfterSeconds(d.RetryAfter), 1)
		}
		h.Set("RateLimit", name+";r="+strconv.FormatInt(max(d.Remaining, 0), 10)+";t="+strconv.FormatInt(t, 10))
	} else {
		h.Del("RateLimit")
	}
	switch d.Reason {
	case ReasonFailedOpen, ReasonFallback, ReasonShadow:
		h.Set("RateLimit-Reason", d.Reason.String())
	default:
		h.Del("RateLimit-Reason")
	}
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

// ErrorStatus maps an error from Node.Allow to an HTTP status: 503 Service
// Unavailable for ErrUnavailable and ErrClosed (the limiter could not
// decide; never 429), 500 Internal Server Error for everything else,
// including ErrInvalidKey, ErrInvalidHits and ErrUnknownPolicy (keys and
// costs come from server code, so those are server bugs).
func ErrorStatus(err error) int {
	if errors.Is(err, ErrUnavailable) || errors.Is(err, ErrClosed) {
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// DefaultOnError writes ErrorStatus(err) with a JSON body
// {"error":...,"reason":...}. The body names the class of failure only:
// err's text, which may carry key parts or addresses, is not sent to the
// client.
func DefaultOnError(w http.ResponseWriter, r *http.Request, err error) {
	status := ErrorStatus(err)
	body := errorBody{Error: "internal error", Reason: "internal"}
	switch {
	case errors.Is(err, ErrUnavailable):
		body = errorBody{Error: "rate limiter unavailable", Reason: ReasonUnavailable.String()}
	case errors.Is(err, ErrClosed):
		body = errorBody{Error: "rate limiter shutting down", Reason: ReasonUnavailable.String()}
	}
	writeJSON(w, status, body)
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

// sfString quotes s as a structured-field string (RFC 8941 §3.3.3):
// backslash and double quote are escaped; bytes outside printable ASCII,
// which validated policy names never hold, are replaced by '?'.
func sfString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
