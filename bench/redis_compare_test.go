package bench

// This file compares ringlimit with the usual alternative, a sliding log kept
// in a Redis sorted set and updated by a Lua script. It is opt-in: every test
// and benchmark here skips unless RINGLIMIT_REDIS=1, so CI never needs Redis.
// With it set, the test starts its own redis-server (from PATH) on a free
// 127.0.0.1 port and kills it when done:
//
//	RINGLIMIT_REDIS=1 go test -run 'Redis' -bench 'CompareRedis' -benchtime=2s -count=3 ./bench/
//
// The client is a minimal RESP2 implementation (no third-party module): one
// connection per benchmark goroutine, SCRIPT LOAD once, EVALSHA per request.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/shard"
)

// redisEnv is the variable that enables this file's tests and benchmarks.
const redisEnv = "RINGLIMIT_REDIS"

// Both scripts take the same arguments, so the tests and the benchmark can
// swap them:
//
//	KEYS[1] the sorted set holding the key's log (score = admission time, ms)
//	KEYS[2] a per-key counter (used by the corrected script only)
//	ARGV[1] limit L, ARGV[2] window W in ms,
//	ARGV[3] now in ms, or "" to read the server clock (redis TIME)
//
// and return 1 when the request is admitted (and recorded), 0 when refused.
// Each request costs one unit.

// redisScriptNaive is the sliding-log script found in blog posts. Its
// boundary choices happen to match the promise: ZREMRANGEBYSCORE with an
// inclusive max of now-W drops ts <= now-W, so the window is (now-W, now],
// and "count < L" admits while one more unit fits (posts differ here: an
// exclusive "(now-W" keeps entries exactly W old, a stricter limiter, and
// "count <= L" admits L+1). Its flaw is the member: ZADD key now now uses
// the timestamp as the member, and a sorted set is a set, so a second
// admission in the same millisecond only updates the existing member.
// Equal timestamps merge into one entry, ZCARD under-counts, and the script
// admits far more than L per window (see TestRedisScriptMergesEqualTimestamps).
const redisScriptNaive = `
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
redis.call('ZREMRANGEBYSCORE', key, 0, now - window)
local count = redis.call('ZCARD', key)
if count < limit then
  redis.call('ZADD', key, now, now)
  redis.call('PEXPIRE', key, window)
  return 1
end
return 0
`

// redisScriptExact is the corrected script, used for the speed comparison:
// it keeps the promise. Each admission gets a unique member (now-<seq>,
// seq from INCR on KEYS[2]), so equal timestamps stay distinct admissions;
// ZREMRANGEBYSCORE key -inf now-W drops exactly ts <= now-W; a unit is
// admitted only if count+1 <= L, and a refusal records nothing. The script
// runs atomically in Redis, so the decision is one step per key. It still
// differs from ringlimit in two ways: it stores one member per admission
// (memory grows with the admitted rate, up to L per key, not with distinct
// timestamps), and the server clock is not clamped per key, so a backward
// step of the Redis host's clock counts expired entries again (stricter,
// never looser).
const redisScriptExact = `
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
local count = redis.call('ZCARD', key)
if count + 1 > limit then
  return 0
end
local seq = redis.call('INCR', KEYS[2])
redis.call('ZADD', key, now, now .. '-' .. seq)
redis.call('PEXPIRE', key, window)
redis.call('PEXPIRE', KEYS[2], window)
return 1
`

// requireRedis skips tb unless the comparison was asked for.
func requireRedis(tb testing.TB) {
	tb.Helper()
	if os.Getenv(redisEnv) != "1" {
		tb.Skipf("Redis comparison is opt-in: set %s=1 with redis-server on PATH to run it", redisEnv)
	}
}

// startRedis starts a private redis-server on a free 127.0.0.1 port, waits
// until it answers PING, logs its version and kills it when tb ends. It
// returns the server's address.
func startRedis(tb testing.TB) string {
	tb.Helper()
	addr, _ := startRedisProc(tb)
	return addr
}

