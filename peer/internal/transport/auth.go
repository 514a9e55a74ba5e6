package transport

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

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
//   - with mutual TLS that requires and verifies client certificates, a
//     verified certificate whose SANs match one of the peer name patterns
//     (AuthConfig.PeerNames; with none, every certificate of the CA is a
//     peer). A certificate of the same CA that matches none (Envoy's, an
//     application's) is a client: it may call the public API, not the
//     peers' methods (issue 53 item 5).
//   - with a secret, nothing that can be replayed (issue 53 item 6). Each
//     gRPC call carries a fresh token (callToken): an HMAC, under a key
//     derived from the secret, of the method, the sender's and the
//     receiver's member names, a session chosen at random by the sender's
//     client, a counter and the sender's wall-clock time. The receiver
//     accepts a token once: its counter must be new for its session
//     (replayCache, a sliding window of ReplayWindowCalls counters per
//     session, as IPsec's), and its time within ReplayWindow of the
//     receiver's clock and not before the receiver started (a session it
//     forgot is at least 2*ReplayWindow idle, so every token of it is too
//     old). A framed pipe's hello is a challenge: the server sends a nonce
//     of its own and the client answers with an HMAC of both sides'
//     nonces, the kind and both member names (helloProof), so a captured
//     hello opens nothing.
//
// With neither, peer calls stay open (Auth.Open). Calls to methods
// outside the protected services are never checked.
//
// The static token of earlier versions (an HMAC of a fixed label, the
// same on every call) is accepted only on a TLS connection, where it
// cannot be captured, and sent beside the call token only on one, so that
// members of both versions call each other during a rolling upgrade of a
// TLS cluster (a framed pipe's v2 hello is refused by an earlier member,
// whose client then uses a gRPC stream); over plaintext it is neither
// sent nor accepted, and a plaintext cluster with a secret upgrades all
// members at once.
//
// One operation carries more than the call's token: a peer reset, the
// one peer operation that clears a key outright, must also carry a reset
// proof (ResetProof), an HMAC of the key keyed by a second key derived
// from the secret. Only a node that took the reset from a caller its own
// Config.AuthorizeReset allowed (or an in-process Node.Reset) makes one,
// and a framed pipe, whose requests carry no metadata, resets nothing.

// CallTokenKey is the gRPC metadata key carrying a peer call's token.
const CallTokenKey = "ringlimit-peer-call"

// TokenKey is the gRPC metadata key of the static token of earlier
// versions: sent beside the call token on TLS connections only, for
// members of an earlier version during a rolling upgrade, and accepted
// only on TLS connections.
const TokenKey = "ringlimit-peer-token"

// ResetProofKey is the gRPC metadata key carrying a reset's proof.
const ResetProofKey = "ringlimit-reset-proof"

// Labels derive keys and tokens from the secret; changing one changes
// every token (a protocol change).
const (
	resetLabel = "ringlimit/v1 reset proof"
	tokenLabel = "ringlimit/v1 peer rpc" // the static token of earlier versions
	callLabel  = "ringlimit/v2 peer auth"
)

// ReplayWindow bounds how far a call token's time may be from the
// receiver's clock: members' wall clocks must agree within it (NTP keeps
// them within milliseconds), and a session idle for twice as long is
// forgotten.
const ReplayWindow = 30 * time.Second

// ReplayWindowCalls is how many counters behind a session's newest a call
// may arrive (calls sent concurrently overtake each other).
const ReplayWindowCalls = 4096

// maxSessions bounds the sessions a receiver remembers. Only a holder of
// the secret makes one (the token's HMAC is checked first).
const maxSessions = 1 << 16

// AuthConfig is what a node's peer authentication is made of.
type AuthConfig struct {
	// Secret authenticates peers by call tokens and hello challenges;
	// none if empty.
	Secret []byte
	// MutualTLS: the server requires and verifies client certificates.
	MutualTLS bool
	// PeerNames are patterns (path.Match: '*' matches any run of
	// characters but '/') matched against a verified certificate's DNS
	// and URI SANs: a certificate is a peer's if one matches. None: every
	// verified certificate is a peer's.
	PeerNames []string
	// Self is this member's name: tokens and hellos are made for a
	// receiver, and this member accepts only those made for it.
	Self string
	// Protected are the method prefixes ("/package.Service/") only peers
	// may call.
	Protected []string
	// Now is the wall clock of call tokens (time.Now if nil).
	Now func() time.Time
}

// Auth is a node's peer authentication, fixed when the node starts; the
// zero Auth is open.
type Auth struct {
	callKey   []byte // keys call tokens and hello proofs; nil without a secret
	legacy    string // hex HMAC of tokenLabel: the earlier static token
	resetKey  []byte // HMAC of resetLabel: keys reset proofs; nil without a secret
	mtls      bool
	peerNames []string
	self      string
	protected []string
	now       func() time.Time
	startMs   int64 // the wall clock when the Auth was made
	seen      *replayCache
}

// NewAuth returns the peer authentication cfg describes.
func NewAuth(cfg AuthConfig) Auth {
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	a := Auth{mtls: cfg.MutualTLS, peerNames: cfg.PeerNames, self: cfg.Self, protected: cfg.Protected, now: now}
	if len(cfg.Secret) > 0 {
		a.legacy = hex.EncodeToString(mac(cfg.Secret, []byte(tokenLabel)))
		a.resetKey = mac(cfg.Secret, []byte(resetLabel))
		a.callKey = mac(cfg.Secret, []byte(callLabel))
		a.startMs = now().UnixMilli()
		a.seen = newReplayCache()
	}
	return a
}

