package peer

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/internal/transport"
	"github.com/ringlimit/ringlimit/peer/internal/wire"
	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// admitFromAll sends Allow for key from every node of c, calls times in
// all from 4 goroutines per node, and returns how many were admitted.
func admitFromAll(t *testing.T, c *cluster, key Key, calls int) int {
	t.Helper()
	var mu sync.Mutex
	admitted := 0
	var wg sync.WaitGroup
	per := calls / (4 * len(c.nodes))
	for _, nd := range c.nodes {
		for range 4 {
			wg.Go(func() {
				for range per {
					d, err := nd.Allow(context.Background(), Request{Key: key})
					if err != nil {
						t.Errorf("Allow via %s: %v", nd.Name(), err)
						return
					}
					if d.Allowed {
						mu.Lock()
						admitted++
						mu.Unlock()
					}
				}
			})
		}
	}
	wg.Wait()
	return admitted
}

// TestFramedPipesCarryForwards runs a 3-node cluster under sync
// replication: forwards and replication travel on framed pipes (each
// holder serves both kinds), and the key's owner still admits exactly its
// limit of the calls made through every node at once.
func TestFramedPipesCarryForwards(t *testing.T) {
	pols := map[string]PolicyConfig{"p": {Limit: 50, Window: time.Minute}}
	c := startCluster(t, 3, Config{Policies: pols, ForwardTimeout: 5 * time.Second})
	key := pmKeyOwnedBy(t, c.nodes[0], "p", "n1")
	if got := admitFromAll(t, c, key, 240); got != 50 {
		t.Fatalf("admitted %d of 240 calls through 3 nodes, want exactly the limit 50", got)
	}
	n1 := c.nodes[1]
	if got := n1.framedServed[transport.KindCheck].Load(); got == 0 {
		t.Errorf("the owner served %d framed forward pipes, want at least 1", got)
	}
	var repl int64
	for _, nd := range c.nodes {
		repl += nd.framedServed[transport.KindReplicate].Load()
	}
	if repl == 0 {
		t.Errorf("no member served a framed replication pipe (sync replication sends every admission)")
	}
	if got := c.nodes[0].links.framedOpened.Load() + c.nodes[2].links.framedOpened.Load(); got == 0 {
		t.Errorf("the forwarding members opened no framed pipe")
	}
}

// TestFramedFallsBackToGRPCStream gives the owner a server without framed
// pipes (a node from before them): its peers' dials are refused, they say
// so once and forward on gRPC streams, and the limit holds.
func TestFramedFallsBackToGRPCStream(t *testing.T) {
	pols := map[string]PolicyConfig{"p": {Limit: 40, Window: time.Minute}}
	tap, log := newLogTap(t)
	refused := tap.on("peer takes no framed pipe; using a gRPC stream", func(a map[string]string) bool { return a["peer"] == "n1" })
	c := startClusterWith(t, 2, Config{Policies: pols, ForwardTimeout: 5 * time.Second}, func(i int, cfg *Config) {
		if i == 0 {
			cfg.Logger = log
		} else {
			cfg.noFramedServer = true
		}
	})
	key := pmKeyOwnedBy(t, c.nodes[0], "p", "n1")
	if got := admitFromAll(t, c, key, 160); got != 40 {
		t.Fatalf("admitted %d of 160, want exactly the limit 40", got)
	}
	waitLog(t, refused, 10*time.Second, "n0 to note that n1 takes no framed pipe")
	if got := c.nodes[1].framedServed[transport.KindCheck].Load(); got != 0 {
		t.Fatalf("a server without framed pipes served %d", got)
	}
	// Later batches go on a gRPC stream, not as unary RPCs: the pipe
	// stays open across calls, so breaking it is seen.
	breaks := c.nodes[0].pipeBreaksForTest()
	c.nodes[1].stopRPCForTest()
	waitFor(t, 10*time.Second, "n0's gRPC stream to n1 to break", func() bool {
		return c.nodes[0].pipeBreaksForTest() > breaks
	})
	if err := c.nodes[1].restartRPCForTest(); err != nil {
		t.Fatal(err)
	}
}

