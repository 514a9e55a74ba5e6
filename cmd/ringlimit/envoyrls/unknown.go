package envoyrls

import (
	"fmt"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// UnknownDomain is what ShouldRateLimit answers for a domain its table
// does not define (Table.WithUnknownDomain). Every such request is
// counted (Server's metric) and logged at Warn, at most once a second per
// server, whatever the answer.
type UnknownDomain uint8

const (
	// UnknownError (the default) answers gRPC NotFound, naming the domain:
	// Envoy counts it as a rate limit service error and its filter's
	// failure_mode_deny decides (admit, the default, or refuse), as when
	// ringlimit cannot decide. A typo in a domain thus shows in Envoy's
	// error counters and in this server's, and what traffic gets is the
	// choice the operator already made for an unreachable limiter.
	UnknownError UnknownDomain = iota
	// UnknownDeny answers OVER_LIMIT for every descriptor: Envoy refuses
	// the request (429). Loud, at the price of refusing traffic for a
	// configuration mistake.
	UnknownDeny
	// UnknownAllow answers OK with no limit for every descriptor, as
	// envoyproxy/ratelimit answers an unknown domain: the request is not
	// limited.
	UnknownAllow
)

// unknownDomainNames are the policy file's names, by UnknownDomain.
var unknownDomainNames = [...]string{UnknownError: "error", UnknownDeny: "deny", UnknownAllow: "allow"}

func (u UnknownDomain) String() string {
	if int(u) < len(unknownDomainNames) {
		return unknownDomainNames[u]
	}
	return fmt.Sprintf("UnknownDomain(%d)", u)
}

// ParseUnknownDomain reads "error", "deny" or "allow".
func ParseUnknownDomain(s string) (UnknownDomain, error) {
	for u, name := range unknownDomainNames {
		if s == name {
			return UnknownDomain(u), nil
		}
	}
	return 0, fmt.Errorf("unknown_domain %q: want error (the default), deny or allow", s)
}

// WithUnknownDomain returns a copy of t that answers u for a domain it
// does not define. A table from Compile answers UnknownError.
func (t *Table) WithUnknownDomain(u UnknownDomain) *Table {
	c := *t
	c.unknown = u
	return &c
}

// UnknownDomainAnswer is what t answers for a domain it does not define.
func (t *Table) UnknownDomainAnswer() UnknownDomain { return t.unknown }

// maxLoggedDomain bounds the domain name an unknown-domain log line
// carries: anyone who reaches the port chooses it.
const maxLoggedDomain = 64

// unknownDomain answers a request for domain, which t does not define,
// as t says, and counts and logs it.
func (s *Server) unknownDomain(t *Table, domain string, resp *rlsv3.RateLimitResponse) (*rlsv3.RateLimitResponse, error) {
	u := t.unknown
	if int(u) >= len(s.unknown) {
		u = UnknownError
	}
	s.unknown[u].Add(1)
	now, last := time.Now().UnixNano(), s.lastUnknownLog.Load()
	if now-last >= int64(time.Second) && s.lastUnknownLog.CompareAndSwap(last, now) {
		name := domain
		if len(name) > maxLoggedDomain {
			name = name[:maxLoggedDomain] + "..."
		}
		s.log.Warn("envoy rate limit request for an unknown domain", "domain", name, "answer", u.String(),
			"unknown_domain_requests", s.unknown[0].Load()+s.unknown[1].Load()+s.unknown[2].Load())
	}
	switch u {
	case UnknownAllow:
		okStatuses(resp.Statuses)
		return resp, nil
	case UnknownDeny:
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		for i := range resp.Statuses {
			resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT}
		}
		return resp, nil
	default:
		return nil, status.Errorf(codes.NotFound, "ringlimit: rate limit domain %q is not configured (the policy file's domains; unknown_domain: error)", domain)
	}
}

// Describe and Collect make the server a prometheus.Collector of one
// counter, ringlimit_envoy_unknown_domain_requests_total{answer}: requests
// for a domain the table does not define, by the answer given (error,
// deny, allow). The domain is not a label: the caller chooses it.
func (s *Server) Describe(ch chan<- *prometheus.Desc) { ch <- s.unknownDesc }

// Collect reports the counter (see Describe).
func (s *Server) Collect(ch chan<- prometheus.Metric) {
	for u := range s.unknown {
		ch <- prometheus.MustNewConstMetric(s.unknownDesc, prometheus.CounterValue, float64(s.unknown[u].Load()), UnknownDomain(u).String())
	}
}

// UnknownDomainRequests returns how many requests for an unknown domain
// the server answered with u.
func (s *Server) UnknownDomainRequests(u UnknownDomain) uint64 {
	if int(u) >= len(s.unknown) {
		return 0
	}
	return s.unknown[u].Load()
}

// newUnknownDesc describes the unknown-domain counter.
func newUnknownDesc() *prometheus.Desc {
	return prometheus.NewDesc("ringlimit_envoy_unknown_domain_requests_total",
		"Envoy rate limit requests for a domain the policy file does not define, by the answer given (the policy file's unknown_domain: error, deny or allow).",
		[]string{"answer"}, nil)
}
