package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/peer"
)

func TestServeConfigErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	shortKey := writeFile(t, dir, "short.key", "too short")
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"missing policy file", []string{"--policies", filepath.Join(dir, "nope.yaml")}, "nope.yaml"},
		{"bad log format", []string{"--log-format", "xml"}, `log format "xml"`},
		{"bad log level", []string{"--log-level", "loud"}, `log level "loud"`},
		{"half of TLS", []string{"--tls-cert", "x.pem"}, "go together"},
		{"bad gossip key", []string{"--gossip-key", shortKey}, "want 16, 24 or 32"},
		{"bad gossip profile", []string{"--gossip-profile", "moon"}, "gossip profile"},
		{"bad peer pipes", []string{"--peer-pipes", "smoke"}, `peer pipes "smoke": want framed, grpc or unary`},
		{"bad ownership", []string{"--ownership", "raft"}, `ownership "raft": want log`},
		{"stray argument", []string{"now"}, `unexpected argument "now"`},
		{"negative GC headroom", []string{"--gc-headroom", "-1"}, `invalid value "-1" for flag -gc-headroom`},
		{"GC headroom past 1 TiB", []string{"--gc-headroom", "2000000"}, "--gc-headroom 2000000 MiB is more than 1 TiB"},
		{"bad address", []string{"--gossip-addr", "nowhere", "--grpc-addr", "127.0.0.1:0", "--http-addr", ""}, "gossip address"},
		{"negative max conns", []string{"--grpc-max-conns", "-1"}, "--grpc-max-conns -1 and --grpc-max-conns-per-ip 64 must not be negative (0 disables)"},
		{"no streams", []string{"--grpc-max-streams", "0"}, "--grpc-max-streams 0 must be between 1 and"},
		{"keepalive under a second", []string{"--grpc-keepalive-time", "500ms"}, "--grpc-keepalive-time 500ms must be at least 1s"},
		{"negative idle timeout", []string{"--grpc-idle-timeout", "-1s"}, "--grpc-idle-timeout -1s must not be negative (0 disables)"},
		{"negative max keys", []string{"--max-keys", "-5"}, "--max-keys -5 must not be negative (0 disables)"},
		{"no forward timeout", []string{"--forward-timeout", "0s"}, "--forward-timeout must be positive"},
		{"too many partitions", []string{"--partitions", "70000"}, "--partitions 70000 must be between 1 and 65536"},
		{"negative partitions", []string{"--partitions", "-3"}, "--partitions -3 must be between 1 and 65536"},
		{"too many members", []string{"--expected-members", "5000"}, "--expected-members 5000 must be between 1 and 4000"},
		{"negative members", []string{"--expected-members", "-2"}, "--expected-members -2 must be between 1 and 4000"},
		{"data dir without a name", []string{"--data-dir", filepath.Join(dir, "data")}, "--data-dir needs --name"},
		{"data dir of a file", []string{"--name", "x", "--data-dir", shortKey, "--gossip-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--http-addr", ""}, shortKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(context.Background(), append([]string{"serve"}, tc.args...), &out, &out)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("serve %q: error %v, want one containing %q", tc.args, err, tc.wantErr)
			}
			if code := exitCode(err, io.Discard); code != 1 {
				t.Errorf("serve %q: exit code %d, want 1", tc.args, code)
			}
		})
	}
}

// TestServeRPCLimits checks that the --grpc-* flags reach the node's
// RPCLimits: unset, peer's defaults; 0, no bound (peer's negative).
func TestServeRPCLimits(t *testing.T) {
	t.Parallel()
	def := peer.RPCLimits{}.WithDefaults()
	for _, tc := range []struct {
		name string
		args []string
		want peer.RPCLimits
	}{
		{"defaults", nil, def},
		{"set", []string{"--grpc-max-conns", "10", "--grpc-max-conns-per-ip", "3", "--grpc-max-streams", "7", "--grpc-idle-timeout", "1m",
			"--grpc-keepalive-time", "2s", "--grpc-keepalive-timeout", "1s", "--grpc-min-ping-interval", "3s"},
			peer.RPCLimits{MaxConns: 10, MaxConnsPerIP: 3, MaxStreams: 7, IdleTimeout: time.Minute, KeepaliveTime: 2 * time.Second,
				KeepaliveTimeout: time.Second, MinPingInterval: 3 * time.Second}},
		{"disabled", []string{"--grpc-max-conns", "0", "--grpc-max-conns-per-ip", "0", "--grpc-idle-timeout", "0"},
			peer.RPCLimits{MaxConns: -1, MaxConnsPerIP: -1, MaxStreams: def.MaxStreams, IdleTimeout: -1, KeepaliveTime: def.KeepaliveTime,
				KeepaliveTimeout: def.KeepaliveTimeout, MinPingInterval: def.MinPingInterval}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parseServeFlags(tc.args, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if got := f.peerConfig(nil).RPCLimits; got != tc.want {
				t.Fatalf("serve %q: RPCLimits %+v, want %+v", tc.args, got, tc.want)
			}
		})
	}
}