// startRedisProc is startRedis that also returns the server's process id,
// so a caller can read its CPU time from /proc.
func startRedisProc(tb testing.TB, extra ...string) (addr string, pid int) {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("%s=1 but redis-server is not on PATH (apt-get install -y redis-server): %v", redisEnv, err)
	}
	dir := tb.TempDir()
	// A free port found by listening on :0 can be taken again before
	// redis-server binds it; such a start fails fast and is retried.
	var last error
	for attempt := range 3 {
		addr, pid, retry, err := redisTryStart(tb, bin, dir, attempt, extra...)
		if err == nil {
			redisLogVersion(tb, addr)
			return addr, pid
		}
		last = err
		if !retry {
			break
		}
	}
	tb.Fatalf("start redis-server: %v", last)
	return "", 0
}

// startRedisReplica starts a second redis-server replicating master and
// waits (10 s at most) until the master counts it as a connected replica
// and the replica's link is up. It returns the replica's process id.
func startRedisReplica(tb testing.TB, master string) int {
	tb.Helper()
	host, port, err := net.SplitHostPort(master)
	if err != nil {
		tb.Fatal(err)
	}
	addr, pid := startRedisProc(tb, "--replicaof", host, port)
	info := func(a, field string) string {
		c, err := dialRESP(a)
		if err != nil {
			return ""
		}
		defer c.close()
		r, err := c.do("INFO", "replication")
		if err != nil {
			return ""
		}
		for line := range strings.Lines(r.s) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
				return v
			}
		}
		return ""
	}
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for info(master, "connected_slaves") != "1" || info(addr, "master_link_status") != "up" {
		if time.Now().After(deadline) {
			tb.Fatalf("redis replica at %s not in sync with %s within 10 s", addr, master)
		}
		<-tick.C
	}
	return pid
}

// redisTryStart makes one start attempt. retry reports whether the failure
// looks like a lost port race.
func redisTryStart(tb testing.TB, bin, dir string, attempt int, extra ...string) (addr string, pid int, retry bool, err error) {
	tb.Helper()
	port := freePorts(tb, 1)[0]
	addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	logPath := filepath.Join(dir, fmt.Sprintf("redis-%d.log", attempt))
	logf, err := os.Create(logPath)
	if err != nil {
		return "", 0, false, err
	}
	cmd := exec.Command(bin, append([]string{
		"--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--save", "", "--appendonly", "no", "--dir", dir}, extra...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return "", 0, false, err
	}
	exited := make(chan error, 1)
	go func() {
		exited <- cmd.Wait()
		logf.Close()
	}()
	stop := func() {
		// Kill the process this helper started, by its handle, and wait
		// for the goroutine above so nothing outlives the test.
		_ = cmd.Process.Kill()
		<-exited
	}
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if redisPing(addr) == nil {
			tb.Cleanup(stop)
			return addr, cmd.Process.Pid, false, nil
		}
		select {
		case werr := <-exited:
			out, _ := os.ReadFile(logPath)
			return "", 0, bytes.Contains(out, []byte("in use")),
				fmt.Errorf("redis-server on %s exited before answering PING: %v\n%s", addr, werr, out)
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			stop()
			out, _ := os.ReadFile(logPath)
			return "", 0, false, fmt.Errorf("redis-server on %s did not answer PING within 10 s\n%s", addr, out)
		}
	}
}

// redisPing dials addr and expects PONG.
func redisPing(addr string) error {
	c, err := dialRESP(addr)
	if err != nil {
		return err
	}
	defer c.close()
	r, err := c.do("PING")
	if err != nil {
		return err
	}
	if r.kind != '+' || r.s != "PONG" {
		return fmt.Errorf("redis: PING answered %+v", r)
	}
	return nil
}

// redisLogVersion logs the server's version line, so results carry it.
func redisLogVersion(tb testing.TB, addr string) {
	tb.Helper()
	c, err := dialRESP(addr)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.close()
	r, err := c.do("INFO", "server")
	if err != nil {
		tb.Fatal(err)
	}
	for line := range bytes.Lines([]byte(r.s)) {
		if bytes.HasPrefix(line, []byte("redis_version:")) {
			tb.Logf("redis-server %s on %s", bytes.TrimSpace(line), addr)
		}
	}
}

// respTimeout bounds one command's round trip.
const respTimeout = 10 * time.Second

// Bounds on replies, so a confused stream cannot make the client allocate
// without limit.
const (
	respMaxBulk  = 16 << 20
	respMaxArray = 1 << 20
)

