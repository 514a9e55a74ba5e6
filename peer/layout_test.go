package peer

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestLayout pins the import rules between peer's parts (each part's doc.go states its own), on
// the transitive dependencies `go list -deps` reports for every package
// under peer/internal/ (test files excluded):
//
//  1. Nothing under internal/ imports peer, cmd or bench: peer drives its
//     parts, never the other way round. (For a part peer imports, the
//     compiler refuses the cycle first; the rule holds the others, and
//     cmd and bench, which import peer.)
//  2. internal/policy, the policy table, knows nothing of the network: no
//     memberlist, no gRPC, no net. Publishing its version is peer's job.
//  3. internal/ownership, the protocol as a state machine, does no I/O: no
//     net, no raft, no gRPC, no memberlist (its simulator, ownership/sim,
//     may drive it through a raft log).
//  4. internal/transport, the framed pipe, knows nothing of what it
//     carries: no ownership, ownership log, policy table, membership,
//     shard, peerpb, raft or memberlist.
//  5. internal/membership, the memberlist glue, knows nothing of rings,
//     keys, RPCs or ownership: no ring, shard, ownership, ownlog, policy,
//     transport, peerpb, gRPC or raft.
//  6. internal/wire, the packed batches' layout, decides nothing and
//     carries nothing: no ownership, ownlog, policy, membership,
//     transport, raft or memberlist.
//  7. internal/grantee, a spread key's rights as state with time passed
//     in, does no I/O and knows no protocol but its own: of ours only
//     shard; no net, gRPC, raft or memberlist.
//  8. internal/connlimit, the connection bounds, counts connections and
//     knows nothing of what they carry: none of ours, no gRPC, raft or
//     memberlist.
//  9. internal/durable, the data directory, stores what it is given and
//     decides nothing about ownership: no ownership, ownlog, policy,
//     membership or transport, no raft or memberlist (ownlog keeps its
//     raft log through it, not the other way round).
//  10. internal/partition, what a node does with a partition's keys,
//     decides on memory it is given, with time passed in: no net, gRPC,
//     raft, memberlist, transport, ownership log or peerpb (the wire);
//     its collaborators are interfaces it declares.
func TestLayout(t *testing.T) {
	const mod = "github.com/ringlimit/ringlimit"
	out, err := exec.Command("go", "list", "-e", "-deps", "-f", `{{.ImportPath}} {{join .Deps " "}}`, "./internal/...").Output()
	if err != nil {
		t.Fatalf("go list -deps ./internal/...: %v", err)
	}
	deps := make(map[string][]string)
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) > 0 && strings.HasPrefix(f[0], mod+"/peer/internal/") {
			deps[f[0]] = f[1:]
		}
	}
	isNet := func(d string) bool { return d == "net" || strings.HasPrefix(d, "net/") }
	isGRPC := func(d string) bool {
		return d == "google.golang.org/grpc" || strings.HasPrefix(d, "google.golang.org/grpc/")
	}
	isMemberlist := func(d string) bool { return d == "github.com/hashicorp/memberlist" }
	isRaft := func(d string) bool { return strings.HasPrefix(d, "go.etcd.io/raft") }
	isUp := func(d string) bool {
		return d == mod+"/peer" || d == mod+"/cmd" || strings.HasPrefix(d, mod+"/cmd/") || d == mod+"/bench" || strings.HasPrefix(d, mod+"/bench/")
	}
	isOurs := func(d string) bool {
		for _, p := range []string{"peer/internal/ownership", "peer/internal/ownlog", "peer/internal/policy", "peer/internal/membership", "shard", "peer/peerpb"} {
			if d == mod+"/"+p || strings.HasPrefix(d, mod+"/"+p+"/") {
				return true
			}
		}
		return false
	}
	isOursBelow := func(d string) bool {
		return isOurs(d) || d == mod+"/ring" || d == mod+"/peer/internal/transport"
	}
	rules := []struct {
		pkg    string // "" for every package under peer/internal/
		what   string
		banned func(string) bool
	}{
		{"", "peer, cmd or bench", isUp},
		{"policy", "net", isNet},
		{"policy", "gRPC", isGRPC},
		{"policy", "memberlist", isMemberlist},
		{"ownership", "net", isNet},
		{"ownership", "raft", isRaft},
		{"ownership", "gRPC", isGRPC},
		{"ownership", "memberlist", isMemberlist},
		{"transport", "ownership, ownlog, policy, membership, shard or peerpb", isOurs},
		{"transport", "raft", isRaft},
		{"transport", "memberlist", isMemberlist},
		{"membership", "ring, shard, ownership, ownlog, policy, transport or peerpb", isOursBelow},
		{"membership", "gRPC", isGRPC},
		{"wire", "ownership, ownlog, policy, membership or transport", func(d string) bool {
			return isOursBelow(d) && d != mod+"/shard" && d != mod+"/peer/peerpb" && d != mod+"/ring"
		}},
		{"wire", "raft", isRaft},
		{"wire", "memberlist", isMemberlist},
		{"membership", "raft", isRaft},
		{"grantee", "ownership, ownlog, policy, membership, transport, ring or peerpb", func(d string) bool {
			return isOursBelow(d) && d != mod+"/shard"
		}},
		{"grantee", "net", isNet},
		{"grantee", "gRPC", isGRPC},
		{"grantee", "raft", isRaft},
		{"grantee", "memberlist", isMemberlist},
		{"connlimit", "anything of ringlimit's", func(d string) bool { return strings.HasPrefix(d, mod+"/") }},
		{"connlimit", "gRPC", isGRPC},
		{"connlimit", "raft", isRaft},
		{"connlimit", "memberlist", isMemberlist},
		{"durable", "ownership, ownlog, policy, membership or transport", func(d string) bool {
			return isOursBelow(d) && d != mod+"/shard" && d != mod+"/peer/peerpb" && d != mod+"/ring"
		}},
		{"durable", "raft", isRaft},
		{"durable", "memberlist", isMemberlist},
		{"partition", "net", isNet},
		{"partition", "gRPC", isGRPC},
		{"partition", "raft", isRaft},
		{"partition", "memberlist", isMemberlist},
		{"partition", "transport, ownlog, membership or peerpb", func(d string) bool {
			for _, p := range []string{"peer/internal/transport", "peer/internal/ownlog", "peer/internal/membership", "peer/peerpb"} {
				if d == mod+"/"+p {
					return true
				}
			}
			return false
		}},
	}
	for _, r := range rules {
		if r.pkg != "" {
			if _, ok := deps[mod+"/peer/internal/"+r.pkg]; !ok {
				t.Errorf("peer/internal/%s is missing from go list's output; a rule pins nothing", r.pkg)
			}
		}
		for pkg, ds := range deps {
			if r.pkg != "" && pkg != mod+"/peer/internal/"+r.pkg {
				continue
			}
			var bad []string
			for _, d := range ds {
				if r.banned(d) {
					bad = append(bad, d)
				}
			}
			if bad != nil {
				t.Errorf("%s depends on %s: it must not import %s", strings.TrimPrefix(pkg, mod+"/"), strings.Join(bad, ", "), r.what)
			}
		}
	}
}