func mac(key []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// ResetProof is the proof a peer reset of the key encoded as key carries
// in its call's metadata (ResetProofKey): "" without a secret. The
// caller makes one only for a reset it has authorized.
func (a Auth) ResetProof(key []byte) string {
	if a.resetKey == nil {
		return ""
	}
	return hex.EncodeToString(mac(a.resetKey, key))
}

// CheckResetProof decides a peer reset of the key encoded as key: with a
// secret, the call's metadata must carry its proof (ResetProof), so that
// a framed pipe (whose requests carry no metadata) resets nothing.
// Without a secret peers are authenticated by a verified certificate (TLS:
// nothing to replay) or not at all, and every reset passes. A refusal is
// a gRPC status.
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
func (a Auth) Open() bool { return a.callKey == nil && !a.mtls }

// LegacyToken is the static token earlier versions sent ("" without a
// secret): accepted only on TLS connections (tests replay it).
func (a Auth) LegacyToken() string { return a.legacy }

// PeerCert reports whether a connection's TLS state shows a verified
// client certificate of a peer (AuthConfig.PeerNames).
func (a Auth) PeerCert(cs *tls.ConnectionState) bool {
	if !a.mtls || cs == nil || len(cs.VerifiedChains) == 0 || len(cs.PeerCertificates) == 0 {
		return false
	}
	return PeerNameMatch(a.peerNames, cs.PeerCertificates[0])
}

// PeerNameMatch reports whether one of cert's DNS or URI SANs matches one
// of patterns (path.Match); an empty pattern list matches every
// certificate. A malformed pattern matches nothing (config validation
// rejects it: ValidPeerNames).
func PeerNameMatch(patterns []string, cert *x509.Certificate) bool {
	if len(patterns) == 0 {
		return true
	}
	names := append([]string(nil), cert.DNSNames...)
	for _, u := range cert.URIs {
		names = append(names, u.String())
	}
	for _, p := range patterns {
		for _, n := range names {
			if ok, err := path.Match(p, n); ok && err == nil {
				return true
			}
		}
	}
	return false
}

// ValidPeerNames reports the first malformed pattern's error.
func ValidPeerNames(patterns []string) error {
	for _, p := range patterns {
		if p == "" {
			return errors.New("an empty peer name pattern")
		}
		if _, err := path.Match(p, ""); err != nil {
			return fmt.Errorf("peer name pattern %q: %w", p, err)
		}
	}
	return nil
}

// notPeer is the refusal of a verified certificate that is not a peer's.
func notPeer(cs *tls.ConnectionState) error {
	var sans []string
	if len(cs.PeerCertificates) > 0 {
		c := cs.PeerCertificates[0]
		sans = append(sans, c.DNSNames...)
		for _, u := range c.URIs {
			sans = append(sans, u.String())
		}
	}
	s := strings.Join(sans, ",")
	if len(s) > 120 {
		s = s[:120] + "..."
	}
	return status.Errorf(codes.PermissionDenied, "the client certificate (SANs %s) is not a peer's: it matches no peer name pattern", s)
}

// check admits every unprotected method, and a protected one from an
// authenticated peer (or from anyone when authentication is off).
func (a Auth) check(ctx context.Context, method string) error {
	if a.Open() || !a.isProtected(method) {
		return nil
	}
	var cs *tls.ConnectionState
	if p, ok := grpcpeer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			cs = &ti.State
		}
	}
	if a.PeerCert(cs) {
		return nil
	}
	token := ""
	if got := metadata.ValueFromIncomingContext(ctx, CallTokenKey); len(got) > 0 {
		token = got[0]
	} else if got := metadata.ValueFromIncomingContext(ctx, TokenKey); len(got) > 0 {
		token = got[0]
	}
	return a.admitToken(cs, method, token)
}

// admitToken decides a call that no peer certificate admitted, by its
// token: a call token, or the static token of earlier versions on a TLS
// connection (cs set).
func (a Auth) admitToken(cs *tls.ConnectionState, method, token string) error {
	if a.callKey == nil {
		if cs != nil && len(cs.VerifiedChains) > 0 {
			return notPeer(cs)
		}
		return status.Error(codes.Unauthenticated, "peer RPCs need a verified client certificate")
	}
	switch {
	case token == "":
		if cs != nil && len(cs.VerifiedChains) > 0 && a.mtls {
			return notPeer(cs)
		}
		return status.Error(codes.Unauthenticated, "peer RPCs need the cluster's peer token")
	case strings.HasPrefix(token, callTokenPrefix):
		return a.checkCallToken(method, token)
	case hmac.Equal([]byte(token), []byte(a.legacy)):
		if cs == nil {
			return status.Error(codes.PermissionDenied, "the static peer token of earlier versions is refused over plaintext (it can be captured and replayed): upgrade every member")
		}
		return nil
	}
	return status.Error(codes.PermissionDenied, "wrong peer token: the caller's PeerSecret (or GossipKey) differs")
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

// DialOptions make a peer client of member receiver send a fresh call
// token on every call (none without a secret); over TLS (tls) the static
// token of earlier versions too, which members of an earlier version
// check (a rolling upgrade of a TLS cluster) and TLS keeps from being
// captured.
func (a Auth) DialOptions(receiver string, tls bool) []grpc.DialOption {
	if a.callKey == nil {
		return nil
	}
	return []grpc.DialOption{grpc.WithPerRPCCredentials(a.callCredsFor(receiver, tls))}
}