// respConn is one RESP2 connection to Redis. Not safe for concurrent use:
// each benchmark goroutine holds its own. After an I/O or protocol error the
// connection is broken and every later call returns that error.
type respConn struct {
	c   net.Conn
	r   *bufio.Reader
	buf []byte // the command being written, reused
	err error
}

// respReply is one decoded reply. kind is the RESP type byte: '+' simple
// string (s), '-' error (s), ':' integer (n), '$' bulk string (s; n is its
// length, -1 for nil), '*' array (arr; n is its length, -1 for nil).
type respReply struct {
	kind byte
	n    int64
	s    string
	arr  []respReply
}

// respError is an error reply from the server.
type respError string

func (e respError) Error() string { return "redis: " + string(e) }

func dialRESP(addr string) (*respConn, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	return &respConn{c: c, r: bufio.NewReaderSize(c, 4096), buf: make([]byte, 0, 512)}, nil
}

func (rc *respConn) close() error { return rc.c.Close() }

// do sends one command and reads its reply. An error reply at the top level
// is returned as a respError (the connection stays usable). It does not
// allocate for an integer reply.
func (rc *respConn) do(args ...string) (respReply, error) {
	if err := rc.send(appendRESP(rc.buf[:0], args)); err != nil {
		return respReply{}, err
	}
	return rc.reply()
}

// do2 sends two commands in one write (a pipeline) and reads both
// replies, as a client that asks for a script and WAIT together does.
func (rc *respConn) do2(a, b []string) (respReply, respReply, error) {
	if err := rc.send(appendRESP(appendRESP(rc.buf[:0], a), b)); err != nil {
		return respReply{}, respReply{}, err
	}
	ra, errA := rc.reply()
	if errA != nil && rc.err != nil {
		return respReply{}, respReply{}, errA
	}
	rb, errB := rc.reply()
	if errA != nil {
		return ra, rb, errA
	}
	return ra, rb, errB
}

// appendRESP appends args as one RESP command.
func appendRESP(b []byte, args []string) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(len(args)), 10)
	b = append(b, '\r', '\n')
	for _, a := range args {
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(a)), 10)
		b = append(b, '\r', '\n')
		b = append(b, a...)
		b = append(b, '\r', '\n')
	}
	return b
}

// send writes b (and keeps it as the connection's buffer).
func (rc *respConn) send(b []byte) error {
	if rc.err != nil {
		return rc.err
	}
	rc.buf = b
	if err := rc.c.SetDeadline(time.Now().Add(respTimeout)); err != nil {
		rc.err = err
		return err
	}
	if _, err := rc.c.Write(b); err != nil {
		rc.err = err
		return err
	}
	return nil
}

// reply reads one reply; an error reply is a respError.
func (rc *respConn) reply() (respReply, error) {
	r, err := rc.read()
	if err != nil {
		rc.err = err
		return respReply{}, err
	}
	if r.kind == '-' {
		return respReply{}, respError(r.s)
	}
	return r, nil
}

// read decodes one reply, recursively for arrays.
func (rc *respConn) read() (respReply, error) {
	line, err := rc.r.ReadSlice('\n')
	if err != nil {
		return respReply{}, fmt.Errorf("redis: read reply: %w", err)
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return respReply{}, fmt.Errorf("redis: malformed reply line %q", line)
	}
	kind, body := line[0], line[1:len(line)-2]
	switch kind {
	case '+', '-':
		return respReply{kind: kind, s: string(body)}, nil
	case ':':
		n, err := parseRESPInt(body)
		return respReply{kind: kind, n: n}, err
	case '$':
		n, err := parseRESPInt(body)
		if err != nil || n < 0 {
			return respReply{kind: kind, n: n}, err
		}
		if n > respMaxBulk {
			return respReply{}, fmt.Errorf("redis: bulk reply of %d bytes exceeds %d", n, respMaxBulk)
		}
		p := make([]byte, n+2)
		if _, err := io.ReadFull(rc.r, p); err != nil {
			return respReply{}, fmt.Errorf("redis: read bulk reply: %w", err)
		}
		if p[n] != '\r' || p[n+1] != '\n' {
			return respReply{}, errors.New("redis: bulk reply not terminated by CRLF")
		}
		return respReply{kind: kind, n: n, s: string(p[:n])}, nil
	case '*':
		n, err := parseRESPInt(body)
		if err != nil || n < 0 {
			return respReply{kind: kind, n: n}, err
		}
		if n > respMaxArray {
			return respReply{}, fmt.Errorf("redis: array reply of %d elements exceeds %d", n, respMaxArray)
		}
		arr := make([]respReply, n)
		for i := range arr {
			if arr[i], err = rc.read(); err != nil {
				return respReply{}, err
			}
		}
		return respReply{kind: kind, n: n, arr: arr}, nil
	}
	return respReply{}, fmt.Errorf("redis: unknown reply type %q", kind)
}