// TestFramedAuth dials framed pipes to a node of a cluster with a peer
// secret: without a credential, with a wrong token, with the static token
// of earlier versions over plaintext, with another member's challenge
// answer, or of an unknown kind the hello is refused with the status a
// peer RPC would get and nothing is decided; with a member's answer to the
// challenge a batch is decided.
func TestFramedAuth(t *testing.T) {
	pols := map[string]PolicyConfig{"p": {Limit: 3, Window: time.Minute}}
	c := startCluster(t, 2, Config{Policies: pols, PeerSecret: []byte("s3cret")})
	n1 := c.nodes[1]
	cred := c.nodes[0].ops.auth.PipeCredential("n1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		cred transport.Credential
		kind byte
		want codes.Code
	}{
		{"no token", transport.Credential{}, transport.KindCheck, codes.Unauthenticated},
		{"wrong token", transport.Credential{Token: "00ff"}, transport.KindCheck, codes.PermissionDenied},
		{"wrong token, replication", transport.Credential{Token: "00ff"}, transport.KindReplicate, codes.PermissionDenied},
		{"static token over plaintext", transport.Credential{Token: n1.ops.auth.LegacyToken()}, transport.KindCheck, codes.PermissionDenied},
		{"answer made for another member", c.nodes[0].ops.auth.PipeCredential("n0"), transport.KindCheck, codes.PermissionDenied},
		{"unknown kind", cred, 9, codes.Unimplemented},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc, err := transport.Dial(ctx, n1.RPCAddr(), tc.kind, tc.cred, nil)
			if err == nil {
				fc.Close()
				t.Fatalf("framed dial accepted")
			}
			if !errors.Is(err, transport.ErrRefused) || status.Code(err) != tc.want {
				t.Fatalf("framed dial = %v, want refused with %v", err, tc.want)
			}
		})
	}
	key := pmKeyOwnedBy(t, c.nodes[0], "p", "n1")
	if _, ok := n1.ExportForTest(key); ok {
		t.Fatalf("n1 holds the key after refused dials")
	}
	fc, err := transport.Dial(ctx, n1.RPCAddr(), transport.KindCheck, cred, nil)
	if err != nil {
		t.Fatalf("framed dial with a member's answer: %v", err)
	}
	defer fc.Close()
	st := transport.NewStream[peerpb.CheckResponse, peerpb.CheckRequest](fc, ctx, false, nil)
	b := wire.AppendItem(nil, &peerpb.CheckItem{Key: &peerpb.Key{Tenant: key.Tenant, Subject: key.Subject, Policy: key.Policy}, Hits: 2})
	if err := st.Send(&peerpb.CheckRequest{Sender: "n0", Id: 7, ItemsPacked: append([]byte{1}, b...)}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil || resp.GetId() != 7 || resp.GetCode() != 0 {
		t.Fatalf("answer on the framed pipe = %v, %v; want id 7, no error", resp, err)
	}
	if runs, _ := n1.ExportForTest(key); len(runs) != 1 || runs[0].Count != 2 {
		t.Fatalf("n1's log after the framed batch = %v, want one run of 2", runs)
	}
}

// TestFramedMutualTLS runs two nodes that require verified client
// certificates: forwards go on framed pipes over TLS, while a framed dial
// without a certificate, or without TLS, is refused.
func TestFramedMutualTLS(t *testing.T) {
	serverCfg, clientCfg, noCert := testMutualTLS(t)
	pols := map[string]PolicyConfig{"p": {Limit: 20, Window: time.Minute}}
	c := startCluster(t, 2, Config{Policies: pols, ServerTLS: serverCfg, ClientTLS: clientCfg, ForwardTimeout: 5 * time.Second})
	key := pmKeyOwnedBy(t, c.nodes[0], "p", "n1")
	if got := admitFromAll(t, c, key, 80); got != 20 {
		t.Fatalf("admitted %d of 80, want exactly the limit 20", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A framed pipe is dialled beside the gRPC stream and taken once its
	// TLS handshake and hello are done; on a loaded machine the burst
	// above can end first. Keep forwarding (peeks change nothing) until
	// the pipe is up.
	waitFor(t, 10*time.Second, "a framed forward pipe over mutual TLS", func() bool {
		if _, err := c.nodes[0].Peek(ctx, Request{Key: key}); err != nil {
			t.Fatalf("Peek through n0: %v", err)
		}
		return c.nodes[1].framedServed[transport.KindCheck].Load() > 0
	})
	for _, tc := range []struct {
		name string
		cfg  *tls.Config
	}{
		{"TLS without a client certificate", noCert},
		{"plaintext", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc, err := transport.Dial(ctx, c.nodes[1].RPCAddr(), transport.KindCheck, transport.Credential{}, tc.cfg)
			if err == nil {
				fc.Close()
				t.Fatalf("framed dial accepted")
			}
			if !errors.Is(err, transport.ErrRefused) {
				t.Fatalf("framed dial = %v, want refused", err)
			}
		})
	}
}

// testMutualTLS makes a CA and one certificate for 127.0.0.1 (server and
// client), and returns the server's config (client certificates required
// and verified), a client's, and a client's without a certificate.
func testMutualTLS(t *testing.T) (server, client, noCert *tls.Config) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "framed test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	must(err)
	ca, err := x509.ParseCertificate(caDER)
	must(err)
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	leafTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "node"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &leafKey.PublicKey, caKey)
	must(err)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	cert := tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: leafKey}
	server = &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	client = &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool}
	noCert = &tls.Config{RootCAs: pool}
	return server, client, noCert
}

