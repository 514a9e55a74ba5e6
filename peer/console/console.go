package console

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ringlimit/ringlimit/peer"
)

//go:embed assets
var assets embed.FS

// CSP is the Content-Security-Policy of every answer: the page loads its
// own script and style only, talks to its own origin only, and may not be
// framed.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Config configures a Console. The zero value is a read-only console of
// the node alone, without a traffic chart.
type Config struct {
	// Recorder is the Recorder given to the node's peer.Config.Metrics:
	// the source of the traffic chart. Nil: no traffic is shown.
	Recorder *Recorder
	// AdminToken, when set, enables the console's one action, resetting a
	// key, for a request that carries it as a bearer token. Nil: no
	// actions at all.
	AdminToken []byte
	// Peers returns the base URLs of the other members' consoles
	// ("http://10.0.0.2:9091/ui/"), asked for their part of the cluster
	// view; URLs that answer with this node's name are skipped. Nil: the
	// page shows what this node knows only.
	Peers func() []string
	// Client asks the peers; nil: a client with PeerTimeout.
	Client *http.Client
	// PeerTimeout bounds each peer's answer. Zero means 1 s.
	PeerTimeout time.Duration
	// Interval is how often the node's status is sampled for the timeline
	// and its traffic closed into the history. Zero means 1 s.
	Interval time.Duration
	// ClusterCache is how long one api/cluster answer is served again,
	// so that pages refreshing together cost the node and its peers one
	// gathering. Zero means 900 ms; negative, no caching.
	ClusterCache time.Duration
	// Logger receives the reset actions (Info) and peers that did not
	// answer (Debug). Nil: discard.
	Logger *slog.Logger
}

// Console is the node's console: an http.Handler serving the page, its
// assets and its JSON, and the goroutine sampling the node for the
// timeline. Mount it where its path ends in a slash (serve: /ui/ on the
// ops listener); the page's URLs are relative to it. Close stops the
// sampling.
type Console struct {
	node   *peer.Node
	cfg    Config
	log    *slog.Logger
	tl     timeline
	static map[string]asset

	cacheMu  sync.Mutex // guards what follows, never held across I/O
	cacheAt  time.Time
	cacheVal []byte
	flight   *flight // the gathering under way, nil when none

	// lastMu guards the last sample and the api/node answers built from
	// it: a page's refresh costs the node an encoding per sample at most,
	// however many pages ask.
	lastMu   sync.Mutex
	lastAt   time.Time
	lastOv   peer.Overview
	lastNode [2][]byte // api/node without and with full=1; nil until asked

	closeOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
}

type asset struct {
	body  []byte
	ctype string
}

// New returns the console of node and starts sampling it; Close stops.
func New(node *peer.Node, cfg Config) (*Console, error) {
	if node == nil {
		return nil, errors.New("console: nil node")
	}
	if cfg.PeerTimeout == 0 {
		cfg.PeerTimeout = time.Second
	}
	if cfg.Interval == 0 {
		cfg.Interval = time.Second
	}
	if cfg.ClusterCache == 0 {
		cfg.ClusterCache = 900 * time.Millisecond
	}
	if cfg.PeerTimeout < 0 || cfg.Interval < 0 {
		return nil, fmt.Errorf("console: PeerTimeout %v and Interval %v must not be negative", cfg.PeerTimeout, cfg.Interval)
	}
	if cfg.AdminToken != nil && len(cfg.AdminToken) == 0 {
		return nil, errors.New("console: AdminToken is empty: give a long random secret, or nil for no actions")
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: cfg.PeerTimeout}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Console{node: node, cfg: cfg, log: log, static: map[string]asset{}, stop: make(chan struct{}), done: make(chan struct{})}
	for name, ctype := range map[string]string{"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"} {
		b, err := assets.ReadFile("assets/" + name)
		if err != nil {
			return nil, fmt.Errorf("console: embedded asset %s: %w", name, err)
		}
		c.static[name] = asset{b, ctype}
	}
	c.sample(time.Now())
	go c.run()
	return c, nil
}

// Close stops the sampling goroutine and waits for it; a second Close
// returns at once. The handler keeps answering from what was sampled
// last.
func (c *Console) Close() {
	c.closeOnce.Do(func() { close(c.stop) })
	<-c.done
}

func (c *Console) run() {
	defer close(c.done)
	t := time.NewTicker(c.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case now := <-t.C:
			c.sample(now)
		}
	}
}

