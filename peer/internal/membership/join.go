package membership

import (
	"context"
	"fmt"
	"log/slog"
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
// ctx's error. On error the caller shuts ml down (a try cut short by the
// deadline already has).
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
