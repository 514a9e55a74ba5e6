package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// TestServeMutualTLS runs two nodes with mutual TLS on gRPC and an
// encrypted gossip key, forwards between them, and checks that a client
// without a certificate is refused. One node uses gRPC streams to its
// peer (--peer-pipes grpc), the other framed pipes over TLS: both kinds
// meet in one cluster.
func TestServeMutualTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca, cert, key := writeTestPKI(t, dir)
	gossipKey := writeFile(t, dir, "gossip.key", base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))+"\n")
	flags := []string{"--tls-ca", ca, "--tls-cert", cert, "--tls-key", key, "--gossip-key", gossipKey}
	a := startServe(t, "tls-a", nil, flags...)
	b := startServe(t, "tls-b", nil, append(flags, "--join", a.gossipAddr, "--peer-pipes", "grpc")...)
	waitFor(t, 15*time.Second, "both nodes to see 2 members", func() bool {
		for _, p := range []*serveProc{a, b} {
			r := doHTTP(t, "GET", "http://"+p.httpAddr+"/readyz", "")
			if r.status != 200 || r.body["members"] != 2.0 {
				return false
			}
		}
		return true
	})
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := loadCAPool(ca)
	if err != nil {
		t.Fatal(err)
	}
	creds := credentials.NewTLS(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}})
	conn, err := grpc.NewClient(a.grpcAddr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	owners := map[string]bool{}
	for i := range 40 {
		resp, err := peerpb.NewRateLimiterClient(conn).Allow(ctx, &peerpb.AllowRequest{
			Key: &peerpb.Key{Tenant: "acme", Subject: fmt.Sprintf("u%d", i), Policy: "default"},
		})
		if err != nil {
			t.Fatalf("Allow over mutual TLS: %v", err)
		}
		owners[resp.GetOwner()] = true
	}
	if !owners["tls-a"] || !owners["tls-b"] {
		t.Errorf("owners %v: want decisions from both nodes (forwarding over mutual TLS)", owners)
	}
	// Without --admin-token-file a verified client certificate may still
	// reset (the port is the guard), and the start-up log says so.
	if _, err := peerpb.NewRateLimiterClient(conn).Reset(ctx, &peerpb.AllowRequest{Key: &peerpb.Key{Tenant: "acme", Subject: "u0", Policy: "default"}}); err != nil {
		t.Errorf("Reset with a verified client certificate and no admin token: %v", err)
	}
	if !strings.Contains(a.logText(), "reset: only with a client certificate the node verifies") {
		t.Errorf("start-up log does not say who may reset")
	}
	// The check command with and without a client certificate.
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"with client certificate", []string{"--tls-ca", ca, "--tls-cert", cert, "--tls-key", key}, exitOK},
		// Set-up mistakes: the node never answered in gRPC (exit 4, not
		// 3, which is the node's own "could not decide").
		{"without client certificate", []string{"--tls-ca", ca}, exitUnreachable},
		{"plaintext", nil, exitUnreachable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"check", "--addr", a.grpcAddr, "--tenant", "t", "--subject", "s", "--policy", "default", "--timeout", "3s"}, tc.args...)
			var out bytes.Buffer
			if code := exitCode(run(context.Background(), args, &out, &out), &out); code != tc.want {
				t.Errorf("check %s: exit code %d, want %d\n%s", tc.name, code, tc.want, out.String())
			}
		})
	}
}

// writeTestPKI writes a CA and one certificate for 127.0.0.1, usable as
// both server and client, and returns the three PEM paths.
func writeTestPKI(t *testing.T, dir string) (caPath, certPath, keyPath string) {
	t.Helper()
	return writeTestPKIFor(t, dir, []net.IP{net.ParseIP("127.0.0.1")}, nil)
}

// writeTestPKIFor is writeTestPKI with the leaf's SANs given: ips and
// dnsNames.
func writeTestPKIFor(t *testing.T, dir string, ips []net.IP, dnsNames []string) (caPath, certPath, keyPath string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ringlimit test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "ringlimit node"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IPAddresses: ips, DNSNames: dnsNames,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(leafKey)
	if err != nil {
		t.Fatal(err)
	}
	pemOf := func(typ string, der []byte) string {
		return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
	}
	return writeFile(t, dir, "ca.pem", pemOf("CERTIFICATE", caDER)),
		writeFile(t, dir, "node.pem", pemOf("CERTIFICATE", leafDER)),
		writeFile(t, dir, "node.key", pemOf("EC PRIVATE KEY", keyDER))
}

func TestLoadGossipKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	k24 := bytes.Repeat([]byte{1}, 24)
	for _, tc := range []struct {
		name    string
		content []byte
		want    []byte
	}{
		{"raw 16", bytes.Repeat([]byte{0xfe}, 16), bytes.Repeat([]byte{0xfe}, 16)},
		{"raw 32", bytes.Repeat([]byte{0x00}, 32), bytes.Repeat([]byte{0x00}, 32)},
		// The base64 of a 24-byte key is 32 bytes long: it must be decoded,
		// not taken as a raw 32-byte key.
		{"base64 of 24", []byte(base64.StdEncoding.EncodeToString(k24)), k24},
		{"base64 with newline", []byte(base64.StdEncoding.EncodeToString(k24) + "\n"), k24},
		{"wrong length", []byte("0123456789"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, dir, strings.ReplaceAll(tc.name, " ", "_"), string(tc.content))
			got, err := loadGossipKey(path)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("loadGossipKey(%q) = %x, want an error", tc.content, got)
				}
				return
			}
			if err != nil || !bytes.Equal(got, tc.want) {
				t.Errorf("loadGossipKey(%q) = %x, %v; want %x", tc.content, got, err, tc.want)
			}
		})
	}
	if _, err := loadGossipKey(filepath.Join(dir, "missing")); err == nil {
		t.Error("loadGossipKey(missing) returned no error")
	}
}
