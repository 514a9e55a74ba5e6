package peer

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// badKeys are keys that fail validation, each with one bad part.
func badKeys() []struct {
	name string
	key  Key
} {
	long := strings.Repeat("x", 129)
	return []struct {
		name string
		key  Key
	}{
		{"empty_tenant", Key{Tenant: "", Subject: "s", Policy: "p"}},
		{"empty_subject", Key{Tenant: "t", Subject: "", Policy: "p"}},
		{"empty_policy", Key{Tenant: "t", Subject: "s", Policy: ""}},
		{"long_tenant", Key{Tenant: long, Subject: "s", Policy: "p"}},
		{"long_subject", Key{Tenant: "t", Subject: long, Policy: "p"}},
		{"long_policy", Key{Tenant: "t", Subject: "s", Policy: long}},
		{"control_tenant", Key{Tenant: "t\x00", Subject: "s", Policy: "p"}},
		{"newline_subject", Key{Tenant: "t", Subject: "s\n", Policy: "p"}},
		{"space_subject", Key{Tenant: "t", Subject: "a b", Policy: "p"}},
		{"delete_policy", Key{Tenant: "t", Subject: "s", Policy: "p\x7f"}},
		{"utf8_subject", Key{Tenant: "t", Subject: "jürgen", Policy: "p"}},
	}
}

// TestInputAllow sends bad requests through Allow, on a key owned locally
// and on one owned by the other node, and checks each is refused with the
// right sentinel and records nothing.
func TestInputAllow(t *testing.T) {
	const limit = 5
	c := startCluster(t, 2, Config{Policies: map[string]PolicyConfig{"p": {Limit: limit, Window: time.Minute}}})
	via := c.nodes[0]
	for _, owner := range c.nodes {
		t.Run("owner="+owner.Name(), func(t *testing.T) {
			good := pmKeyOwnedBy(t, via, "p", owner.Name())
			remaining := func() int64 {
				t.Helper()
				d, err := via.Allow(context.Background(), Request{Key: good})
				if err != nil || !d.Allowed || d.Owner != owner.Name() {
					t.Fatalf("Allow(%v) = %+v, %v; want admitted by %s", good, d, err, owner.Name())
				}
				return d.Remaining
			}
			if got := remaining(); got != limit-1 {
				t.Fatalf("first request left %d, want %d", got, limit-1)
			}
			type tc struct {
				name string
				req  Request
				want error
			}
			var cases []tc
			for _, bk := range badKeys() {
				// Each bad part sits beside the good key's other parts, so
				// a bad request that slipped through would hit good's log
				// or a neighbour of it.
				k := good
				switch {
				case bk.key.Tenant != "t":
					k.Tenant = bk.key.Tenant
				case bk.key.Subject != "s":
					k.Subject = bk.key.Subject
				default:
					k.Policy = bk.key.Policy
				}
				cases = append(cases, tc{"key/" + bk.name, Request{Key: k}, ErrInvalidKey})
			}
			unknown := good
			unknown.Policy = "nope"
			cases = append(cases,
				tc{"unknown_policy", Request{Key: unknown}, ErrUnknownPolicy},
				tc{"hits=-1", Request{Key: good, Hits: -1}, ErrInvalidHits},
				tc{"hits=limit+1", Request{Key: good, Hits: limit + 1}, ErrInvalidHits},
				tc{"hits=maxint", Request{Key: good, Hits: 1<<63 - 1}, ErrInvalidHits},
			)
			for _, tc := range cases {
				d, err := via.Allow(context.Background(), tc.req)
				if !errors.Is(err, tc.want) || !reflect.DeepEqual(d, Decision{}) {
					t.Errorf("%s: Allow(%+v) = %+v, %v; want no decision and %v", tc.name, tc.req, d, err, tc.want)
				}
			}
			if got := remaining(); got != limit-2 {
				t.Fatalf("after the bad requests the key has %d remaining, want %d: a bad request was recorded", got, limit-2)
			}
		})
	}
}

