package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// TestTLSRecipe runs README.md's TLS recipe (the openssl block between the
// tls markers) in a temporary directory, starts two serve processes with
// the node certificate, and makes the requests the README describes: a
// `ringlimit check` with the client certificate (allowed; forwarded
// between the nodes over mutual TLS), the same without it (unreachable,
// exit 4), and an Envoy RateLimitService call with the TLS settings of
// the README's Envoy cluster (sni, ALPN, client certificate).
func TestTLSRecipe(t *testing.T) {
	if testing.Short() {
		t.Skip("runs openssl and starts two nodes")
	}
	for _, tool := range []string{"bash", "openssl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the TLS recipe needs %s: %v", tool, err)
		}
	}
	t.Parallel()
	dir := t.TempDir()
	script := readmeBlocks(t, "tls", "sh")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-c", script)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("the TLS recipe failed: %v\nscript:\n%s\noutput:\n%s", err, script, out.String())
	}
	file := func(name string) string { return filepath.Join(dir, name) }
	for _, name := range []string{"ca.pem", "node.pem", "node.key", "client.pem", "client.key"} {
		if _, err := os.Stat(file(name)); err != nil {
			t.Fatalf("the TLS recipe did not write %s: %v\noutput:\n%s", name, err, out.String())
		}
	}
	node := parseCertFile(t, file("node.pem"))
	if !slices.ContainsFunc(node.IPAddresses, func(ip net.IP) bool { return ip.Equal(net.IPv4(127, 0, 0, 1)) }) ||
		!slices.Contains(node.DNSNames, "localhost") {
		t.Fatalf("node.pem names %v %v, want 127.0.0.1 and localhost", node.IPAddresses, node.DNSNames)
	}

	envoy := parseEnvoyCluster(t, readmeBlocks(t, "tls-envoy", "yaml"))
	// serve's gRPC port, where it answers Envoy's RateLimitService: the
	// default --grpc-addr's, which README.md's serve command keeps.
	defaults, err := parseServeFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if _, def, _ := net.SplitHostPort(defaults.grpcAddr); fmt.Sprint(envoy.port) != def {
		t.Errorf("the Envoy cluster points at port %d, want serve's gRPC port %s", envoy.port, def)
	}
	for _, f := range []string{envoy.cert, envoy.key, envoy.ca} {
		if _, err := os.Stat(file(filepath.Base(f))); err != nil {
			t.Errorf("the Envoy cluster reads %s, which the recipe does not make", f)
		}
	}
	if !slices.Contains(node.DNSNames, envoy.sni) || !slices.Contains(envoy.alpn, "h2") || envoy.san != envoy.sni {
		t.Errorf("the Envoy cluster's sni %q, SAN %q and ALPN %v: want a DNS name of node.pem %v in both, and h2", envoy.sni, envoy.san, envoy.alpn, node.DNSNames)
	}

	// The Envoy call below names the domain "edge": the policy file
	// configures it (an unknown domain is an error by default).
	pols := writeFile(t, dir, "policies.yaml", "policies:\n  - {name: default, limit: 1000, window: 1m}\n"+
		"domains:\n  - domain: edge\n    descriptors:\n      - key: remote_address\n        rate_limit: {unit: second, requests_per_unit: 100}\n")
	// --tls-peer-name as README.md's serve line gives it: the node
	// certificate's DNS name, which the client certificate lacks.
	tlsFlags := []string{"--tls-ca", file("ca.pem"), "--tls-cert", file("node.pem"), "--tls-key", file("node.key"), "--tls-peer-name", "localhost", "--policies", pols}
	if client := parseCertFile(t, file("client.pem")); peer.PeerCertName([]string{"localhost"}, client) || !peer.PeerCertName([]string{"localhost"}, node) {
		t.Errorf("--tls-peer-name localhost: want node.pem a peer's and client.pem not")
	}
	a := startServe(t, "tls-recipe-a", nil, tlsFlags...)
	b := startServe(t, "tls-recipe-b", nil, append(tlsFlags, "--join", a.gossipAddr)...)
	nodes := []*serveProc{a, b}
	waitMembers(t, nodes, 2)

	// The README's check, with the client certificate, and without it.
	for _, tc := range []struct {
		name  string
		flags []string
		want  int
	}{
		{"with the client certificate", []string{"--tls-ca", file("ca.pem"), "--tls-cert", file("client.pem"), "--tls-key", file("client.key")}, exitOK},
		{"without a client certificate", []string{"--tls-ca", file("ca.pem")}, exitUnreachable},
	} {
		_, port, _ := net.SplitHostPort(a.grpcAddr)
		args := append([]string{"check", "--addr", "localhost:" + port, "--tenant", "acme", "--subject", "alice", "--policy", "default", "--timeout", "5s"}, tc.flags...)
		var out bytes.Buffer
		if code := exitCode(run(context.Background(), args, &out, &out), &out); code != tc.want {
			t.Errorf("check %s: exit code %d, want %d\n%s", tc.name, code, tc.want, out.String())
		}
	}

	// Envoy's side: the cluster's TLS settings against node b's gRPC port.
	pool := x509.NewCertPool()
	pool.AddCert(parseCertFile(t, file("ca.pem")))
	pair, err := tls.LoadX509KeyPair(file("client.pem"), file("client.key"))
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(b.grpcAddr)
	conn, err := grpc.NewClient(net.JoinHostPort(envoy.address, port), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		ServerName: envoy.sni, NextProtos: envoy.alpn, RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12,
	})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(rctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", "127.0.0.1")}})
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("ShouldRateLimit over the Envoy cluster's TLS: %v, %v; want OK", resp, err)
	}
	// Both nodes decide: b forwards the keys a owns over mutual TLS, as a
	// client with node.pem.
	owners := map[string]bool{}
	for i := range 40 {
		d, err := peerpb.NewRateLimiterClient(conn).Allow(rctx, &peerpb.AllowRequest{
			Key: &peerpb.Key{Tenant: "acme", Subject: fmt.Sprintf("u%d", i), Policy: "default"},
		})
		if err != nil {
			t.Fatalf("Allow over the Envoy cluster's TLS: %v", err)
		}
		owners[d.GetOwner()] = true
	}
	if !owners[a.name] || !owners[b.name] {
		t.Errorf("owners %v: want decisions from both nodes (forwarding over mutual TLS with node.pem)", owners)
	}
}

