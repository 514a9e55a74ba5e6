package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// TestServeMaxKeys starts serve with --max-keys 1, which leaves each of
// its testPartitions partitions its least, 64 keys, and sends distinct keys
// through /v1/checks until one is refused: that happens within
// testPartitions × 64 + 1 keys
// (by then some partition must overflow), and the refusal is capacity,
// not over limit and not a plain unavailability: 503 with reason
// "capacity" over HTTP, ResourceExhausted over gRPC, counted under
// reason="capacity"; keys held are still decided.
func TestServeMaxKeys(t *testing.T) {
	t.Parallel()
	p := startServe(t, "capacity", nil, "--max-keys", "1")
	const bound = testPartitions*64 + 1
	subject := func(i int) string { return fmt.Sprintf("k%06d", i) }
	refused, held := "", ""
	sent := 0
	for sent < bound && refused == "" {
		var reqs []string
		for j := sent; j < min(sent+1000, bound); j++ {
			reqs = append(reqs, fmt.Sprintf(`{"tenant":"t","subject":%q,"policy":"default"}`, subject(j)))
		}
		r := mustPost(t, p, "/v1/checks", `{"requests":[`+strings.Join(reqs, ",")+`]}`)
		results, _ := r.body["results"].([]any)
		if r.status != 200 || len(results) != len(reqs) {
			t.Fatalf("/v1/checks of %d keys: %d %s", len(reqs), r.status, r.raw)
		}
		for j, res := range results {
			m, _ := res.(map[string]any)
			switch {
			case m["allowed"] == true:
				held = subject(sent + j)
			case m["status"] == 503.0 && m["reason"] == "capacity":
				if refused == "" {
					refused = subject(sent + j)
				}
			default:
				t.Fatalf("key %s: %v; want admitted or refused for capacity", subject(sent+j), m)
			}
		}
		sent += len(reqs)
	}
	if refused == "" {
		t.Fatalf("%d distinct keys admitted with --max-keys 1 (64 a partition)", sent)
	}
	t.Logf("first key refused for capacity after %d sent", sent)

	r := mustPost(t, p, "/v1/check", keyOf(refused))
	if msg, _ := r.body["error"].(string); r.status != 503 || r.body["reason"] != "capacity" || r.header.Get("RateLimit-Reason") != "capacity" || !strings.Contains(msg, "--max-keys") {
		t.Errorf("/v1/check of a refused key: %d %q %s; want 503, reason and RateLimit-Reason capacity, naming --max-keys", r.status, r.header.Get("RateLimit-Reason"), r.raw)
	}
	if r := mustPost(t, p, "/v1/check", keyOf(held)); r.status != 200 || r.body["remaining"] != 98.0 {
		t.Errorf("/v1/check of a held key: %d %s; want 200 with 98 remaining", r.status, r.raw)
	}
	conn, err := grpc.NewClient(p.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := peerpb.NewRateLimiterClient(conn).Allow(ctx, &peerpb.AllowRequest{Key: &peerpb.Key{Tenant: "t", Subject: refused, Policy: "default"}}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("gRPC Allow of a refused key: %v, want ResourceExhausted", err)
	}
	m := doHTTP(t, "GET", "http://"+p.httpAddr+"/metrics", "")
	if !strings.Contains(m.raw, `reason="capacity"`) {
		t.Errorf("/metrics has no decision with reason=\"capacity\"")
	}
}

// keyOf is a /v1/check body for subject of tenant t, policy default.
func keyOf(subject string) string {
	b, _ := json.Marshal(map[string]string{"tenant": "t", "subject": subject, "policy": "default"})
	return string(b)
}