// parseRESPInt parses a decimal integer without allocating.
func parseRESPInt(b []byte) (int64, error) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 18 {
		return 0, fmt.Errorf("redis: bad integer %q", b)
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("redis: bad integer %q", b)
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, nil
}

// respPool hands out connections to one server, one per worker. Safe for
// concurrent use.
type respPool struct {
	addr string
	mu   sync.Mutex
	free []*respConn
	all  []*respConn
}

// get returns an idle connection, dialing one if none is idle.
func (p *respPool) get() (*respConn, error) {
	p.mu.Lock()
	if n := len(p.free); n > 0 {
		c := p.free[n-1]
		p.free = p.free[:n-1]
		p.mu.Unlock()
		return c, nil
	}
	p.mu.Unlock()
	c, err := dialRESP(p.addr)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.all = append(p.all, c)
	p.mu.Unlock()
	return c, nil
}

// put returns c to the pool; a broken connection is dropped.
func (p *respPool) put(c *respConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.err == nil {
		p.free = append(p.free, c)
	}
}

// warm dials until n connections are idle, so no dial lands in a timed loop.
func (p *respPool) warm(n int) error {
	cs := make([]*respConn, 0, n)
	defer func() {
		for _, c := range cs {
			p.put(c)
		}
	}()
	for range n {
		c, err := p.get()
		if err != nil {
			return err
		}
		cs = append(cs, c)
	}
	return nil
}

// close closes every connection the pool dialed.
func (p *respPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.all {
		c.close()
	}
	p.all, p.free = nil, nil
}

// redisLoad loads src with SCRIPT LOAD and returns its SHA1.
func redisLoad(tb testing.TB, c *respConn, src string) string {
	tb.Helper()
	r, err := c.do("SCRIPT", "LOAD", src)
	if err != nil || r.kind != '$' || r.n != 40 {
		tb.Fatalf("SCRIPT LOAD = %+v, %v; want a 40-digit SHA1", r, err)
	}
	return r.s
}

// redisEval runs a loaded script on key (see the argument list above the
// scripts) and reports whether it admitted.
func redisEval(c *respConn, sha, key, seq, limit, window, now string) (bool, error) {
	r, err := c.do("EVALSHA", sha, "2", key, seq, limit, window, now)
	if err != nil {
		return false, err
	}
	if r.kind != ':' || (r.n != 0 && r.n != 1) {
		return false, fmt.Errorf("redis: script answered %+v, want integer 0 or 1", r)
	}
	return r.n == 1, nil
}

// redisKeys returns the Redis names (log and counter) for a ringlimit key.
// The hash tag keeps both in one slot, as Redis Cluster would need.
func redisKeys(k peer.Key) (log, seq string) {
	log = "rl:{" + k.String() + "}"
	return log, log + ":seq"
}

// redisDecider is one limiter under test, deciding one unit at an explicit
// time (ms).
type redisDecider func(atMS int64) (bool, error)

// redisT0 is the tests' fixed epoch in ms: offsets in the tables are added
// to it. 13 digits, which Lua's number formatting prints exactly.
const redisT0 = 1_700_000_000_000

// redisImpl is one limiter in the tests: decide, and card, which returns
// the size of a script's sorted set (-1 for the Store, which has none).
type redisImpl struct {
	decide redisDecider
	card   func() int64
}

