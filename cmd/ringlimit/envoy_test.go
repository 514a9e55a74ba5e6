package main

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// envoyPolicies has the "probe" policy waitSettled needs and an Envoy
// domain exercising every form of rate_limit.
const envoyPolicies = `policies:
  - name: probe
    limit: 1000000000
    window: 1h
domains:
  - domain: edge
    response_headers: true
    descriptors:
      - key: client
        rate_limit: {window: 1m, requests: 100}
      - key: client
        value: internal
        rate_limit: {unlimited: true}
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 3}
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 5}
      - key: path
        value: /login
        descriptors:
          - key: remote_address
            rate_limit: {window: 1m30s, requests: 2}
      - key: shadow
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 30}
`

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func rlsClient(t *testing.T, p *serveProc) rlsv3.RateLimitServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return rlsv3.NewRateLimitServiceClient(cc)
}

// TestEnvoyRLS drives a 3-process serve cluster with what Envoy's
// ratelimit filter sends: several descriptors, hits_addend (request and
// descriptor level), refunds (is_negative_hits), unknown domains and
// descriptors, and 300 concurrent requests against a limit of 100.
//
// It runs beside other tests: what it checks is exact counts, and its
// forwards get 5 s.
func TestEnvoyRLS(t *testing.T) {
	t.Parallel()
	pols := writeFile(t, t.TempDir(), "policies.yaml", envoyPolicies)
	// 300 requests at once, two thirds forwarded, under the race detector
	// on a loaded machine: some waited past the default half second for
	// a live owner and were answered unavailable. What is checked is
	// exactness, not the timeout: give the owner time.
	ft := []string{"--policies", pols, "--forward-timeout", "5s"}
	a := startServe(t, "envoy-a", nil, ft...)
	b := startServe(t, "envoy-b", nil, append(ft, "--join", a.gossipAddr)...)
	c := startServe(t, "envoy-c", nil, append(ft, "--join", a.gossipAddr)...)
	nodes := []*serveProc{a, b, c}
	waitMembers(t, nodes, 3)
	waitSettled(t, nodes)
	clients := []rlsv3.RateLimitServiceClient{rlsClient(t, a), rlsClient(t, b), rlsClient(t, c)}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	call := func(t *testing.T, i int, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := clients[i%3].ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("ShouldRateLimit(%v) via node %d: %v", req, i%3, err)
		}
		return resp
	}
	code := func(r *rlsv3.RateLimitResponse, i int) rlsv3.RateLimitResponse_Code { return r.Statuses[i].Code }
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT

	t.Run("300 concurrent against 100 admit exactly 100", func(t *testing.T) {
		var mu sync.Mutex
		got := map[rlsv3.RateLimitResponse_Code]int{}
		var wg sync.WaitGroup
		for i := range 300 {
			wg.Go(func() {
				resp, err := clients[i%3].ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("client", "c300")}})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("request %d: %v", i, err)
					return
				}
				got[resp.OverallCode]++
			})
		}
		wg.Wait()
		if got[ok] != 100 || got[over] != 200 {
			t.Errorf("overall codes %v, want 100 OK and 200 OVER_LIMIT", got)
		}
	})

	t.Run("several descriptors, limits and headers", func(t *testing.T) {
		r := call(t, 0, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("path", "/x"), desc("path", "/login", "remote_address", "10.0.0.1"), desc("client", "internal"), desc("nokey", "x"),
		}})
		if r.OverallCode != ok || len(r.Statuses) != 4 {
			t.Fatalf("got %v, want OK with 4 statuses", r)
		}
		for i, want := range []struct {
			unit      rlsv3.RateLimitResponse_RateLimit_Unit
			rpu, mult uint32
			remaining uint32
		}{{rlsv3.RateLimitResponse_RateLimit_MINUTE, 5, 1, 4}, {rlsv3.RateLimitResponse_RateLimit_SECOND, 2, 90, 1}} {
			cl := r.Statuses[i].CurrentLimit
			mult := uint32(1)
			if cl.GetUnitMultiplier() != nil {
				mult = cl.GetUnitMultiplier().GetValue()
			}
			if cl.GetUnit() != want.unit || cl.GetRequestsPerUnit() != want.rpu || mult != want.mult || r.Statuses[i].LimitRemaining != want.remaining {
				t.Errorf("status %d = %v, want %v×%d, %d per unit, %d remaining", i, r.Statuses[i], want.unit, want.mult, want.rpu, want.remaining)
			}
			if r.Statuses[i].DurationUntilReset.AsDuration() <= 0 {
				t.Errorf("status %d: duration_until_reset %v, want > 0", i, r.Statuses[i].DurationUntilReset)
			}
		}
		for i := 2; i < 4; i++ {
			if code(r, i) != ok || r.Statuses[i].CurrentLimit != nil {
				t.Errorf("status %d (unlimited / unmatched) = %v, want OK without a limit", i, r.Statuses[i])
			}
		}
		hdr := map[string]string{}
		for _, h := range r.ResponseHeadersToAdd {
			hdr[h.Key] = h.Value
		}
		if !strings.Contains(hdr["RateLimit-Policy"], ";q=5;w=60") || !strings.Contains(hdr["RateLimit-Policy"], ";q=2;w=90") || !strings.Contains(hdr["RateLimit"], ";r=4;") {
			t.Errorf("response headers %v, want RateLimit-Policy with q=5;w=60 and q=2;w=90, RateLimit with r=4", hdr)
		}
	})

	t.Run("hits_addend, descriptor override and refund", func(t *testing.T) {
		r := call(t, 1, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "u1")}})
		if r.OverallCode != ok || r.Statuses[0].LimitRemaining != 0 {
			t.Fatalf("hits_addend 3 of 3: %v, want OK with 0 remaining", r)
		}
		r = call(t, 2, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "u1")}})
		if r.OverallCode != over || r.Statuses[0].DurationUntilReset.AsDuration() <= 0 {
			t.Fatalf("4th hit: %v, want OVER_LIMIT with a duration until reset", r)
		}
		neg := desc("user", "u1")
		neg.HitsAddend, neg.IsNegativeHits = wrapperspb.UInt64(2), true
		r = call(t, 0, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 1, Descriptors: []*ratelimitv3.RateLimitDescriptor{neg}})
		if r.OverallCode != ok || r.Statuses[0].LimitRemaining != 2 {
			t.Fatalf("refund of 2: %v, want OK with 2 remaining", r)
		}
		// Descriptor hits_addend overrides the request's (5 would never fit).
		two := desc("user", "u1")
		two.HitsAddend = wrapperspb.UInt64(2)
		r = call(t, 1, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 5, Descriptors: []*ratelimitv3.RateLimitDescriptor{two, desc("user", "u2")}})
		if code(r, 0) != ok || r.Statuses[0].LimitRemaining != 0 || code(r, 1) != over || r.OverallCode != over {
			t.Fatalf("override 2 and request-level 5: %v, want u1 OK 0 remaining, u2 OVER_LIMIT (5 > 3)", r)
		}
	})

	t.Run("same values are decided atomically", func(t *testing.T) {
		call(t, 0, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "same")}})
		r := call(t, 1, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("client", "same"), desc("user", "same")}})
		if r.OverallCode != over || code(r, 0) != ok || code(r, 1) != over {
			t.Fatalf("client+user with user spent: %v, want OVER_LIMIT (client OK, user OVER_LIMIT)", r)
		}
		r = call(t, 2, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("client", "same")}})
		if r.Statuses[0].LimitRemaining != 99 {
			t.Errorf("client after the refused pair: %v, want 99 remaining (the pair recorded nothing)", r)
		}
	})

	t.Run("shadow mode answers OK", func(t *testing.T) {
		for i := range 3 {
			r := call(t, i, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("shadow", "s")}})
			if r.OverallCode != ok {
				t.Fatalf("shadow hit %d: %v, want OK", i, r)
			}
		}
	})

	t.Run("unknown domain and bad requests", func(t *testing.T) {
		// The policy file sets no unknown_domain: an error, counted.
		_, err := clients[0].ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "nope", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("client", "c300")}})
		if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), `"nope"`) {
			t.Errorf("unknown domain: %v, want NotFound naming it", err)
		}
		if v := metricValue(t, a, `ringlimit_envoy_unknown_domain_requests_total{answer="error"}`); v != "1" {
			t.Errorf(`ringlimit_envoy_unknown_domain_requests_total{answer="error"} = %q, want 1`, v)
		}
		for _, req := range []*rlsv3.RateLimitRequest{
			{Domain: "", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("client", "x")}},
			{Domain: "edge"},
		} {
			if _, err := clients[0].ShouldRateLimit(ctx, req); status.Code(err) != codes.InvalidArgument {
				t.Errorf("ShouldRateLimit(%v) = %v, want InvalidArgument", req, err)
			}
		}
	})

	for _, p := range []*serveProc{c, b, a} {
		if code := p.terminate(t); code != 0 {
			t.Errorf("%s exit code %d after SIGTERM, want 0", p.name, code)
		}
	}
}