// TestSniffDoesNotBlock opens connections to a node's port that send
// nothing, or half of the magic: gRPC calls on new connections are
// served meanwhile, and Close ends the stalled connections at once
// instead of waiting for their setup timeout.
func TestSniffDoesNotBlock(t *testing.T) {
	pols := map[string]PolicyConfig{"p": {Limit: 5, Window: time.Minute}}
	c := startCluster(t, 1, Config{Policies: pols})
	nd := c.nodes[0]
	stalled := dialStalled(t, nd.RPCAddr(), "", transport.Magic[:4], transport.Magic)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn := dialTest(t, nd.RPCAddr())
	if _, err := peerpb.NewRateLimiterClient(conn).Allow(ctx, &peerpb.AllowRequest{Key: &peerpb.Key{Tenant: "t", Subject: "s", Policy: "p"}}); err != nil {
		t.Fatalf("gRPC Allow while 3 connections stall: %v", err)
	}
	start := time.Now()
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	if err := nd.Close(cctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if d := time.Since(start); d >= transport.SetupTimeout {
		t.Fatalf("Close took %v with stalled connections, want well under the %v setup timeout", d, transport.SetupTimeout)
	}
	checkEnded(t, stalled, "Close")
}

// dialStalled opens a connection to addr for each head, writes head and
// nothing more; the connections close with the test.
func dialStalled(t *testing.T, addr string, heads ...string) []net.Conn {
	t.Helper()
	var conns []net.Conn
	for _, head := range heads {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if _, err := conn.Write([]byte(head)); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
	}
	return conns
}

// checkEnded fails the test unless each of conns reads its end (not data,
// not a timeout) within 4 s of after.
func checkEnded(t *testing.T, conns []net.Conn, after string) {
	t.Helper()
	for i, conn := range conns {
		_ = conn.SetReadDeadline(time.Now().Add(4 * time.Second))
		var b [64]byte
		k, err := conn.Read(b[:])
		if err == nil {
			t.Errorf("stalled connection %d read %d bytes (%q) after %s, want its end", i, k, b[:k], after)
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Errorf("stalled connection %d not closed by %s", i, after)
		}
	}
}

// TestSniffStopClosesStalled: a graceful stop shuts the reading of the
// connections still being sniffed. The framed side stops beside gRPC, which
// may still be accepting; a stalled connection whose read the stop cut
// short is closed, not handed to gRPC (which would greet it with its
// settings). Seen once in CI as TestSniffDoesNotBlock reading data from a
// stalled connection after Close.
func TestSniffStopClosesStalled(t *testing.T) {
	pols := map[string]PolicyConfig{"p": {Limit: 5, Window: time.Minute}}
	c := startCluster(t, 1, Config{Policies: pols})
	nd := c.nodes[0]
	stalled := dialStalled(t, nd.RPCAddr(), "", transport.Magic[:4])
	waitFor(t, 5*time.Second, "the node to sniff both connections", func() bool { return nd.framedConnsForTest() == 2 })
	nd.grpcSrv.framed.Stop(true) // gRPC keeps accepting
	checkEnded(t, stalled, "the framed stop")
}

// TestFramedReplacesGRPCStream starts the owner refusing framed pipes (as
// Unavailable, a passing condition): its peer forwards on a gRPC stream.
// Once framed pipes are taken, the peer moves to one while calls keep
// coming: no call fails in the switch, and every admission answered is
// counted once by the owner. The peer's replication to the owner stays on
// its gRPC stream: two live pipes would not keep its order.
func TestFramedReplacesGRPCStream(t *testing.T) {
	pols := map[string]PolicyConfig{"p": {Limit: 1 << 30, Window: time.Hour}}
	c := startClusterWith(t, 2, Config{Policies: pols, ForwardTimeout: 5 * time.Second}, func(i int, cfg *Config) {
		cfg.refuseFramed = i == 1
	})
	n0, n1 := c.nodes[0], c.nodes[1]
	key := pmKeyOwnedBy(t, n0, "p", "n1")
	own := pmKeyOwnedBy(t, n0, "p", "n0") // n0 holds it, n1 keeps its copy
	admitOwn := func() {
		t.Helper()
		if d, err := n0.Allow(context.Background(), Request{Key: own}); err != nil || !d.Allowed {
			t.Fatalf("local Allow on n0: %+v, %v", d, err)
		}
	}
	admitted := 0
	call := func() {
		t.Helper()
		d, err := n0.Allow(context.Background(), Request{Key: key})
		if err != nil || !d.Allowed {
			t.Fatalf("forwarded Allow: %+v, %v", d, err)
		}
		admitted++
	}
	waitFor(t, 10*time.Second, "n0 to forward on a pipe to n1", func() bool {
		call()
		return n0.pipeForTest(n1.Name()) != ""
	})
	if got := n0.pipeForTest(n1.Name()); got != "grpc" {
		t.Fatalf("n0's pipe to n1 while n1 refuses framed pipes: %q, want grpc", got)
	}
	waitFor(t, 10*time.Second, "n0 to replicate to n1 on a pipe", func() bool {
		admitOwn()
		return n0.replPipeForTest(n1.Name()) != ""
	})
	if got := n0.replPipeForTest(n1.Name()); got != "grpc" {
		t.Fatalf("n0's replication pipe to n1 while n1 refuses framed pipes: %q, want grpc", got)
	}
	breaks := n0.pipeBreaksForTest()
	n1.hooks.refuseFramed.Store(false)
	// Several callers at once, so requests are in flight on the stream
	// when the framed pipe takes over.
	var mu sync.Mutex
	waitFor(t, 10*time.Second, "n0 to move to a framed pipe to n1", func() bool {
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				d, err := n0.Allow(context.Background(), Request{Key: key})
				mu.Lock()
				defer mu.Unlock()
				if err != nil || !d.Allowed {
					t.Errorf("forwarded Allow in the switch: %+v, %v", d, err)
					return
				}
				admitted++
			})
		}
		wg.Wait()
		return n0.pipeForTest(n1.Name()) == "framed"
	})
	call()
	for range 3 {
		admitOwn()
	}
	if got := n0.replPipeForTest(n1.Name()); got != "grpc" {
		t.Errorf("n0's replication pipe to n1 after the forward pipe moved: %q, want grpc (kept until it breaks)", got)
	}
	if got := n1.framedServed[transport.KindCheck].Load(); got == 0 {
		t.Fatalf("n1 served no framed forward pipe after the switch")
	}
	if b := n0.pipeBreaksForTest(); b != breaks {
		t.Errorf("the switch broke %d pipes, want none (the stream is retired, not broken)", b-breaks)
	}
	runs, _ := n1.ExportForTest(key)
	var held int64
	for _, r := range runs {
		held += r.Count
	}
	if held != int64(admitted) {
		t.Fatalf("owner holds %d admissions, %d were answered", held, admitted)
	}
}

