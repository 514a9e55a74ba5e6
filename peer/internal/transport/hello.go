package transport

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A framed pipe's hello (see auth.go). The client's first frame is the
// kind, then either
//
//   - helloV2, its nonce (nonceLen bytes) and its member name: the
//     server answers challengeTag and a nonce of its own, the client
//     answers with helloProof, and the server then answers as below; or
//   - a static token (earlier versions; "" without a secret): accepted
//     only under TLS, or with a peer's certificate.
//
// The server's last answer is 0 (accepted) or a gRPC code and a message.
// A server of an earlier version takes a v2 hello for a wrong token and
// refuses it; the client then uses a gRPC stream.
const (
	helloV2      = "RLv2"
	nonceLen     = 16
	challengeTag = 0xff
)

// helloProof is the client's answer to the server's challenge.
func (a Auth) helloProof(kind byte, clientNonce, serverNonce []byte, sender, receiver string) []byte {
	return mac(a.callKey, []byte("hello\x00"), []byte{kind}, clientNonce, serverNonce, []byte(sender), []byte{0}, []byte(receiver))
}

// Credential is what a framed pipe's client presents in its hello.
type Credential struct {
	auth     *Auth  // answers the challenge; nil: Token
	receiver string // the member dialled
	// Token is sent as is (earlier versions' static token; tests).
	Token string
}

// PipeCredential is the credential of this member's pipes to member
// receiver: the challenge with a secret, else nothing (a certificate
// speaks for it under mutual TLS).
func (a Auth) PipeCredential(receiver string) Credential {
	if a.callKey == nil {
		return Credential{}
	}
	return Credential{auth: &a, receiver: receiver}
}

// clientHello runs the client's side of the hello on fc.
func (c Credential) clientHello(fc *Conn, kind byte) error {
	if c.auth == nil {
		return fc.WriteRaw(append([]byte{kind}, c.Token...))
	}
	cn := make([]byte, nonceLen)
	_, _ = rand.Read(cn)
	hello := append(append(append([]byte{kind}, helloV2...), cn...), c.auth.self...)
	if err := fc.WriteRaw(hello); err != nil {
		return err
	}
	ch, err := fc.ReadFrame(MaxHello)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	if len(ch) != 1+nonceLen || ch[0] != challengeTag {
		// Refused at once: a server of an earlier version.
		if err := refusal(ch); err != nil {
			return err
		}
		return fmt.Errorf("%w: a v2 hello accepted without its challenge", ErrRefused)
	}
	return fc.WriteRaw(c.auth.helloProof(kind, cn, ch[1:], c.auth.self, c.receiver))
}

// refusal is the error of the server's answer ans (0: none).
func refusal(ans []byte) error {
	switch {
	case len(ans) == 0:
		return fmt.Errorf("%w: empty answer", ErrRefused)
	case ans[0] != 0:
		return fmt.Errorf("%w: %w", ErrRefused, status.Error(codes.Code(ans[0]), string(ans[1:])))
	}
	return nil
}

// errNoProof ends a hello whose client sent no answer to the challenge.
var errNoProof = errors.New("no answer to the challenge")

// serverHello decides the hello frame hello of a connection with TLS
// state cs (nil: plaintext), running the challenge on fc when the client
// asks for it. A refusal is a gRPC status (sent back by the caller);
// errNoProof means the connection broke.
func (a Auth) serverHello(fc *Conn, cs *tls.ConnectionState, hello []byte) error {
	kind, body := hello[0], hello[1:]
	if !bytes.HasPrefix(body, []byte(helloV2)) {
		if a.Open() || a.PeerCert(cs) {
			return nil
		}
		return a.admitToken(cs, "", string(body))
	}
	body = body[len(helloV2):]
	if len(body) < nonceLen {
		return status.Error(codes.InvalidArgument, "short hello")
	}
	cn, sender := body[:nonceLen], string(body[nonceLen:])
	sn := make([]byte, nonceLen)
	_, _ = rand.Read(sn)
	if err := fc.WriteRaw(append([]byte{challengeTag}, sn...)); err != nil {
		return errNoProof
	}
	proof, err := fc.ReadFrame(MaxHello)
	if err != nil {
		return errNoProof
	}
	if a.Open() || a.PeerCert(cs) {
		return nil
	}
	if a.callKey == nil {
		return a.admitToken(cs, "", "")
	}
	if !hmac.Equal(proof, a.helloProof(kind, cn, sn, sender, a.self)) {
		return status.Error(codes.PermissionDenied, "wrong answer to the hello's challenge: the caller's PeerSecret (or GossipKey) differs, or it dialled another member")
	}
	return nil
}
