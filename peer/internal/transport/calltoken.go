package transport

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// Call tokens (see auth.go): "2:<session>:<counter>:<unix ms>:<sender>:<mac>",
// session 8 random bytes and sender in hex (member names are any string),
// counter and time in decimal, mac the HMAC of callInput under the call
// key.
const callTokenPrefix = "2:"

// callInput is what a call token's HMAC covers.
func callInput(method, sender, receiver string, session [8]byte, counter uint64, ms int64) []byte {
	b := make([]byte, 0, 64+len(method)+len(sender)+len(receiver))
	b = append(b, "call\x00"...)
	b = append(b, method...)
	b = append(b, 0)
	b = append(b, sender...)
	b = append(b, 0)
	b = append(b, receiver...)
	b = append(b, 0)
	b = append(b, session[:]...)
	b = binary.BigEndian.AppendUint64(b, counter)
	return binary.BigEndian.AppendUint64(b, uint64(ms))
}

// callCredsFor makes a call token for every call to member receiver: a
// session of its own, counting from 1; over TLS (tls) it adds the static
// token (DialOptions).
func (a Auth) callCredsFor(receiver string, tls bool) *callCreds {
	c := &callCreds{a: a, receiver: receiver}
	_, _ = rand.Read(c.session[:])
	if tls {
		c.legacy = a.legacy
	}
	return c
}

type callCreds struct {
	a        Auth
	receiver string
	legacy   string // the static token sent beside (TLS only); "" for none
	session  [8]byte
	counter  atomic.Uint64
}

// GetRequestMetadata makes the call's token, bound to its method.
func (c *callCreds) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	ri, ok := credentials.RequestInfoFromContext(ctx)
	if !ok {
		return nil, fmt.Errorf("peer: no request info for a call token")
	}
	md := map[string]string{CallTokenKey: c.a.callToken(ri.Method, c.receiver, c.session, c.counter.Add(1))}
	if c.legacy != "" {
		md[TokenKey] = c.legacy
	}
	return md, nil
}

// RequireTransportSecurity is false: a call token is fresh, so plaintext
// clusters authenticate too.
func (*callCreds) RequireTransportSecurity() bool { return false }

// callToken is the token of the call to method on receiver.
func (a Auth) callToken(method, receiver string, session [8]byte, counter uint64) string {
	ms := a.now().UnixMilli()
	sum := mac(a.callKey, callInput(method, a.self, receiver, session, counter, ms))
	return callTokenPrefix + hex.EncodeToString(session[:]) + ":" + strconv.FormatUint(counter, 10) + ":" +
		strconv.FormatInt(ms, 10) + ":" + hex.EncodeToString([]byte(a.self)) + ":" + hex.EncodeToString(sum)
}

// CallTokenForTest is the token a client of receiver sends on a call to
// method as the counter'th call of session.
func (a Auth) CallTokenForTest(method, receiver string, session [8]byte, counter uint64) string {
	return a.callToken(method, receiver, session, counter)
}

// checkCallToken accepts a call token made for this member and this
// method, at most once.
func (a Auth) checkCallToken(method, token string) error {
	f := strings.Split(token[len(callTokenPrefix):], ":")
	bad := status.Error(codes.PermissionDenied, "malformed peer call token")
	if len(f) != 5 {
		return bad
	}
	var session [8]byte
	sb, err1 := hex.DecodeString(f[0])
	counter, err2 := strconv.ParseUint(f[1], 10, 64)
	ms, err3 := strconv.ParseInt(f[2], 10, 64)
	sender, err4 := hex.DecodeString(f[3])
	sum, err5 := hex.DecodeString(f[4])
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || err5 != nil || len(sb) != len(session) || counter == 0 {
		return bad
	}
	copy(session[:], sb)
	if !hmac.Equal(sum, mac(a.callKey, callInput(method, string(sender), a.self, session, counter, ms))) {
		return status.Error(codes.PermissionDenied, "wrong peer token: the caller's PeerSecret (or GossipKey) differs, or the token was made for another member or method")
	}
	now := a.now()
	t := time.UnixMilli(ms)
	if d := now.Sub(t); d > ReplayWindow || d < -ReplayWindow {
		return status.Errorf(codes.PermissionDenied, "peer call token made %v from this member's clock (a replay, or wall clocks more than %v apart)", d.Round(time.Millisecond), ReplayWindow)
	}
	if ms < a.startMs {
		return status.Error(codes.PermissionDenied, "peer call token made before this member started (a replay, or the sender's clock is behind)")
	}
	return a.seen.use(string(sender), session, counter, now)
}

// replayCache remembers, per session, which counters were used: the
// newest and a bitmap of the ReplayWindowCalls before it.
type replayCache struct {
	mu       sync.Mutex
	sessions map[sessionID]*sessionSeen
	swept    time.Time
}

type sessionID struct {
	sender  string
	session [8]byte
}

type sessionSeen struct {
	newest uint64
	bits   [ReplayWindowCalls / 64]uint64 // bit c%ReplayWindowCalls: counter c used
	last   time.Time
}

func newReplayCache() *replayCache {
	return &replayCache{sessions: map[sessionID]*sessionSeen{}}
}

// use accepts counter of the session once.
func (r *replayCache) use(sender string, session [8]byte, counter uint64, now time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := sessionID{sender, session}
	s := r.sessions[id]
	if s == nil {
		if now.Sub(r.swept) > ReplayWindow || len(r.sessions) >= maxSessions {
			r.sweep(now)
		}
		if len(r.sessions) >= maxSessions {
			return status.Errorf(codes.ResourceExhausted, "peer call sessions: %d remembered, none idle for %v", len(r.sessions), 2*ReplayWindow)
		}
		s = &sessionSeen{}
		r.sessions[id] = s
	}
	s.last = now
	switch {
	case counter > s.newest:
		// Clear the bits of the counters the window moves past.
		for c := s.newest + 1; c < counter && c <= s.newest+ReplayWindowCalls; c++ {
			s.bits[(c%ReplayWindowCalls)/64] &^= 1 << (c % 64)
		}
		s.newest = counter
	case counter+ReplayWindowCalls <= s.newest:
		return status.Errorf(codes.PermissionDenied, "peer call token %d behind its session's newest (a replay, or more than %d calls overtook it)", s.newest-counter, ReplayWindowCalls)
	case s.bits[(counter%ReplayWindowCalls)/64]&(1<<(counter%64)) != 0:
		return status.Error(codes.PermissionDenied, "peer call token used before (a replay)")
	}
	s.bits[(counter%ReplayWindowCalls)/64] |= 1 << (counter % 64)
	return nil
}

// sweep forgets sessions idle for more than 2*ReplayWindow: every token
// of theirs is older than ReplayWindow by then.
func (r *replayCache) sweep(now time.Time) {
	r.swept = now
	for id, s := range r.sessions {
		if now.Sub(s.last) > 2*ReplayWindow {
			delete(r.sessions, id)
		}
	}
}
