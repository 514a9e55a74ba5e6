package transport

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

const healthCheck = "/grpc.health.v1.Health/Check"

// TestAuth: with a secret, a protected method needs a call token made
// from it for this member and method (none: Unauthenticated; another
// secret's, member's or method's, or the static token over plaintext:
// PermissionDenied); with mutual TLS alone, a verified certificate;
// unprotected methods and an open Auth admit anyone.
func TestAuth(t *testing.T) {
	cfg := func(secret string, self string, mtls bool) AuthConfig {
		return AuthConfig{Secret: []byte(secret), Self: self, MutualTLS: mtls, Protected: []string{"/p.Peer/"}}
	}
	mine := NewAuth(cfg("s3cret", "n1", false))
	sender := NewAuth(cfg("s3cret", "n0", false))
	theirs := NewAuth(cfg("other", "n0", false))
	mtls := NewAuth(cfg("", "n1", true))
	open := NewAuth(cfg("", "n1", false))
	if mine.Open() || mtls.Open() || !open.Open() {
		t.Fatal("Open: want only the Auth without secret and mTLS open")
	}
	var session [8]byte
	next := uint64(0)
	tok := func(a Auth, method, receiver string) string {
		next++
		return a.CallTokenForTest(method, receiver, session, next)
	}
	call := func(a Auth, method, token string) codes.Code {
		ctx := context.Background()
		if token != "" {
			key := TokenKey // the static token's key
			if strings.HasPrefix(token, callTokenPrefix) {
				key = CallTokenKey
			}
			ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(key, token))
		}
		return status.Code(a.check(ctx, method))
	}
	for _, tc := range []struct {
		name   string
		a      Auth
		method string
		token  string
		want   codes.Code
	}{
		{"a call token", mine, "/p.Peer/Check", tok(sender, "/p.Peer/Check", "n1"), codes.OK},
		{"no token", mine, "/p.Peer/Check", "", codes.Unauthenticated},
		{"another secret's token", mine, "/p.Peer/Check", tok(theirs, "/p.Peer/Check", "n1"), codes.PermissionDenied},
		{"made for another member", mine, "/p.Peer/Check", tok(sender, "/p.Peer/Check", "n2"), codes.PermissionDenied},
		{"made for another method", mine, "/p.Peer/Check", tok(sender, "/p.Peer/Lease", "n1"), codes.PermissionDenied},
		{"static token over plaintext", mine, "/p.Peer/Check", mine.LegacyToken(), codes.PermissionDenied},
		{"garbage", mine, "/p.Peer/Check", "2:zz", codes.PermissionDenied},
		{"public method", mine, "/p.Public/Allow", "", codes.OK},
		{"prefix is a service, not a substring", mine, "/p.PeerX/Check", "", codes.OK},
		{"mTLS without a verified certificate", mtls, "/p.Peer/Check", "anything", codes.Unauthenticated},
		{"open", open, "/p.Peer/Check", "", codes.OK},
	} {
		if got := call(tc.a, tc.method, tc.token); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if opts := mine.DialOptions("n0", false); len(opts) != 1 {
		t.Errorf("DialOptions with a secret: %d options, want 1", len(opts))
	}
	if opts := open.DialOptions("n0", false); len(opts) != 0 {
		t.Errorf("DialOptions without a secret: %d options, want none", len(opts))
	}
}

