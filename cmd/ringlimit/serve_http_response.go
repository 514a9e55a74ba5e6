package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/peer/httplimit"
	"github.com/ringlimit/ringlimit/shard"
)

// checkResponse is the answer of /v1/check, /v1/peek, /v1/refund and
// /v1/reset (and check --json). Durations are in milliseconds, rounded up so
// that waiting them is never too short. For a multi-policy request the
// top-level fields describe the whole decision (the refusing policy, or the
// admitted one with the least remaining) and Limits has one entry per policy.
type checkResponse struct {
	Allowed      bool   `json:"allowed"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	ResetAfterMs int64  `json:"reset_after_ms"`
	Reason       string `json:"reason"`
	Owner        string `json:"owner,omitempty"`
	// DecidedAtUnixNs is the deciding node's clock when it decided, in
	// nanoseconds since the Unix epoch (0 when nothing decided, as for
	// failed_open). Above 2^53: parse it as a 64-bit integer.
	DecidedAtUnixNs int64           `json:"decided_at_unix_ns,omitempty"`
	RefusedBy       string          `json:"refused_by,omitempty"`
	Limits          []limitResponse `json:"limits,omitempty"`
	// LeaseID (/v1/acquire, when allowed) is the lease to pass to
	// /v1/release, as a decimal string (64-bit ids exceed a JSON number's
	// exact range); LeaseTTLMs is how long after decided_at_unix_ns it
	// expires unless released.
	LeaseID    string `json:"lease_id,omitempty"`
	LeaseTTLMs int64  `json:"lease_ttl_ms,omitempty"`
	// ReservationID (/v1/reserve, when allowed) is the reservation to
	// pass to /v1/settle, a decimal string; ReservationTTLMs is how long
	// after decided_at_unix_ns it stays pending (after that the estimate
	// stands and a settle changes nothing).
	ReservationID    string `json:"reservation_id,omitempty"`
	ReservationTTLMs int64  `json:"reservation_ttl_ms,omitempty"`
	// Estimate and Overage (/v1/settle) are the settled reservation's
	// estimate and the units of its actual cost beyond it, recorded
	// without admission (0 and 0 when nothing was pending).
	Estimate *int64 `json:"estimate,omitempty"`
	Overage  *int64 `json:"overage,omitempty"`
	Error    string `json:"error,omitempty"`
}

// limitResponse is one policy's part of a multi-policy decision.
type limitResponse struct {
	Policy       string `json:"policy"`
	Limit        int64  `json:"limit"`
	Remaining    int64  `json:"remaining"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	ResetAfterMs int64  `json:"reset_after_ms"`
	Allowed      bool   `json:"allowed"`
}

// reasonNothingToRefund is the reason of a refund that gave nothing back
// (the key held no admissions in its window): "allowed" is false and the
// body is the key's unchanged state. A refund that gave units back answers
// "refunded" with "allowed" true.
const reasonNothingToRefund = "nothing_to_refund"

// reasonNotPending is the reason of a settle that found no pending
// reservation under its id (settled already, expired, reset or never
// made): "allowed" is false and nothing changed, so a retried settle is
// harmless.
const reasonNotPending = "not_pending"

func responseFrom(d peer.Decision) checkResponse {
	r := checkResponse{
		Allowed: d.Allowed, Limit: d.Limit, Remaining: d.Remaining,
		RetryAfterMs: ceilMillis(d.RetryAfter), ResetAfterMs: ceilMillis(d.ResetAfter),
		Reason: d.Reason.String(), Owner: d.Owner, RefusedBy: d.RefusedBy,
	}
	if d.Reason == peer.ReasonRefunded && !d.Allowed {
		// peer reports it as ReasonRefunded with Allowed false; "refunded"
		// next to "allowed": false reads as a refused refund.
		r.Reason = reasonNothingToRefund
	}
	if !d.DecidedAt.IsZero() {
		r.DecidedAtUnixNs = d.DecidedAt.UnixNano()
	}
	for _, l := range d.Limits {
		r.Limits = append(r.Limits, limitResponse{Policy: l.Policy, Limit: l.Limit, Remaining: l.Remaining,
			RetryAfterMs: ceilMillis(l.RetryAfter), ResetAfterMs: ceilMillis(l.ResetAfter), Allowed: l.Allowed})
	}
	return r
}

// ceilMillis returns d in whole milliseconds, rounded up; 0 for d <= 0.
func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

type errorResponse struct {
	Error string `json:"error"`
}

