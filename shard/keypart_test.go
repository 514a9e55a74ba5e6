package shard_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"

	"github.com/ringlimit/ringlimit/shard"
)

// checkKeyPart fails the test unless out is a valid key part.
func checkKeyPart(t *testing.T, in, out string) {
	t.Helper()
	if err := (shard.Key{Tenant: out, Subject: "s", Policy: "p"}).Validate(); err != nil {
		t.Fatalf("KeyPart(%q) = %q, not a valid key part: %v", in, out, err)
	}
}

// decodeKeyPart is the test's independent inverse of KeyPart's escaped
// form: percent-decoding, rejecting anything KeyPart would not produce.
func decodeKeyPart(t *testing.T, p string) string {
	t.Helper()
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '%' && i+2 < len(p):
			v, err := strconv.ParseUint(p[i+1:i+3], 16, 8)
			if err != nil || strings.ToUpper(p[i+1:i+3]) != p[i+1:i+3] {
				t.Fatalf("part %q: bad escape at %d", p, i)
			}
			b.WriteByte(byte(v))
			i += 2
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', strings.IndexByte("._@-", c) >= 0:
			b.WriteByte(c)
		default:
			t.Fatalf("part %q: byte %q at %d is neither kept nor an escape", p, c, i)
		}
	}
	return b.String()
}

func TestKeyPart(t *testing.T) {
	sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:16]) }
	long := strings.Repeat("a", 200)
	longUTF8 := strings.Repeat("é", 70) // 140 bytes, 420 escaped
	for _, tc := range []struct {
		name, in, want string
	}{
		{"empty is the fixed token", "", "~"},
		{"plain kept as is", "user-42", "user-42"},
		{"email kept as is", "jane.doe@example.com", "jane.doe@example.com"},
		{"UTF-8 escaped byte by byte", "josé", "jos%C3%A9"},
		{"IPv6 with port", "[::1]:8080", "%5B%3A%3A1%5D%3A8080"},
		{"escape char escaped", "100%", "100%25"},
		{"hash mark escaped", "~", "%7E"},
		{"space and slash escaped", "a b/c", "a%20b%2Fc"},
		{"control and high bytes", "\x00\xff", "%00%FF"},
		{"invalid UTF-8 kept apart from its escape", "\xc3", "%C3"},
		{"exactly 128 plain bytes kept", strings.Repeat("x", 128), strings.Repeat("x", 128)},
		{"exactly 128 escaped bytes kept", strings.Repeat("x", 125) + " ", strings.Repeat("x", 125) + "%20"},
		{"129 plain bytes hashed", strings.Repeat("x", 129), strings.Repeat("x", 95) + "~" + sum(strings.Repeat("x", 129))},
		{"escape that would pass 128 hashed", strings.Repeat("x", 126) + " ", strings.Repeat("x", 95) + "~" + sum(strings.Repeat("x", 126)+" ")},
		{"long hashed", long, long[:95] + "~" + sum(long)},
		// 95 is not a multiple of 3: the prefix stops before the escape
		// that would not fit whole.
		{"hashed prefix never splits an escape", longUTF8, strings.Repeat("%C3%A9", 15) + "%C3~" + sum(longUTF8)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := shard.KeyPart(tc.in)
			if got != tc.want {
				t.Fatalf("KeyPart(%q) = %q, want %q", tc.in, got, tc.want)
			}
			checkKeyPart(t, tc.in, got)
			if again := shard.KeyPart(tc.in); again != got {
				t.Errorf("KeyPart(%q) not deterministic: %q then %q", tc.in, got, again)
			}
		})
	}
}

func TestKeyProblem(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  shard.Key
		want string
	}{
		{"valid", shard.Key{Tenant: "t", Subject: "s", Policy: "p"}, ""},
		{"empty tenant", shard.Key{Subject: "s", Policy: "p"}, "tenant is empty"},
		{"UTF-8 subject", shard.Key{Tenant: "t", Subject: "josé", Policy: "p"}, "subject has byte 0xc3 at 3 outside visible ASCII"},
		{"long policy", shard.Key{Tenant: "t", Subject: "s", Policy: strings.Repeat("p", 129)}, "policy is 129 bytes, longer than 128"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.key.Problem()
			if got != tc.want {
				t.Errorf("%+v.Problem() = %q, want %q", tc.key, got, tc.want)
			}
			err := tc.key.Validate()
			if (err == nil) != (got == "") || (err != nil && !strings.HasSuffix(err.Error(), ": "+got)) {
				t.Errorf("%+v: Validate() = %v, disagrees with Problem() %q", tc.key, err, got)
			}
		})
	}
}

// FuzzKeyPart checks, for any two inputs, that KeyPart's output is a valid
// key part, that it is deterministic, that the escaped form decodes back to
// the input (so it is injective there), that only hashed or empty inputs
// give a '~', and that distinct inputs give distinct parts.
func FuzzKeyPart(f *testing.F) {
	f.Add("josé", "jos%C3%A9")
	f.Add("", "~")
	f.Add("[::1]:8080", "%5B%3A%3A1%5D%3A8080")
	f.Fuzz(func(t *testing.T, a, b string) {
		pa, pb := shard.KeyPart(a), shard.KeyPart(b)
		checkKeyPart(t, a, pa)
		checkKeyPart(t, b, pb)
		if again := shard.KeyPart(a); again != pa {
			t.Fatalf("KeyPart(%q) not deterministic: %q then %q", a, pa, again)
		}
		for _, in := range []struct{ s, p string }{{a, pa}, {b, pb}} {
			switch {
			case in.s == "":
				if in.p != "~" {
					t.Fatalf("KeyPart(\"\") = %q, want \"~\"", in.p)
				}
			case !strings.Contains(in.p, "~"):
				if got := decodeKeyPart(t, in.p); got != in.s {
					t.Fatalf("KeyPart(%q) = %q decodes to %q", in.s, in.p, got)
				}
			case len(in.p) < 34:
				t.Fatalf("KeyPart(%q) = %q: hashed form shorter than its '~' and digest", in.s, in.p)
			}
		}
		// For two hashed inputs, equality would be a 128-bit SHA-256
		// prefix collision: no fuzzer finds one.
		if a != b && pa == pb {
			t.Fatalf("KeyPart(%q) == KeyPart(%q) == %q", a, b, pa)
		}
	})
}