// redisDeciders builds the three limiters for one case with limit L and
// window W, by name: the naive script and the exact script (each on a fresh
// Redis key), and shard.Store, the decision ringlimit's owner makes.
func redisDeciders(t *testing.T, c *respConn, shaNaive, shaExact, name string, limit int64, window time.Duration) map[string]redisImpl {
	t.Helper()
	L, W := strconv.FormatInt(limit, 10), strconv.FormatInt(window.Milliseconds(), 10)
	script := func(sha, impl string) redisDecider {
		key, seq := redisKeys(peer.Key{Tenant: "test", Subject: name + "-" + impl, Policy: "p"})
		return func(at int64) (bool, error) {
			return redisEval(c, sha, key, seq, L, W, strconv.FormatInt(redisT0+at, 10))
		}
	}
	card := func(impl string) func() int64 {
		key, _ := redisKeys(peer.Key{Tenant: "test", Subject: name + "-" + impl, Policy: "p"})
		return func() int64 {
			r, err := c.do("ZCARD", key)
			if err != nil || r.kind != ':' {
				t.Fatalf("ZCARD %s = %+v, %v", key, r, err)
			}
			return r.n
		}
	}
	st, err := shard.NewStore(shard.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sk := shard.Key{Tenant: "test", Subject: name, Policy: "p"}
	sp := shard.Policy{Limit: limit, Window: window}
	return map[string]redisImpl{
		"redis-naive": {script(shaNaive, "naive"), card("naive")},
		"redis-exact": {script(shaExact, "exact"), card("exact")},
		"ringlimit": {func(at int64) (bool, error) {
			d, err := st.Allow(sk, sp, 1, time.UnixMilli(redisT0+at))
			return d.Allowed, err
		}, func() int64 { return -1 }},
	}
}

// redisTestSetup starts Redis and loads both scripts.
func redisTestSetup(t *testing.T) (c *respConn, shaNaive, shaExact string) {
	t.Helper()
	requireRedis(t)
	addr := startRedis(t)
	c, err := dialRESP(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.close() })
	return c, redisLoad(t, c, redisScriptNaive), redisLoad(t, c, redisScriptExact)
}

// TestRedisScriptMergesEqualTimestamps shows why the blog-post script is
// not a rate limiter: L = 100, W = 60 s, three bursts of 100 requests
// within 1 ms (100 at t, 100 more at t, 100 at t+1 ms), all inside one
// window. The naive script records the first burst as a single member and so
// admits all 300; the exact script and ringlimit's shard.Store admit 100.
func TestRedisScriptMergesEqualTimestamps(t *testing.T) {
	c, shaNaive, shaExact := redisTestSetup(t)
	const limit = 100
	bursts := []int64{0, 0, 1} // ms offsets of three bursts of 100
	tests := []struct {
		impl       string
		wantFirst  int64 // admitted in the first burst
		wantCard   int64 // ZCARD after the first burst; -1: not Redis
		wantTotal  int64 // admitted of all 300
		overAdmits bool
	}{
		{impl: "redis-naive", wantFirst: 100, wantCard: 1, wantTotal: 300, overAdmits: true},
		{impl: "redis-exact", wantFirst: 100, wantCard: 100, wantTotal: 100},
		{impl: "ringlimit", wantFirst: 100, wantCard: -1, wantTotal: 100},
	}
	impls := redisDeciders(t, c, shaNaive, shaExact, "merge", limit, time.Minute)
	for _, tc := range tests {
		t.Run("impl="+tc.impl, func(t *testing.T) {
			im := impls[tc.impl]
			var total int64
			for b, at := range bursts {
				for i := range 100 {
					ok, err := im.decide(at)
					if err != nil {
						t.Fatalf("burst %d request %d at +%d ms: %v", b, i, at, err)
					}
					if ok {
						total++
					}
				}
				if b == 0 {
					if total != tc.wantFirst {
						t.Errorf("first burst of 100 at one ms: admitted %d, want %d", total, tc.wantFirst)
					}
					if got := im.card(); got != tc.wantCard {
						t.Errorf("after the first burst the log holds %d members, want %d", got, tc.wantCard)
					}
				}
			}
			if total != tc.wantTotal {
				t.Errorf("admitted %d of 300 within one window (L = %d), want %d", total, limit, tc.wantTotal)
			}
			if got := total > limit; got != tc.overAdmits {
				t.Errorf("over-admission (admitted %d > L = %d) is %v, want %v", total, limit, got, tc.overAdmits)
			}
		})
	}
}