// sample feeds the timeline one overview of the node and the recorder's
// history what was counted since the last sample.
func (c *Console) sample(now time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Interval)
	st := c.node.Overview(ctx)
	cancel()
	c.tl.observe(st, now)
	if c.cfg.Recorder != nil {
		c.cfg.Recorder.Tick(now)
	}
	c.lastMu.Lock()
	c.lastAt, c.lastOv, c.lastNode = now, st, [2][]byte{}
	c.lastMu.Unlock()
}

// nodeAnswer returns api/node's answer (full: every partition) as of the
// last sample, encoding it on the first ask after each sample.
func (c *Console) nodeAnswer(full bool) []byte {
	i := 0
	if full {
		i = 1
	}
	c.lastMu.Lock()
	defer c.lastMu.Unlock()
	if c.lastNode[i] == nil {
		b, err := json.Marshal(c.snapshot(c.lastOv, c.lastAt, full))
		if err != nil {
			return []byte(`{"error":"internal error"}`)
		}
		c.lastNode[i] = append(b, '\n')
	}
	return c.lastNode[i]
}

// Counters returns what the sampling has counted so far.
func (c *Console) Counters() Counters { return c.tl.counters() }

// ServeHTTP serves the page at the mount point, its assets, and api/*.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	// The route is the last path element(s) after the mount point, so
	// the console answers alike under any prefix.
	path := r.URL.Path
	route := ""
	if i := strings.LastIndex(path, "/api/"); i >= 0 {
		route = path[i+1:]
	} else if i := strings.LastIndex(path, "/"); i >= 0 {
		route = path[i+1:]
	}
	if route == "" {
		route = "index.html"
	}
	if a, ok := c.static[route]; ok {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h.Set("Content-Type", a.ctype)
		_, _ = w.Write(a.body)
		return
	}
	switch {
	case route == "api/node" && r.Method == http.MethodGet:
		writeRaw(w, c.nodeAnswer(r.URL.Query().Get("full") == "1"))
	case route == "api/cluster" && r.Method == http.MethodGet:
		c.serveCluster(w, r)
	case route == "api/peek" && r.Method == http.MethodGet:
		c.servePeek(w, r)
	case route == "api/reset" && r.Method == http.MethodPost:
		c.serveReset(w, r)
	case strings.HasPrefix(route, "api/"):
		c.writeJSON(w, http.StatusNotFound, errorJSON{Error: "no such console call (or wrong method): " + route})
	default:
		http.NotFound(w, r)
	}
}

type errorJSON struct {
	Error string `json:"error"`
}

func (c *Console) writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"internal error"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// nodeJSON is one node's answer to api/node: its status, timeline,
// traffic and hot keys. Partitions are every partition with full=1,
// else only those it holds (the table is replicated: every member's
// agrees; only the holder knows its keys and whether it decides).
type nodeJSON struct {
	Name           string       `json:"name"`
	At             time.Time    `json:"at"`
	RPCAddr        string       `json:"rpc_addr"`
	Ready          bool         `json:"ready"`
	NotReady       string       `json:"not_ready,omitempty"`
	Voter          bool         `json:"voter"`
	Term           uint64       `json:"term"`
	Leader         string       `json:"leader"`
	LivenessLeftMs int64        `json:"liveness_left_ms"`
	Fingerprint    string       `json:"fingerprint"`
	PolicyVersion  uint64       `json:"policy_version"`
	RingVersion    uint64       `json:"ring_version"`
	Members        []memberJSON `json:"members"`
	Partitions     []partJSON   `json:"partitions"`
	Events         []Event      `json:"events"`
	Traffic        *Traffic     `json:"traffic,omitempty"`
	HotKeys        []hotKeyJSON `json:"hot_keys"`
	Policies       []policyJSON `json:"policies,omitempty"`
	Actions        bool         `json:"actions"`
}

type memberJSON struct {
	Name          string `json:"name"`
	Incarnation   string `json:"incarnation"`
	RPCAddr       string `json:"rpc_addr"`
	GossipAddr    string `json:"gossip_addr"`
	Gossip        string `json:"gossip"`
	LivenessEpoch uint64 `json:"liveness_epoch"`
	LivenessEnded bool   `json:"liveness_ended"`
	PolicyVersion uint64 `json:"policy_version"`
	Ignored       string `json:"ignored,omitempty"`
}

