package shard

import (
	"errors"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

func TestAllowEncoded(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	p := Policy{Limit: 2, Window: time.Minute}
	k := Key{Tenant: "t", Subject: "s", Policy: "p"}
	ek, _ := k.AppendEncoded(nil)
	for _, tc := range []struct {
		name string
		enc  []byte
	}{
		{"truncated", ek[:len(ek)-1]},
		{"trailing", append(append([]byte(nil), ek...), 'x')},
		{"empty part", []byte{0, 1, 's', 1, 'p'}},
		{"control byte", []byte{1, '\n', 1, 's', 1, 'p'}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := NewStore(Config{})
			if _, err := s.AllowEncoded(tc.enc, p, 1, t0); !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("AllowEncoded(%q) error = %v, want ErrInvalidKey", tc.enc, err)
			}
			if s.Len() != 0 || s.Bytes() != 0 {
				t.Fatalf("after a rejected encoding the store holds %d keys, %d bytes; want none", s.Len(), s.Bytes())
			}
		})
	}
	t.Run("same state as Allow", func(t *testing.T) {
		s, _ := NewStore(Config{})
		if _, err := s.AllowEncoded(ek, p, 1, t0); err != nil {
			t.Fatal(err)
		}
		d, err := s.Allow(k, p, 1, t0)
		if err != nil || !d.Allowed || d.Remaining != 0 {
			t.Fatalf("Allow after AllowEncoded = %+v, %v; want the second admission of the same key (remaining 0)", d, err)
		}
		if d, _ := s.AllowEncoded(ek, p, 1, t0); d.Allowed {
			t.Fatalf("third admission at limit 2 allowed: %+v", d)
		}
	})
}

// TestAllowPlaced checks that a placed key shares its state with the
// encoded and plain forms (the same stripe and entry), that Place hashes
// exactly the placement prefix, and that the malformed encodings
// AllowEncoded rejects are rejected placed too.
func TestAllowPlaced(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	p := Policy{Limit: 3, Window: time.Minute}
	k := Key{Tenant: "t", Subject: "s", Policy: "p"}
	ek, _ := k.AppendEncoded(nil)
	pre, _ := k.AppendPlacement(nil)
	pk := Place(ek)
	if got, want := pk.Hash(), xxhash.Sum64(pre); got != want {
		t.Fatalf("Place(%q).Hash() = %#x, want xxhash of the placement %q = %#x", ek, got, pre, want)
	}
	s, _ := NewStore(Config{Stripes: 4})
	if st := &s.stripes[pk.Hash()&s.mask]; st != s.stripeFor(ek) {
		t.Fatalf("placed key's stripe differs from stripeFor(%q)", ek)
	}
	for i, allow := range []func() (Decision, error){
		func() (Decision, error) { var d Decision; _, err := s.AllowPlaced(pk, p, 1, t0, &d); return d, err },
		func() (Decision, error) { return s.AllowEncoded(ek, p, 1, t0) },
		func() (Decision, error) { return s.Allow(k, p, 1, t0) },
	} {
		d, err := allow()
		if err != nil || !d.Allowed || d.Remaining != p.Limit-int64(i)-1 {
			t.Fatalf("admission %d = %+v, %v; want admitted with %d remaining", i+1, d, err, p.Limit-int64(i)-1)
		}
	}
	var d Decision
	if at, err := s.AllowPlaced(pk, p, 1, t0, &d); err != nil || d.Allowed || at != t0.UnixNano() {
		t.Fatalf("fourth admission at limit 3 = %+v at %d, %v; want refused at %d", d, at, err, t0.UnixNano())
	}
	for _, enc := range [][]byte{ek[:len(ek)-1], {0, 1, 's', 1, 'p'}, {1, '\n', 1, 's', 1, 'p'}, {}} {
		s, _ := NewStore(Config{})
		var d Decision
		if _, err := s.AllowPlaced(Place(enc), p, 1, t0, &d); !errors.Is(err, ErrInvalidKey) || d != (Decision{}) {
			t.Fatalf("AllowPlaced(%q) = %+v, %v; want ErrInvalidKey and the decision untouched", enc, d, err)
		}
	}
}
