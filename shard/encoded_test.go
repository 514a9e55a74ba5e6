package shard

import (
	"errors"
	"testing"
	"time"
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