// TestCallTokenFresh: a call token is accepted once (a replay is refused,
// also out of order within the window and after the window moved past
// it), only within ReplayWindow of the receiver's clock and not before
// the receiver started; calls that overtake each other are accepted.
func TestCallTokenFresh(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { return now }
	recv := NewAuth(AuthConfig{Secret: []byte("k"), Self: "n1", Protected: []string{"/p.Peer/"}, Now: clock})
	send := NewAuth(AuthConfig{Secret: []byte("k"), Self: "n0", Now: clock})
	var session [8]byte
	m := "/p.Peer/Check"
	ok := func(tok string) error { return recv.checkCallToken(m, tok) }
	t5 := send.CallTokenForTest(m, "n1", session, 5)
	t3 := send.CallTokenForTest(m, "n1", session, 3)
	if err := ok(t5); err != nil {
		t.Fatalf("first use: %v", err)
	}
	if err := ok(t3); err != nil {
		t.Fatalf("an overtaken call: %v", err)
	}
	for name, tok := range map[string]string{"replayed": t5, "replayed, out of order": t3} {
		if err := ok(tok); status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: %v, want PermissionDenied", name, err)
		}
	}
	far := send.CallTokenForTest(m, "n1", session, 5+ReplayWindowCalls+10)
	if err := ok(far); err != nil {
		t.Fatalf("a call far ahead: %v", err)
	}
	if err := ok(send.CallTokenForTest(m, "n1", session, 6)); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a call the window moved past: %v, want PermissionDenied", err)
	}
	// Made ReplayWindow+1s ago (its sender's clock behind): refused,
	// though its session is new.
	now = now.Add(ReplayWindow + time.Second)
	if err := ok(send.CallTokenForTest(m, "n1", [8]byte{1}, 1)); err != nil {
		t.Fatalf("a new session: %v", err)
	}
	old := NewAuth(AuthConfig{Secret: []byte("k"), Self: "n0", Now: func() time.Time { return now.Add(-ReplayWindow - time.Second) }})
	if err := ok(old.CallTokenForTest(m, "n1", [8]byte{2}, 1)); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a token older than the window: %v, want PermissionDenied", err)
	}
	// The receiver forgets an idle session; every token of it is too old
	// by then.
	now = now.Add(3 * ReplayWindow)
	if err := ok(send.CallTokenForTest(m, "n1", [8]byte{3}, 1)); err != nil {
		t.Fatalf("a new session: %v", err)
	}
	if n := len(recv.seen.sessions); n != 1 {
		t.Errorf("%d sessions remembered after 3 windows idle, want 1", n)
	}
	if err := ok(far); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a forgotten session's token: %v, want PermissionDenied", err)
	}
	// A receiver restarted (a new Auth) refuses tokens made before.
	before := send.CallTokenForTest(m, "n1", [8]byte{4}, 1)
	now = now.Add(time.Millisecond)
	restarted := NewAuth(AuthConfig{Secret: []byte("k"), Self: "n1", Now: clock})
	if err := restarted.checkCallToken(m, before); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a token made before the receiver started: %v, want PermissionDenied", err)
	}
}

// TestCallTokenReplayOverGRPC captures the metadata of a real peer call
// on 127.0.0.1 and sends it again: refused, while the client's own next
// call goes through.
func TestCallTokenReplayOverGRPC(t *testing.T) {
	prot := []string{"/grpc.health.v1.Health/"}
	srvA := NewAuth(AuthConfig{Secret: []byte("k"), Self: "n1", Protected: prot})
	cliA := NewAuth(AuthConfig{Secret: []byte("k"), Self: "n0"})
	var mu sync.Mutex
	var captured []string
	capture := grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		mu.Lock()
		captured = append(captured, metadata.ValueFromIncomingContext(ctx, CallTokenKey)...)
		if len(metadata.ValueFromIncomingContext(ctx, TokenKey)) > 0 {
			t.Error("the static token was sent over plaintext")
		}
		mu.Unlock()
		return h(ctx, req)
	})
	s := grpc.NewServer(append([]grpc.ServerOption{capture}, srvA.ServerOptions()...)...)
	healthpb.RegisterHealthServer(s, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(lis) }()
	defer s.Stop()
	dial := func(opts ...grpc.DialOption) healthpb.HealthClient {
		conn, err := grpc.NewClient(lis.Addr().String(), append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return healthpb.NewHealthClient(conn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	peerCli := dial(cliA.DialOptions("n1", false)...)
	if _, err := peerCli.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("a peer call: %v", err)
	}
	mu.Lock()
	tok := captured[0]
	mu.Unlock()
	attacker := dial()
	_, err = attacker.Check(metadata.AppendToOutgoingContext(ctx, CallTokenKey, tok), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("the captured token replayed: %v, want PermissionDenied", err)
	}
	if _, err := peerCli.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("the peer's next call: %v", err)
	}
}

