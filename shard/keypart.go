package shard

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// KeyPart maps any string (an email address, a UTF-8 name such as "josé",
// an address with a port such as "[::1]:8080", even invalid UTF-8) to a
// valid key part: 1 to MaxKeyPartLen bytes of visible ASCII. Use it to build
// a Key's Tenant or Subject from identities that are not already key-safe.
// It is deterministic, allocation-light and safe for concurrent use.
//
// The encoding, which is stable and part of the key's identity (changing it
// would move every key it built to a new quota):
//
//   - Bytes in [A-Za-z0-9._@-] are kept as they are; every other byte,
//     including '%' itself, is written as '%' and two uppercase hex digits
//     (percent-encoding of the UTF-8 bytes: "josé" → "jos%C3%A9").
//   - If that result is at most MaxKeyPartLen bytes it is the answer. This
//     range is injective: different inputs give different parts, and the
//     input can be recovered by percent-decoding.
//   - Otherwise (a hashed part) the answer is the longest prefix of that
//     result of at most 95 bytes that does not split a %XX escape, then '~',
//     then the first 128 bits of the input's SHA-256 as 32 lowercase hex
//     digits: at most MaxKeyPartLen bytes in all. Two distinct long inputs
//     collide only if their 128-bit hashes do: with n such inputs the chance
//     is about n²/2¹²⁹, negligible (below 10⁻²⁰ for n = 10⁹).
//   - The empty string maps to "~".
//
// The three forms never meet: an escaped part never contains '~' (it is
// escaped as %7E), and a hashed part is at least 34 bytes long.
func KeyPart(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if keepInKeyPart[s[i]] {
			n++
		} else {
			n += 3
		}
	}
	switch {
	case len(s) == 0:
		return emptyKeyPart
	case n == len(s) && n <= MaxKeyPartLen:
		return s // nothing to escape: no allocation
	}
	var b strings.Builder
	if n <= MaxKeyPartLen {
		b.Grow(n)
		appendEscaped(&b, s, MaxKeyPartLen)
		return b.String()
	}
	b.Grow(MaxKeyPartLen)
	appendEscaped(&b, s, hashedPrefixLen)
	sum := sha256.Sum256([]byte(s))
	b.WriteByte('~')
	var h [2 * hashedSumBytes]byte
	hex.Encode(h[:], sum[:hashedSumBytes])
	b.Write(h[:])
	return b.String()
}

const (
	// emptyKeyPart is KeyPart(""): escaped parts never contain '~' and
	// hashed parts are longer, so nothing else encodes to it.
	emptyKeyPart = "~"
	// hashedSumBytes is how much of the SHA-256 a hashed part keeps: 128
	// bits.
	hashedSumBytes = 16
	// hashedPrefixLen is the readable prefix of a hashed part: what is left
	// of MaxKeyPartLen after '~' and the hex digest.
	hashedPrefixLen = MaxKeyPartLen - 1 - 2*hashedSumBytes
)

// keepInKeyPart reports which bytes KeyPart keeps unescaped. '%' and '~' are
// not among them: they mark escapes and hashed parts.
var keepInKeyPart = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "._@-" {
		t[c] = true
	}
	return t
}()

// appendEscaped writes s percent-encoded to b, stopping before the first
// unit (a kept byte or a whole %XX escape) that would take b past limit
// bytes.
func appendEscaped(b *strings.Builder, s string, limit int) {
	const hexDigits = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if keepInKeyPart[c] {
			if b.Len()+1 > limit {
				return
			}
			b.WriteByte(c)
			continue
		}
		if b.Len()+3 > limit {
			return
		}
		b.WriteByte('%')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&0xf])
	}
}

// Problem returns "" if k is valid, and otherwise what is wrong with its
// first bad part in the user's terms, without a package prefix ("subject has
// byte 0xc3 at 3 outside visible ASCII"), for messages shown to whoever
// builds keys. It never quotes the part's value. Validate returns the same
// text wrapped in ErrInvalidKey.
func (k Key) Problem() string {
	for _, p := range [...]struct{ name, v string }{{"tenant", k.Tenant}, {"subject", k.Subject}, {"policy", k.Policy}} {
		if msg := validatePart(p.v); msg != "" {
			return p.name + " " + msg
		}
	}
	return ""
}
