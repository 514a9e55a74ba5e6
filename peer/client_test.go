package peer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

var clientPolicies = map[string]PolicyConfig{"p": {Limit: 5, Window: time.Minute}, "q": {Limit: 1000, Window: time.Minute},
	"c": {Limit: 2, Window: time.Minute, Algorithm: Concurrency}}

func dialForTest(t *testing.T, nodes ...*Node) *Client {
	t.Helper()
	var addrs []string
	for _, nd := range nodes {
		addrs = append(addrs, nd.RPCAddr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// DecisionTimeout as the test nodes' ForwardTimeout (testForwardTimeout):
	// a loaded machine must not turn a slow answer into a failed test.
	cl, err := Dial(ctx, ClientConfig{Addrs: addrs, RefreshInterval: 50 * time.Millisecond, DecisionTimeout: testForwardTimeout})
	if err != nil {
		t.Fatalf("Dial(%v): %v", addrs, err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// holderForTest returns the name of the live node whose table names it
// key's holder (deciding, or fenced for a moment), or "".
func holderForTest(c *cluster, key Key) string {
	for _, nd := range c.live() {
		if nd.namedHolderForTest(key) {
			return nd.Name()
		}
	}
	return ""
}

// placementPartition computes a key's partition as README documents it,
// without the ring package: XXH64 of the length-prefixed tenant and
// subject, modulo the partition count.
func placementPartition(key Key, count int) int {
	b := []byte{byte(len(key.Tenant))}
	b = append(b, key.Tenant...)
	b = append(b, byte(len(key.Subject)))
	b = append(b, key.Subject...)
	return int(xxhash.Sum64(b) % uint64(count))
}

// TestPlacementRPC checks the Placement table against the nodes: the
// documented key → partition mapping matches every node's, and each
// partition's holder is the node that holds it.
func TestPlacementRPC(t *testing.T) {
	c := startCluster(t, 3, Config{Policies: clientPolicies})
	conn, err := grpc.NewClient(c.nodes[1].RPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := peerpb.NewRateLimiterClient(conn).Placement(context.Background(), &peerpb.PlacementRequest{})
	if err != nil {
		t.Fatalf("Placement: %v", err)
	}
	if resp.GetNode() != c.nodes[1].Name() || len(resp.GetMembers()) != 3 || int(resp.GetPartitionCount()) != len(resp.GetHolders()) {
		t.Fatalf("Placement = node %q, %d members, %d partitions, %d holders", resp.GetNode(), len(resp.GetMembers()), resp.GetPartitionCount(), len(resp.GetHolders()))
	}
	addrs := map[string]string{}
	for _, nd := range c.nodes {
		addrs[nd.Name()] = nd.RPCAddr()
	}
	for i, m := range resp.GetMembers() {
		if addrs[m.GetName()] != m.GetAddr() || i > 0 && resp.GetMembers()[i-1].GetName() >= m.GetName() {
			t.Fatalf("member %d = %v; want sorted names with their gRPC addresses %v", i, m, addrs)
		}
	}
	// README's worked example.
	if ex := (Key{Tenant: "acme", Subject: "alice", Policy: "q"}); xxhash.Sum64([]byte("\x04acme\x05alice")) != 0x7ee608d8b0db7a84 ||
		placementPartition(ex, 271) != 42 || resp.GetPartitionCount() == 271 && c.nodes[0].partIDForTest(ex) != 42 {
		t.Fatalf("README's example: acme/alice is no longer partition 42 of 271 with XXH64 0x7ee608d8b0db7a84")
	}
	for i := range 500 {
		k := Key{Tenant: "t", Subject: fmt.Sprintf("user-%d", i), Policy: "q"}
		pid := placementPartition(k, int(resp.GetPartitionCount()))
		if got := c.nodes[0].partIDForTest(k); got != pid {
			t.Fatalf("key %v: documented partition %d, node's %d", k, pid, got)
		}
		if want, got := holderForTest(c, k), resp.GetMembers()[resp.GetHolders()[pid]].GetName(); got != want {
			t.Fatalf("key %v (partition %d): table names %s, holder is %s", k, pid, got, want)
		}
	}
}

// TestClientRoutesToHolder checks that the client sends each key to its
// holder (the holder decides, no forward) and that the limit holds
// exactly through it.
func TestClientRoutesToHolder(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 3, Config{Policies: clientPolicies})
	cl := dialForTest(t, c.nodes[2])
	ctx := context.Background()
	for i := range 300 {
		k := Key{Tenant: "t", Subject: fmt.Sprintf("user-%d", i), Policy: "q"}
		d, err := cl.Allow(ctx, Request{Key: k})
		if err != nil || !d.Allowed {
			t.Fatalf("Allow(%v) = %+v, %v", k, d, err)
		}
		if want := holderForTest(c, k); d.Owner != want {
			t.Fatalf("Allow(%v) decided by %s, holder is %s", k, d.Owner, want)
		}
	}
	// 40 concurrent requests for one key of limit 5: exactly 5 admitted.
	k := Key{Tenant: "t", Subject: "hot", Policy: "p"}
	var admitted atomic.Int32
	var wg sync.WaitGroup
	for range 40 {
		wg.Go(func() {
			d, err := cl.Allow(ctx, Request{Key: k})
			if err != nil {
				t.Errorf("Allow(%v): %v", k, err)
				return
			}
			if d.Allowed {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != 5 {
		t.Fatalf("admitted %d of 40 under a limit of 5", got)
	}
	d, err := cl.Allow(ctx, Request{Key: k})
	if err != nil || d.Allowed || d.Reason != ReasonOverLimit || d.RetryAfter <= 0 {
		t.Fatalf("Allow over the limit = %+v, %v; want over_limit with a RetryAfter", d, err)
	}
}

// TestClientMembershipChange checks that the client follows a join and a
// graceful leave: it re-reads the table, routes to the new holders, and
// its stream to the leaving node ends without breaking later calls. The
// limit holds across both changes.
func TestClientMembershipChange(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 2, Config{Policies: clientPolicies})
	cl := dialForTest(t, c.nodes[0])
	ctx := context.Background()
	keys := make([]Key, 40)
	for i := range keys {
		keys[i] = Key{Tenant: "t", Subject: fmt.Sprintf("user-%d", i), Policy: "p"}
	}
	admitted := make([]int, len(keys))
	// allowAll calls Allow once per key; calls that meet a change may be
	// unavailable, never wrong.
	allowAll := func(checkOwner bool) {
		t.Helper()
		for i, k := range keys {
			d, err := cl.Allow(ctx, Request{Key: k})
			if err != nil {
				if checkOwner || !errors.Is(err, ErrUnavailable) {
					t.Fatalf("Allow(%v): %v", k, err)
				}
				continue
			}
			if d.Allowed {
				admitted[i]++
			}
			if want := holderForTest(c, k); checkOwner && d.Owner != want {
				t.Fatalf("Allow(%v) decided by %s, holder is %s", k, d.Owner, want)
			}
		}
	}
	allowAll(true)
	// routed waits until the client's table names every key's holder.
	routed := func(what string) {
		t.Helper()
		waitFor(t, 10*time.Second, what, func() bool {
			holders, _ := cl.Placement()
			for _, k := range keys {
				if holders[placementPartition(k, len(holders))] != holderForTest(c, k) {
					return false
				}
			}
			return true
		})
	}
	joiner := c.add("n2")
	allowAll(false)
	c.waitMembers(3)
	routed("the client's table to follow the join")
	allowAll(true)
	moved := 0
	for _, k := range keys {
		if holderForTest(c, k) == joiner.Name() {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("the joiner took none of the keys; pick more keys")
	}
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.nodes[0].Close(closeCtx); err != nil { // the node the client dialed
		t.Fatalf("Close %s: %v", c.nodes[0].Name(), err)
	}
	c.waitMembers(2)
	routed("the client's table to follow the leave")
	allowAll(true)
	for i, n := range admitted {
		if n > 5 {
			t.Fatalf("key %v admitted %d times under a limit of 5", keys[i], n)
		}
		if n < 3 {
			t.Fatalf("key %v admitted %d times in 3 settled rounds", keys[i], n)
		}
	}
}

// TestClientNodeStopped checks that a node stopping ends the client's
// stream to it (Unavailable, not a hang), and that the client re-reads
// the table and decides the node's keys at their new holder.
func TestClientNodeStopped(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 3, Config{Policies: clientPolicies})
	cl := dialForTest(t, c.nodes...)
	ctx := context.Background()
	victim := c.nodes[1]
	var k Key
	for i := 0; ; i++ {
		k = Key{Tenant: "t", Subject: fmt.Sprintf("user-%d", i), Policy: "q"}
		if holderForTest(c, k) == victim.Name() {
			break
		}
	}
	if d, err := cl.Allow(ctx, Request{Key: k}); err != nil || d.Owner != victim.Name() {
		t.Fatalf("Allow(%v) = %+v, %v; want a decision by %s", k, d, err, victim.Name())
	}
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := victim.Close(closeCtx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	c.waitMembers(2)
	waitFor(t, 10*time.Second, "a decision by the key's new holder", func() bool {
		d, err := cl.Allow(ctx, Request{Key: k})
		return err == nil && d.Owner == holderForTest(c, k) && d.Owner != victim.Name()
	})
}

// TestClientBadInput checks the client's errors: invalid input fails
// before anything is sent, with the sentinel to branch on.
func TestClientBadInput(t *testing.T) {
	c := startCluster(t, 1, Config{Policies: clientPolicies})
	cl := dialForTest(t, c.nodes[0])
	ctx := context.Background()
	for _, tc := range []struct {
		req  Request
		want error
	}{
		{Request{Key: Key{Tenant: "", Subject: "s", Policy: "p"}}, ErrInvalidKey},
		{Request{Key: Key{Tenant: "t", Subject: "a b", Policy: "p"}}, ErrInvalidKey},
		{Request{Key: Key{Tenant: "t", Subject: "s", Policy: "p"}, Hits: -1}, ErrInvalidHits},
		{Request{Key: Key{Tenant: "t", Subject: "s", Policy: "p"}, Hits: 6}, ErrInvalidHits}, // the server's InvalidArgument
		{Request{Key: Key{Tenant: "t", Subject: "s", Policy: "nope"}}, ErrUnknownPolicy},
		{Request{Key: Key{Tenant: "t", Subject: "s", Policy: "c"}}, ErrWrongAlgorithm}, // a concurrency policy
	} {
		if d, err := cl.Allow(ctx, tc.req); !errors.Is(err, tc.want) || d.Allowed {
			t.Errorf("Allow(%+v) = %+v, %v; want an error wrapping %v", tc.req, d, err, tc.want)
		}
	}
	// A valid key of a concurrency policy is not an invalid key, and the
	// error says what to call instead.
	_, err := cl.Allow(ctx, Request{Key: Key{Tenant: "t", Subject: "s", Policy: "c"}})
	if errors.Is(err, ErrInvalidKey) || err == nil || !strings.Contains(err.Error(), `policy "c" is a concurrency policy`) || !strings.Contains(err.Error(), "Acquire") {
		t.Errorf("Allow of concurrency policy c = %v; want ErrWrongAlgorithm (not ErrInvalidKey) naming the policy and Acquire", err)
	}
	if _, err := Dial(ctx, ClientConfig{}); err == nil {
		t.Error("Dial without addresses succeeded")
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := Dial(short, ClientConfig{Addrs: []string{freeAddr(t)}}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Dial to a closed port = %v; want an error wrapping ErrUnavailable", err)
	}
}

// TestClientClose checks that Close ends calls in flight (none hangs) and
// later calls return ErrClosed; the package's leak check sees that its
// goroutines are gone.
func TestClientClose(t *testing.T) {
	c := startCluster(t, 2, Config{Policies: clientPolicies})
	cl := dialForTest(t, c.nodes...)
	ctx := context.Background()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := Key{Tenant: "t", Subject: fmt.Sprintf("w%d-%d", w, i%50), Policy: "q"}
				if _, err := cl.Allow(ctx, Request{Key: k}); err != nil {
					if !errors.Is(err, ErrClosed) && !errors.Is(err, ErrUnavailable) {
						t.Errorf("Allow during Close: %v", err)
					}
					return
				}
			}
		})
	}
	waitFor(t, 5*time.Second, "calls to run", func() bool {
		d, err := cl.Allow(ctx, Request{Key: Key{Tenant: "t", Subject: "probe", Policy: "q"}})
		return err == nil && d.Allowed
	})
	cl.Close()
	close(stop)
	wg.Wait()
	if _, err := cl.Allow(ctx, Request{Key: Key{Tenant: "t", Subject: "s", Policy: "q"}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Allow after Close = %v; want ErrClosed", err)
	}
}

// TestAllowStreamWire drives AllowStream directly, as a client in another
// language would: several items in one message, answered by id, a bad
// item failing alone and a key held elsewhere forwarded.
func TestAllowStreamWire(t *testing.T) {
	c := startCluster(t, 2, Config{Policies: clientPolicies})
	nd := c.nodes[0]
	remote := pmKeyOwnedBy(t, nd, "q", c.nodes[1].Name())
	local := pmKeyOwnedBy(t, nd, "q", nd.Name())
	conn, err := grpc.NewClient(nd.RPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := peerpb.NewRateLimiterClient(conn).AllowStream(ctx)
	if err != nil {
		t.Fatalf("AllowStream: %v", err)
	}
	wk := func(k Key) *peerpb.Key { return &peerpb.Key{Tenant: k.Tenant, Subject: k.Subject, Policy: k.Policy} }
	err = st.Send(&peerpb.AllowStreamRequest{Items: []*peerpb.AllowStreamItem{
		{Id: 7, Request: &peerpb.AllowRequest{Key: wk(local)}},
		{Id: 8, Request: &peerpb.AllowRequest{Key: wk(remote), Hits: 3}},
		{Id: 9, Request: &peerpb.AllowRequest{Key: &peerpb.Key{Tenant: "t", Subject: "s", Policy: "nope"}}},
		{Id: 10, Request: &peerpb.AllowRequest{Key: &peerpb.Key{Tenant: "", Subject: "s", Policy: "q"}}},
	}})
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	got := map[uint64]*peerpb.AllowStreamResult{}
	for {
		resp, err := st.Recv()
		if err != nil {
			break // io.EOF once every item is answered
		}
		for _, r := range resp.GetResults() {
			if got[r.GetId()] != nil {
				t.Fatalf("id %d answered twice", r.GetId())
			}
			got[r.GetId()] = r
		}
	}
	if r := got[7]; r.GetCode() != 0 || !r.GetResponse().GetAllowed() || r.GetResponse().GetOwner() != nd.Name() {
		t.Errorf("local item = %v; want admitted by %s", r, nd.Name())
	}
	if r := got[8]; r.GetCode() != 0 || r.GetResponse().GetRemaining() != 997 || r.GetResponse().GetOwner() != c.nodes[1].Name() {
		t.Errorf("remote item = %v; want admitted by %s with 997 remaining", r, c.nodes[1].Name())
	}
	if r := got[9]; codes.Code(r.GetCode()) != codes.NotFound {
		t.Errorf("unknown policy item = %v; want NotFound", r)
	}
	if r := got[10]; codes.Code(r.GetCode()) != codes.InvalidArgument {
		t.Errorf("invalid key item = %v; want InvalidArgument", r)
	}
}

// TestAllowStreamRoutedBound sends a stream twice as many items for a
// holder that never answers as a stream may route at once: the node must
// hold the client back (at most maxStreamRouted goroutines for them), and
// still answer every item, unavailable, once ForwardTimeout has passed.
func TestAllowStreamRoutedBound(t *testing.T) {
	const forwardTimeout = time.Second
	c := startCluster(t, 2, Config{Policies: clientPolicies, ForwardTimeout: forwardTimeout})
	nd, silent := c.nodes[0], c.nodes[1]
	remote := pmKeyOwnedBy(t, nd, "q", silent.Name())
	silent.setCheckHookForTest(func(ctx context.Context) { <-ctx.Done() })
	conn, err := grpc.NewClient(nd.RPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := peerpb.NewRateLimiterClient(conn).AllowStream(ctx)
	if err != nil {
		t.Fatalf("AllowStream: %v", err)
	}
	base := runtime.NumGoroutine()
	var peak atomic.Int64
	sampled := make(chan struct{})
	stopSampling := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			if g := int64(runtime.NumGoroutine()); g > peak.Load() {
				peak.Store(g)
			}
			select {
			case <-stopSampling:
				return
			case <-tick.C:
			}
		}
	}()
	const messages = 2 * maxStreamRouted / MaxBatch
	wk := &peerpb.Key{Tenant: remote.Tenant, Subject: remote.Subject, Policy: remote.Policy}
	sendErr := make(chan error, 1)
	go func() {
		for m := range messages {
			items := make([]*peerpb.AllowStreamItem, MaxBatch)
			for i := range items {
				items[i] = &peerpb.AllowStreamItem{Id: uint64(m*MaxBatch + i), Request: &peerpb.AllowRequest{Key: wk}}
			}
			if err := st.Send(&peerpb.AllowStreamRequest{Items: items}); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- st.CloseSend()
	}()
	answered := 0
	for answered < messages*MaxBatch {
		resp, err := st.Recv()
		if err != nil {
			t.Fatalf("Recv after %d answers: %v", answered, err)
		}
		for _, r := range resp.GetResults() {
			if codes.Code(r.GetCode()) != codes.Unavailable {
				t.Fatalf("item %d = %v; want unavailable (its holder never answers)", r.GetId(), r)
			}
			answered++
		}
	}
	close(stopSampling)
	<-sampled
	if err := <-sendErr; err != nil {
		t.Fatalf("Send: %v", err)
	}
	if grew := peak.Load() - int64(base); grew > maxStreamRouted+500 {
		t.Fatalf("goroutines grew by %d while routing %d items; want at most about %d (the stream's bound)", grew, messages*MaxBatch, maxStreamRouted)
	}
	t.Logf("%d items answered; goroutines grew by at most %d (bound %d)", answered, peak.Load()-int64(base), maxStreamRouted)
}

// dialThroughForTest dials a client whose every member connection goes to
// via instead: the client still routes by its table, but a key held by
// another node reaches it through via's forward hop, where a test can hold
// it (setCheckHookForTest).
func dialThroughForTest(t *testing.T, via *Node, cfg ClientConfig) *Client {
	t.Helper()
	cfg.Addrs = []string{via.RPCAddr()}
	cfg.DialOptions = []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", via.RPCAddr())
		}),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl, err := Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("Dial through %s: %v", via.Name(), err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// TestClientDecisionTimeout checks that a call whose context has no
// deadline is bounded by ClientConfig.DecisionTimeout when the holder
// never answers (and the node's ForwardTimeout is far longer): it returns
// an error wrapping ErrUnavailable and context.DeadlineExceeded instead of
// blocking. A caller's own deadline still wins, and zero means twice the
// node's default ForwardTimeout (a node's failure answer comes first).
func TestClientDecisionTimeout(t *testing.T) {
	const forwardTimeout, decisionTimeout = 10 * time.Second, 200 * time.Millisecond
	c := startCluster(t, 2, Config{Policies: clientPolicies, ForwardTimeout: forwardTimeout})
	via, silent := c.nodes[0], c.nodes[1]
	k := pmKeyOwnedBy(t, via, "q", silent.Name())
	cl := dialThroughForTest(t, via, ClientConfig{DecisionTimeout: decisionTimeout})
	if d, err := cl.Allow(context.Background(), Request{Key: k}); err != nil || !d.Allowed || d.Owner != silent.Name() {
		t.Fatalf("Allow(%v) before the fault = %+v, %v; want admitted by %s", k, d, err, silent.Name())
	}
	// The hook lets go when the test ends, before the cluster closes, so
	// Close does not wait out the forward.
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	silent.setCheckHookForTest(func(ctx context.Context) {
		select {
		case <-ctx.Done():
		case <-release:
		}
	})
	// callOp runs op, one call for k, and waits for it far less long than
	// the node would hold it; call is callOp of Allow.
	callOp := func(ctx context.Context, op func(context.Context) (Decision, error)) (time.Duration, error) {
		t.Helper()
		type result struct {
			d   Decision
			err error
		}
		start := time.Now()
		done := make(chan result, 1)
		go func() {
			d, err := op(ctx)
			done <- result{d, err}
		}()
		select {
		case r := <-done:
			if r.err == nil {
				t.Fatalf("a call for %v with a silent holder = %+v; want an error", k, r.d)
			}
			return time.Since(start), r.err
		case <-time.After(forwardTimeout / 2):
			t.Fatalf("a call for %v with a silent holder still blocked after %v (DecisionTimeout %v)", k, forwardTimeout/2, decisionTimeout)
			return 0, nil
		}
	}
	call := func(ctx context.Context) (time.Duration, error) {
		t.Helper()
		return callOp(ctx, func(ctx context.Context) (Decision, error) { return cl.Allow(ctx, Request{Key: k}) })
	}
	took, err := call(context.Background())
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "DecisionTimeout") {
		t.Fatalf("Allow without a deadline = %v; want ErrUnavailable and context.DeadlineExceeded, naming DecisionTimeout", err)
	}
	if took < decisionTimeout {
		t.Fatalf("Allow without a deadline returned after %v, before DecisionTimeout %v: %v", took, decisionTimeout, err)
	}
	// The caller's deadline, shorter than DecisionTimeout, is the bound.
	ctx, cancel := context.WithTimeout(context.Background(), decisionTimeout/4)
	defer cancel()
	took, err = call(ctx)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || strings.Contains(err.Error(), "DecisionTimeout") || took >= decisionTimeout {
		t.Fatalf("Allow with a %v deadline = %v after %v; want the caller's deadline, not DecisionTimeout", decisionTimeout/4, err, took)
	}
	// The unary calls are bounded the same way.
	took, err = callOp(context.Background(), func(ctx context.Context) (Decision, error) { return cl.Peek(ctx, Request{Key: k}) })
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "DecisionTimeout") || took < decisionTimeout {
		t.Fatalf("Peek without a deadline = %v after %v; want ErrUnavailable and context.DeadlineExceeded after DecisionTimeout %v", err, took, decisionTimeout)
	}
	if def, fwd := dialThroughForTest(t, via, ClientConfig{}), (Config{}).withDefaults().ForwardTimeout; def.cfg.DecisionTimeout != 2*fwd {
		t.Fatalf("zero DecisionTimeout = %v; want twice the node's default ForwardTimeout %v", def.cfg.DecisionTimeout, fwd)
	}
}

// TestClientPeekRefund checks Peek and Refund through the client against
// a 3-node cluster: each decided by the key's holder, a peek consuming
// nothing, a refund giving units back so that exactly as many more are
// admitted, and the concurrency policy refused with ErrWrongAlgorithm.
func TestClientPeekRefund(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 3, Config{Policies: clientPolicies})
	cl := dialForTest(t, c.nodes[0])
	ctx := context.Background()
	for _, holder := range c.nodes {
		k := pmKeyOwnedBy(t, c.nodes[0], "p", holder.Name())
		for i := range 3 {
			if d, err := cl.Allow(ctx, Request{Key: k}); err != nil || !d.Allowed {
				t.Fatalf("Allow %d of %v = %+v, %v", i, k, d, err)
			}
		}
		// A peek answers as if admitted: 1 would remain, twice.
		for range 2 {
			d, err := cl.Peek(ctx, Request{Key: k})
			if err != nil || !d.Allowed || d.Remaining != 1 || d.Reason != ReasonPeek || d.Owner != holder.Name() {
				t.Fatalf("Peek(%v) after 3 of 5 = %+v, %v; want allowed, 1 remaining after it, ReasonPeek, by %s", k, d, err, holder.Name())
			}
		}
		d, err := cl.Refund(ctx, Request{Key: k, Hits: 2})
		if err != nil || !d.Allowed || d.Remaining != 4 || d.Reason != ReasonRefunded || d.Owner != holder.Name() {
			t.Fatalf("Refund(%v, 2) after 3 of 5 = %+v, %v; want allowed, 4 remaining, ReasonRefunded, by %s", k, d, err, holder.Name())
		}
		admitted := 0
		for range 6 {
			d, err := cl.Allow(ctx, Request{Key: k})
			if err != nil {
				t.Fatalf("Allow(%v) after the refund: %v", k, err)
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted != 4 {
			t.Fatalf("key %v admitted %d of 6 after refunding 2 of 3; want 4", k, admitted)
		}
	}
	for _, tc := range []struct {
		name string
		call func(Request) (Decision, error)
		req  Request
		want error
	}{
		{"refund of a concurrency policy", func(r Request) (Decision, error) { return cl.Refund(ctx, r) }, Request{Key: Key{Tenant: "t", Subject: "s", Policy: "c"}}, ErrWrongAlgorithm},
		{"peek of an unknown policy", func(r Request) (Decision, error) { return cl.Peek(ctx, r) }, Request{Key: Key{Tenant: "t", Subject: "s", Policy: "nope"}}, ErrUnknownPolicy},
		{"peek of an invalid key", func(r Request) (Decision, error) { return cl.Peek(ctx, r) }, Request{Key: Key{Tenant: "", Subject: "s", Policy: "p"}}, ErrInvalidKey},
		{"refund of negative hits", func(r Request) (Decision, error) { return cl.Refund(ctx, r) }, Request{Key: Key{Tenant: "t", Subject: "s", Policy: "p"}, Hits: -1}, ErrInvalidHits},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if d, err := tc.call(tc.req); !errors.Is(err, tc.want) || d.Allowed {
				t.Fatalf("%+v = %+v, %v; want an error wrapping %v", tc.req, d, err, tc.want)
			}
		})
	}
}

// TestClientAcquireRelease checks leases through the client against a
// 3-node cluster: at most the limit held, a refusal with a RetryAfter, a
// release freeing a unit once (a second release is harmless), each decided
// by the key's holder, and another policy refused with ErrWrongAlgorithm.
func TestClientAcquireRelease(t *testing.T) {
	t.Parallel()
	c := startCluster(t, 3, Config{Policies: clientPolicies})
	cl := dialForTest(t, c.nodes[0])
	ctx := context.Background()
	for _, holder := range c.nodes {
		k := pmKeyOwnedBy(t, c.nodes[0], "c", holder.Name())
		var ids []uint64
		for i := range 2 {
			l, err := cl.Acquire(ctx, Request{Key: k})
			if err != nil || !l.Allowed || l.ID == 0 || l.TTL != time.Minute || l.Owner != holder.Name() {
				t.Fatalf("Acquire %d of %v = %+v, %v; want a lease of TTL 1m from %s", i, k, l, err, holder.Name())
			}
			ids = append(ids, l.ID)
		}
		if l, err := cl.Acquire(ctx, Request{Key: k}); err != nil || l.Allowed || l.ID != 0 || l.RetryAfter <= 0 {
			t.Fatalf("Acquire at the limit of %v = %+v, %v; want refused with a RetryAfter and no lease", k, l, err)
		}
		d, err := cl.Release(ctx, k, ids[0])
		if err != nil || !d.Allowed || d.Reason != ReasonReleased || d.Owner != holder.Name() {
			t.Fatalf("Release(%v, %d) = %+v, %v; want a live lease ended by %s", k, ids[0], d, err, holder.Name())
		}
		if d, err := cl.Release(ctx, k, ids[0]); err != nil || d.Allowed {
			t.Fatalf("second Release(%v, %d) = %+v, %v; want Allowed false and no error", k, ids[0], d, err)
		}
		if l, err := cl.Acquire(ctx, Request{Key: k}); err != nil || !l.Allowed {
			t.Fatalf("Acquire of %v after a release = %+v, %v; want a lease", k, l, err)
		}
	}
	p := Key{Tenant: "t", Subject: "s", Policy: "p"}
	if l, err := cl.Acquire(ctx, Request{Key: p}); !errors.Is(err, ErrWrongAlgorithm) || l.Allowed {
		t.Fatalf("Acquire of sliding-log policy p = %+v, %v; want ErrWrongAlgorithm", l, err)
	}
	if d, err := cl.Release(ctx, p, 1); !errors.Is(err, ErrWrongAlgorithm) || d.Allowed {
		t.Fatalf("Release of sliding-log policy p = %+v, %v; want ErrWrongAlgorithm", d, err)
	}
}
