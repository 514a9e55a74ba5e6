package peer

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/ringlimit/ringlimit/peer/internal/ownlog"
	"github.com/ringlimit/ringlimit/peer/internal/transport"
	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// testCA is a CA that mints certificates for tests.
type testCA struct {
	t    *testing.T
	ca   *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	next int64
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "peer-name test CA"},
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
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &testCA{t: t, ca: ca, key: key, pool: pool, next: 1}
}

// mint is a certificate for 127.0.0.1 with the given DNS and URI SANs,
// good for serving and as a client's.
func (c *testCA) mint(dns []string, uris ...string) tls.Certificate {
	c.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		c.t.Fatal(err)
	}
	c.next++
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(c.next), Subject: pkix.Name{CommonName: "leaf"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: dns,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, u := range uris {
		pu, err := url.Parse(u)
		if err != nil {
			c.t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, pu)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.ca, &key.PublicKey, c.key)
	if err != nil {
		c.t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestPeerCertNames runs two nodes under mutual TLS whose certificates
// carry a peer's URI SAN, with PeerCertNames set (issue 53 item 5: every
// certificate of the CA was a peer's). A client certificate of the same
// CA with another SAN, as Envoy's, is refused on every peer-only path -
// Limiter Check, Replicate and Lease, the ownership log's Raft stream, a
// framed pipe - and changes nothing, while the public RateLimiter API
// serves it; the peers forward to each other.
func TestPeerCertNames(t *testing.T) {
	ca := newTestCA(t)
	const peerURI = "spiffe://test.local/ns/default/sa/ringlimit"
	nodeCert := ca.mint(nil, peerURI)
	serverCfg := &tls.Config{Certificates: []tls.Certificate{nodeCert}, ClientCAs: ca.pool, ClientAuth: tls.RequireAndVerifyClientCert}
	clientCfg := &tls.Config{Certificates: []tls.Certificate{nodeCert}, RootCAs: ca.pool}
	envoyCfg := &tls.Config{Certificates: []tls.Certificate{ca.mint([]string{"envoy.default.svc.cluster.local"})}, RootCAs: ca.pool}
	pols := map[string]PolicyConfig{"p": {Limit: 5, Window: time.Minute}}
	c := startCluster(t, 2, Config{Policies: pols, ServerTLS: serverCfg, ClientTLS: clientCfg, PeerCertNames: []string{"spiffe://test.local/ns/*/sa/ringlimit"}, ForwardTimeout: 5 * time.Second})
	n0, n1 := c.nodes[0], c.nodes[1]
	key := pmKeyOwnedBy(t, n0, "p", "n1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if d, err := n0.Allow(ctx, Request{Key: key}); err != nil || !d.Allowed || d.Owner != "n1" {
		t.Fatalf("a forward between peers = %+v, %v; want admitted by n1", d, err)
	}
	conn, err := grpc.NewClient(n1.RPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(envoyCfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	lim := peerpb.NewLimiterClient(conn)
	wireKey := &peerpb.Key{Tenant: key.Tenant, Subject: key.Subject, Policy: key.Policy}
	refused := func(what string, err error) {
		t.Helper()
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s with Envoy's certificate = %v, want PermissionDenied", what, err)
		}
	}
	_, err = lim.Check(ctx, &peerpb.CheckRequest{Sender: "n0", Items: []*peerpb.CheckItem{{Key: wireKey, Hits: 2}, {Key: wireKey, Op: peerpb.Op_OP_RESET}}})
	refused("Limiter/Check", err)
	_, err = lim.Replicate(ctx, &peerpb.ReplicateRequest{Sender: "n0", Ops: []*peerpb.PartitionOp{{Kind: peerpb.PartitionOp_KIND_SYNC_BEGIN, Epoch: 1 << 40}}})
	refused("Limiter/Replicate", err)
	_, err = lim.Lease(ctx, &peerpb.LeaseRequest{Sender: "n0", Item: &peerpb.CheckItem{Key: wireKey, Hits: 1, Op: peerpb.Op_OP_ACQUIRE}})
	refused("Limiter/Lease", err)
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{StreamName: "Stream", ClientStreams: true}, "/"+ownlog.ServiceName+"/Stream")
	if err == nil {
		_ = st.SendMsg(wrapperspb.Bytes([]byte{1, 2, 3}))
		_ = st.CloseSend()
		err = st.RecvMsg(&wrapperspb.BytesValue{})
	}
	refused("the ownership log's Raft stream", err)
	_, err = transport.Dial(ctx, n1.RPCAddr(), transport.KindCheck, transport.Credential{}, envoyCfg)
	if !errors.Is(err, transport.ErrRefused) {
		t.Errorf("a framed pipe with Envoy's certificate = %v, want refused", err)
	}
	refused("a framed pipe", err)
	if runs, _ := n1.ExportForTest(key); len(runs) != 1 || runs[0].Count != 1 {
		t.Errorf("n1's log of the key after the refused calls = %v, want the one peer admission", runs)
	}
	r, err := peerpb.NewRateLimiterClient(conn).Allow(ctx, &peerpb.AllowRequest{Key: wireKey})
	if err != nil || !r.GetAllowed() || r.GetRemaining() != 3 {
		t.Fatalf("public RateLimiter/Allow with Envoy's certificate = %v, %v; want admitted, 3 remaining", r, err)
	}
}

// TestPeerCertNamesInvalid: a malformed pattern is ErrInvalidConfig.
func TestPeerCertNamesInvalid(t *testing.T) {
	_, err := New(context.Background(), Config{Name: "n0", PeerCertNames: []string{"spiffe://x/[bad"}})
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New with a malformed peer name pattern = %v, want ErrInvalidConfig", err)
	}
}
