package transport

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Peer authentication. A node's port serves two audiences: clients and
// peers. A peer call changes or reveals limiter state on the caller's
// word alone, so it is accepted only from authenticated peers:
//
//   - with a secret, peers send a token, HMAC-SHA256 of a fixed label
//     keyed with the secret, in the metadata of every call (and in a
//     framed pipe's hello); the server compares it in constant time. The
//     token is the same on every call and node, so it proves knowledge of
//     the secret, not freshness: over plaintext a listener can replay it.
//   - with mutual TLS that requires and verifies client certificates, a
//     verified certificate authenticates the caller as a peer.
//
// With neither, peer calls stay open (Auth.Open). Calls to methods
// outside the protected services are never checked.
//
// Token mode therefore needs TLS wherever the network can be listened
// to: a captured token is as good as the secret for every peer call
// (issue 53 item 6). A fresh challenge in the framed hello and per call
// is not built yet (TODO(issue 53)). One operation carries more than the
// token: a peer reset, the one peer operation that clears a key outright,
// must also carry a reset proof (ResetProof), an HMAC of the key keyed by
// a second key derived from the secret that never travels. Only a node
// that took the reset from a caller its own Config.AuthorizeReset allowed
// (or an in-process Node.Reset) makes one, so a captured token alone
// resets nothing; a captured proof replays only the reset of that one key.

// TokenKey is the gRPC metadata key carrying the peer token.
const TokenKey = "ringlimit-peer-token"

// ResetProofKey is the gRPC metadata key carrying a reset's proof.
const ResetProofKey = "ringlimit-reset-proof"

// resetLabel derives the key of reset proofs from the secret; changing
// it changes every proof (a protocol change).
const resetLabel = "ringlimit/v1 reset proof"

// tokenLabel is what the token authenticates; changing it changes every
// token (a protocol change).
const tokenLabel = "ringlimit/v1 peer rpc"

// Auth is a node's peer authentication, fixed when the node starts; the
// zero Auth is open.
type Auth struct {
	token     string   // hex HMAC; "" without a secret
	resetKey  []byte   // HMAC of resetLabel: keys reset proofs; nil without a secret
	mtls      bool     // the server requires and verifies client certificates
	protected []string // method prefixes only peers may call
}

// NewAuth authenticates peers by secret (none if empty) and, when mtls,
// by a verified client certificate; the methods under the protected
// prefixes ("/package.Service/") are the peers' own.
func NewAuth(secret []byte, mtls bool, protected ...string) Auth {
	a := Auth{mtls: mtls, protected: protected}
	if len(secret) > 0 {
		mac := hmac.New(sha256.New, secret)
		mac.Write([]byte(tokenLabel))
		a.token = hex.EncodeToString(mac.Sum(nil))
		mac = hmac.New(sha256.New, secret)
		mac.Write([]byte(resetLabel))
		a.resetKey = mac.Sum(nil)
	}
	return a
}

// ResetProof is the proof a peer reset of the key encoded as key carries
// in its call's metadata (ResetProofKey): "" without a secret. The
// caller makes one only for a reset it has authorized.
func (a Auth) ResetProof(key []byte) string {
	if a.resetKey == nil {
		return ""
	}
	mac := hmac.New(sha256.New, a.resetKey)
	mac.Write(key)
	return hex.EncodeToString(mac.Sum(nil))
}

// CheckResetProof decides a peer reset of the key encoded as key: with a
// secret, the call's metadata must carry its proof (ResetProof), so that
// a captured peer token, or a framed pipe (whose requests carry no
// metadata), resets nothing. Without a secret peers are authenticated by
// a verified certificate (TLS: nothing to replay) or not at all, and
// every reset passes. A refusal is a gRPC status.
func (a Auth) CheckResetProof(ctx context.Context, key []byte) error {
	if a.resetKey == nil {
		return nil
	}
	want := a.ResetProof(key)
	for _, got := range metadata.ValueFromIncomingContext(ctx, ResetProofKey) {
		if hmac.Equal([]byte(got), []byte(want)) {
			return nil
		}
	}
	return status.Error(codes.PermissionDenied, "a peer reset needs the proof of the member that authorized it (a unary Limiter.Check with "+ResetProofKey+"): streams and framed pipes carry none")
}

// Open reports that peer calls are accepted from anyone.
func (a Auth) Open() bool { return a.token == "" && !a.mtls }

// Token is the token this node presents to its peers ("" without a
// secret).
func (a Auth) Token() string { return a.token }

// Admit decides for a peer call or a framed pipe's hello: verified says
// its TLS handshake verified a client certificate, token is the peer
// token it sent ("" for none). A refusal is a gRPC status.
func (a Auth) Admit(verified bool, token string) error {
	if a.Open() || (a.mtls && verified) {
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

// check admits every unprotected method, and a protected one from an
// authenticated peer (or from anyone when authentication is off).
func (a Auth) check(ctx context.Context, method string) error {
	if a.Open() || !a.isProtected(method) {
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
	if got := metadata.ValueFromIncomingContext(ctx, TokenKey); len(got) > 0 {
		token = got[0]
	}
	return a.Admit(verified, token)
}

func (a Auth) isProtected(method string) bool {
	for _, p := range a.protected {
		if strings.HasPrefix(method, p) {
			return true
		}
	}
	return false
}

// ServerOptions are the gRPC server's interceptors that check every
// protected call.
func (a Auth) ServerOptions() []grpc.ServerOption {
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

// DialOptions make a peer client send the token (none without a secret).
func (a Auth) DialOptions() []grpc.DialOption {
	if a.token == "" {
		return nil
	}
	return []grpc.DialOption{grpc.WithPerRPCCredentials(peerToken(a.token))}
}

// peerToken attaches the peer token to every call.
type peerToken string

func (t peerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{TokenKey: string(t)}, nil
}

// RequireTransportSecurity is false: plaintext clusters authenticate too
// (see the caveat on replay above).
func (peerToken) RequireTransportSecurity() bool { return false }