// parseCertFile reads the first PEM certificate of path.
func parseCertFile(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s holds no PEM block", path)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return c
}

// envoyCluster is what TestTLSRecipe reads from README.md's Envoy cluster.
type envoyCluster struct {
	address       string
	port          int
	sni, san      string
	alpn          []string
	cert, key, ca string
}

// parseEnvoyCluster reads the "ringlimit" cluster of an Envoy bootstrap.
func parseEnvoyCluster(t *testing.T, doc string) envoyCluster {
	t.Helper()
	type file struct {
		Filename string `yaml:"filename"`
	}
	var cfg struct {
		StaticResources struct {
			Clusters []struct {
				Name           string `yaml:"name"`
				LoadAssignment struct {
					Endpoints []struct {
						LBEndpoints []struct {
							Endpoint struct {
								Address struct {
									SocketAddress struct {
										Address   string `yaml:"address"`
										PortValue int    `yaml:"port_value"`
									} `yaml:"socket_address"`
								} `yaml:"address"`
							} `yaml:"endpoint"`
						} `yaml:"lb_endpoints"`
					} `yaml:"endpoints"`
				} `yaml:"load_assignment"`
				TransportSocket struct {
					Name        string `yaml:"name"`
					TypedConfig struct {
						Type             string `yaml:"@type"`
						SNI              string `yaml:"sni"`
						CommonTLSContext struct {
							ALPN            []string `yaml:"alpn_protocols"`
							TLSCertificates []struct {
								CertificateChain file `yaml:"certificate_chain"`
								PrivateKey       file `yaml:"private_key"`
							} `yaml:"tls_certificates"`
							ValidationContext struct {
								TrustedCA file `yaml:"trusted_ca"`
								SANs      []struct {
									Type    string            `yaml:"san_type"`
									Matcher map[string]string `yaml:"matcher"`
								} `yaml:"match_typed_subject_alt_names"`
							} `yaml:"validation_context"`
						} `yaml:"common_tls_context"`
					} `yaml:"typed_config"`
				} `yaml:"transport_socket"`
			} `yaml:"clusters"`
		} `yaml:"static_resources"`
	}
	if err := yaml.Unmarshal([]byte(doc), &cfg); err != nil {
		t.Fatalf("README.md's Envoy cluster is not YAML: %v\n%s", err, doc)
	}
	cs := cfg.StaticResources.Clusters
	if len(cs) != 1 || cs[0].Name != "ringlimit" || len(cs[0].LoadAssignment.Endpoints) != 1 ||
		len(cs[0].LoadAssignment.Endpoints[0].LBEndpoints) != 1 {
		t.Fatalf("README.md's Envoy configuration: want one cluster ringlimit with one endpoint:\n%s", doc)
	}
	ts := cs[0].TransportSocket
	tc := ts.TypedConfig.CommonTLSContext
	if ts.Name != "envoy.transport_sockets.tls" || !strings.HasSuffix(ts.TypedConfig.Type, ".tls.v3.UpstreamTlsContext") ||
		len(tc.TLSCertificates) != 1 || len(tc.ValidationContext.SANs) != 1 || tc.ValidationContext.SANs[0].Type != "DNS" {
		t.Fatalf("README.md's Envoy cluster: want a TLS transport_socket (UpstreamTlsContext) with one certificate and one DNS SAN matcher:\n%s", doc)
	}
	sa := cs[0].LoadAssignment.Endpoints[0].LBEndpoints[0].Endpoint.Address.SocketAddress
	return envoyCluster{
		address: sa.Address, port: sa.PortValue,
		sni: ts.TypedConfig.SNI, san: tc.ValidationContext.SANs[0].Matcher["exact"], alpn: tc.ALPN,
		cert: tc.TLSCertificates[0].CertificateChain.Filename, key: tc.TLSCertificates[0].PrivateKey.Filename,
		ca: tc.ValidationContext.TrustedCA.Filename,
	}
}