// TestServeMaxKeysFlag checks that --max-keys reaches the node's
// Store.MaxKeys: a million unless given, 0 for none.
func TestServeMaxKeysFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want int
	}{{nil, 1_000_000}, {[]string{"--max-keys", "5000"}, 5000}, {[]string{"--max-keys", "0"}, 0}} {
		f, err := parseServeFlags(tc.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if got := f.peerConfig(nil).Store.MaxKeys; got != tc.want {
			t.Errorf("serve %q: Store.MaxKeys %d, want %d", tc.args, got, tc.want)
		}
	}
}

// TestServePartitionsFlags checks that --partitions and --expected-members
// reach the node's config (Ring.PartitionCount 0 leaves the count to
// peer's defaults: ring.PartitionsFor of ExpectedMembers, else 271).
func TestServePartitionsFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args           []string
		expected, want int
	}{
		{nil, 0, 0},
		{[]string{"--partitions", "1009"}, 0, 1009},
		{[]string{"--expected-members", "1024"}, 1024, 0},
		{[]string{"--expected-members", "1024", "--partitions", "4099"}, 1024, 4099},
	} {
		f, err := parseServeFlags(tc.args, io.Discard)
		if err != nil {
			t.Fatalf("serve %q: %v", tc.args, err)
		}
		cfg := f.peerConfig(nil)
		if cfg.ExpectedMembers != tc.expected {
			t.Errorf("serve %q: ExpectedMembers %d, want %d", tc.args, cfg.ExpectedMembers, tc.expected)
		}
		if got := cfg.Ring.PartitionCount; got != tc.want {
			t.Errorf("serve %q: Ring.PartitionCount %d, want %d", tc.args, got, tc.want)
		}
	}
}

func TestApplyEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		args     []string
		env      map[string]string
		wantAddr string
		wantJoin string
		wantErr  string
	}{
		{"defaults", nil, nil, "127.0.0.1:7946", "", ""},
		{"from env", nil, map[string]string{"RINGLIMIT_GOSSIP_ADDR": "127.0.0.1:9", "RINGLIMIT_JOIN": "x:1,y:2"}, "127.0.0.1:9", "x:1,y:2", ""},
		{"flag wins", []string{"--gossip-addr", "127.0.0.1:5"}, map[string]string{"RINGLIMIT_GOSSIP_ADDR": "127.0.0.1:9"}, "127.0.0.1:5", "", ""},
		{"bad env value", nil, map[string]string{"RINGLIMIT_DRAIN_TIMEOUT": "soon"}, "", "", "RINGLIMIT_DRAIN_TIMEOUT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			addr := fs.String("gossip-addr", "127.0.0.1:7946", "")
			join := fs.String("join", "", "")
			fs.Duration("drain-timeout", time.Second, "")
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := applyEnv(fs, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("applyEnv error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || *addr != tc.wantAddr || *join != tc.wantJoin {
				t.Errorf("applyEnv: addr %q join %q err %v; want %q %q", *addr, *join, err, tc.wantAddr, tc.wantJoin)
			}
		})
	}
	if got := envName("tls-server-name"); got != "RINGLIMIT_TLS_SERVER_NAME" {
		t.Errorf("envName = %q", got)
	}
}

