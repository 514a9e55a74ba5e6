package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

func TestDNSJoinParse(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in      string
		want    []joinEntry
		wantErr string
	}{
		{in: "10.0.0.1:7946, b:7946", want: []joinEntry{{name: "10.0.0.1:7946"}, {name: "b:7946"}}},
		{in: "dns+rl.default.svc:7946", want: []joinEntry{{kind: "dns", name: "rl.default.svc", port: "7946"}}},
		{in: "dnssrv+_gossip._tcp.rl.default.svc", want: []joinEntry{{kind: "dnssrv", name: "_gossip._tcp.rl.default.svc"}}},
		{in: "dns+rl.default.svc", wantErr: "want dns+NAME:PORT"},
		{in: "dns+rl:0", wantErr: "want dns+NAME:PORT"},
		{in: "dnssrv+", wantErr: "want dnssrv+NAME"},
		{in: "srv+x", wantErr: "unknown scheme"},
	} {
		got, err := parseJoin(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("parseJoin(%q) error %v, want one containing %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("parseJoin(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

// dnsServer answers A, AAAA and SRV questions from its tables over UDP on
// 127.0.0.1, until the test ends. Names are absolute ("x.test.").
type dnsServer struct {
	a   map[string][]netip.Addr
	srv map[string][]dnsmessage.SRVResource
}

func (s *dnsServer) start(t *testing.T) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { _ = pc.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return // closed at cleanup
			}
			if resp, ok := s.answer(buf[:n]); ok {
				_, _ = pc.WriteTo(resp, from)
			}
		}
	}()
	addr := pc.LocalAddr().String()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", addr)
	}}
}

func (s *dnsServer) answer(req []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(req)
	if err != nil {
		return nil, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, false
	}
	name := q.Name.String()
	_, knownA := s.a[name]
	_, knownSRV := s.srv[name]
	rcode := dnsmessage.RCodeSuccess
	if !knownA && !knownSRV {
		rcode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RCode: rcode})
	b.EnableCompression()
	_ = b.StartQuestions()
	_ = b.Question(q)
	_ = b.StartAnswers()
	rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}
	switch q.Type {
	case dnsmessage.TypeA, dnsmessage.TypeAAAA:
		for _, ip := range s.a[name] {
			switch {
			case q.Type == dnsmessage.TypeA && ip.Is4():
				_ = b.AResource(rh, dnsmessage.AResource{A: ip.As4()})
			case q.Type == dnsmessage.TypeAAAA && ip.Is6():
				_ = b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: ip.As16()})
			}
		}
	case dnsmessage.TypeSRV:
		for _, r := range s.srv[name] {
			_ = b.SRVResource(rh, r)
		}
	}
	out, err := b.Finish()
	return out, err == nil
}

// TestDNSJoinResolve resolves dns+ and dnssrv+ entries through a real Go
// resolver talking to an in-test DNS server on loopback, leaving out the
// node's own address.
func TestDNSJoinResolve(t *testing.T) {
	t.Parallel()
	srv := &dnsServer{
		a: map[string][]netip.Addr{
			"pods.test.": {netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2"), netip.MustParseAddr("::1")},
			"p0.test.":   {netip.MustParseAddr("127.0.0.1")},
			"p1.test.":   {netip.MustParseAddr("127.0.0.3")},
		},
		srv: map[string][]dnsmessage.SRVResource{
			"_gossip._tcp.pods.test.": {
				{Priority: 1, Weight: 1, Port: 7001, Target: dnsmessage.MustNewName("p0.test.")},
				{Priority: 1, Weight: 1, Port: 7002, Target: dnsmessage.MustNewName("p1.test.")},
			},
		},
	}
	r := srv.start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	entries, err := parseJoin("dns+pods.test.:7001,dnssrv+_gossip._tcp.pods.test.,10.1.1.1:7946")
	if err != nil {
		t.Fatal(err)
	}
	got, err := resolveJoin(ctx, r, entries, selfFunc("7001"))
	want := []string{"10.1.1.1:7946", "127.0.0.2:7001", "127.0.0.3:7002"}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("resolveJoin = %v, %v; want %v (127.0.0.1:7001 and [::1]:7001 are this node)", got, err, want)
	}
	// Another node's view: only its own port is left out.
	got, _ = resolveJoin(ctx, r, entries[:1], selfFunc("9999"))
	if want := []string{"127.0.0.1:7001", "127.0.0.2:7001", "[::1]:7001"}; !reflect.DeepEqual(got, want) {
		t.Errorf("resolveJoin from another port = %v, want %v", got, want)
	}
	// A missing name is reported; the others still resolve.
	entries, _ = parseJoin("dns+missing.test.:7001,dns+pods.test.:7003")
	got, err = resolveJoin(ctx, r, entries, selfFunc("0"))
	if err == nil || !strings.Contains(err.Error(), "missing.test") || len(got) != 3 {
		t.Errorf("resolveJoin with a missing name = %v, %v; want 3 addresses and an error naming missing.test", got, err)
	}
}