// TestInputWire sends bad input over gRPC: to the peer service (Check) and
// to the public RateLimiter service.
func TestInputWire(t *testing.T) {
	const limit = 5
	c := startCluster(t, 2, Config{Policies: map[string]PolicyConfig{"p": {Limit: limit, Window: time.Minute}}})
	nd := c.nodes[0]
	conn, err := grpc.NewClient(nd.RPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	peerc := peerpb.NewLimiterClient(conn)
	public := peerpb.NewRateLimiterClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mine := pmKeyOwnedBy(t, nd, "p", nd.Name())
	theirs := pmKeyOwnedBy(t, nd, "p", c.nodes[1].Name())
	wire := func(k Key) *peerpb.Key { return &peerpb.Key{Tenant: k.Tenant, Subject: k.Subject, Policy: k.Policy} }
	remaining := func() int64 {
		t.Helper()
		resp, err := public.Allow(ctx, &peerpb.AllowRequest{Key: wire(mine)})
		if err != nil || !resp.GetAllowed() || resp.GetOwner() != nd.Name() {
			t.Fatalf("public Allow(%v) = %v, %v; want admitted by %s", mine, resp, err, nd.Name())
		}
		return resp.GetRemaining()
	}
	if got := remaining(); got != limit-1 {
		t.Fatalf("first request left %d, want %d", got, limit-1)
	}

	t.Run("check/too_many_items", func(t *testing.T) {
		items := make([]*peerpb.CheckItem, maxWireBatch+1)
		for i := range items {
			items[i] = &peerpb.CheckItem{Key: wire(mine)}
		}
		_, err := peerc.Check(ctx, &peerpb.CheckRequest{Sender: "test", Items: items})
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("Check with %d items = %v, want InvalidArgument", len(items), err)
		}
	})

	t.Run("check/per_item", func(t *testing.T) {
		type tc struct {
			name string
			item *peerpb.CheckItem
			want peerpb.Status
		}
		var cases []tc
		for _, bk := range badKeys() {
			want := peerpb.Status_STATUS_INVALID_ARGUMENT
			cases = append(cases, tc{"key/" + bk.name, &peerpb.CheckItem{Key: wire(bk.key)}, want})
		}
		unknown := mine
		unknown.Policy = "nope"
		cases = append(cases,
			tc{"no_key", &peerpb.CheckItem{}, peerpb.Status_STATUS_INVALID_ARGUMENT},
			tc{"unknown_policy", &peerpb.CheckItem{Key: wire(unknown)}, peerpb.Status_STATUS_UNKNOWN_POLICY},
			tc{"hits=-1", &peerpb.CheckItem{Key: wire(mine), Hits: -1}, peerpb.Status_STATUS_INVALID_ARGUMENT},
			tc{"hits=limit+1", &peerpb.CheckItem{Key: wire(mine), Hits: limit + 1}, peerpb.Status_STATUS_INVALID_ARGUMENT},
			tc{"not_owner", &peerpb.CheckItem{Key: wire(theirs)}, peerpb.Status_STATUS_NOT_OWNER},
		)
		// One batch: items are decided independently.
		items := make([]*peerpb.CheckItem, len(cases))
		for i, tc := range cases {
			items[i] = tc.item
		}
		resp, err := peerc.Check(ctx, &peerpb.CheckRequest{Sender: "test", Items: items})
		if err != nil {
			t.Fatalf("Check: %v", err)
		}
		if len(resp.GetDecisions()) != len(cases) {
			t.Fatalf("Check answered %d decisions for %d items", len(resp.GetDecisions()), len(cases))
		}
		for i, tc := range cases {
			d := resp.GetDecisions()[i]
			if d.GetStatus() != tc.want || d.GetAllowed() {
				t.Errorf("%s: decision %v, want status %v and not allowed", tc.name, d, tc.want)
			}
		}
		if n := resp.GetDecisions()[len(cases)-1]; n.GetOwner() != c.nodes[1].Name() {
			t.Errorf("not-owner answer names %q as owner, want %s", n.GetOwner(), c.nodes[1].Name())
		}
	})

	t.Run("public", func(t *testing.T) {
		type tc struct {
			name string
			req  *peerpb.AllowRequest
			want codes.Code
		}
		var cases []tc
		for _, bk := range badKeys() {
			cases = append(cases, tc{"key/" + bk.name, &peerpb.AllowRequest{Key: wire(bk.key)}, codes.InvalidArgument})
		}
		unknown := mine
		unknown.Policy = "nope"
		cases = append(cases,
			tc{"no_key", &peerpb.AllowRequest{}, codes.InvalidArgument},
			tc{"unknown_policy", &peerpb.AllowRequest{Key: wire(unknown)}, codes.NotFound},
			tc{"hits=-1", &peerpb.AllowRequest{Key: wire(mine), Hits: -1}, codes.InvalidArgument},
			tc{"hits=limit+1", &peerpb.AllowRequest{Key: wire(mine), Hits: limit + 1}, codes.InvalidArgument},
		)
		for _, tc := range cases {
			resp, err := public.Allow(ctx, tc.req)
			if status.Code(err) != tc.want {
				t.Errorf("%s: Allow(%v) = %v, %v; want code %v", tc.name, tc.req, resp, err, tc.want)
			}
		}
	})

	if got := remaining(); got != limit-2 {
		t.Fatalf("after the bad wire requests the key has %d remaining, want %d: a bad request was recorded", got, limit-2)
	}
}