// TestHelloReplay opens a framed pipe through a recording proxy, then
// sends every byte the client sent to the server again on a new
// connection: the server's fresh challenge makes the recorded answer
// wrong, and the pipe is refused.
func TestHelloReplay(t *testing.T) {
	l, _ := serveEcho(t)
	proxy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	var rec bytes.Buffer
	var recMu sync.Mutex
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := proxy.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		up, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			return
		}
		defer up.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = io.Copy(c, up)
			c.Close()
		}()
		buf := make([]byte, 4096)
		for {
			k, err := c.Read(buf)
			recMu.Lock()
			rec.Write(buf[:k])
			recMu.Unlock()
			if _, werr := up.Write(buf[:k]); err != nil || werr != nil {
				up.Close()
				return
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fc, err := Dial(ctx, proxy.Addr().String(), KindCheck, good, nil)
	if err != nil {
		t.Fatalf("a pipe through the proxy: %v", err)
	}
	fc.Close()
	proxy.Close()
	wg.Wait()
	recMu.Lock()
	sent := append([]byte(nil), rec.Bytes()...)
	recMu.Unlock()

	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(sent); err != nil {
		t.Fatal(err)
	}
	r := NewConn(c)
	ch, err := r.ReadFrame(MaxHello)
	if err != nil || len(ch) != 1+nonceLen || ch[0] != challengeTag {
		t.Fatalf("first answer to the replayed hello = %x, %v; want a challenge", ch, err)
	}
	ans, err := r.ReadFrame(MaxHello)
	if err != nil {
		t.Fatalf("answer to the replayed proof: %v", err)
	}
	if err := refusal(ans); !errors.Is(err, ErrRefused) || status.Code(err) != codes.PermissionDenied {
		t.Fatalf("the replayed hello: %v, want refused with PermissionDenied", err)
	}
}

// TestPeerNames: a verified certificate is a peer's only if one of its
// DNS or URI SANs matches a pattern (every one with no patterns); a
// client certificate of the same CA is refused on a protected method
// with PermissionDenied, and still served on a public one.
func TestPeerNames(t *testing.T) {
	cert := func(dns []string, uris ...string) *tls.ConnectionState {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "x"}, DNSNames: dns, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
		for _, u := range uris {
			pu, _ := url.Parse(u)
			tmpl.URIs = append(tmpl.URIs, pu)
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return &tls.ConnectionState{PeerCertificates: []*x509.Certificate{c}, VerifiedChains: [][]*x509.Certificate{{c}}}
	}
	peerPod := cert([]string{"ringlimit-0.ringlimit.default.svc.cluster.local"})
	spiffe := cert(nil, "spiffe://cluster.local/ns/default/sa/ringlimit")
	envoy := cert([]string{"envoy.default.svc.cluster.local"})
	a := NewAuth(AuthConfig{MutualTLS: true, PeerNames: []string{"*.ringlimit.default.svc.cluster.local", "spiffe://cluster.local/ns/default/sa/ringlimit"}, Protected: []string{"/p.Peer/"}})
	every := NewAuth(AuthConfig{MutualTLS: true})
	for _, tc := range []struct {
		name string
		a    Auth
		cs   *tls.ConnectionState
		want bool
	}{
		{"pod DNS SAN", a, peerPod, true},
		{"SPIFFE URI SAN", a, spiffe, true},
		{"Envoy's certificate", a, envoy, false},
		{"no certificate", a, nil, false},
		{"no patterns: every certificate", every, envoy, true},
	} {
		if got := tc.a.PeerCert(tc.cs); got != tc.want {
			t.Errorf("%s: PeerCert = %v, want %v", tc.name, got, tc.want)
		}
	}
	ctx := grpcpeer.NewContext(context.Background(), &grpcpeer.Peer{AuthInfo: credentials.TLSInfo{State: *envoy}})
	if err := a.check(ctx, "/p.Peer/Check"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Envoy's certificate on a peer method: %v, want PermissionDenied", err)
	}
	if err := a.check(ctx, "/p.Public/Allow"); err != nil {
		t.Errorf("Envoy's certificate on a public method: %v, want served", err)
	}
	pctx := grpcpeer.NewContext(context.Background(), &grpcpeer.Peer{AuthInfo: credentials.TLSInfo{State: *peerPod}})
	if err := a.check(pctx, "/p.Peer/Check"); err != nil {
		t.Errorf("a peer's certificate on a peer method: %v, want served", err)
	}
	if err := ValidPeerNames([]string{"[bad"}); err == nil {
		t.Error("ValidPeerNames([bad) = nil, want an error")
	}
}

// TestCallCredentialsStaticOnlyOverTLS: a peer client sends the static
// token of earlier versions beside its call token over TLS only (members
// of both versions call each other during a rolling upgrade of a TLS
// cluster), never over plaintext, where it could be captured; a member of
// this version accepts the static token on a TLS connection only.
func TestCallCredentialsStaticOnlyOverTLS(t *testing.T) {
	a := NewAuth(AuthConfig{Secret: []byte("k"), Self: "n0"})
	ctx := credentials.NewContextWithRequestInfo(context.Background(), credentials.RequestInfo{Method: "/p.Peer/Check"})
	for _, tls := range []bool{false, true} {
		md, err := a.callCredsFor("n1", tls).GetRequestMetadata(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(md[CallTokenKey], callTokenPrefix) {
			t.Errorf("tls %v: call token %q", tls, md[CallTokenKey])
		}
		if got := md[TokenKey] == a.LegacyToken(); got != tls {
			t.Errorf("tls %v: static token sent = %v", tls, got)
		}
	}
	srv := NewAuth(AuthConfig{Secret: []byte("k"), Self: "n1", Protected: []string{"/p.Peer/"}})
	if err := srv.admitToken(&tls.ConnectionState{}, "/p.Peer/Check", a.LegacyToken()); err != nil {
		t.Errorf("the static token on a TLS connection: %v", err)
	}
	if err := srv.admitToken(nil, "/p.Peer/Check", a.LegacyToken()); status.Code(err) != codes.PermissionDenied {
		t.Errorf("the static token over plaintext: %v, want PermissionDenied", err)
	}
}