// fakeJoiner records Join calls.
type fakeJoiner struct {
	mu    sync.Mutex
	calls [][]string
	err   error
}

func (f *fakeJoiner) Join(_ context.Context, addrs []string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, addrs)
	return len(addrs), f.err
}

// stubResolver answers from fixed tables.
type stubResolver struct{ ips map[string][]net.IPAddr }

func (s stubResolver) LookupIPAddr(_ context.Context, host string) ([]net.IPAddr, error) {
	if ips, ok := s.ips[host]; ok {
		return ips, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (stubResolver) LookupSRV(context.Context, string, string, string) (string, []*net.SRV, error) {
	return "", nil, errors.New("no SRV")
}

// TestDNSJoinRefresh calls one refresh round directly (the ticker in
// serve calls the same function): new addresses reach Node.Join; nothing
// resolved means no call.
func TestDNSJoinRefresh(t *testing.T) {
	t.Parallel()
	r := stubResolver{ips: map[string][]net.IPAddr{"pods": {{IP: net.ParseIP("127.0.0.5")}, {IP: net.ParseIP("127.0.0.6")}}}}
	entries, _ := parseJoin("dns+pods:7946")
	j := &fakeJoiner{}
	log := slog.New(slog.DiscardHandler)
	refreshJoin(context.Background(), r, j, entries, selfFunc("0"), log)
	entries2, _ := parseJoin("dns+gone:7946")
	refreshJoin(context.Background(), r, j, entries2, selfFunc("0"), log)
	if want := [][]string{{"127.0.0.5:7946", "127.0.0.6:7946"}}; !reflect.DeepEqual(j.calls, want) {
		t.Errorf("Join calls %v, want %v", j.calls, want)
	}
}

// TestDNSJoinServe runs serve with --join dns+localhost:PORT: b joins a
// through the name at start-up, and c, started later as a cluster of its
// own on a port b's second name already named, is contacted by b's
// periodic re-resolution. c was founded separately (two first pods that
// raced), so the clusters refuse each other rather than merge: c and b
// say so in /readyz, and a and b stay a cluster of 2.
func TestDNSJoinServe(t *testing.T) {
	pols := writeFile(t, t.TempDir(), "policies.yaml", envoyPolicies)
	a := startServe(t, "dns-a", nil, "--policies", pols)
	_, aPort, _ := net.SplitHostPort(a.gossipAddr)
	// c's gossip port, chosen now so that b's --join can name it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cPort := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	_ = l.Close()
	b := startServe(t, "dns-b", nil, "--policies", pols, "--join", "dns+localhost:"+aPort+",dns+localhost:"+cPort, "--join-refresh", "100ms")
	waitMembers(t, []*serveProc{a, b}, 2)
	c := startServe(t, "dns-c", nil, "--policies", pols, "--gossip-addr", "127.0.0.1:"+cPort)
	nodes := []*serveProc{a, b, c}
	refuses := func(p *serveProc, other string) bool {
		r, err := httpDo("GET", "http://"+p.httpAddr+"/readyz", "")
		why, _ := r.body["reason"].(string)
		return err == nil && r.status == http.StatusServiceUnavailable && strings.Contains(why, other+" (member of another cluster")
	}
	waitFor(t, 20*time.Second, "b and c to refuse each other's cluster", func() bool {
		return strings.Contains(b.logText(), "dns join: joined") && refuses(b, "dns-c") && refuses(c, "dns-b")
	})
	for _, p := range []*serveProc{a, b} {
		r, err := httpDo("GET", "http://"+p.httpAddr+"/debug/ring", "")
		if ms, _ := r.body["members"].([]any); err != nil || len(ms) != 2 {
			t.Errorf("%s's ring has %d members (err %v), want a and b only", p.name, len(ms), err)
		}
	}
	for _, p := range []*serveProc{c, b, a} {
		if code := p.terminate(t); code != 0 {
			t.Errorf("%s exit code %d after SIGTERM, want 0", p.name, code)
		}
	}
	// Every line names its node: serve's own (dns join, shutdown) too,
	// as the node's lines do.
	for _, p := range nodes {
		for _, l := range strings.Split(strings.TrimSpace(p.logText()), "\n") {
			var rec map[string]any
			if err := json.Unmarshal([]byte(l), &rec); err != nil || rec["node"] != p.name {
				t.Errorf("%s logged a line without node=%s: %s", p.name, p.name, l)
			}
		}
	}
}
