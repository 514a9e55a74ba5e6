package main

import (
	"encoding/json"
	"net/http"
	"testing"
)

// TestServeDebugOwnership: /debug/ownership of a log-owned node that
// founded its cluster names it the log's leader and one voter, and the
// holder, deciding, of every partition.
func TestServeDebugOwnership(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a serve process: skipped with -short")
	}
	p := startServe(t, "own-a", nil, "--ownership", "log")
	r := doHTTP(t, "GET", "http://"+p.httpAddr+"/debug/ownership", "")
	if r.status != http.StatusOK {
		t.Fatalf("/debug/ownership: %d %s", r.status, r.raw)
	}
	var info ownershipInfo
	if err := json.Unmarshal([]byte(r.raw), &info); err != nil {
		t.Fatalf("/debug/ownership: %v in %s", err, r.raw)
	}
	if info.Mode != "log" || info.Member == "" || info.Leader != "own-a" || info.Voters != 1 || !info.Live {
		t.Fatalf("/debug/ownership: mode %q member %q leader %q voters %d live %v, want log, an ID, own-a, 1, true",
			info.Mode, info.Member, info.Leader, info.Voters, info.Live)
	}
	if len(info.Partitions) == 0 {
		t.Fatal("/debug/ownership lists no partition")
	}
	for _, pi := range info.Partitions {
		if pi.Holder != "own-a" || !pi.Deciding {
			t.Fatalf("partition %d: holder %q deciding %v, want own-a deciding", pi.Partition, pi.Holder, pi.Deciding)
		}
	}
}