// rateLimitHeaders sets the RateLimit header fields for decision d on b's
// policy or policies. Several policies are listed in one field each, in the
// request's order, as the IETF draft allows:
//
//	RateLimit-Policy: "per_second";q=10;w=1, "per_day";q=1000;w=86400
//	RateLimit: "per_second";r=9;t=1, "per_day";r=999;t=86400
//
// A refused check carries Retry-After from the refusing policy. Peek,
// refund and reset answers describe the key's state and never carry
// Retry-After (they are not refusals).
func (a *httpAPI) rateLimitHeaders(h http.Header, o op, b checkBody, d peer.Decision) {
	if o == opRefund || o == opReset || o == opRelease || o == opSettle {
		// Allowed reports whether anything was given back, not a refusal:
		// describe the state as an admitted decision would.
		d.Allowed = true
	}
	if len(b.Policies) == 0 {
		httplimit.RateLimitHeaders(h, b.Policy, a.policy(b.Policy), d)
	} else {
		a.multiHeaders(h, b.Policies, d)
	}
	if o != opCheck && o != opAcquire && o != opReserve {
		h.Del("Retry-After")
	}
}

// multiHeaders is rateLimitHeaders for a multi-policy decision.
func (a *httpAPI) multiHeaders(h http.Header, names []string, d peer.Decision) {
	var pols, states []string
	retry := ""
	if len(d.Limits) == 0 {
		// failed_open or fallback: no per-policy state is known; list the
		// configured quotas only.
		for _, name := range names {
			tmp := http.Header{}
			httplimit.UnavailableHeaders(tmp, name, a.policy(name))
			pols = append(pols, tmp.Get("RateLimit-Policy"))
		}
		if !d.Allowed {
			retry = fmt.Sprint(max(httplimit.RetryAfterSeconds(d.RetryAfter), 1))
		}
	}
	for _, l := range d.Limits {
		if l.Limit == 0 {
			// An unlimited override exempts the key from this policy:
			// no quota to advertise.
			continue
		}
		tmp := http.Header{}
		httplimit.RateLimitHeaders(tmp, l.Policy, a.policy(l.Policy), peer.Decision{
			Allowed: l.Allowed, Limit: l.Limit, Remaining: l.Remaining, RetryAfter: l.RetryAfter, ResetAfter: l.ResetAfter, Reason: d.Reason})
		pols = append(pols, tmp.Get("RateLimit-Policy"))
		states = append(states, tmp.Get("RateLimit"))
		if l.Policy == d.RefusedBy {
			retry = tmp.Get("Retry-After")
		}
	}
	if len(pols) > 0 {
		h.Set("RateLimit-Policy", strings.Join(pols, ", "))
	} else {
		h.Del("RateLimit-Policy")
	}
	if len(states) > 0 {
		h.Set("RateLimit", strings.Join(states, ", "))
	} else {
		h.Del("RateLimit")
	}
	if !d.Allowed && retry != "" {
		h.Set("Retry-After", retry)
	}
	switch d.Reason {
	case peer.ReasonFailedOpen, peer.ReasonFallback, peer.ReasonShadow:
		h.Set("RateLimit-Reason", d.Reason.String())
	default:
		h.Del("RateLimit-Reason")
	}
}