// TestLayoutPublicParts pins that the public packages beside peer
// (httplimit, prommetrics, console) use peer's public API only, none importing a
// package under peer/internal/ (their own imports; peer's are its own
// business), and that peer itself, its parts included, does not depend
// on Prometheus: the adapter is the one place that knows it.
func TestLayoutPublicParts(t *testing.T) {
	const mod = "github.com/ringlimit/ringlimit"
	out, err := exec.Command("go", "list", "-e", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./httplimit", "./prommetrics", "./console").Output()
	if err != nil {
		t.Fatalf("go list ./httplimit ./prommetrics ./console: %v", err)
	}
	seen := 0
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], mod+"/peer/") || !slices.Contains(f, mod+"/peer") {
			t.Fatalf("go list printed %q: not a package and its imports as this test reads them", line)
		}
		seen++
		for _, d := range f[1:] {
			if strings.HasPrefix(d, mod+"/peer/internal/") {
				t.Errorf("%s imports %s: it must use peer's public API only", strings.TrimPrefix(f[0], mod+"/"), d)
			}
		}
	}
	if seen != 3 {
		t.Fatalf("go list printed %d packages, want 3:\n%s", seen, out)
	}
	deps, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps .: %v", err)
	}
	for d := range strings.Lines(string(deps)) {
		if strings.HasPrefix(d, "github.com/prometheus/") {
			t.Errorf("peer depends on %s: Prometheus belongs to peer/prommetrics", strings.TrimSpace(d))
		}
	}
}