type partJSON struct {
	P      int    `json:"p"`
	Holder string `json:"h,omitempty"`
	Backup string `json:"b,omitempty"`
	Epoch  uint64 `json:"e"`
	Target string `json:"t,omitempty"`
	// State is this node's part: "deciding" or "fenced" when it holds
	// the partition, "" otherwise.
	State string `json:"s,omitempty"`
	Keys  int    `json:"k,omitempty"`
}

type hotKeyJSON struct {
	Tenant  string  `json:"tenant"`
	Subject string  `json:"subject"`
	Policy  string  `json:"policy"`
	Rate    float64 `json:"rate"`
	Holder  string  `json:"holder"`
	// Spread: a key of a spread policy this node decides from rights;
	// Rights left, Granted in all, Asking whether it asks for more.
	Spread  bool  `json:"spread,omitempty"`
	Rights  int64 `json:"rights_left,omitempty"`
	Granted int64 `json:"rights_granted,omitempty"`
	Asking  bool  `json:"asking,omitempty"`
}

type policyJSON struct {
	Name          string `json:"name"`
	Limit         int64  `json:"limit"`
	Window        string `json:"window"`
	Algorithm     string `json:"algorithm"`
	OnUnavailable string `json:"on_unavailable"`
	Shadow        bool   `json:"shadow,omitempty"`
}

// maxEventsShown bounds the events one api/node answer carries: the
// newest.
const maxEventsShown = 100

func newest(ev []Event, n int) []Event { return ev[max(len(ev)-n, 0):] }

// snapshot builds api/node's answer from st, sampled at now. Called with
// lastMu held (it reads no I/O: hot keys, policies and the recorder are
// in memory).
func (c *Console) snapshot(st peer.Overview, now time.Time, full bool) nodeJSON {
	out := nodeJSON{
		Name: st.Name, At: now, RPCAddr: st.RPCAddr, Ready: st.Ready, NotReady: st.NotReady, Voter: st.Voter, Term: st.Term,
		Leader: st.Leader, LivenessLeftMs: st.LivenessLeft.Milliseconds(), Fingerprint: fmt.Sprintf("%016x", st.Fingerprint),
		PolicyVersion: st.PolicyVersion, RingVersion: st.RingVersion, Events: newest(c.tl.list(), maxEventsShown), Actions: c.cfg.AdminToken != nil,
		Members: []memberJSON{}, Partitions: []partJSON{}, HotKeys: []hotKeyJSON{},
	}
	for _, m := range st.Members {
		out.Members = append(out.Members, memberJSON{Name: m.Name, Incarnation: m.Incarnation, RPCAddr: m.RPCAddr, GossipAddr: m.GossipAddr,
			Gossip: m.Gossip, LivenessEpoch: m.LivenessEpoch, LivenessEnded: m.LivenessEnded, PolicyVersion: m.PolicyVersion, Ignored: m.Ignored})
	}
	for _, p := range st.Partitions {
		mine := p.Deciding || p.Fenced
		if !full && !mine {
			continue
		}
		pj := partJSON{P: p.Partition, Holder: p.Holder, Backup: p.Backup, Epoch: p.Epoch, Target: p.Target, Keys: p.Keys}
		switch {
		case p.Deciding:
			pj.State = "deciding"
		case p.Fenced:
			pj.State = "fenced"
		}
		out.Partitions = append(out.Partitions, pj)
	}
	if c.cfg.Recorder != nil {
		t := c.cfg.Recorder.Traffic(time.Now())
		out.Traffic = &t
	}
	for _, h := range c.node.HotKeys() {
		out.HotKeys = append(out.HotKeys, hotKeyJSON{Tenant: h.Key.Tenant, Subject: h.Key.Subject, Policy: h.Key.Policy, Rate: h.Rate, Holder: st.Name})
	}
	for _, k := range c.node.SpreadKeys() {
		out.HotKeys = append(out.HotKeys, hotKeyJSON{Tenant: k.Key.Tenant, Subject: k.Key.Subject, Policy: k.Key.Policy, Rate: k.Rate, Holder: st.Name,
			Spread: true, Rights: k.Rights, Granted: k.Granted, Asking: k.Active})
	}
	if full {
		for name, pc := range c.node.Policies() {
			out.Policies = append(out.Policies, policyJSON{Name: name, Limit: pc.Limit, Window: pc.Window.String(), Algorithm: fmt.Sprint(pc.Algorithm),
				OnUnavailable: fmt.Sprint(pc.OnUnavailable), Shadow: pc.Shadow})
		}
		sort.Slice(out.Policies, func(i, j int) bool { return out.Policies[i].Name < out.Policies[j].Name })
	}
	return out
}

