package main

import (
	"strings"
	"testing"
)

// TestServeCalendarPolicy: a calendar quota from the policy file decides
// over HTTP: limit 2 admits two, refuses the third with 429, and its
// RateLimit-Policy has no w= (a calendar period has no fixed length).
func TestServeCalendarPolicy(t *testing.T) {
	t.Parallel()
	pols := writeFile(t, t.TempDir(), "policies.yaml",
		"policies:\n  - {name: monthly, limit: 2, window: calendar_month, zone: Europe/Berlin}\n")
	p := startServe(t, "calendar", nil, "--policies", pols)
	body := `{"tenant":"acme","subject":"alice","policy":"monthly"}`
	for i, want := range []int{200, 200, 429} {
		r := doHTTP(t, "POST", "http://"+p.httpAddr+"/v1/check", body)
		if r.status != want {
			t.Fatalf("check %d: status %d, want %d: %s", i+1, r.status, want, r.raw)
		}
		if pol := r.header.Get("RateLimit-Policy"); pol != `"monthly";q=2` {
			t.Fatalf("check %d: RateLimit-Policy %q, want %q", i+1, pol, `"monthly";q=2`)
		}
		if want == 429 && (r.header.Get("Retry-After") == "" || strings.HasPrefix(r.header.Get("Retry-After"), "0")) {
			t.Fatalf("check %d: Retry-After %q, want the seconds to the month's end", i+1, r.header.Get("Retry-After"))
		}
	}
}
