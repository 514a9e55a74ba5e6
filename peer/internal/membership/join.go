package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
)

// Join backoff: the first retry comes quickly (a seed started at the same
// moment is usually up within a few hundred milliseconds), later ones no
// more often than every 2 s so a missing seed is not hammered.
const (
	joinBackoffMin = 100 * time.Millisecond
	joinBackoffMax = 2 * time.Second
)

// Join joins seeds through ml, retrying with backoff until one answers,
// timeout passes or ctx ends. Each failed try is logged with its attempt
// number; the final error names the seeds and wraps the last cause and
// ctx's error. A seed that answers that its gossip encryption differs
// from this node's ends the join at once with an error wrapping
// ErrKeyMismatch that says which side lacks a key and quotes the answer:
// the keys are configuration, and no retry changes them. On error the
// caller shuts ml down (a try cut short by the deadline already has).
func Join(ctx context.Context, ml *memberlist.Memberlist, seeds []string, timeout time.Duration, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	backoff := joinBackoffMin
	for attempt := 1; ; attempt++ {
		err := joinOnce(ctx, ml, seeds)
		if err == nil {
			if attempt > 1 {
				log.Info("joined", "seeds", seeds, "attempt", attempt)
			}
			return nil
		}
		err = flatten(err)
		if hint := keyMismatch(err); hint != "" {
			return fmt.Errorf("%w: join %v: %s (%v): give every member the same gossip key (Config.GossipKey; serve --gossip-key), or none",
				ErrKeyMismatch, seeds, hint, err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("peer: join %v: no seed answered in %d attempts over %v: %w: %w",
				seeds, attempt, time.Since(start).Round(time.Millisecond), err, ctx.Err())
		}
		log.Warn("join failed, retrying", "seeds", seeds, "attempt", attempt, "retry_in", backoff, "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("peer: join %v: no seed answered in %d attempts over %v: %w: %w",
				seeds, attempt, time.Since(start).Round(time.Millisecond), err, ctx.Err())
		}
		backoff = min(2*backoff, joinBackoffMax)
	}
}

// joinOnce makes one ml.Join, returning early with ctx's error if ctx ends
// first. The join goroutine always ends before joinOnce returns: when ctx
// ends first, ml is shut down, which cuts the join short (its TCP exchange
// is bounded by memberlist's TCPTimeout in any case).
func joinOnce(ctx context.Context, ml *memberlist.Memberlist, seeds []string) error {
	joined := make(chan error, 1)
	go func() {
		_, err := ml.Join(seeds)
		joined <- err
	}()
	select {
	case err := <-joined:
		return err
	case <-ctx.Done():
		_ = ml.Shutdown()
		<-joined
		return ctx.Err()
	}
}

// keyMismatches are memberlist's words (v0.7.0: net.go's readStream and
// security.go's decryptPayload) for a stream whose encryption does not
// match this node's, each with what it means for the join. memberlist
// returns them as plain formatted errors, so their text is all there is to
// go on; TestJoinKeyMismatch joins real memberlists with mismatched keys,
// so a change of wording fails that test rather than going unseen (the
// join would only go back to retrying until its timeout).
var keyMismatches = [...]struct{ text, hint string }{
	// This node sent plaintext; the seed's answer came encrypted (or the
	// seed said so in its error answer).
	{"remote state is encrypted and encryption is not configured", "this node has no gossip key and the seed has one"},
	// This node sent an encrypted stream; the answer came in plaintext.
	{"encryption is configured but remote state is not encrypted", "this node has a gossip key and the seed answered without one"},
	// Both encrypt, neither can read the other.
	{"no installed keys could decrypt the message", "this node and the seed have different gossip keys"},
}

// keyMismatch returns what err, a failed join, says about the two sides'
// gossip keys, or "" when it says nothing about them.
func keyMismatch(err error) string {
	msg := err.Error()
	for _, m := range keyMismatches {
		if strings.Contains(msg, m.text) {
			return m.hint
		}
	}
	return ""
}

// flatten turns memberlist's multi-line error list ("1 error occurred:\n\t*
// failed to join ...") into one line, its errors joined by "; ", so a log
// line or an error message stays one line.
func flatten(err error) error {
	var list interface{ WrappedErrors() []error }
	if !errors.As(err, &list) {
		return err
	}
	var parts []string
	for _, e := range list.WrappedErrors() {
		parts = append(parts, e.Error())
	}
	return errors.New(strings.Join(parts, "; "))
}
