package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// resetGuard is serve's --admin-token-file: one token guarding Reset on
// every transport, POST /v1/reset (Authorization: Bearer <token>) and the
// gRPC RateLimiter.Reset (metadata authorization: Bearer <token>, or a
// client certificate the node verified: with mutual TLS the port itself
// is the guard). Refusals are counted (ringlimit_reset_refused_total, by
// transport) and logged at Warn, at most once per resetWarnEvery per
// transport, with how many were refused since the last line.
type resetGuard struct {
	token   []byte
	log     *slog.Logger
	refused *prometheus.CounterVec // nil: not counted

	mu       sync.Mutex
	lastWarn map[string]time.Time // transport -> last Warn
	quiet    map[string]int       // transport -> refusals not logged since
}

// resetWarnEvery spaces the refusal warnings of one transport.
const resetWarnEvery = 10 * time.Second

// newResetGuard returns the guard for token, registering its counter on
// reg when reg is not nil.
func newResetGuard(token []byte, log *slog.Logger, reg prometheus.Registerer) (*resetGuard, error) {
	g := &resetGuard{token: token, log: log, lastWarn: map[string]time.Time{}, quiet: map[string]int{}}
	if reg != nil {
		g.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_reset_refused_total",
			Help: "Reset calls refused for a missing or wrong admin token, by transport (http, grpc).",
		}, []string{"transport"})
		if err := reg.Register(g.refused); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// bearerOK reports whether auth is "Bearer <token>" with the admin token.
// The comparison takes the same time whatever the token: both sides are
// hashed first, so neither length nor content leaks.
func (g *resetGuard) bearerOK(auth string) bool {
	const scheme = "bearer "
	if len(auth) <= len(scheme) || !strings.EqualFold(auth[:len(scheme)], scheme) {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(auth[len(scheme):])))
	want := sha256.Sum256(g.token)
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}

// refuse counts one refused reset and logs it, throttled.
func (g *resetGuard) refuse(transport, remote string) {
	if g.refused != nil {
		g.refused.WithLabelValues(transport).Inc()
	}
	g.mu.Lock()
	now := time.Now()
	if now.Sub(g.lastWarn[transport]) < resetWarnEvery {
		g.quiet[transport]++
		g.mu.Unlock()
		return
	}
	g.lastWarn[transport] = now
	before := g.quiet[transport]
	g.quiet[transport] = 0
	g.mu.Unlock()
	g.log.Warn("reset refused: missing or wrong admin token", "transport", transport, "remote_addr", remote, "refused_unlogged_before", before)
}

// authorizeGRPC is peer.Config.AuthorizeReset: a verified client
// certificate or the admin token in the metadata.
func (g *resetGuard) authorizeGRPC(ctx context.Context) error {
	remote := ""
	if p, ok := grpcpeer.FromContext(ctx); ok {
		if p.Addr != nil {
			remote = p.Addr.String()
		}
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 {
			return nil
		}
	}
	for _, auth := range metadata.ValueFromIncomingContext(ctx, "authorization") {
		if g.bearerOK(auth) {
			return nil
		}
	}
	g.refuse("grpc", remote)
	return status.Error(codes.Unauthenticated, "reset needs the admin token: send metadata authorization: Bearer <token from --admin-token-file>, or a client certificate the node trusts")
}