// TestRedisScriptBoundaryFacts runs the boundary facts of the promise on
// both scripts and on shard.Store. The naive script's boundaries are right
// (the L = 1 case passes); only its merging of equal timestamps breaks the
// L = 100 case.
func TestRedisScriptBoundaryFacts(t *testing.T) {
	c, shaNaive, shaExact := redisTestSetup(t)
	type step struct {
		at   int64 // ms after redisT0
		n    int   // requests at at
		want map[string]int
	}
	all := func(n int) map[string]int {
		return map[string]int{"redis-naive": n, "redis-exact": n, "ringlimit": n}
	}
	tests := []struct {
		name  string
		limit int64
		steps []step
	}{
		{name: "L=100", limit: 100, steps: []step{
			{at: 59_900, n: 100, want: all(100)},
			{at: 60_100, n: 100, want: map[string]int{"redis-naive": 100, "redis-exact": 0, "ringlimit": 0}},
			{at: 119_899, n: 1, want: map[string]int{"redis-naive": 1, "redis-exact": 0, "ringlimit": 0}},
			{at: 119_900, n: 1, want: all(1)},
		}},
		{name: "L=1", limit: 1, steps: []step{
			{at: 0, n: 1, want: all(1)},
			{at: 59_999, n: 1, want: all(0)},
			{at: 60_000, n: 1, want: all(1)},
		}},
	}
	for _, tc := range tests {
		impls := redisDeciders(t, c, shaNaive, shaExact, "boundary-"+tc.name, tc.limit, time.Minute)
		for _, impl := range []string{"redis-naive", "redis-exact", "ringlimit"} {
			t.Run(tc.name+"/impl="+impl, func(t *testing.T) {
				for _, s := range tc.steps {
					got := 0
					for range s.n {
						ok, err := impls[impl].decide(s.at)
						if err != nil {
							t.Fatalf("at %d ms: %v", s.at, err)
						}
						if ok {
							got++
						}
					}
					if want := s.want[impl]; got != want {
						t.Errorf("%d requests at %d ms (L = %d, W = 60 s): admitted %d, want %d", s.n, s.at, tc.limit, got, want)
					}
				}
			})
		}
	}
}

// cmpParallelism is the RunParallel multiplier for every implementation,
// the same as BenchmarkNodeAllowForwarded's.
const cmpParallelism = 16

// cmpLatCap bounds each goroutine's latency samples; beyond it the newest
// samples overwrite the oldest, so a long local run keeps its steady state
// without gigabytes of samples.
const cmpLatCap = 1 << 16

// cmpWorker makes the request for key slot i and returns an error unless it
// was admitted the way the benchmark requires.
type cmpWorker func(i int) error

// cmpRunParallel runs the benchmark loop shared by every implementation:
// each RunParallel goroutine gets its worker from newWorker (and its
// release func, called when the goroutine ends), times every call into a
// preallocated per-goroutine slice, and the merged samples give p50-ns and
// p99-ns. It also reports ops/s and allocations.
func cmpRunParallel(b *testing.B, newWorker func() (cmpWorker, func(), error)) {
	b.ReportAllocs()
	b.SetParallelism(cmpParallelism)
	g := cmpParallelism * runtime.GOMAXPROCS(0)
	lat := make([][]time.Duration, g)
	for i := range lat {
		lat[i] = make([]time.Duration, min(b.N, cmpLatCap))
	}
	filled := make([]int, g)
	var next atomic.Int64
	var failed atomic.Pointer[error]
	fail := func(err error) { failed.CompareAndSwap(nil, &err) }
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		id := int(next.Add(1) - 1)
		work, release, err := newWorker()
		if err != nil {
			fail(err)
			return
		}
		defer release()
		var rec []time.Duration
		if id < len(lat) {
			rec = lat[id]
		} // else: more goroutines than RunParallel documents; drop samples.
		i, j, n := id*7919, 0, 0
		for pb.Next() {
			start := time.Now()
			err := work(i)
			d := time.Since(start)
			if err != nil {
				fail(err)
				return
			}
			if len(rec) > 0 {
				rec[j] = d
				if j++; j == len(rec) {
					j = 0
				}
				n++
			}
			i++
		}
		if id < len(lat) {
			filled[id] = min(n, len(rec))
		}
	})
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatalf("request failed: %v", *err)
	}
	var all []time.Duration
	for id, r := range lat {
		all = append(all, r[:filled[id]]...)
	}
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(b.N)/s, "ops/s")
	}
	if len(all) == 0 {
		return
	}
	slices.Sort(all)
	pct := func(p float64) float64 {
		return float64(all[min(len(all)-1, int(p*float64(len(all))))].Nanoseconds())
	}
	b.ReportMetric(pct(0.50), "p50-ns")
	b.ReportMetric(pct(0.99), "p99-ns")
}