// TestSetPeerPipes pins what --peer-pipes sets in the node's Config.
func TestSetPeerPipes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode                string
		noFramed, noStreams bool
	}{
		{"framed", false, false},
		{"grpc", true, false},
		{"unary", true, true},
	} {
		cfg := peer.Config{DisableFramedPipes: !tc.noFramed, DisableStreams: !tc.noStreams}
		if err := setPeerPipes(tc.mode, &cfg); err != nil || cfg.DisableFramedPipes != tc.noFramed || cfg.DisableStreams != tc.noStreams {
			t.Errorf("--peer-pipes %s: DisableFramedPipes %v, DisableStreams %v, err %v; want %v, %v", tc.mode, cfg.DisableFramedPipes, cfg.DisableStreams, err, tc.noFramed, tc.noStreams)
		}
	}
}

// TestServeOwnershipFlag pins what --ownership (and RINGLIMIT_OWNERSHIP)
// sets in the node's Config. It does not start a node: log mode is
// peer's to test.
func TestServeOwnershipFlag(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  string // RINGLIMIT_OWNERSHIP, "" for unset
		want peer.OwnershipMode
	}{
		{"default", nil, "", peer.OwnershipLog},
		{"log", []string{"--ownership", "log"}, "", peer.OwnershipLog},
		{"log from the environment", nil, "log", peer.OwnershipLog},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("RINGLIMIT_OWNERSHIP", tc.env)
			}
			f, err := parseServeFlags(tc.args, io.Discard)
			if err != nil {
				t.Fatalf("parseServeFlags(%q): %v", tc.args, err)
			}
			if got := f.peerConfig(nil).Ownership; got != tc.want {
				t.Errorf("serve %q (RINGLIMIT_OWNERSHIP=%q): Config.Ownership %q, want %q", tc.args, tc.env, got, tc.want)
			}
		})
	}
	if !strings.Contains(serveUsage, "--ownership M") {
		t.Error("serve's help text does not document --ownership")
	}
}

// TestServeBadOwnership: a bad --ownership is a usage error (exit 1)
// naming the value and the choices, refused before serve does anything —
// before it reads the policy or token file or binds a port (either would
// fail here with another error).
func TestServeBadOwnership(t *testing.T) {
	t.Parallel()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	missing := filepath.Join(t.TempDir(), "missing")
	for _, bad := range []string{"raft", "Log", " gossip", "none", "gossip"} {
		var stdout, stderr bytes.Buffer
		args := []string{"serve", "--ownership", bad,
			"--gossip-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--http-addr", held.Addr().String(),
			"--policies", missing, "--admin-token-file", missing}
		err := run(context.Background(), args, &stdout, &stderr)
		want := `serve: ownership "` + bad + `": want log`
		if bad == "gossip" {
			want = `serve: ownership "gossip" was removed: holders change only through the ownership log (log)`
		}
		if err == nil || err.Error() != want {
			t.Errorf("serve --ownership %q: error %v, want %q", bad, err, want)
		}
		if code := exitCode(err, io.Discard); code != exitFailure {
			t.Errorf("serve --ownership %q: exit code %d, want %d (a usage error, like a bad --gossip-profile)", bad, code, exitFailure)
		}
		if stdout.Len() != 0 || stderr.Len() != 0 {
			t.Errorf("serve --ownership %q wrote output before failing:\nstdout: %s\nstderr: %s", bad, stdout.String(), stderr.String())
		}
		if _, err := parseServeFlags(args[1:], io.Discard); err == nil {
			t.Errorf("parseServeFlags accepted --ownership %q", bad)
		}
	}
}

// TestServeFlagsInREADME: README.md's table of serve flags names every
// flag that serve's help text documents.
func TestServeFlagsInREADME(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	const begin, end = "<!-- serveflags:begin -->", "<!-- serveflags:end -->"
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("README.md has no %s ... %s section", begin, end)
	}
	table := s[i:j]
	flags := regexp.MustCompile(`(?m)^  (--[a-z-]+)`).FindAllStringSubmatch(serveUsage, -1)
	if len(flags) < 20 {
		t.Fatalf("found %d flags in serve's help text; the pattern is out of date", len(flags))
	}
	for _, m := range flags {
		if !strings.Contains(table, "`"+m[1]+"`") {
			t.Errorf("README.md's serve flag table lacks %s", m[1])
		}
	}
}
