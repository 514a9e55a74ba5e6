package httplimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/peer/httplimit"
)

// ExampleMiddleware limits a handler to 2 requests a minute per
// authenticated user, on a single embedded node.
func ExampleMiddleware() {
	ctx := context.Background()
	node, err := peer.New(ctx, peer.Config{
		Policies: map[string]peer.PolicyConfig{"api": {Limit: 2, Window: time.Minute}},
	})
	if err != nil {
		fmt.Println("start:", err)
		return
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_ = node.Close(closeCtx)
	}()

	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	limited := httplimit.Middleware(httplimit.MiddlewareConfig{
		Limiter: node,
		// The key comes from the authenticated identity: here a user an
		// authentication layer in front has put in the request's context.
		Key: func(r *http.Request) (peer.Key, bool) {
			user, ok := r.Context().Value(userKey{}).(string)
			return peer.Key{Tenant: "acme", Subject: user, Policy: "api"}, ok
		},
	}, hello)

	for range 3 {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req = req.WithContext(context.WithValue(req.Context(), userKey{}, "alice"))
		rec := httptest.NewRecorder()
		limited.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("RateLimit"))
	}
	// Output:
	// 200 "api";r=1;t=60
	// 200 "api";r=0;t=60
	// 429 "api";r=0;t=60
}

// userKey is the context key of the example's authenticated user.
type userKey struct{}