// allowError answers an error from the node for body b: 400 for bad input,
// in the client's terms and once (the error's own text stacks the peer and
// shard prefixes); 503 for unavailability, with the headers and body fields
// a 429 carries; 500 otherwise. It sets header fields in h and returns the
// status and body.
func (a *httpAPI) allowError(h http.Header, b checkBody, err error) (int, any) {
	names := b.Policies
	if names == nil {
		names = []string{b.Policy}
	}
	switch {
	case errors.Is(err, peer.ErrInvalidKey):
		msg := "invalid key"
		for _, name := range names {
			if p := (peer.Key{Tenant: b.Tenant, Subject: b.Subject, Policy: name}).Problem(); p != "" {
				msg += ": " + p
				break
			}
		}
		msg += fmt.Sprintf("; tenant, subject and policy must each be 1 to %d bytes of visible ASCII", shard.MaxKeyPartLen)
		msg += encodingHint(b.Tenant, b.Subject)
		return http.StatusBadRequest, errorResponse{Error: msg}
	case errors.Is(err, peer.ErrWrongAlgorithm):
		// A check that names a concurrency policy (among others or alone)
		// is the concurrency policy's mistake; an acquire or release names
		// one policy, of another kind.
		for _, name := range names {
			if a.policy(name).Algorithm != peer.Concurrency {
				continue
			}
			if len(names) > 1 {
				return http.StatusBadRequest, errorResponse{Error: fmt.Sprintf("policy %q is a concurrency policy: it cannot be part of a multi-policy check; take its lease with /v1/acquire (end it with /v1/release) and check the other policies without it", name)}
			}
			return http.StatusBadRequest, errorResponse{Error: fmt.Sprintf("policy %q is a concurrency policy: use /v1/acquire and /v1/release", name)}
		}
		return http.StatusBadRequest, errorResponse{Error: fmt.Sprintf("policy %q is %v: /v1/acquire and /v1/release need a concurrency policy", names[0], a.policy(names[0]).Algorithm)}
	case errors.Is(err, peer.ErrUnknownPolicy):
		unknown := names[0]
		for _, name := range names {
			if _, ok := a.pols.Policy(name); !ok {
				unknown = name
				break
			}
		}
		// The table's names are not listed: the decision API answers
		// callers it has not authenticated (issue 53 item 8).
		return http.StatusBadRequest, errorResponse{Error: fmt.Sprintf("unknown policy %q: not in this node's policy table", unknown)}
	case errors.Is(err, peer.ErrInvalidHits):
		if len(names) > 1 {
			for _, name := range names {
				if lim := a.policy(name).For(b.Tenant, b.Subject).Limit; b.Hits > lim && lim > 0 {
					return http.StatusBadRequest, errorResponse{Error: fmt.Sprintf("invalid hits %d: above policy %q's limit %d; a multi-policy check must fit every policy", b.Hits, name, lim)}
				}
			}
		}
		return http.StatusBadRequest, errorResponse{Error: fmt.Sprintf("invalid hits %d: must be between 1 and the policy's limit %d (leave hits out to mean 1)", b.Hits, a.policy(names[0]).For(b.Tenant, b.Subject).Limit)}
	case errors.Is(err, peer.ErrUnavailable), errors.Is(err, peer.ErrClosed):
		// Unavailable is never 429: the limiter could not decide. The
		// cause (addresses, refused connections) stays in the node's own
		// logs; the text claims a timeout only when there was one.
		msg := "rate limiter unavailable: could not get a decision from the key's owner"
		reason := peer.ReasonUnavailable
		switch {
		case errors.Is(err, peer.ErrClosed):
			msg = "rate limiter unavailable: node is shutting down"
		case errors.Is(err, peer.ErrCapacity):
			// Not over limit, and not a failure to reach the owner: the
			// owner holds its most keys (--max-keys) and refuses new ones.
			msg = "rate limiter at capacity: the key's holder holds its most keys (serve --max-keys) and refuses new ones; keys it holds are still decided"
			reason = peer.ReasonCapacity
		case errors.Is(err, context.DeadlineExceeded):
			msg = "rate limiter unavailable: the key's owner could not decide in time"
		}
		a.log.Debug("check unavailable", "policy", strings.Join(names, ","), "err", err)
		body := checkResponse{Reason: reason.String(), Error: msg,
			RetryAfterMs: httplimit.UnavailableRetryAfter.Milliseconds()}
		var pols []string
		for _, name := range names {
			pc, known := a.pols.Policy(name)
			pc = pc.For(b.Tenant, b.Subject)
			if !known || pc.Limit == 0 {
				continue // unknown, or exempt by an unlimited override
			}
			tmp := http.Header{}
			httplimit.UnavailableHeaders(tmp, name, pc)
			pols = append(pols, tmp.Get("RateLimit-Policy"))
			if len(names) > 1 {
				body.Limits = append(body.Limits, limitResponse{Policy: name, Limit: pc.Limit})
			} else {
				body.Limit = pc.Limit
			}
		}
		h.Set("Retry-After", fmt.Sprint(httplimit.RetryAfterSeconds(httplimit.UnavailableRetryAfter)))
		h.Del("RateLimit")
		if len(pols) > 0 {
			h.Set("RateLimit-Policy", strings.Join(pols, ", "))
			h.Set("RateLimit-Reason", reason.String())
		}
		return http.StatusServiceUnavailable, body
	default:
		a.log.Error("check failed", "policy", strings.Join(names, ","), "err", err)
		return http.StatusInternalServerError, errorResponse{Error: "internal error"}
	}
}

// encodingHint says how to send a tenant or subject that is not visible
// ASCII (a UTF-8 name, a space): percent-encoded the way Go embedders'
// shard.KeyPart encodes it, so that both build the same key. "" when
// every part is visible ASCII (the problem is its length).
func encodingHint(parts ...string) string {
	for _, part := range parts {
		for i := 0; i < len(part); i++ {
			if part[i] < 0x21 || part[i] > 0x7e {
				return `; to send other text, percent-encode it as shard.KeyPart does: keep A-Z a-z 0-9 . _ @ - and write every other byte as %XX in uppercase hex ("josé" is "jos%C3%A9"), so that HTTP and Go clients share one key`
			}
		}
	}
	return ""
}