// clusterJSON is api/cluster: this node's full answer and every peer's
// (or why it did not answer).
type clusterJSON struct {
	Self  string            `json:"self"`
	Nodes []json.RawMessage `json:"nodes"`
	// Unreached lists the peers that did not answer, with why.
	Unreached []unreachedJSON `json:"unreached"`
}

type unreachedJSON struct {
	URL   string `json:"url"`
	Error string `json:"error"`
}

// maxPeerAnswer bounds what is read from one peer.
const maxPeerAnswer = 4 << 20

// serveCluster answers api/cluster: this node's own view with every
// partition, and each peer's api/node, asked in parallel, each within
// PeerTimeout. The cluster view is gathered here, on the server, rather
// than by the page from every node: the page then talks to one origin
// (its CSP allows no other), and no node has to let other origins read
// its ops endpoints.
func (c *Console) serveCluster(w http.ResponseWriter, r *http.Request) {
	c.cacheMu.Lock()
	if c.cacheVal != nil && time.Since(c.cacheAt) < c.cfg.ClusterCache {
		b := c.cacheVal
		c.cacheMu.Unlock()
		writeRaw(w, b)
		return
	}
	f := c.flight
	if f == nil {
		// This request gathers; the ones that come meanwhile wait for
		// its answer rather than gather again.
		f = &flight{done: make(chan struct{})}
		c.flight = f
		c.cacheMu.Unlock()
		f.val = c.gather(context.WithoutCancel(r.Context()))
		c.cacheMu.Lock()
		c.cacheAt, c.cacheVal, c.flight = time.Now(), f.val, nil
		c.cacheMu.Unlock()
		close(f.done)
	} else {
		c.cacheMu.Unlock()
		select {
		case <-f.done:
		case <-r.Context().Done():
			return
		}
	}
	writeRaw(w, f.val)
}

// flight is one gathering of api/cluster; val is set before done closes.
type flight struct {
	done chan struct{}
	val  []byte
}

func writeRaw(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// gather builds api/cluster's answer: this node's full answer first, then
// each peer's, asked in parallel within PeerTimeout each.
func (c *Console) gather(ctx context.Context) []byte {
	selfJSON := c.nodeAnswer(true)
	out := clusterJSON{Self: c.node.Name(), Nodes: []json.RawMessage{selfJSON}, Unreached: []unreachedJSON{}}
	var urls []string
	if c.cfg.Peers != nil {
		urls = c.cfg.Peers()
	}
	answers := make([]json.RawMessage, len(urls))
	errs := make([]error, len(urls))
	var wg sync.WaitGroup
	for i, u := range urls {
		wg.Go(func() { answers[i], errs[i] = c.askPeer(ctx, u) })
	}
	wg.Wait()
	seen := map[string]bool{out.Self: true}
	for i, a := range answers {
		if errs[i] != nil {
			c.log.Debug("console peer did not answer", "peer_url", urls[i], "err", errs[i])
			out.Unreached = append(out.Unreached, unreachedJSON{URL: urls[i], Error: errs[i].Error()})
			continue
		}
		var head struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(a, &head); err != nil || head.Name == "" {
			out.Unreached = append(out.Unreached, unreachedJSON{URL: urls[i], Error: "answer is not a console's api/node"})
			continue
		}
		if seen[head.Name] {
			continue
		}
		seen[head.Name] = true
		out.Nodes = append(out.Nodes, a)
	}
	// The nodes' answers are JSON already (checked): written as they
	// are, not re-encoded.
	var b bytes.Buffer
	name, _ := json.Marshal(out.Self)
	unreached, _ := json.Marshal(out.Unreached)
	b.WriteString(`{"self":`)
	b.Write(name)
	b.WriteString(`,"nodes":[`)
	for i, n := range out.Nodes {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(n)
	}
	b.WriteString(`],"unreached":`)
	b.Write(unreached)
	b.WriteString("}\n")
	return b.Bytes()
}

func (c *Console) askPeer(ctx context.Context, base string) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.PeerTimeout)
	defer cancel()
	if !strings.HasSuffix(base, "/") {
		base += "/"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"api/node", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.cfg.Client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxPeerAnswer))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s", base, resp.Status)
	}
	if !json.Valid(b) {
		return nil, fmt.Errorf("%s answered no JSON", base)
	}
	return b, nil
}
