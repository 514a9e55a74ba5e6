package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer"
)

// staticPolicies is a fixed policy table for httpAPI tests without a node.
type staticPolicies map[string]peer.PolicyConfig

func (s staticPolicies) Policy(name string) (peer.PolicyConfig, bool) {
	pc, ok := s[name]
	return pc, ok
}

func (s staticPolicies) Policies() map[string]peer.PolicyConfig { return s }

// TestServeAllowErrors checks how serve answers each error Node.Allow can
// return: bad input in the client's terms with no package prefixes, and a
// 503 that carries what a 429 carries and claims a timeout only after one.
func TestServeAllowErrors(t *testing.T) {
	t.Parallel()
	api := &httpAPI{pols: staticPolicies{
		"api": {Limit: 3, Window: time.Minute}, "shared": {Limit: 10, Window: time.Minute},
		"inflight": {Algorithm: peer.Concurrency, Limit: 2, Window: time.Minute},
	}, log: slog.New(slog.DiscardHandler)}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	good := peer.Key{Tenant: "a", Subject: "b", Policy: "api"}
	for _, tc := range []struct {
		name     string
		key      peer.Key
		policies []string // instead of key.Policy
		hits     int64
		err      error
		status   int
		headers  map[string]string // "" means absent
		body     map[string]any
		errPart  string
		errNotIn string
	}{
		{name: "connection refused", key: good, status: 503,
			err:     fmt.Errorf("%w: forward to ub: %w", peer.ErrUnavailable, refused),
			headers: map[string]string{"Retry-After": "1", "RateLimit-Policy": `"api";q=3;w=60`, "RateLimit-Reason": "unavailable", "RateLimit": ""},
			body:    map[string]any{"retry_after_ms": 1000.0, "limit": 3.0, "reason": "unavailable", "allowed": false},
			errPart: "could not get a decision from the key's owner", errNotIn: "in time"},
		{name: "deadline", key: good, status: 503,
			err:     fmt.Errorf("%w: %w", peer.ErrUnavailable, context.DeadlineExceeded),
			headers: map[string]string{"Retry-After": "1", "RateLimit-Policy": `"api";q=3;w=60`},
			body:    map[string]any{"retry_after_ms": 1000.0, "limit": 3.0},
			errPart: "could not decide in time"},
		{name: "closed", key: good, err: peer.ErrClosed, status: 503,
			headers: map[string]string{"Retry-After": "1", "RateLimit-Policy": `"api";q=3;w=60`},
			body:    map[string]any{"retry_after_ms": 1000.0, "limit": 3.0}, errPart: "shutting down"},
		{name: "closed before the policy was looked up", key: peer.Key{Tenant: "a", Subject: "b", Policy: "nope"}, err: peer.ErrClosed, status: 503,
			headers: map[string]string{"Retry-After": "1", "RateLimit-Policy": ""},
			body:    map[string]any{"retry_after_ms": 1000.0}, errPart: "shutting down"},
		{name: "invalid key", key: peer.Key{Tenant: "a", Subject: "josé", Policy: "api"}, status: 400,
			err:     fmt.Errorf("%w: %w", peer.ErrInvalidKey, peer.Key{Tenant: "a", Subject: "josé", Policy: "api"}.Validate()),
			errPart: "invalid key: subject has byte 0xc3 at 3 outside visible ASCII; tenant, subject and policy must each be 1 to 128 bytes", errNotIn: "invalid key: shard"},
		{name: "non-ASCII subject gets the encoding", key: peer.Key{Tenant: "a", Subject: "josé", Policy: "api"}, status: 400,
			err:     fmt.Errorf("%w: %w", peer.ErrInvalidKey, peer.Key{Tenant: "a", Subject: "josé", Policy: "api"}.Validate()),
			errPart: `percent-encode it as shard.KeyPart does: keep A-Z a-z 0-9 . _ @ - and write every other byte as %XX in uppercase hex ("josé" is "jos%C3%A9")`},
		{name: "a long subject gets no encoding hint", key: peer.Key{Tenant: "a", Subject: strings.Repeat("x", 129), Policy: "api"}, status: 400,
			err:     fmt.Errorf("%w: too long", peer.ErrInvalidKey),
			errPart: "1 to 128 bytes of visible ASCII", errNotIn: "percent-encode"},
		{name: "unknown policy", key: peer.Key{Tenant: "a", Subject: "b", Policy: "nope"}, status: 400,
			err: fmt.Errorf("%w: %q", peer.ErrUnknownPolicy, "nope"), errPart: `unknown policy "nope": not in this node's policy table`, errNotIn: "inflight"},
		{name: "invalid hits", key: good, hits: 4, status: 400,
			err: fmt.Errorf("%w: hits 4 must be between 1 and the limit 3", peer.ErrInvalidHits), errPart: "invalid hits 4: must be between 1 and the policy's limit 3 (leave hits out to mean 1)", errNotIn: "0 means 1"},
		{name: "anything else", key: good, err: errors.New("boom"), status: 500, errPart: "internal error", errNotIn: "boom"},
		{name: "multi unavailable", key: peer.Key{Tenant: "a", Subject: "b"}, policies: []string{"api", "shared"}, status: 503,
			err:     fmt.Errorf("%w: %w", peer.ErrUnavailable, refused),
			headers: map[string]string{"Retry-After": "1", "RateLimit-Policy": `"api";q=3;w=60, "shared";q=10;w=60`, "RateLimit-Reason": "unavailable", "RateLimit": ""},
			body:    map[string]any{"retry_after_ms": 1000.0, "reason": "unavailable"}, errPart: "could not get a decision"},
		{name: "multi unknown policy", key: peer.Key{Tenant: "a", Subject: "b"}, policies: []string{"api", "nope"}, status: 400,
			err: fmt.Errorf("%w: %q", peer.ErrUnknownPolicy, "nope"), errPart: `unknown policy "nope": not in this node's policy table`},
		{name: "multi invalid hits", key: peer.Key{Tenant: "a", Subject: "b"}, policies: []string{"shared", "api"}, hits: 5, status: 400,
			err: fmt.Errorf("%w: hits 5 exceed policy %q's limit 3", peer.ErrInvalidHits, "api"), errPart: `invalid hits 5: above policy "api"'s limit 3; a multi-policy check must fit every policy`},
		{name: "multi with a concurrency policy", key: peer.Key{Tenant: "a", Subject: "b"}, policies: []string{"api", "inflight"}, status: 400,
			err:     fmt.Errorf("%w: policy %q is a concurrency policy", peer.ErrWrongAlgorithm, "inflight"),
			errPart: `policy "inflight" is a concurrency policy: it cannot be part of a multi-policy check; take its lease with /v1/acquire`},
		{name: "check of a concurrency policy", key: peer.Key{Tenant: "a", Subject: "b", Policy: "inflight"}, status: 400,
			err: fmt.Errorf("%w: policy %q is a concurrency policy", peer.ErrWrongAlgorithm, "inflight"), errPart: `policy "inflight" is a concurrency policy: use /v1/acquire and /v1/release`},
		{name: "acquire of a sliding log", key: good, status: 400,
			err: fmt.Errorf("%w: policy %q is sliding_log", peer.ErrWrongAlgorithm, "api"), errPart: `policy "api" is sliding_log: /v1/acquire and /v1/release need a concurrency policy`},
		{name: "multi invalid key", key: peer.Key{Tenant: "a", Subject: "b"}, policies: []string{"api", "sh ared"}, status: 400,
			err: fmt.Errorf("%w: bad", peer.ErrInvalidKey), errPart: "invalid key: policy has byte 0x20 at 2 outside visible ASCII;"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			b := checkBody{Tenant: tc.key.Tenant, Subject: tc.key.Subject, Policy: tc.key.Policy, Policies: tc.policies, Hits: tc.hits}
			status, out := api.allowError(rec.Header(), b, tc.err)
			writeJSON(rec, status, out)
			var body map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q is not JSON: %v", rec.Body.String(), err)
			}
			msg, _ := body["error"].(string)
			if rec.Code != tc.status || !strings.Contains(msg, tc.errPart) {
				t.Errorf("error %v: %d %q, want %d with error containing %q", tc.err, rec.Code, msg, tc.status, tc.errPart)
			}
			if strings.Contains(msg, "peer:") || strings.Contains(msg, "shard:") || (tc.errNotIn != "" && strings.Contains(msg, tc.errNotIn)) {
				t.Errorf("error %v: message %q has a package prefix or %q", tc.err, msg, tc.errNotIn)
			}
			for k, want := range tc.headers {
				if got := rec.Header().Get(k); got != want {
					t.Errorf("error %v: header %s = %q, want %q", tc.err, k, got, want)
				}
			}
			for k, want := range tc.body {
				if body[k] != want {
					t.Errorf("error %v: body %s = %v, want %v (%s)", tc.err, k, body[k], want, rec.Body.String())
				}
			}
		})
	}
}
