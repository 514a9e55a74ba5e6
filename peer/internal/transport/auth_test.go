package transport

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// TestAuth: with a secret, a protected method needs the token derived
// from it (none: Unauthenticated; another secret's: PermissionDenied);
// with mutual TLS alone, a verified certificate; unprotected methods and
// an open Auth admit anyone.
func TestAuth(t *testing.T) {
	mine := NewAuth([]byte("s3cret"), false, "/p.Peer/")
	theirs := NewAuth([]byte("other"), false, "/p.Peer/")
	mtls := NewAuth(nil, true, "/p.Peer/")
	open := NewAuth(nil, false, "/p.Peer/")
	if mine.Token() == "" || mine.Token() == theirs.Token() || mine.Token() != NewAuth([]byte("s3cret"), true).Token() {
		t.Fatal("a token is not a function of the secret alone")
	}
	if mine.Open() || mtls.Open() || !open.Open() {
		t.Fatal("Open: want only the Auth without secret and mTLS open")
	}
	call := func(a Auth, method, token string) codes.Code {
		ctx := context.Background()
		if token != "" {
			ctx = metadata.NewIncomingContext(ctx, metadata.Pairs(TokenKey, token))
		}
		return status.Code(a.check(ctx, method))
	}
	for _, tc := range []struct {
		name   string
		a      Auth
		method string
		token  string
		want   codes.Code
	}{
		{"right token", mine, "/p.Peer/Check", mine.Token(), codes.OK},
		{"no token", mine, "/p.Peer/Check", "", codes.Unauthenticated},
		{"another secret's token", mine, "/p.Peer/Check", theirs.Token(), codes.PermissionDenied},
		{"public method", mine, "/p.Public/Allow", "", codes.OK},
		{"prefix is a service, not a substring", mine, "/p.PeerX/Check", "", codes.OK},
		{"mTLS without a verified certificate", mtls, "/p.Peer/Check", "anything", codes.Unauthenticated},
		{"open", open, "/p.Peer/Check", "", codes.OK},
	} {
		if got := call(tc.a, tc.method, tc.token); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if err := mtls.Admit(true, ""); err != nil {
		t.Errorf("mTLS with a verified certificate: %v", err)
	}
	if opts := mine.DialOptions(); len(opts) != 1 {
		t.Errorf("DialOptions with a secret: %d options, want 1", len(opts))
	}
	if opts := open.DialOptions(); len(opts) != 0 {
		t.Errorf("DialOptions without a secret: %d options, want none", len(opts))
	}
}