// BenchmarkCompareRedis compares the cost of one admitted decision:
//
//   - impl=redis-lua: the exact script (redisScriptExact) by EVALSHA over
//     loopback TCP, one connection per goroutine, the server's clock;
//   - impl=ringlimit-forwarded: Node.Allow on a 3-node loopback cluster for
//     keys another node owns (one gRPC hop, batching on);
//   - impl=ringlimit-local: Node.Allow on the same kind of cluster for keys
//     the calling node owns.
//
// All use the policy of BenchmarkNodeAllowForwarded (a limit of 2^50 per
// 1 s, so every request is admitted: this measures the decision's cost, not
// refusals), the same key pools and RunParallel with SetParallelism(16).
// The Redis log keeps one member per admission (up to the admitted rate ×
// 1 s per key); ringlimit's keeps runs at 10 ms resolution (at most 100
// per key). Redis, the cluster and the client share the machine's cores.
func BenchmarkCompareRedis(b *testing.B) {
	requireRedis(b)
	// The script's arguments mirror startPeerCluster's policy.
	limit, window := strconv.FormatInt(1<<50, 10), strconv.FormatInt(time.Second.Milliseconds(), 10)
	b.Run("impl=redis-lua", func(b *testing.B) {
		addr := startRedis(b)
		pool := &respPool{addr: addr}
		b.Cleanup(pool.close)
		c, err := pool.get()
		if err != nil {
			b.Fatal(err)
		}
		sha := redisLoad(b, c, redisScriptExact)
		pool.put(c)
		for _, kc := range peerKeyCounts {
			// The same key identities as the ringlimit pools, spread
			// cyclically over peerKeySlots slots.
			logs, seqs := make([]string, peerKeySlots), make([]string, peerKeySlots)
			for i := range peerKeySlots {
				logs[i], seqs[i] = redisKeys(peer.Key{Tenant: "bench", Subject: fmt.Sprintf("user-%08d", i%kc.distinct), Policy: peerPolicy})
			}
			b.Run("keys="+kc.name, func(b *testing.B) {
				if err := pool.warm(cmpParallelism * runtime.GOMAXPROCS(0)); err != nil {
					b.Fatal(err)
				}
				cmpRunParallel(b, func() (cmpWorker, func(), error) {
					c, err := pool.get()
					if err != nil {
						return nil, nil, err
					}
					return func(i int) error {
						s := i & (peerKeySlots - 1)
						ok, err := redisEval(c, sha, logs[s], seqs[s], limit, window, "")
						if err == nil && !ok {
							err = errors.New("redis-lua refused a request under a limit of 2^50")
						}
						return err
					}, func() { pool.put(c) }, nil
				})
			})
		}
	})
	allow := func(via *peer.Node, keys []peer.Key, local bool) func() (cmpWorker, func(), error) {
		return func() (cmpWorker, func(), error) {
			ctx := context.Background()
			return func(i int) error {
				d, err := via.Allow(ctx, peer.Request{Key: keys[i&(peerKeySlots-1)]})
				if err != nil {
					return err
				}
				if !d.Allowed || (d.Owner == via.Name()) != local {
					return fmt.Errorf("decision %+v by %s: want admitted, local=%v", d, via.Name(), local)
				}
				return nil
			}, func() {}, nil
		}
	}
	b.Run("impl=ringlimit-forwarded", func(b *testing.B) {
		via := startPeerCluster(b, 3, true)[0]
		for _, kc := range peerKeyCounts {
			keys := peerKeys(b, via, kc.distinct, func(owner string) bool { return owner != via.Name() })
			b.Run("keys="+kc.name, func(b *testing.B) { cmpRunParallel(b, allow(via, keys, false)) })
		}
	})
	b.Run("impl=ringlimit-local", func(b *testing.B) {
		via := startPeerCluster(b, 3, true)[0]
		keys := peerKeys(b, via, 10000, func(owner string) bool { return owner == via.Name() })
		b.Run("keys=1e4", func(b *testing.B) { cmpRunParallel(b, allow(via, keys, true)) })
	})
}