// leafErrors flattens errors.Join trees.
func leafErrors(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, leafErrors(e)...)
		}
		return out
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

// TestInputConfig checks that New reports every bad field at once, each
// wrapping ErrInvalidConfig, and never writes into the caller's Config.
func TestInputConfig(t *testing.T) {
	bad := func() Config {
		return Config{
			GossipAddr:      "no-port",
			MaxBatch:        maxWireBatch + 1,
			MaxInFlight:     -1,
			NotOwnerRetries: -2,
			ForwardTimeout:  -time.Second,
			GossipKey:       []byte("short"),
			HotKeys:         -1,
			Join:            []string{"127.0.0.1:1"},
			Policies: map[string]PolicyConfig{
				"zero":     {Limit: 0, Window: time.Minute},
				"bad name": {Limit: 1, Window: time.Minute},
				"fallback": {Limit: 1, Window: time.Minute, FallbackLimit: -1},
			},
		}
	}
	cfg := bad()
	nd, err := New(context.Background(), cfg)
	if err == nil {
		_ = nd.Close(context.Background())
		t.Fatal("New accepted a bad config")
	}
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New error %v does not wrap ErrInvalidConfig", err)
	}
	leaves := leafErrors(err)
	for _, e := range leaves {
		if !errors.Is(e, ErrInvalidConfig) {
			t.Errorf("problem %q does not wrap ErrInvalidConfig", e)
		}
	}
	for _, want := range []string{"gossip address", "max batch", "max in flight", "not-owner retries", "forward timeout", "gossip key", `policy "zero"`, `policy name "bad name"`, `policy "fallback"`, "hot keys"} {
		if !slices.ContainsFunc(leaves, func(e error) bool { return strings.Contains(e.Error(), want) }) {
			t.Errorf("New error does not report the bad %s; got:\n%v", want, err)
		}
	}
	if !reflect.DeepEqual(cfg, bad()) {
		t.Errorf("New changed the caller's config: got %+v, want %+v", cfg, bad())
	}

	// A valid config with zero fields: New fills in defaults on its copy.
	good := func() Config {
		return Config{Policies: map[string]PolicyConfig{"p": {Limit: 1, Window: time.Second}}, Join: []string{}}
	}
	cfg = good()
	nd, err = New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New(valid config): %v", err)
	}
	if err := nd.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !reflect.DeepEqual(cfg, good()) {
		t.Errorf("New changed the caller's config: got %+v, want %+v", cfg, good())
	}
}

// TestInputGossipKey starts a node whose gossip key differs from the
// cluster's: memberlist cannot decrypt its join, so New fails, having
// released everything it started.
func TestInputGossipKey(t *testing.T) {
	c := startCluster(t, 1, Config{GossipKey: []byte("0123456789abcdef")})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nd, err := New(ctx, Config{
		Name:      "intruder",
		GossipKey: []byte("fedcba9876543210"),
		Join:      []string{c.nodes[0].GossipAddr()},
		// The join is retried until JoinTimeout: a wrong key looks like a
		// seed that does not answer.
		JoinTimeout: time.Second,
		Gossip:      fastGossip,
		Logger:      testLogger(t),
	})
	if err == nil {
		_ = nd.Close(context.Background())
		t.Fatal("a node with another gossip key joined the cluster")
	}
	t.Logf("New: %v", err)
	if got := c.nodes[0].GossipMembers(); got != 1 {
		t.Fatalf("the cluster's gossip knows %d members after the failed join, want 1", got)
	}
	if got := c.nodes[0].Members(); !slices.Equal(got, []string{"n0"}) {
		t.Fatalf("ring members = %v, want [n0]", got)
	}
}

