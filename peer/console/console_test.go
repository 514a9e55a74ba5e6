package console_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/peer/console"
	"github.com/ringlimit/ringlimit/peer/prommetrics"
)

// startNode starts a one-node cluster on loopback with rec as its
// Metrics, closed at cleanup.
func startNode(t *testing.T, rec *console.Recorder) *peer.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := peer.Config{
		Logger: slog.New(slog.DiscardHandler),
		Name:   "solo", GossipAddr: "127.0.0.1:0", RPCAddr: "127.0.0.1:0", GossipProfile: peer.GossipFast,
		Policies: map[string]peer.PolicyConfig{"api": {Limit: 10, Window: time.Minute}},
	}
	if rec != nil {
		cfg.Metrics = rec
	}
	n, err := peer.New(ctx, cfg)
	if err != nil {
		t.Fatalf("peer.New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := n.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return n
}

type got struct {
	status int
	header http.Header
	body   string
}

func do(t *testing.T, h http.Handler, method, target, body string, hdr ...string) got {
	t.Helper()
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	b, _ := io.ReadAll(w.Result().Body)
	return got{w.Code, w.Result().Header, string(b)}
}

// TestHandler serves the page and its JSON from a real node: every answer
// carries the CSP, the node's JSON has every partition, the inspector
// peeks without consuming, and the reset action needs the admin token.
func TestHandler(t *testing.T) {
	rec := console.NewRecorder(nil)
	n := startNode(t, rec)
	c, err := console.New(n, console.Config{Recorder: rec, AdminToken: []byte("s3cret-token")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	for _, path := range []string{"/ui/", "/ui/app.js", "/ui/app.css", "/ui/api/node"} {
		g := do(t, c, "GET", path, "")
		if g.status != http.StatusOK || g.header.Get("Content-Security-Policy") != console.CSP {
			t.Errorf("GET %s: status %d, CSP %q; want 200 and %q", path, g.status, g.header.Get("Content-Security-Policy"), console.CSP)
		}
	}
	if g := do(t, c, "GET", "/ui/", ""); !strings.Contains(g.body, `<script src="app.js"`) || strings.Contains(g.body, "<script>") {
		t.Errorf("index.html must load app.js and hold no inline script:\n%s", g.body)
	}

	key := peer.Key{Tenant: "acme", Subject: "<script>alert(1)</script>", Policy: "api"}
	for range 3 {
		if _, err := n.Allow(context.Background(), peer.Request{Key: key}); err != nil {
			t.Fatal(err)
		}
	}
	rec.Tick(time.Now())
	var node struct {
		Name       string `json:"name"`
		Partitions []struct {
			P int    `json:"p"`
			H string `json:"h"`
			S string `json:"s"`
		} `json:"partitions"`
		Traffic struct {
			Policies map[string][][3]uint64 `json:"policies"`
		} `json:"traffic"`
		Actions bool `json:"actions"`
	}
	g := do(t, c, "GET", "/ui/api/node?full=1", "")
	if err := json.Unmarshal([]byte(g.body), &node); err != nil {
		t.Fatalf("api/node: %v\n%s", err, g.body)
	}
	if node.Name != "solo" || len(node.Partitions) != 271 || !node.Actions {
		t.Errorf("api/node: name %q, %d partitions, actions %v; want solo, 271, true", node.Name, len(node.Partitions), node.Actions)
	}
	for _, p := range node.Partitions {
		if p.H != "solo" || p.S != "deciding" {
			t.Fatalf("partition %d: holder %q state %q, want solo deciding", p.P, p.H, p.S)
		}
	}
	var allowed uint64
	for _, b := range node.Traffic.Policies["api"] {
		allowed += b[0]
	}
	if allowed != 3 {
		t.Errorf("traffic: %d allowed decisions of policy api, want 3 (%v)", allowed, node.Traffic.Policies)
	}

	q := url.Values{"tenant": {key.Tenant}, "subject": {key.Subject}, "policy": {key.Policy}}
	var peek struct {
		Holder    string `json:"holder"`
		Count     int64  `json:"count"`
		Remaining int64  `json:"remaining"`
		Frees     []struct {
			Units int64 `json:"units"`
		} `json:"frees"`
	}
	for range 2 { // looking twice changes nothing
		g = do(t, c, "GET", "/ui/api/peek?"+q.Encode(), "")
		if err := json.Unmarshal([]byte(g.body), &peek); err != nil || g.status != http.StatusOK {
			t.Fatalf("api/peek: %d %v\n%s", g.status, err, g.body)
		}
		if peek.Holder != "solo" || peek.Count != 3 || peek.Remaining != 7 || len(peek.Frees) == 0 || peek.Frees[len(peek.Frees)-1].Units != 10 {
			t.Fatalf("api/peek: %+v; want holder solo, count 3, remaining 7, frees up to 10 units", peek)
		}
	}

	body := `{"tenant":"acme","subject":"<script>alert(1)</script>","policy":"api"}`
	for _, tc := range []struct {
		name   string
		hdr    []string
		status int
	}{
		{"no token", nil, http.StatusUnauthorized},
		{"wrong token", []string{"Authorization", "Bearer nope"}, http.StatusUnauthorized},
		{"not bearer", []string{"Authorization", "s3cret-token"}, http.StatusUnauthorized},
	} {
		if g := do(t, c, "POST", "/ui/api/reset", body, tc.hdr...); g.status != tc.status {
			t.Errorf("%s: reset answered %d %s, want %d", tc.name, g.status, g.body, tc.status)
		}
	}
	// A peek of one unit answers what remains after that unit.
	if d, _ := n.Peek(context.Background(), peer.Request{Key: key, Hits: 1}); d.Remaining != 6 {
		t.Fatalf("a refused reset changed the key: remaining %d after one more, want 6", d.Remaining)
	}
	if g := do(t, c, "POST", "/ui/api/reset", body, "Authorization", "Bearer s3cret-token"); g.status != http.StatusOK {
		t.Fatalf("reset with the token: %d %s", g.status, g.body)
	}
	if d, _ := n.Peek(context.Background(), peer.Request{Key: key, Hits: 1}); d.Remaining != 9 {
		t.Errorf("after reset: remaining %d after one more, want 9", d.Remaining)
	}
	if g := do(t, c, "GET", "/ui/api/reset", ""); g.status != http.StatusNotFound {
		t.Errorf("GET api/reset: %d, want 404", g.status)
	}
	if g := do(t, c, "GET", "/ui/api/peek?tenant=a&subject=b", ""); g.status != http.StatusBadRequest {
		t.Errorf("peek without policy: %d %s, want 400", g.status, g.body)
	}
}

// TestNoActionsWithoutToken: a console without an admin token has no
// actions, whatever the request carries.
func TestNoActionsWithoutToken(t *testing.T) {
	n := startNode(t, nil)
	c, err := console.New(n, console.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g := do(t, c, "POST", "/ui/api/reset", `{"tenant":"a","subject":"b","policy":"api"}`, "Authorization", "Bearer anything")
	if g.status != http.StatusNotFound || !strings.Contains(g.body, "actions are off") {
		t.Errorf("reset without a configured token: %d %s, want 404 saying actions are off", g.status, g.body)
	}
	if _, err := console.New(n, console.Config{AdminToken: []byte{}}); err == nil {
		t.Error("an empty (non-nil) AdminToken was accepted")
	}
}

// TestClusterFanOut: api/cluster holds this node first and lists each peer
// that did not answer with why; a URL answering this node's name is not
// counted twice.
func TestClusterFanOut(t *testing.T) {
	n := startNode(t, nil)
	var self *httptest.Server
	var asked atomic.Int64
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		asked.Add(1)
		_, _ = io.WriteString(w, "<html>")
	}))
	defer garbage.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL + "/ui/"
	dead.Close()
	c, err := console.New(n, console.Config{ClusterCache: time.Hour, Peers: func() []string { return []string{self.URL + "/ui/", garbage.URL + "/ui/", deadURL} }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	self = httptest.NewServer(c)
	defer self.Close()
	var cl struct {
		Nodes []struct {
			Name string `json:"name"`
		} `json:"nodes"`
		Unreached []struct {
			URL string `json:"url"`
		} `json:"unreached"`
	}
	g := do(t, c, "GET", "/ui/api/cluster", "")
	if err := json.Unmarshal([]byte(g.body), &cl); err != nil {
		t.Fatalf("api/cluster: %v\n%s", err, g.body)
	}
	if len(cl.Nodes) != 1 || cl.Nodes[0].Name != "solo" || len(cl.Unreached) != 2 {
		t.Errorf("api/cluster: nodes %+v, unreached %+v; want solo once and 2 unreached (garbage, dead)", cl.Nodes, cl.Unreached)
	}
	if again := do(t, c, "GET", "/ui/api/cluster", ""); again.body != g.body || asked.Load() != 1 {
		t.Errorf("a second api/cluster within ClusterCache asked the peers again (%d asks) or answered differently", asked.Load())
	}
}

// TestRecorderKeepsEveryMethod: the Recorder has every method of
// prommetrics.Metrics, so wrapping it loses none of the optional ones
// the node looks for (spread rights, overage, raft traffic).
func TestRecorderKeepsEveryMethod(t *testing.T) {
	rec := reflect.TypeOf(&console.Recorder{})
	prom := reflect.TypeOf(&prommetrics.Metrics{})
	for i := range prom.NumMethod() {
		m := prom.Method(i)
		if _, ok := rec.MethodByName(m.Name); !ok {
			t.Errorf("console.Recorder lacks %s: the node's calls of it would not reach prommetrics", m.Name)
		}
	}
}
