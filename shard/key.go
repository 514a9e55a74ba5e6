package shard

import (
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// MaxKeyPartLen is the maximum length in bytes of each of a key's parts.
const MaxKeyPartLen = 128

// MaxEncodedKeyLen is the maximum length of a key's canonical encoding.
const MaxEncodedKeyLen = 3 * (1 + MaxKeyPartLen)

// Key identifies one quota: a tenant, the authenticated subject within it,
// and the name of the server-side policy that applies. It is never a string a
// client chose freely: callers build it from authenticated identity.
//
// Each part is 1 to MaxKeyPartLen bytes of visible ASCII (0x21 to 0x7E).
type Key struct {
	Tenant  string
	Subject string
	Policy  string
}

// keyChar reports which bytes a key part may hold.
var keyChar = func() (t [256]bool) {
	for c := 0x21; c <= 0x7e; c++ {
		t[c] = true
	}
	return t
}()

// Validate returns an error wrapping ErrInvalidKey if any part is empty, longer
// than MaxKeyPartLen or holds a byte outside visible ASCII.
func (k Key) Validate() error {
	for _, p := range [...]struct{ name, v string }{{"tenant", k.Tenant}, {"subject", k.Subject}, {"policy", k.Policy}} {
		if err := validatePart(p.v); err != "" {
			return fmt.Errorf("%w: %s %s", ErrInvalidKey, p.name, err)
		}
	}
	return nil
}

func validatePart(s string) string {
	if s == "" {
		return "is empty"
	}
	if len(s) > MaxKeyPartLen {
		return fmt.Sprintf("is %d bytes, longer than %d", len(s), MaxKeyPartLen)
	}
	for i := 0; i < len(s); i++ {
		if !keyChar[s[i]] {
			return fmt.Sprintf("has byte 0x%02x at %d outside visible ASCII", s[i], i)
		}
	}
	return ""
}

// AppendEncoded appends the key's canonical encoding to dst: each part as one
// length byte followed by its bytes. Length prefixes make the encoding
// injective: two different keys never encode to the same bytes. It returns
// ok == false, and dst unchanged, if the key is invalid.
func (k Key) AppendEncoded(dst []byte) ([]byte, bool) {
	if !validFast(k.Tenant) || !validFast(k.Subject) || !validFast(k.Policy) {
		return dst, false
	}
	dst = append(dst, byte(len(k.Tenant)))
	dst = append(dst, k.Tenant...)
	dst = append(dst, byte(len(k.Subject)))
	dst = append(dst, k.Subject...)
	dst = append(dst, byte(len(k.Policy)))
	dst = append(dst, k.Policy...)
	return dst, true
}

// AppendPlacement appends the encoding of the key's (tenant, subject) part
// to dst: the prefix of AppendEncoded's output that precedes the policy.
// Placement and ownership should hash these bytes, not the whole encoding,
// so that one owner holds all of a subject's policies and can decide them
// together (Store.AllowMulti); Store chooses its lock stripe from them for
// the same reason. It returns ok == false, and dst unchanged, if the key
// (policy included) is invalid.
func (k Key) AppendPlacement(dst []byte) ([]byte, bool) {
	if !validFast(k.Tenant) || !validFast(k.Subject) || !validFast(k.Policy) {
		return dst, false
	}
	return appendPlacement(dst, k.Tenant, k.Subject), true
}

// Placed is a key's canonical encoding (Key.AppendEncoded) together with
// the xxhash64 of its (tenant, subject) prefix (Key.AppendPlacement). That
// one hash both chooses the Store's lock stripe (Store.AllowPlaced) and
// places the key on the ring (ring.Snapshot.PartitionOfHash), so a caller
// that does both hashes the key once. Build it with Place; the hash is
// computed here, never supplied by a caller, so a Placed can never name
// the wrong stripe.
type Placed struct {
	ek   []byte
	hash uint64
}

// Place returns ek with its placement hash. It does not copy ek: the Placed
// shares its memory, and the caller keeps it unchanged while the Placed is
// in use. It does not allocate.
func Place(ek []byte) Placed {
	return Placed{ek: ek, hash: xxhash.Sum64(ek[:placementLen(ek)])}
}

// Encoded returns the key's canonical encoding (shared, not copied).
func (pk Placed) Encoded() []byte { return pk.ek }

// Hash returns xxhash64 of the key's (tenant, subject) encoding: what ring
// placement hashes.
func (pk Placed) Hash() uint64 { return pk.hash }

// appendPlacement appends the encoding of two validated parts.
func appendPlacement(dst []byte, tenant, subject string) []byte {
	dst = append(dst, byte(len(tenant)))
	dst = append(dst, tenant...)
	dst = append(dst, byte(len(subject)))
	return append(dst, subject...)
}

func validFast(s string) bool {
	if len(s) == 0 || len(s) > MaxKeyPartLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !keyChar[s[i]] {
			return false
		}
	}
	return true
}

// DecodeKey parses a canonical encoding produced by AppendEncoded. The
// returned key's parts share memory with enc when enc is a string.
func DecodeKey(enc string) (Key, error) {
	var parts [3]string
	rest := enc
	for i := range parts {
		if len(rest) == 0 {
			return Key{}, fmt.Errorf("%w: truncated encoding", ErrInvalidKey)
		}
		n := int(rest[0])
		if len(rest) < 1+n {
			return Key{}, fmt.Errorf("%w: truncated encoding", ErrInvalidKey)
		}
		parts[i], rest = rest[1:1+n], rest[1+n:]
	}
	if rest != "" {
		return Key{}, fmt.Errorf("%w: trailing bytes in encoding", ErrInvalidKey)
	}
	k := Key{Tenant: parts[0], Subject: parts[1], Policy: parts[2]}
	if err := k.Validate(); err != nil {
		return Key{}, err
	}
	return k, nil
}

// String returns the key's encoding-independent, human-readable form
// "tenant/subject/policy". It is for logs and debugging, not for identity:
// use AppendEncoded for that.
func (k Key) String() string { return k.Tenant + "/" + k.Subject + "/" + k.Policy }
