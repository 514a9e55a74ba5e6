package shard_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/ringlimit/ringlimit/shard"
)

// A Limiter is one key on the caller's clock: at most Limit admissions in
// any rolling window, an admission exactly Window old has expired, and time
// may not move backwards.
func ExampleLimiter() {
	lim, err := shard.NewLimiter(shard.Policy{Limit: 2, Window: time.Minute})
	if err != nil {
		fmt.Println(err)
		return
	}
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	for _, at := range []time.Duration{0, 30 * time.Second, 45 * time.Second, 60 * time.Second} {
		d, err := lim.Allow(t0.Add(at), 1)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("at %v: allowed=%v remaining=%d retry after %v\n", at, d.Allowed, d.Remaining, d.RetryAfter)
	}
	_, err = lim.Allow(t0, 1)
	fmt.Println(errors.Is(err, shard.ErrTimeBackwards))
	// Output:
	// at 0s: allowed=true remaining=1 retry after 0s
	// at 30s: allowed=true remaining=0 retry after 0s
	// at 45s: allowed=false remaining=0 retry after 15s
	// at 1m0s: allowed=true remaining=0 retry after 0s
	// true
}

// A Store decides for many keys on the owner's clock, and hands a key's
// state to another store as ages, rebased on the receiver's clock.
func ExampleStore() {
	store, err := shard.NewStore(shard.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	key := shard.Key{Tenant: "acme", Subject: "user-42", Policy: "search"}
	policy := shard.Policy{Limit: 3, Window: 10 * time.Second}
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)

	for i := range 4 {
		d, err := store.Allow(key, policy, 1, t0.Add(time.Duration(i)*time.Second))
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("request %d: allowed=%v remaining=%d retry after %v\n", i+1, d.Allowed, d.Remaining, d.RetryAfter)
	}

	// Ownership moves: the receiver's clock is 5 s ahead, which changes
	// nothing, because the state travels as ages.
	state, _ := store.Take(key, t0.Add(4*time.Second))
	receiver, _ := shard.NewStore(shard.Config{})
	if err := receiver.Import(state, policy, t0.Add(9*time.Second)); err != nil {
		fmt.Println(err)
		return
	}
	d, _ := receiver.Allow(key, policy, 1, t0.Add(14*time.Second))
	fmt.Printf("after handoff: allowed=%v retry after %v\n", d.Allowed, d.RetryAfter)
	d, _ = receiver.Allow(key, policy, 1, t0.Add(15*time.Second))
	fmt.Printf("one window after the first request: allowed=%v\n", d.Allowed)

	_, err = store.Allow(shard.Key{Tenant: "acme", Subject: "user 42", Policy: "search"}, policy, 1, t0)
	fmt.Println(errors.Is(err, shard.ErrInvalidKey))
	// Output:
	// request 1: allowed=true remaining=2 retry after 0s
	// request 2: allowed=true remaining=1 retry after 0s
	// request 3: allowed=true remaining=0 retry after 0s
	// request 4: allowed=false remaining=0 retry after 7s
	// after handoff: allowed=false retry after 1s
	// one window after the first request: allowed=true
	// true
}

// KeyPart turns any identity into a valid key part: key-safe text is kept,
// everything else is percent-encoded, and very long inputs are shortened
// with a 128-bit hash.
func ExampleKeyPart() {
	for _, id := range []string{"jane.doe@example.com", "josé", "[::1]:8080", ""} {
		key := shard.Key{Tenant: "acme", Subject: shard.KeyPart(id), Policy: "search"}
		fmt.Printf("%q -> %s (valid: %v)\n", id, key.Subject, key.Validate() == nil)
	}
	// Output:
	// "jane.doe@example.com" -> jane.doe@example.com (valid: true)
	// "josé" -> jos%C3%A9 (valid: true)
	// "[::1]:8080" -> %5B%3A%3A1%5D%3A8080 (valid: true)
	// "" -> ~ (valid: true)
}
