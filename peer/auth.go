package peer

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/internal/ownlog"
)

// The gRPC port serves two audiences: clients (the public RateLimiter
// service and health) and peers (the Limiter service: forwards, handoff,
// pull, backup). A peer RPC changes or reveals limiter state on the
// owner's word alone, so it is accepted only from authenticated peers:
//
//   - with a secret (Config.PeerSecret, else Config.GossipKey), peers send
//     a token, HMAC-SHA256 of a fixed label keyed with the secret, in the
//     metadata of every call; the server compares it in constant time. The
//     token is the same on every call and node, so it proves knowledge of
//     the secret, not freshness: over plaintext a listener can replay it.
//   - with mutual TLS that requires and verifies client certificates, a
//     verified certificate authenticates the caller as a peer.
//
// With neither, peer RPCs stay open (as before this check existed), and
// New logs a warning and reports it through Metrics.PeerRPCOpen. Public RPCs
// and health are never checked here.

// peerService prefixes every peer-only method name.
const peerService = "/ringlimit.v1.Limiter/"

// logService is the prefix of the ownership log's methods: peer methods
// too (a raft message from anyone could change who holds what).
const logService = "/" + ownlog.ServiceName + "/"

// peerTokenKey is the gRPC metadata key carrying the peer token.
const peerTokenKey = "ringlimit-peer-token"

// peerTokenLabel is what the token authenticates; changing it changes
// every token (a protocol change).
const peerTokenLabel = "ringlimit/v1 peer rpc"

// peerAuth is the node's peer-RPC authentication, fixed in New.
type peerAuth struct {
	token string // hex HMAC; "" without a secret
	mtls  bool   // ServerTLS requires and verifies client certificates
}

func newPeerAuth(cfg Config) peerAuth {
	var a peerAuth
	secret := cfg.PeerSecret
	if len(secret) == 0 {
		secret = cfg.GossipKey
	}
	if len(secret) > 0 {
		mac := hmac.New(sha256.New, secret)
		mac.Write([]byte(peerTokenLabel))
		a.token = hex.EncodeToString(mac.Sum(nil))
	}
	a.mtls = cfg.ServerTLS != nil && cfg.ServerTLS.ClientAuth == tls.RequireAndVerifyClientCert
	return a
}

func (a peerAuth) open() bool { return a.token == "" && !a.mtls }

// setupAuth sets up peer-RPC authentication once, before the node first
// serves or dials, logging a warning and reporting it when peer RPCs are
// open. It is never written again, so every dial reads it without locks.
func (n *Node) setupAuth() {
	n.ops.auth = newPeerAuth(n.cfg)
	n.metrics.PeerRPCOpen(n.ops.auth.open())
	if n.ops.auth.open() {
		n.log.Warn("peer RPCs are not authenticated: anyone who reaches the gRPC port can decide, hand off and read limiter state; set Config.PeerSecret (or GossipKey), or require client certificates")
	}
}

// rpcAuthServerOptions are the gRPC server's interceptors that check the
// peer token (setupAuth).
func (n *Node) rpcAuthServerOptions() []grpc.ServerOption {
	a := n.ops.auth
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := a.check(ctx, info.FullMethod); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := a.check(ss.Context(), info.FullMethod); err != nil {
				return err
			}
			return h(srv, ss)
		}),
	}
}

// check admits every non-peer method, and a peer method from an
// authenticated peer (or from anyone when authentication is off).
func (a peerAuth) check(ctx context.Context, method string) error {
	if !strings.HasPrefix(method, peerService) && !strings.HasPrefix(method, logService) || a.open() {
		return nil
	}
	verified := false
	if a.mtls {
		if p, ok := grpcpeer.FromContext(ctx); ok {
			if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.VerifiedChains) > 0 {
				verified = true
			}
		}
	}
	token := ""
	if got := metadata.ValueFromIncomingContext(ctx, peerTokenKey); len(got) > 0 {
		token = got[0]
	}
	return a.admit(verified, token)
}

// admit decides for a peer call or a framed pipe's hello: verified says
// its TLS handshake verified a client certificate, token is the peer
// token it sent ("" for none).
func (a peerAuth) admit(verified bool, token string) error {
	if a.open() || (a.mtls && verified) {
		return nil
	}
	if a.token == "" {
		return status.Error(codes.Unauthenticated, "peer RPCs need a verified client certificate")
	}
	if token == "" {
		return status.Error(codes.Unauthenticated, "peer RPCs need the cluster's peer token")
	}
	if !hmac.Equal([]byte(token), []byte(a.token)) {
		return status.Error(codes.PermissionDenied, "wrong peer token: the caller's PeerSecret (or GossipKey) differs")
	}
	return nil
}

// rpcAuthDialOptions are the dial options that make a peer client send
// the token (none without a secret).
func (n *Node) rpcAuthDialOptions() []grpc.DialOption {
	if n.ops.auth.token == "" {
		return nil
	}
	return []grpc.DialOption{grpc.WithPerRPCCredentials(peerToken(n.ops.auth.token))}
}

// peerToken attaches the peer token to every call.
type peerToken string

func (t peerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{peerTokenKey: string(t)}, nil
}

// RequireTransportSecurity is false: plaintext clusters authenticate too
// (see the caveat on replay above).
func (peerToken) RequireTransportSecurity() bool { return false }
