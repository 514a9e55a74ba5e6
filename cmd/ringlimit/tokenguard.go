package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer"
)

// tokenGuard guards one state-changing operation with bearer tokens on
// every transport: over HTTP (Authorization: Bearer <token>) and over gRPC
// (metadata authorization: Bearer <token>, or a client certificate the
// node verified: with mutual TLS the port itself is the guard). serve has
// two: Reset takes the admin token (--admin-token-file); Refund takes the
// admin token or the refund token (--refund-token-file). A refund gives
// back whoever's admissions (nothing ties it to the caller that was
// admitted), so once any token is configured, refunds need one too; the
// refund token exists so that services which refund routinely (a request
// that failed on the server's side) need not hold the power to reset.
// Refusals are counted (ringlimit_<op>_refused_total, by transport) and
// logged at Warn, at most once per resetWarnEvery per transport, with how
// many were refused since the last line.
type tokenGuard struct {
	op     string   // "reset" or "refund"
	tokens [][]byte // any one of them authorizes
	// what names the tokens in messages ("admin token"); send says where
	// the caller gets one ("--admin-token-file").
	what, send string
	log        *slog.Logger
	refused    *prometheus.CounterVec // nil: not counted
	// peerNames are --tls-peer-name's patterns: a verified client
	// certificate stands for a token only if it is a peer's (none: every
	// verified certificate), so that Envoy's certificate of the same CA
	// is no admin's (issue 53 item 5).
	peerNames []string

	mu       sync.Mutex
	lastWarn map[string]time.Time // transport -> last Warn
	quiet    map[string]int       // transport -> refusals not logged since
}

// resetWarnEvery spaces the refusal warnings of one transport.
const resetWarnEvery = 10 * time.Second

// newResetGuard returns Reset's guard, of the admin token, registering its
// counter on reg when reg is not nil. With admin nil (serve without
// --admin-token-file) it holds no token: gRPC Reset is then refused to
// everyone but a caller whose client certificate the node verified (issue
// 53 item 7: it was open to whoever reached the port, while /v1/reset
// answered 404). serve keeps such a guard off the HTTP API, where
// /v1/reset stays 404.
func newResetGuard(admin []byte, log *slog.Logger, reg prometheus.Registerer) (*tokenGuard, error) {
	var tokens [][]byte
	if admin != nil {
		tokens = [][]byte{admin}
	}
	return newTokenGuard("reset", tokens, "admin token", "--admin-token-file", log, reg)
}

// newRefundGuard returns Refund's guard, of the admin token and the
// refund token (either may be nil, not both).
func newRefundGuard(admin, refund []byte, log *slog.Logger, reg prometheus.Registerer) (*tokenGuard, error) {
	var tokens [][]byte
	var files []string
	if refund != nil {
		tokens, files = append(tokens, refund), append(files, "--refund-token-file")
	}
	if admin != nil {
		tokens, files = append(tokens, admin), append(files, "--admin-token-file")
	}
	what := "refund or admin token"
	switch {
	case admin == nil:
		what = "refund token"
	case refund == nil:
		what = "admin token"
	}
	return newTokenGuard("refund", tokens, what, strings.Join(files, " or "), log, reg)
}

func newTokenGuard(op string, tokens [][]byte, what, send string, log *slog.Logger, reg prometheus.Registerer) (*tokenGuard, error) {
	g := &tokenGuard{op: op, tokens: tokens, what: what, send: send, log: log, lastWarn: map[string]time.Time{}, quiet: map[string]int{}}
	if reg != nil {
		g.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ringlimit_" + op + "_refused_total",
			Help: fmt.Sprintf("%s calls refused for a missing or wrong %s, by transport (http, grpc).", strings.ToUpper(op[:1])+op[1:], what),
		}, []string{"transport"})
		if err := reg.Register(g.refused); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// bearerOK reports whether auth is "Bearer <token>" with one of the
// guard's tokens. The comparison takes the same time whatever the token:
// both sides are hashed first, and every token is compared, so neither
// length, content nor which token matched leaks.
func (g *tokenGuard) bearerOK(auth string) bool {
	const scheme = "bearer "
	if len(auth) <= len(scheme) || !strings.EqualFold(auth[:len(scheme)], scheme) {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(auth[len(scheme):])))
	ok := 0
	for _, tok := range g.tokens {
		want := sha256.Sum256(tok)
		ok |= subtle.ConstantTimeCompare(got[:], want[:])
	}
	return ok == 1
}

// refuse counts one refused call and logs it, throttled.
func (g *tokenGuard) refuse(transport, remote string) {
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
	g.log.Warn(g.op+" refused: missing or wrong "+g.what, "transport", transport, "remote_addr", remote, "refused_unlogged_before", before)
}

// authorizeHTTP reports whether r carries one of the guard's tokens; when
// it does not, it has answered 401 (with WWW-Authenticate) and counted
// the refusal.
func (g *tokenGuard) authorizeHTTP(w http.ResponseWriter, r *http.Request) bool {
	if g.bearerOK(r.Header.Get("Authorization")) {
		return true
	}
	g.refuse("http", r.RemoteAddr)
	w.Header().Set("WWW-Authenticate", `Bearer realm="ringlimit"`)
	writeJSON(w, http.StatusUnauthorized, errorResponse{Error: fmt.Sprintf("%s needs the %s: send Authorization: Bearer <token from %s>", g.op, g.what, g.send)})
	return false
}

// authorizeGRPC is peer.Config.AuthorizeReset (or AuthorizeRefund): a
// verified client certificate or one of the tokens in the metadata.
func (g *tokenGuard) authorizeGRPC(ctx context.Context) error {
	remote := ""
	if p, ok := grpcpeer.FromContext(ctx); ok {
		if p.Addr != nil {
			remote = p.Addr.String()
		}
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 && len(ti.State.PeerCertificates) > 0 &&
			peer.PeerCertName(g.peerNames, ti.State.PeerCertificates[0]) {
			return nil
		}
	}
	for _, auth := range metadata.ValueFromIncomingContext(ctx, "authorization") {
		if g.bearerOK(auth) {
			return nil
		}
	}
	g.refuse("grpc", remote)
	if len(g.tokens) == 0 {
		return status.Error(codes.Unauthenticated, fmt.Sprintf("%s is off: the node has no %s (start it with %s), and the caller presented no peer's client certificate the node verified", g.op, g.what, g.send))
	}
	return status.Error(codes.Unauthenticated, fmt.Sprintf("%s needs the %s: send metadata authorization: Bearer <token from %s>, or a client certificate the node trusts", g.op, g.what, g.send))
}
