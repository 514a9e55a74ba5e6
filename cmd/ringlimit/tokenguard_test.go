package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// TestResetGuard checks who may reset over gRPC when serve has an admin
// token: the token in the authorization metadata, or a caller whose client
// certificate the node verified; everyone else is refused, counted, and
// logged once per resetWarnEvery.
func TestResetGuard(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	g, err := newResetGuard([]byte("tok"), slog.New(slog.NewTextHandler(&logs, nil)), reg)
	if err != nil {
		t.Fatal(err)
	}
	from := func(auth string, verified bool) context.Context {
		p := &grpcpeer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4242}}
		if verified {
			leaf := &x509.Certificate{DNSNames: []string{"envoy.default.svc.cluster.local"}}
			p.AuthInfo = credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}, VerifiedChains: [][]*x509.Certificate{{leaf}}}}
		}
		ctx := grpcpeer.NewContext(context.Background(), p)
		if auth != "" {
			ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", auth))
		}
		return ctx
	}
	for _, tc := range []struct {
		name     string
		auth     string
		verified bool
		want     codes.Code
	}{
		{"no credentials", "", false, codes.Unauthenticated},
		{"wrong token", "Bearer nope", false, codes.Unauthenticated},
		{"basic scheme", "Basic tok", false, codes.Unauthenticated},
		{"token", "Bearer tok", false, codes.OK},
		{"token, any case", "bearer tok", false, codes.OK},
		{"verified client certificate", "", true, codes.OK},
	} {
		if got := status.Code(g.authorizeGRPC(from(tc.auth, tc.verified))); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := testutil.ToFloat64(g.refused.WithLabelValues("grpc")); got != 3 {
		t.Errorf("ringlimit_reset_refused_total{transport=grpc} = %v, want 3", got)
	}
	if n := strings.Count(logs.String(), "reset refused"); n != 1 || !strings.Contains(logs.String(), "remote_addr=127.0.0.1:4242") {
		t.Errorf("%d warnings for 3 refusals within %v, want 1 naming the caller:\n%s", n, resetWarnEvery, logs.String())
	}

	// Without an admin token (serve without --admin-token-file) the guard
	// holds no token: only a verified client certificate passes (issue 53
	// item 7: Reset was open to anyone), and the refusal says how to turn
	// reset on.
	off, err := newResetGuard(nil, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		auth     string
		verified bool
		want     codes.Code
	}{
		{"no credentials", "", false, codes.Unauthenticated},
		{"empty bearer", "Bearer ", false, codes.Unauthenticated},
		{"any token", "Bearer tok", false, codes.Unauthenticated},
		{"verified client certificate", "", true, codes.OK},
	} {
		err := off.authorizeGRPC(from(tc.auth, tc.verified))
		if got := status.Code(err); got != tc.want {
			t.Errorf("no admin token, %s: %v, want %v", tc.name, err, tc.want)
		}
		if err != nil && !strings.Contains(status.Convert(err).Message(), "reset is off") {
			t.Errorf("no admin token, %s: %v, want a message saying reset is off", tc.name, err)
		}
	}
	// With --tls-peer-name a verified certificate that is not a peer's
	// (Envoy's) stands for no token (issue 53 item 5).
	off.peerNames = []string{"*.ringlimit.default.svc.cluster.local"}
	if err := off.authorizeGRPC(from("", true)); status.Code(err) != codes.Unauthenticated {
		t.Errorf("no admin token, --tls-peer-name, Envoy's certificate: %v, want Unauthenticated", err)
	}
}

// TestRefundGuard checks which tokens open Refund: the refund token or the
// admin token when both are set, the one set otherwise; Reset's guard
// never takes the refund token. Refusals are counted under the refund's
// own counter and name what to send.
func TestRefundGuard(t *testing.T) {
	t.Parallel()
	bearer := func(tok string) context.Context {
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+tok))
	}
	for _, tc := range []struct {
		name          string
		admin, refund []byte
		ok, refused   []string
		send          string
	}{
		{"both", []byte("adm"), []byte("ref"), []string{"adm", "ref"}, []string{"nope", "adm2"}, "--refund-token-file or --admin-token-file"},
		{"admin only", []byte("adm"), nil, []string{"adm"}, []string{"ref", "nope"}, "--admin-token-file"},
		{"refund only", nil, []byte("ref"), []string{"ref"}, []string{"adm", "nope"}, "--refund-token-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			g, err := newRefundGuard(tc.admin, tc.refund, slog.New(slog.DiscardHandler), reg)
			if err != nil {
				t.Fatal(err)
			}
			for _, tok := range tc.ok {
				if err := g.authorizeGRPC(bearer(tok)); err != nil {
					t.Errorf("refund with %q: %v, want allowed", tok, err)
				}
			}
			for _, tok := range tc.refused {
				err := g.authorizeGRPC(bearer(tok))
				if status.Code(err) != codes.Unauthenticated || !strings.Contains(status.Convert(err).Message(), tc.send) {
					t.Errorf("refund with %q: %v, want Unauthenticated naming %s", tok, err, tc.send)
				}
			}
			if got := testutil.ToFloat64(g.refused.WithLabelValues("grpc")); got != float64(len(tc.refused)) {
				t.Errorf("ringlimit_refund_refused_total{transport=grpc} = %v, want %d", got, len(tc.refused))
			}
		})
	}
	reset, err := newResetGuard([]byte("adm"), slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := reset.authorizeGRPC(bearer("ref")); status.Code(err) != codes.Unauthenticated {
		t.Errorf("reset with the refund token: %v, want Unauthenticated", err)
	}
}
