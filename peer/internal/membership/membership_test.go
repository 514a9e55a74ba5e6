package membership

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// records is a slog handler that keeps every record, at every level.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}
func (h *records) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *records) WithGroup(string) slog.Handler      { return h }

func (h *records) all() []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.recs)
}

// TestMetaDecodeVersions checks that the current metadata round-trips with
// its policy version, raft id and heir, and that versions 5 (without raft
// id and heir: its raft ID is its start), 4 (without a policy version) and
// 2 (without start and cluster ids) still decode.
func TestMetaDecodeVersions(t *testing.T) {
	m := Meta{Fingerprint: 42, RPCAddr: "127.0.0.1:9", Draining: true, Start: 7, Cluster: 9, Policies: 11, RaftID: 13, Heir: 5}
	got, err := DecodeMeta(m.Encode())
	if err != nil || got != m || got.Raft() != 13 {
		t.Fatalf("decode(encode(%+v)) = %+v, %v", m, got, err)
	}
	v5 := append([]byte{5, 1, 0, 0, 0, 0, 0, 0, 0, 42, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 11}, "127.0.0.1:9"...)
	got, err = DecodeMeta(v5)
	if want := (Meta{Fingerprint: 42, RPCAddr: "127.0.0.1:9", Draining: true, Start: 7, Cluster: 9, Policies: 11}); err != nil || got != want || got.Raft() != 7 {
		t.Fatalf("decode(version 5) = %+v, %v; want %+v with raft ID 7", got, err, want)
	}
	v4 := append([]byte{4, 1, 0, 0, 0, 0, 0, 0, 0, 42, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 9}, "127.0.0.1:9"...)
	got, err = DecodeMeta(v4)
	if want := (Meta{Fingerprint: 42, RPCAddr: "127.0.0.1:9", Draining: true, Start: 7, Cluster: 9}); err != nil || got != want {
		t.Fatalf("decode(version 4) = %+v, %v; want %+v", got, err, want)
	}
	v2 := append([]byte{2, 0, 0, 0, 0, 0, 0, 0, 0, 42}, "127.0.0.1:9"...)
	got, err = DecodeMeta(v2)
	if want := (Meta{Fingerprint: 42, RPCAddr: "127.0.0.1:9"}); err != nil || got != want {
		t.Fatalf("decode(version 2) = %+v, %v; want %+v", got, err, want)
	}
	if _, err := DecodeMeta([]byte{9, 0, 0, 0, 0, 0, 0, 0, 0, 42, '1'}); err == nil {
		t.Fatal("decode accepted metadata version 9")
	}
}

// TestMemberlistWarningsThrottled: memberlist's warnings reach the node's
// log at Warn, but one kind (a failed ping to any peer) at most once per
// WarnEvery, the next saying how many were held back; the ones
// in between are still there at Debug, and other kinds and levels pass.
func TestMemberlistWarningsThrottled(t *testing.T) {
	t.Parallel()
	logs := &records{}
	w := NewLog(slog.New(logs).With("node", "n0"))
	now := time.Unix(1000, 0)
	w.now = func() time.Time { return now }
	say := func(line string) {
		if _, err := w.Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		say("[ERR] memberlist: Failed fallback TCP ping: timeout 200ms: read tcp 127.0.0.1:1->127.0.0.1:2: i/o timeout")
		say("[WARN] memberlist: Refuting a suspect message (from: n1)")
		say("[INFO] memberlist: Suspect n1 has failed, no acks received")
		now = now.Add(time.Second)
	}
	now = now.Add(WarnEvery)
	say("[ERR] memberlist: Failed fallback TCP ping: timeout 400ms: write tcp 127.0.0.1:1->127.0.0.1:3: i/o timeout")
	var warns, debugs, infos []string
	for _, r := range logs.all() {
		switch r.Level {
		case slog.LevelWarn:
			rep := "-"
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "repeated" {
					rep = a.Value.String()
				}
				return true
			})
			warns = append(warns, r.Message+" repeated="+rep)
		case slog.LevelDebug:
			debugs = append(debugs, r.Message)
		case slog.LevelInfo:
			infos = append(infos, r.Message)
		}
	}
	want := []string{
		"Failed fallback TCP ping: timeout 200ms: read tcp 127.0.0.1:1->127.0.0.1:2: i/o timeout repeated=-",
		"Refuting a suspect message (from: n1) repeated=-",
		"Failed fallback TCP ping: timeout 400ms: write tcp 127.0.0.1:1->127.0.0.1:3: i/o timeout repeated=4",
	}
	if !slices.Equal(warns, want) {
		t.Errorf("warnings logged:\n%s\nwant:\n%s", strings.Join(warns, "\n"), strings.Join(want, "\n"))
	}
	if len(debugs) != 8 || len(infos) != 5 {
		t.Errorf("%d held-back warnings at Debug (want 8) and %d info lines (want 5)", len(debugs), len(infos))
	}
}

