package envoyrls

import (
	"context"
	"fmt"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer"
)

// unavailable is a Limiter that can never decide.
type unavailable struct{}

func (unavailable) Allow(context.Context, peer.Request) (peer.Decision, error) {
	return peer.Decision{}, fmt.Errorf("%w: owner gone", peer.ErrUnavailable)
}
func (u unavailable) Peek(ctx context.Context, r peer.Request) (peer.Decision, error) {
	return u.Allow(ctx, r)
}
func (u unavailable) Refund(ctx context.Context, r peer.Request) (peer.Decision, error) {
	return u.Allow(ctx, r)
}

func TestEnvoyUnavailableIsGRPCUnavailable(t *testing.T) {
	t.Parallel()
	tab, err := Compile([]Domain{{Name: "d", Descriptors: []Descriptor{{Key: "k", Limit: &Limit{Requests: 1, Window: time.Second}}}}})
	if err != nil {
		t.Fatal(err)
	}
	s := New(unavailable{}, tab, nil)
	d := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}
	_, err = s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("ShouldRateLimit with an unavailable limiter = %v, want gRPC Unavailable", err)
	}
	// An unknown domain is not the limiter's to decide: NotFound (the
	// default UnknownError), not Unavailable.
	if _, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "other", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown domain with an unavailable limiter = %v, want NotFound", err)
	}
}

func TestEnvoyCurrentLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		window time.Duration
		unit   rlsv3.RateLimitResponse_RateLimit_Unit
		mult   uint32 // 0: omitted (1)
	}{
		{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 0},
		{90 * time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND, 90},
		{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE, 0},
		{2 * time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR, 2},
		{48 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY, 2},
		{500 * time.Millisecond, rlsv3.RateLimitResponse_RateLimit_SECOND, 0},
		{1500 * time.Millisecond, rlsv3.RateLimitResponse_RateLimit_SECOND, 2},
	} {
		got := CurrentLimit("p", Limit{Requests: 7, Window: tc.window})
		if got.Unit != tc.unit || got.GetUnitMultiplier().GetValue() != tc.mult || got.RequestsPerUnit != 7 {
			t.Errorf("CurrentLimit(window %v) = %v, want %v × %d", tc.window, got, tc.unit, tc.mult)
		}
	}
}

// entries is a descriptor's entries with the given values, each of key k.
func entries(values ...string) []*ratelimitv3.RateLimitDescriptor_Entry {
	var es []*ratelimitv3.RateLimitDescriptor_Entry
	for _, v := range values {
		es = append(es, &ratelimitv3.RateLimitDescriptor_Entry{Key: "k", Value: v})
	}
	return es
}

func TestEnvoyKeys(t *testing.T) {
	t.Parallel()
	// Values are encoded one by one and joined by '|', which KeyPart
	// never produces: shifting a separator changes the subject.
	if a, b := subject(entries("a|b", "c")), subject(entries("a", "b|c")); a == b {
		t.Errorf("subjects collide: %q", a)
	}
	long := string(make([]byte, 200))
	if s := subject(entries(long, long)); len(s) > 128 {
		t.Errorf("long subject is %d bytes, want at most 128", len(s))
	}
	if s := subject(entries(long)); len(s) > 128 {
		t.Errorf("long one-value subject is %d bytes, want at most 128", len(s))
	}
	if s := subject(entries("10.0.0.1")); s != "10.0.0.1" {
		t.Errorf("one-value subject is %q, want the value", s)
	}
	for _, tc := range []struct {
		domain string
		path   [][2]string
		want   string
	}{
		{"edge", [][2]string{{"path", "/login"}, {"remote_address", ""}}, "envoy:edge:path=%2Flogin/remote_address"},
		{"a:b", [][2]string{{"c", ""}}, "envoy:a%3Ab:c"},
	} {
		if got := PolicyName(tc.domain, tc.path); got != tc.want {
			t.Errorf("PolicyName(%q, %v) = %q, want %q", tc.domain, tc.path, got, tc.want)
		}
	}
	if got := PolicyName(string(make([]byte, 300)), nil); len(got) != 128 {
		t.Errorf("long policy name is %d bytes, want 128", len(got))
	}
}

// counting is a Limiter that records what it was asked and admits all.
type counting struct{ allows, refunds int }

func (c *counting) Allow(context.Context, peer.Request) (peer.Decision, error) {
	c.allows++
	return peer.Decision{Allowed: true, Limit: 5, Remaining: 4}, nil
}
func (c *counting) Peek(ctx context.Context, r peer.Request) (peer.Decision, error) {
	return c.Allow(ctx, r)
}
func (c *counting) Refund(context.Context, peer.Request) (peer.Decision, error) {
	c.refunds++
	return peer.Decision{Allowed: true, Limit: 5, Remaining: 5}, nil
}

// TestEnvoyGuardRefunds checks GuardRefunds: a request with a negative-hits
// descriptor is refused whole with the guard's status, its other
// descriptors undecided too, unless the guard allows it; a request
// without one is never asked about.
func TestEnvoyGuardRefunds(t *testing.T) {
	t.Parallel()
	tab, err := Compile([]Domain{{Name: "d", Descriptors: []Descriptor{{Key: "k", Limit: &Limit{Requests: 5, Window: time.Minute}}}}})
	if err != nil {
		t.Fatal(err)
	}
	desc := func(v string, negative bool) *ratelimitv3.RateLimitDescriptor {
		return &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: v}}, IsNegativeHits: negative}
	}
	type allowKey struct{}
	for _, tc := range []struct {
		name           string
		descs          []*ratelimitv3.RateLimitDescriptor
		allowed        bool // the guard's answer
		code           codes.Code
		allows, refund int
	}{
		{"refund refused", []*ratelimitv3.RateLimitDescriptor{desc("a", true), desc("b", false)}, false, codes.Unauthenticated, 0, 0},
		{"refund allowed", []*ratelimitv3.RateLimitDescriptor{desc("a", true), desc("b", false)}, true, codes.OK, 1, 1},
		{"no refund, never asked", []*ratelimitv3.RateLimitDescriptor{desc("b", false)}, false, codes.OK, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := &counting{}
			s := New(l, tab, nil)
			s.GuardRefunds(func(ctx context.Context) error {
				if ctx.Value(allowKey{}) != nil {
					return nil
				}
				return status.Error(codes.Unauthenticated, "refund needs a token")
			})
			ctx := context.Background()
			if tc.allowed {
				ctx = context.WithValue(ctx, allowKey{}, true)
			}
			_, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: tc.descs})
			if status.Code(err) != tc.code || l.allows != tc.allows || l.refunds != tc.refund {
				t.Fatalf("ShouldRateLimit = %v with %d allows and %d refunds; want %v, %d and %d", err, l.allows, l.refunds, tc.code, tc.allows, tc.refund)
			}
		})
	}
}
