package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/ringlimit/ringlimit/peer"
)

// yamlDocs parses every document of one YAML file.
func yamlDocs(t *testing.T, file string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		out = append(out, doc)
	}
}

// ofKind is the first document of kind in docs (nil if none).
func ofKind(docs []map[string]any, kind string) map[string]any {
	for _, d := range docs {
		if d["kind"] == kind {
			return d
		}
	}
	return nil
}

// namedIn is the element of list whose "name" is name (nil if none).
func namedIn(list any, name string) any {
	for _, e := range asList(list) {
		if dig(e, "name") == name {
			return e
		}
	}
	return nil
}

// TestDeployTLSStory (issue 53 item 10) checks that one TLS story runs from
// Envoy's configuration to the StatefulSet: Envoy's bootstrap in
// envoy/envoy.yaml is the one envoyrls/README.md shows; its ringlimit
// cluster is STRICT_DNS over TLS (ALPN h2, a client certificate) on a
// headless Service of ready pods, at the pods' gRPC port; the SAN it
// verifies is the pods' --tls-server-name; the files it reads are the
// secret the Deployment mounts, as the README's kubectl line makes it; the
// filter's domain is the ConfigMap's; the app cluster is there. Then the
// README's certificate recipe is run: the node certificate carries every
// name the manifests and Envoy use and is a peer's by --tls-peer-name,
// Envoy's is not.
func TestDeployTLSStory(t *testing.T) {
	t.Parallel()
	envoyDocs := yamlDocs(t, filepath.Join(deployDir, "envoy", "envoy.yaml"))
	cm, dep := ofKind(envoyDocs, "ConfigMap"), ofKind(envoyDocs, "Deployment")
	if cm == nil || dep == nil || ofKind(envoyDocs, "Service") == nil {
		t.Fatal("envoy/envoy.yaml: want a ConfigMap, a Deployment and a Service")
	}
	var boot map[string]any
	if err := yaml.Unmarshal([]byte(dig(cm, "data", "envoy.yaml").(string)), &boot); err != nil {
		t.Fatalf("envoy/envoy.yaml's envoy.yaml: %v", err)
	}
	var readme map[string]any
	if err := yaml.Unmarshal([]byte(readmeBlocksOf(t, "envoyrls/README.md", "envoy-config", "yaml")), &readme); err != nil {
		t.Fatalf("envoyrls/README.md's Envoy configuration: %v", err)
	}
	if !reflect.DeepEqual(boot, readme) {
		t.Error("envoyrls/README.md's Envoy configuration differs from deploy/kubernetes/envoy/envoy.yaml's")
	}

	clusters := dig(boot, "static_resources", "clusters")
	rl, app := namedIn(clusters, "ringlimit"), namedIn(clusters, "app")
	if rl == nil || app == nil {
		t.Fatalf("Envoy's clusters: want ringlimit and app, got %v", clusters)
	}
	hcm := dig(boot, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config")
	if got := dig(hcm, "route_config", "virtual_hosts", 0, "routes", 0, "route", "cluster"); got != "app" {
		t.Errorf("Envoy's route goes to cluster %v, want app", got)
	}
	filter := dig(namedIn(dig(hcm, "http_filters"), "envoy.filters.http.ratelimit"), "typed_config")
	if got := dig(filter, "rate_limit_service", "grpc_service", "envoy_grpc", "cluster_name"); got != "ringlimit" {
		t.Errorf("the rate limit filter calls cluster %v, want ringlimit", got)
	}

	// The cluster: STRICT_DNS on a headless Service of ready pods, at the
	// pods' gRPC port.
	if dig(rl, "type") != "STRICT_DNS" {
		t.Errorf("the ringlimit cluster is %v, want STRICT_DNS (one connection per pod)", dig(rl, "type"))
	}
	sa := dig(rl, "load_assignment", "endpoints", 0, "lb_endpoints", 0, "endpoint", "address", "socket_address")
	host, _ := dig(sa, "address").(string)
	port, _ := dig(sa, "port_value").(int)
	svcName, ns, ok := strings.Cut(strings.TrimSuffix(host, ".svc.cluster.local"), ".")
	if !ok || !strings.HasSuffix(host, ".svc.cluster.local") {
		t.Fatalf("the ringlimit cluster's address %q: want <service>.<namespace>.svc.cluster.local", host)
	}
	docs := manifestDocs(t)
	var svc any
	for _, s := range docs["Service"] {
		if dig(s, "metadata", "name") == svcName {
			svc = s
		}
	}
	if svc == nil {
		t.Fatalf("no Service %s in the manifests (Envoy's cluster address %s)", svcName, host)
	}
	if dig(svc, "spec", "clusterIP") != "None" || dig(svc, "spec", "publishNotReadyAddresses") == true {
		t.Errorf("Service %s: want headless (clusterIP: None) listing ready pods only", svcName)
	}
	ss := docs["StatefulSet"][0]
	c := dig(ss, "spec", "template", "spec", "containers", 0)
	var args []string
	for _, a := range dig(c, "args").([]any) {
		args = append(args, envRef.ReplaceAllString(a.(string), "10.0.0.7"))
	}
	f, err := parseServeFlags(args[1:], io.Discard)
	if err != nil {
		t.Fatalf("serve rejects the StatefulSet's flags: %v", err)
	}
	_, grpcPort, _ := net.SplitHostPort(f.grpcAddr)
	var svcPort any
	for _, p := range asList(dig(svc, "spec", "ports")) {
		if dig(p, "port") == port {
			svcPort = p
		}
	}
	if svcPort == nil || dig(svcPort, "targetPort") != "grpc" || strconv.Itoa(port) != grpcPort {
		t.Errorf("Envoy dials port %d: want a port of Service %s targeting grpc, serve's --grpc-addr port (%s)", port, svcName, grpcPort)
	}
	if dig(namedIn(dig(c, "ports"), "grpc"), "containerPort") != port {
		t.Errorf("the pods' grpc containerPort is not Envoy's port %d", port)
	}

	// TLS: Envoy's client certificate, ALPN h2, the pods' name.
	ts := dig(rl, "transport_socket", "typed_config")
	ctx := dig(ts, "common_tls_context")
	if !strings.HasSuffix(dig(ts, "@type").(string), "UpstreamTlsContext") || !slices.Contains(asList(dig(ctx, "alpn_protocols")), any("h2")) {
		t.Errorf("the ringlimit cluster: want an UpstreamTlsContext with ALPN h2 (gRPC), got %v", ts)
	}
	sni, _ := dig(ts, "sni").(string)
	san, _ := dig(ctx, "validation_context", "match_typed_subject_alt_names", 0, "matcher", "exact").(string)
	if f.tlsServerName == "" || sni != f.tlsServerName || san != f.tlsServerName {
		t.Errorf("Envoy's sni %q and SAN %q: want the pods' --tls-server-name %q", sni, san, f.tlsServerName)
	}
	if f.tlsPeerNames == "" {
		t.Error("the StatefulSet has no --tls-peer-name: Envoy's certificate of the same CA would be a peer's")
	}
	files := []string{
		dig(ctx, "tls_certificates", 0, "certificate_chain", "filename").(string),
		dig(ctx, "tls_certificates", 0, "private_key", "filename").(string),
		dig(ctx, "validation_context", "trusted_ca", "filename").(string),
	}
	pod := dig(dep, "spec", "template", "spec")
	mount := namedIn(dig(pod, "containers", 0, "volumeMounts"), "ringlimit-tls")
	secret, _ := dig(namedIn(dig(pod, "volumes"), "ringlimit-tls"), "secret", "secretName").(string)
	for _, file := range files {
		if mount == nil || path.Dir(file) != dig(mount, "mountPath") {
			t.Errorf("Envoy reads %s, outside the mounted secret (%v)", file, dig(mount, "mountPath"))
		}
	}
	cfgMount := dig(namedIn(dig(pod, "containers", 0, "volumeMounts"), "config"), "mountPath")
	if a := dig(pod, "containers", 0, "args"); !slices.Contains(asList(a), any(path.Join(cfgMount.(string), "envoy.yaml"))) {
		t.Errorf("Envoy's args %v do not name the mounted configuration", a)
	}

	// The secrets, as the README's kubectl lines make them.
	readmeText, err := os.ReadFile(filepath.Join(deployDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	secretLine := func(name string) string {
		for _, l := range strings.Split(string(readmeText), "\n") {
			if strings.HasPrefix(l, "kubectl create secret generic "+name+" ") {
				return l
			}
		}
		t.Fatalf("the README makes no secret %s", name)
		return ""
	}
	for _, file := range files {
		if !strings.Contains(secretLine(secret), "--from-file="+path.Base(file)) {
			t.Errorf("the README's secret %s lacks %s", secret, path.Base(file))
		}
	}
	podSecret := dig(namedIn(dig(ss, "spec", "template", "spec", "volumes"), "tls"), "secret", "secretName").(string)
	for _, file := range []string{f.tlsCert, f.tlsKey, f.tlsCA} {
		if !strings.Contains(secretLine(podSecret), "--from-file="+path.Base(file)+"=") {
			t.Errorf("the README's secret %s lacks %s", podSecret, path.Base(file))
		}
	}

	// The filter's domain is the ConfigMap's.
	var pols struct {
		Domains []struct {
			Domain string `yaml:"domain"`
		} `yaml:"domains"`
	}
	if err := yaml.Unmarshal([]byte(dig(docs["ConfigMap"][0], "data", "policies.yaml").(string)), &pols); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(pols.Domains, func(d struct {
		Domain string `yaml:"domain"`
	}) bool {
		return d.Domain == dig(filter, "domain")
	}) {
		t.Errorf("Envoy's domain %v is not in the ConfigMap's policy file (an unknown domain is an error)", dig(filter, "domain"))
	}

	// The recipe's certificates.
	if testing.Short() {
		t.Skip("runs openssl")
	}
	for _, tool := range []string{"bash", "openssl"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("the certificate recipe needs %s: %v", tool, err)
		}
	}
	dir := t.TempDir()
	script := readmeBlocksOf(t, filepath.Join(deployDir, "README.md"), "k8s-tls", "sh")
	rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(rctx, "bash", "-e", "-c", script)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("the certificate recipe failed: %v\noutput:\n%s", err, out.String())
	}
	node, client := parseCertFile(t, filepath.Join(dir, "node.pem")), parseCertFile(t, filepath.Join(dir, "client.pem"))
	for _, name := range []string{f.tlsServerName, host, "ringlimit." + ns + ".svc.cluster.local"} {
		if node.VerifyHostname(name) != nil {
			t.Errorf("the node certificate (SANs %v) does not name %s", node.DNSNames, name)
		}
	}
	if node.VerifyHostname("ringlimit-0.ringlimit-gossip."+ns+".svc.cluster.local") != nil {
		t.Errorf("the node certificate (SANs %v) does not name the pods under the headless Service", node.DNSNames)
	}
	patterns := splitList(f.tlsPeerNames)
	if !peer.PeerCertName(patterns, node) {
		t.Errorf("the node certificate (SANs %v) is no peer's by --tls-peer-name %v", node.DNSNames, patterns)
	}
	if peer.PeerCertName(patterns, client) {
		t.Errorf("Envoy's certificate (SANs %v) is a peer's by --tls-peer-name %v", client.DNSNames, patterns)
	}
	if !slices.Contains(node.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || !slices.Contains(node.ExtKeyUsage, x509.ExtKeyUsageClientAuth) ||
		!slices.Equal(client.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
		t.Errorf("key usages: node %v (want server and client), Envoy %v (want client)", node.ExtKeyUsage, client.ExtKeyUsage)
	}
}
