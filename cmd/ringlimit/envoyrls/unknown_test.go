package envoyrls

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer"
)

// noCalls is a Limiter that fails the test if anything is decided.
type noCalls struct{ t *testing.T }

func (n noCalls) Allow(context.Context, peer.Request) (peer.Decision, error) {
	n.t.Error("a request for an unknown domain reached the limiter")
	return peer.Decision{}, nil
}
func (n noCalls) Peek(ctx context.Context, r peer.Request) (peer.Decision, error) {
	return n.Allow(ctx, r)
}
func (n noCalls) Refund(ctx context.Context, r peer.Request) (peer.Decision, error) {
	return n.Allow(ctx, r)
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestEnvoyUnknownDomain checks each UnknownDomain answer for a domain the
// table lacks (the default is an error, NotFound), that nothing reaches
// the limiter, that every request is counted in the server's metric by
// answer, and that the Warn naming the domain is throttled (one line for
// a burst, not one per request).
func TestEnvoyUnknownDomain(t *testing.T) {
	t.Parallel()
	tab, err := Compile([]Domain{{Name: "edge", Descriptors: []Descriptor{{Key: "k", Limit: &Limit{Requests: 1, Window: time.Second}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := tab.UnknownDomainAnswer(); got != UnknownError {
		t.Fatalf("Compile's table answers an unknown domain with %v, want error", got)
	}
	desc := func(v string) *ratelimitv3.RateLimitDescriptor {
		return &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: v}}}
	}
	req := &rlsv3.RateLimitRequest{Domain: "egde", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a"), desc("b")}}
	const burst = 50
	for _, tc := range []struct {
		name   string
		answer UnknownDomain
		check  func(resp *rlsv3.RateLimitResponse, err error) string // "" when right
	}{
		{"default error", UnknownError, func(resp *rlsv3.RateLimitResponse, err error) string {
			if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), `"egde"`) {
				return "want gRPC NotFound naming the domain"
			}
			return ""
		}},
		{"deny", UnknownDeny, func(resp *rlsv3.RateLimitResponse, err error) string {
			if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || len(resp.GetStatuses()) != 2 {
				return "want OVER_LIMIT with 2 statuses"
			}
			for _, st := range resp.GetStatuses() {
				if st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT || st.GetCurrentLimit() != nil {
					return "want every status OVER_LIMIT without a limit"
				}
			}
			return ""
		}},
		{"allow", UnknownAllow, func(resp *rlsv3.RateLimitResponse, err error) string {
			if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != 2 {
				return "want OK with 2 statuses"
			}
			for _, st := range resp.GetStatuses() {
				if st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit() != nil {
					return "want every status OK without a limit"
				}
			}
			return ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs syncBuffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			tt := tab
			if tc.answer != UnknownError {
				tt = tab.WithUnknownDomain(tc.answer)
			}
			s := New(noCalls{t}, tt, log)
			reg := prometheus.NewRegistry()
			if err := reg.Register(s); err != nil {
				t.Fatalf("register the server's metrics: %v", err)
			}
			start := time.Now()
			for i := range burst {
				resp, err := s.ShouldRateLimit(context.Background(), req)
				if why := tc.check(resp, err); why != "" {
					t.Fatalf("request %d for unknown domain %q = %v, %v; %s", i, req.Domain, resp, err, why)
				}
			}
			elapsed := time.Since(start)
			if got := s.UnknownDomainRequests(tc.answer); got != burst {
				t.Errorf("UnknownDomainRequests(%v) = %d, want %d", tc.answer, got, burst)
			}
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			counted := map[string]float64{}
			for _, mf := range mfs {
				if mf.GetName() != "ringlimit_envoy_unknown_domain_requests_total" {
					continue
				}
				for _, m := range mf.GetMetric() {
					counted[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
				}
			}
			want := map[string]float64{"error": 0, "deny": 0, "allow": 0}
			want[tc.answer.String()] = burst
			for k, v := range want {
				if counted[k] != v {
					t.Errorf("ringlimit_envoy_unknown_domain_requests_total = %v, want %v", counted, want)
					break
				}
			}
			// One Warn per second at most: the burst logs 1 line (2 if
			// it straddled a second on a slow machine, and so on).
			lines := strings.Count(logs.String(), "unknown domain")
			if maxLines := 1 + int(elapsed/time.Second); lines < 1 || lines > maxLines {
				t.Errorf("%d requests in %v logged %d lines, want 1 to %d:\n%s", burst, elapsed, lines, maxLines, logs.String())
			}
			if line := logs.String(); !strings.Contains(line, "level=WARN") || !strings.Contains(line, "domain=egde") || !strings.Contains(line, "answer="+tc.answer.String()) {
				t.Errorf("log %q: want a WARN naming the domain and the answer", line)
			}
		})
	}
	// A domain is logged cut short: anyone who reaches the port chooses
	// it.
	var logs syncBuffer
	s := New(noCalls{t}, tab, slog.New(slog.NewTextHandler(&logs, nil)))
	long := strings.Repeat("x", 10*maxLoggedDomain)
	if _, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: long, Descriptors: req.Descriptors}); status.Code(err) != codes.NotFound {
		t.Errorf("long unknown domain = %v, want NotFound", err)
	}
	if strings.Contains(logs.String(), long) || !strings.Contains(logs.String(), long[:maxLoggedDomain]+"...") {
		t.Errorf("log %q: want the domain cut to %d bytes", logs.String(), maxLoggedDomain)
	}
	// The answers' names, as the policy file spells them.
	for _, name := range []string{"error", "deny", "allow"} {
		if u, err := ParseUnknownDomain(name); err != nil || u.String() != name {
			t.Errorf("ParseUnknownDomain(%q) = %v, %v", name, u, err)
		}
	}
	if _, err := ParseUnknownDomain("ok"); err == nil || !strings.Contains(err.Error(), "error (the default), deny or allow") {
		t.Errorf("ParseUnknownDomain(\"ok\") = %v, want an error listing the answers", err)
	}
}
