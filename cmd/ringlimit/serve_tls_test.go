package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// testPKI is a CA and leaves of it, written as PEM files.
type testPKI struct {
	t      *testing.T
	dir    string
	caPath string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64
}

func newTestPKI(t *testing.T, dir string) *testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ringlimit test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	p := &testPKI{t: t, dir: dir, ca: ca, caKey: key, serial: 1}
	p.caPath = writeFile(t, dir, "ca.pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	return p
}

// leaf writes a certificate named name for 127.0.0.1 and dns, good for
// serving and as a client's, and returns its PEM paths.
func (p *testPKI) leaf(name string, dns ...string) (certPath, keyPath string) {
	p.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		p.t.Fatal(err)
	}
	p.serial++
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: dns,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		p.t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		p.t.Fatal(err)
	}
	return writeFile(p.t, p.dir, name+".pem", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))),
		writeFile(p.t, p.dir, name+".key", string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})))
}

// clientTLS is a client's config with the leaf at certPath (none if "").
func (p *testPKI) clientTLS(certPath, keyPath string) *tls.Config {
	p.t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	cfg := &tls.Config{RootCAs: pool}
	if certPath != "" {
		pair, err := tls.LoadX509KeyPair(certPath, keyPath)
		if err != nil {
			p.t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg
}

// TestServePeerNamesAndHTTPTLS runs serve with mutual TLS,
// --tls-peer-name, --http-tls and --ops-addr (issue 53 items 5 and 8).
// Envoy's certificate, of the same CA with another SAN, is served on the
// public gRPC API and the HTTP decision API, refused on a peer RPC and on
// Reset (no admin token: only a peer's certificate resets); a peer's
// certificate resets. The HTTP API refuses callers without a client
// certificate and plaintext ones; the ops listener stays plaintext.
func TestServePeerNamesAndHTTPTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pki := newTestPKI(t, dir)
	nodeCert, nodeKey := pki.leaf("node", "ringlimit-0.ringlimit.default.svc.cluster.local")
	envoyCert, envoyKey := pki.leaf("envoy", "envoy.default.svc.cluster.local")
	gossipKey := writeFile(t, dir, "gossip.key", base64.StdEncoding.EncodeToString([]byte(strings.Repeat("k", 32)))+"\n")
	pols := writeFile(t, dir, "policies.yaml", testPolicies)
	p := startServe(t, "tls-names", nil, "--policies", pols, "--tls-ca", pki.caPath, "--tls-cert", nodeCert, "--tls-key", nodeKey,
		"--gossip-key", gossipKey, "--tls-peer-name", "*.ringlimit.default.svc.cluster.local", "--http-tls", "--ops-addr", "127.0.0.1:0")
	waitFor(t, 10*time.Second, "/readyz 200 on the plaintext ops port", func() bool {
		r, err := httpDo("GET", "http://"+p.opsAddr+"/readyz", "")
		return err == nil && r.status == 200
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dial := func(cfg *tls.Config) *grpc.ClientConn {
		conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	envoy := dial(pki.clientTLS(envoyCert, envoyKey))
	key := &peerpb.Key{Tenant: "acme", Subject: "alice", Policy: "api"}
	if r, err := peerpb.NewRateLimiterClient(envoy).Allow(ctx, &peerpb.AllowRequest{Key: key}); err != nil || !r.GetAllowed() {
		t.Fatalf("public Allow with Envoy's certificate = %v, %v; want admitted", r, err)
	}
	_, err := peerpb.NewLimiterClient(envoy).Check(ctx, &peerpb.CheckRequest{Sender: "x", Items: []*peerpb.CheckItem{{Key: key, Op: peerpb.Op_OP_RESET}}})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("peer Limiter/Check with Envoy's certificate = %v, want PermissionDenied", err)
	}
	if _, err := peerpb.NewRateLimiterClient(envoy).Reset(ctx, &peerpb.AllowRequest{Key: key}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Reset with Envoy's certificate = %v, want Unauthenticated (not a peer's certificate)", err)
	}
	if r, err := peerpb.NewRateLimiterClient(dial(pki.clientTLS(nodeCert, nodeKey))).Reset(ctx, &peerpb.AllowRequest{Key: key}); err != nil || r.GetReason() != peerpb.Reason_REASON_RESET {
		t.Errorf("Reset with a peer's certificate = %v, %v; want reset", r, err)
	}

	post := func(cfg *tls.Config, scheme string) (int, string, error) {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		resp, err := c.Post(scheme+"://"+p.httpAddr+"/v1/check", "application/json", strings.NewReader(opsCheckBody))
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	if code, body, err := post(pki.clientTLS(envoyCert, envoyKey), "https"); err != nil || code != 200 {
		t.Errorf("POST /v1/check over TLS with a client certificate = %d %s, %v; want 200", code, body, err)
	}
	if code, _, err := post(pki.clientTLS("", ""), "https"); err == nil {
		t.Errorf("POST /v1/check over TLS without a client certificate = %d, want a TLS failure", code)
	}
	if code, body, err := post(nil, "http"); err == nil && code == 200 {
		t.Errorf("POST /v1/check in plaintext = %d %s, want refused", code, body)
	}
	if !strings.Contains(p.logText(), `"http_tls":true`) {
		t.Errorf("the serving line does not say the HTTP API is behind TLS")
	}
}

// TestServeTLSFlagsNeedTLS: --http-tls and --tls-peer-name without
// --tls-* are usage errors, as is a malformed pattern.
func TestServeTLSFlagsNeedTLS(t *testing.T) {
	for _, args := range [][]string{
		{"--http-tls"},
		{"--tls-peer-name", "*.x"},
		{"--tls-cert", "c", "--tls-key", "k", "--tls-ca", "a", "--tls-peer-name", "[bad"},
	} {
		if _, err := parseServeFlags(args, io.Discard); err == nil || !strings.Contains(err.Error(), "serve:") {
			t.Errorf("serve %v: %v, want a usage error", args, err)
		}
	}
}
