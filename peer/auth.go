package peer

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"

	"github.com/ringlimit/ringlimit/peer/internal/ownlog"
	"github.com/ringlimit/ringlimit/peer/internal/transport"
)

// The gRPC port serves two audiences: clients (the public RateLimiter
// service and health) and peers (the Limiter service: forwards, handoff,
// pull, backup; and the ownership log). A peer RPC changes or reveals
// limiter state on the owner's word alone, so it is accepted only from
// authenticated peers (transport.Auth states the rules): by fresh tokens
// derived from Config.PeerSecret, else Config.GossipKey (one per call,
// accepted once; a challenge in a framed pipe's hello), or by a client
// certificate verified under mutual TLS (ServerTLS requiring and
// verifying them) whose SANs match Config.PeerCertNames. With neither,
// peer RPCs stay open (as before this check existed), and New logs a
// warning and reports it through Metrics.PeerRPCOpen. Public RPCs and
// health are never checked.
//
// A peer reset needs more than the call's token (issue 53 item 6): the
// public Reset is judged once, by Config.AuthorizeReset on the member
// that received it (the entry), which then forwards it to the holder as
// a unary Limiter.Check carrying a reset proof (transport.Auth.ResetProof,
// an HMAC of the key under a key derived from the secret that never
// travels). The holder decides a peer OP_RESET only with that proof
// (decideWire): it cannot judge the original caller itself (the
// credential may be a token it does not have, or a certificate it never
// saw), so the proof stands for "a member authorized this reset of this
// key". A reset on a stream or a framed pipe, which carry no per-request
// metadata, is refused.

// peerService prefixes every peer-only method name.
const peerService = "/ringlimit.v1.Limiter/"

// logService is the prefix of the ownership log's methods: peer methods
// too (a raft message from anyone could change who holds what).
const logService = "/" + ownlog.ServiceName + "/"

func newPeerAuth(cfg Config) transport.Auth {
	secret := cfg.PeerSecret
	if len(secret) == 0 {
		secret = cfg.GossipKey
	}
	mtls := cfg.ServerTLS != nil && cfg.ServerTLS.ClientAuth == tls.RequireAndVerifyClientCert
	return transport.NewAuth(transport.AuthConfig{
		Secret: secret, MutualTLS: mtls, PeerNames: cfg.PeerCertNames, Self: cfg.Name,
		Protected: []string{peerService, logService},
	})
}

// PeerCertName reports whether cert is a peer's by patterns
// (Config.PeerCertNames): one of its DNS or URI SANs matches one of them,
// or there are none. serve uses it for its own guards (Reset, Refund), so
// that Envoy's certificate is not an admin's either.
func PeerCertName(patterns []string, cert *x509.Certificate) bool {
	return transport.PeerNameMatch(patterns, cert)
}

// ValidPeerCertNames reports the first malformed pattern of
// Config.PeerCertNames.
func ValidPeerCertNames(patterns []string) error { return transport.ValidPeerNames(patterns) }

// resetProofInput is what a reset's proof authenticates: the key's
// canonical encoding, or its parts length-prefixed when it does not
// encode (it is refused later as invalid all the same).
func resetProofInput(k Key) []byte {
	if ek, ok := k.AppendEncoded(nil); ok {
		return ek
	}
	var b []byte
	for _, s := range []string{k.Tenant, k.Subject, k.Policy} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}