// TestQueueLeaveOrFailure: a member that disappears after its leaving
// notice, or with its draining flag gossiped, left; any other
// disappearance is a failure. Either way its metadata is kept until
// ForgetFailed or the member's return (a leaver may still be draining,
// cut off from gossip: the rebuild asks the log); the member list is a copy its reader may keep (its metadata is
// shared, never written).
func TestQueueLeaveOrFailure(t *testing.T) {
	var q Queue
	node := func(name string, draining bool) *memberlist.Node {
		md := Meta{Fingerprint: 1, RPCAddr: "127.0.0.1:1", Draining: draining}
		return &memberlist.Node{Name: name, Addr: net.IPv4(127, 0, 0, 1), Port: 7946, Meta: md.Encode()}
	}
	for _, name := range []string{"told", "drained", "crashed"} {
		q.Apply("joined", node(name, false))
	}
	q.Apply("updated", node("drained", true))
	q.MarkLeaving("told")
	var kinds []string
	for _, name := range []string{"told", "drained", "crashed"} {
		kinds = append(kinds, name+"="+q.Apply("left", &memberlist.Node{Name: name}).Kind)
	}
	if want := []string{"told=left", "drained=left", "crashed=failed"}; !slices.Equal(kinds, want) {
		t.Fatalf("kinds %v, want %v", kinds, want)
	}
	evs, dropped, members, failed := q.Take()
	if len(evs) != 7 || dropped != 0 || len(members) != 0 || len(failed) != 3 || failed["crashed"] == nil || failed["told"] == nil || failed["drained"] == nil {
		t.Fatalf("Take: %d events, %d dropped, members %v, failed %v; want 7, 0, none, all three", len(evs), dropped, members, failed)
	}
	q.ForgetFailed("told")
	q.ForgetFailed("drained")
	q.ForgetFailed("crashed")
	if _, _, _, failed := q.Take(); failed != nil {
		t.Fatalf("failed %v after ForgetFailed, want none", failed)
	}
	q.Apply("joined", node("back", false))
	_, _, members, _ = q.Take()
	delete(members, "back") // the reader's copy
	if _, _, again, _ := q.Take(); again["back"] == nil {
		t.Fatal("deleting from Take's member list changed the queue's")
	}
	for i := range MaxEvents + 5 {
		q.Apply("updated", node("busy", i%2 == 0))
	}
	if evs, dropped, _, _ := q.Take(); len(evs) != MaxEvents || dropped != 5 {
		t.Fatalf("after %d events: %d kept, %d dropped; want %d and 5", MaxEvents+5, len(evs), dropped, MaxEvents)
	}
}

// TestJoinKeyMismatch joins real memberlists on 127.0.0.1 whose gossip
// keys differ (one side without a key, or two different keys): the join
// fails at once, with an error wrapping ErrKeyMismatch that says which
// side lacks a key and carries the seed's answer, instead of retrying
// until the timeout as if no seed had answered. Matching keys join. This
// also pins memberlist's wording, which is all Join has to go on.
func TestJoinKeyMismatch(t *testing.T) {
	t.Parallel()
	keyA := []byte("0123456789abcdef0123456789abcdef")
	keyB := []byte("fedcba9876543210fedcba9876543210")
	start := func(t *testing.T, name string, key []byte) *memberlist.Memberlist {
		t.Helper()
		mc := memberlist.DefaultLocalConfig()
		mc.Name = name
		mc.BindAddr = "127.0.0.1"
		mc.BindPort = 0
		mc.SecretKey = key
		mc.LogOutput = io.Discard
		ml, err := memberlist.Create(mc)
		if err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
		t.Cleanup(func() { _ = ml.Shutdown() })
		return ml
	}
	const timeout = 5 * time.Second
	for _, tc := range []struct {
		name       string
		mine, seed []byte
		want       string // "" for a join that succeeds
	}{
		{"no key here, one on the seed", nil, keyA, "this node has no gossip key and the seed has one"},
		{"a key here, none on the seed", keyA, nil, "this node has a gossip key and the seed answered without one"},
		{"different keys", keyA, keyB, "this node and the seed have different gossip keys"},
		{"the same key", keyA, keyA, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			seed := start(t, "seed", tc.seed)
			joiner := start(t, "joiner", tc.mine)
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(seed.LocalNode().Port)))
			logs := &records{}
			began := time.Now()
			err := Join(context.Background(), joiner, []string{addr}, timeout, slog.New(logs))
			took := time.Since(began)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Join with matching keys: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrKeyMismatch) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), addr) {
				t.Fatalf("Join after %v = %v; want an error wrapping ErrKeyMismatch, saying %q and naming the seed %s", took, err, tc.want, addr)
			}
			t.Logf("after %v: %v", took.Round(time.Millisecond), err)
			if took >= timeout/2 {
				t.Fatalf("Join failed after %v (timeout %v); want at once", took, timeout)
			}
			if strings.Contains(err.Error(), "no seed answered") || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q: want one line that does not claim no seed answered", err)
			}
		})
	}
}
