package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ringlimit/ringlimit/peer"
)

// TestHTTPReserveSettle: /v1/reserve admits an estimate and answers a
// reservation id; /v1/settle replaces it with the actual cost (less gives
// back, more is overage), once; and every malformed body is a 400 that
// changes nothing.
func TestHTTPReserveSettle(t *testing.T) {
	pols := map[string]peer.PolicyConfig{
		"tokens": {Limit: 100, Window: time.Minute},
		"bucket": {Limit: 100, Window: time.Minute, Algorithm: peer.TokenBucket},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	nd, err := peer.New(ctx, peer.Config{Name: "solo", Policies: pols, GossipProfile: peer.GossipFast, Logger: slog.New(slog.DiscardHandler)})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = nd.Close(ctx)
	})
	waitSettledNodes(t, []*peer.Node{nd})
	h := (&httpAPI{node: nd, pols: nd, reg: prometheus.NewRegistry(), log: slog.New(slog.DiscardHandler)}).routes()
	call := func(path, body string) (int, map[string]any, http.Header) {
		t.Helper()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
		var out map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
			t.Fatalf("%s %s: %v (%q)", path, body, err, w.Body.String())
		}
		return w.Code, out, w.Result().Header
	}
	code, r, _ := call("/v1/reserve", `{"tenant":"acme","subject":"alice","policy":"tokens","hits":60}`)
	id, _ := r["reservation_id"].(string)
	if code != 200 || r["allowed"] != true || id == "" || r["reservation_ttl_ms"] != 60000.0 || r["remaining"] != 40.0 {
		t.Fatalf("/v1/reserve 60 = %d %v; want 200, a reservation id, 40 left", code, r)
	}
	code, r, hdr := call("/v1/reserve", `{"tenant":"acme","subject":"alice","policy":"tokens","hits":41}`)
	if code != 429 || r["allowed"] != false || r["reservation_id"] != nil || hdr.Get("Retry-After") == "" {
		t.Fatalf("/v1/reserve 41 with 40 left = %d %v; want 429 with Retry-After and no id", code, r)
	}
	code, r, hdr = call("/v1/settle", `{"tenant":"acme","subject":"alice","policy":"tokens","reservation_id":"`+id+`","actual":75}`)
	if code != 200 || r["allowed"] != true || r["reason"] != "settled" || r["estimate"] != 60.0 || r["overage"] != 15.0 || r["remaining"] != 25.0 || hdr.Get("Retry-After") != "" {
		t.Fatalf("/v1/settle 60 → 75 = %d %v; want settled, overage 15, 25 left", code, r)
	}
	code, r, _ = call("/v1/settle", `{"tenant":"acme","subject":"alice","policy":"tokens","reservation_id":"`+id+`","actual":0}`)
	if code != 200 || r["allowed"] != false || r["reason"] != "not_pending" || r["estimate"] != 0.0 || r["remaining"] != 25.0 {
		t.Fatalf("second /v1/settle = %d %v; want not_pending, nothing changed (25 left)", code, r)
	}
	for _, tc := range []struct{ path, body, errPart string }{
		{"/v1/settle", `{"tenant":"acme","subject":"alice","policy":"tokens","actual":1}`, `needs "reservation_id"`},
		{"/v1/settle", `{"tenant":"acme","subject":"alice","policy":"tokens","reservation_id":"` + id + `"}`, `needs "actual"`},
		{"/v1/settle", `{"tenant":"acme","subject":"alice","policy":"tokens","reservation_id":"x1","actual":1}`, "decimal string"},
		{"/v1/settle", `{"tenant":"acme","subject":"alice","policy":"tokens","reservation_id":"1","actual":-1}`, "0 or more"},
		{"/v1/settle", `{"tenant":"acme","subject":"alice","policy":"tokens","reservation_id":"1","actual":1,"hits":2}`, `not "hits"`},
		{"/v1/reserve", `{"tenant":"acme","subject":"alice","policy":"tokens","actual":1}`, "for /v1/settle"},
		{"/v1/check", `{"tenant":"acme","subject":"alice","policy":"tokens","reservation_id":"1"}`, "for /v1/settle"},
		{"/v1/reserve", `{"tenant":"acme","subject":"alice","policies":["tokens"]}`, `one "policy"`},
		{"/v1/reserve", `{"tenant":"acme","subject":"alice","policy":"bucket"}`, "need a sliding_log policy"},
		{"/v1/reserve", `{"tenant":"acme","subject":"alice","policy":"tokens","hits":101}`, "limit"},
	} {
		code, r, _ := call(tc.path, tc.body)
		if msg, _ := r["error"].(string); code != 400 || !strings.Contains(msg, tc.errPart) {
			t.Errorf("%s %s = %d %v; want 400 mentioning %q", tc.path, tc.body, code, r, tc.errPart)
		}
	}
	if code, r, _ := call("/v1/peek", `{"tenant":"acme","subject":"alice","policy":"tokens"}`); code != 200 || r["remaining"] != 24.0 {
		t.Fatalf("after the refused calls: /v1/peek = %d %v; want 25 left (24 after the peeked unit)", code, r)
	}
}