// logWatch is a slog handler that signals when a record with a given message
// and "peer" attribute is logged.
type logWatch struct {
	msg  string
	mu   *sync.Mutex
	seen map[string]chan struct{} // peer -> closed when logged
}

func newLogWatch(msg string) *logWatch {
	return &logWatch{msg: msg, mu: &sync.Mutex{}, seen: map[string]chan struct{}{}}
}

// wait returns a channel closed once msg has been logged about peer.
func (w *logWatch) wait(peer string) <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch := w.seen[peer]
	if ch == nil {
		ch = make(chan struct{})
		w.seen[peer] = ch
	}
	return ch
}

func (w *logWatch) Enabled(context.Context, slog.Level) bool { return true }
func (w *logWatch) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w *logWatch) WithGroup(string) slog.Handler            { return w }
func (w *logWatch) Handle(_ context.Context, r slog.Record) error {
	if r.Message != w.msg {
		return nil
	}
	r.Attrs(func(a slog.Attr) bool {
		if a.Key != "peer" {
			return true
		}
		w.mu.Lock()
		ch := w.seen[a.Value.String()]
		if ch == nil {
			ch = make(chan struct{})
			w.seen[a.Value.String()] = ch
		}
		select {
		case <-ch:
		default:
			close(ch)
		}
		w.mu.Unlock()
		return false
	})
	return nil
}

// TestInputFingerprintMismatch joins a node whose placement (ring
// parameters) differs. It gossips with the cluster, but each side logs the
// mismatch and leaves the other out of its ring, so it never owns a key of
// the cluster's. (Another policy table is no mismatch: TestPolicyRolling.)
func TestInputFingerprintMismatch(t *testing.T) {
	const msg = "member ignored: placement fingerprint differs"
	watches := []*logWatch{newLogWatch(msg), newLogWatch(msg)}
	c := startClusterWith(t, 2, Config{
		Policies: map[string]PolicyConfig{"p": {Limit: 5, Window: time.Minute}},
	}, func(i int, cfg *Config) { cfg.Logger = slog.New(watches[i]) })
	oddWatch := newLogWatch(msg)
	odd := c.addWith("odd", func(cfg *Config) {
		cfg.Ring.PartitionCount = 97
		cfg.Logger = slog.New(oddWatch)
	})
	waits := []struct {
		what string
		ch   <-chan struct{}
	}{
		{"n0 to ignore odd", watches[0].wait("odd")},
		{"n1 to ignore odd", watches[1].wait("odd")},
		{"odd to ignore n0", oddWatch.wait("n0")},
		{"odd to ignore n1", oddWatch.wait("n1")},
	}
	timeout := time.NewTimer(15 * time.Second)
	defer timeout.Stop()
	for _, w := range waits {
		select {
		case <-w.ch:
		case <-timeout.C:
			t.Fatalf("timed out waiting for %s (fingerprint mismatch log)", w.what)
		}
	}
	for _, nd := range c.nodes[:2] {
		if got := nd.Members(); !slices.Equal(got, []string{"n0", "n1"}) {
			t.Fatalf("%s ring members = %v, want [n0 n1]", nd.Name(), got)
		}
		if got := nd.GossipMembers(); got != 3 {
			t.Fatalf("%s gossip knows %d members, want 3 (odd gossips, it just is not used)", nd.Name(), got)
		}
	}
	if got := odd.Members(); !slices.Equal(got, []string{"odd"}) {
		t.Fatalf("odd ring members = %v, want [odd]", got)
	}
	for i, k := range pmKeys(200, "p") {
		via := c.nodes[i%2]
		d, err := via.Allow(context.Background(), Request{Key: k})
		if err != nil || !d.Allowed || d.Owner == "odd" || d.Limit != 5 {
			t.Fatalf("via %s: Allow(%v) = %+v, %v; want admitted with limit 5 by n0 or n1", via.Name(), k, d, err)
		}
	}
}