// TestFramedHandlerEndsWithConnection breaks a framed pipe's connection
// (a reset, as from a crashed sender) while its batch is being decided:
// the batch's context ends at once, as a gRPC stream's does, not at the
// batch's deadline 30 s later.
func TestFramedHandlerEndsWithConnection(t *testing.T) {
	pols := map[string]PolicyConfig{"p": {Limit: 5, Window: time.Minute}}
	c := startCluster(t, 1, Config{Policies: pols, ForwardTimeout: 30 * time.Second})
	nd := c.nodes[0]
	entered, returned := make(chan struct{}), make(chan struct{})
	nd.setCheckHookForTest(func(ctx context.Context) {
		close(entered)
		<-ctx.Done()
		close(returned)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fc, err := transport.Dial(ctx, nd.RPCAddr(), transport.KindCheck, transport.Credential{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := transport.NewStream[peerpb.CheckResponse, peerpb.CheckRequest](fc, ctx, false, nil)
	b := wire.AppendItem(nil, &peerpb.CheckItem{Key: &peerpb.Key{Tenant: "t", Subject: "s", Policy: "p"}, Hits: 1})
	if err := st.Send(&peerpb.CheckRequest{Sender: "other", Id: 1, TimeoutNs: int64(30 * time.Second), ItemsPacked: append([]byte{1}, b...)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the batch never reached Check")
	}
	tc := fc.NetConn().(*net.TCPConn)
	_ = tc.SetLinger(0) // Close sends a reset
	tc.Close()
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("the batch's context did not end within 5 s of the connection's reset (its deadline is 30 s away)")
	}
}

// TestFramedHelloBounded: before its hello is accepted a connection is a
// stranger's; a hello frame that claims more than a hello needs (here
// 16 MiB) closes the connection at once, instead of reserving the buffer
// and waiting out the setup timeout.
func TestFramedHelloBounded(t *testing.T) {
	pols := map[string]PolicyConfig{"p": {Limit: 5, Window: time.Minute}}
	c := startCluster(t, 1, Config{Policies: pols, PeerSecret: []byte("s3cret")})
	conn, err := net.Dial("tcp", c.nodes[0].RPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	msg := append([]byte(transport.Magic), 0x01, 0x00, 0x00, 0x00) // a 16 MiB hello
	if _, err := conn.Write(msg); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(transport.SetupTimeout / 2))
	var b [16]byte
	_, err = conn.Read(b[:])
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the connection stayed open %v after an oversized hello", transport.SetupTimeout/2)
	}
	if err == nil {
		t.Fatalf("the server answered an oversized hello instead of closing")
	}
}

// TestFramedWriteTimeout: a sender that keeps sending batches but stops
// reading their answers (paused, or cut off without a reset) fills the
// connection's buffers. The receiver's write then blocks; after the write
// timeout the receiver closes the connection and its handler ends, instead
// of holding its workers until TCP gives up (minutes) or the node closes.
func TestFramedWriteTimeout(t *testing.T) {
	pols := map[string]PolicyConfig{"p": {Limit: 1 << 40, Window: time.Minute}}
	c := startCluster(t, 1, Config{Policies: pols, framedWriteTimeout: 300 * time.Millisecond})
	nd := c.nodes[0]
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	fc, err := transport.Dial(ctx, nd.RPCAddr(), transport.KindCheck, transport.Credential{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fc.Close()
	_ = fc.NetConn().(*net.TCPConn).SetReadBuffer(4 << 10)
	if got := nd.framedConnsForTest(); got != 1 {
		t.Fatalf("framed connections served = %d, want 1", got)
	}
	// Batches of 500 admissions, each answered with some kilobytes; never
	// read. The sender stops at the first failed send (the receiver has
	// closed), or after 4000 batches.
	var items []byte
	for i := range 500 {
		items = wire.AppendItem(items, &peerpb.CheckItem{Key: &peerpb.Key{Tenant: "t", Subject: fmt.Sprintf("s%d", i), Policy: "p"}, Hits: 1})
	}
	packed := append(binary.AppendUvarint(nil, 500), items...)
	st := transport.NewStream[peerpb.CheckResponse, peerpb.CheckRequest](fc, ctx, false, nil)
	sent := make(chan int, 1)
	go func() {
		n := 0
		defer func() { sent <- n }()
		_ = fc.NetConn().SetWriteDeadline(time.Now().Add(30 * time.Second))
		for ; n < 4000; n++ {
			if err := st.Send(&peerpb.CheckRequest{Sender: "other", Id: uint64(n + 1), TimeoutNs: int64(time.Minute), ItemsPacked: packed}); err != nil {
				return
			}
		}
	}()
	waitFor(t, 25*time.Second, "the receiver to end the pipe whose sender reads nothing (write timeout 300 ms)", func() bool {
		return nd.framedConnsForTest() == 0
	})
	fc.Close()
	if n := <-sent; n == 4000 {
		t.Fatalf("all 4000 batches were sent: the answers never filled the connection")
	}
}
