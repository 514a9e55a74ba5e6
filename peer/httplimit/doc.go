// Package httplimit limits HTTP handlers with a ringlimit node: the
// application's KeyFunc derives each request's key from its authenticated
// identity, Middleware decides it through a Limiter (a *peer.Node, or a
// *peer.Client for a process that does not embed one) and answers 429
// (over limit) or 503 (unavailable: never reported as over limit) with
// the draft RateLimit-Policy, RateLimit and Retry-After headers.
// Concurrency policies hold a lease for the handler's run (Leaser); with
// SettleAfter a reservation is settled with what the handler reports
// through ReportCost (Reserver).
//
// Limiting an API by authenticated user, 100 requests a minute each, with
// an embedded node (auth.User stands for the application's authentication,
// which runs before the middleware):
//
//	node, err := peer.New(ctx, peer.Config{
//		Policies: map[string]peer.PolicyConfig{"api": {Limit: 100, Window: time.Minute}},
//	})
//	if err != nil {
//		return err
//	}
//	defer node.Close(context.Background())
//	api := httplimit.Middleware(httplimit.MiddlewareConfig{
//		Limiter: node,
//		Key: func(r *http.Request) (peer.Key, bool) {
//			user, ok := auth.User(r) // false: not limited here (anonymous)
//			return peer.Key{Tenant: "acme", Subject: shard.KeyPart(user), Policy: "api"}, ok
//		},
//		// Logger: nil logs through slog.Default, one line a second per
//		// kind of failure (a mistyped policy is a 500 and an ERROR line).
//	}, apiHandler)
//	http.Handle("/api/", api)
//
// RateLimitHeaders, UnavailableHeaders, RetryAfterSeconds and ErrorStatus
// are the same answers for other front ends (ringlimit serve's JSON API,
// its Envoy rate limit service).
//
// What it may import: peer's public API and the standard library, never
// a package under peer/internal (peer's TestLayoutPublicParts pins it);
// peer cannot import it back.
package httplimit
