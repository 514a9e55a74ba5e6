package main

import (
	"fmt"
	"time"

	"github.com/ringlimit/ringlimit/shard"
)

// demoEpoch is the demo's fixed clock origin for the single-key limiters, in
// Unix seconds: a whole second, so fixed windows of 1 s start exactly at
// offsets 0, 1 s, ...
const demoEpoch = 1_700_000_000

// burst asks l for n single-unit admissions at offset at and counts them.
func burst(l *shard.Limiter, at time.Duration, n int) (admitted int, last shard.Decision) {
	for range n {
		dec, err := l.Allow(time.Unix(demoEpoch, 0).Add(at), 1)
		if err != nil {
			// Times only move forward here and hits are 1: unreachable.
			return admitted, last
		}
		last = dec
		if dec.Allowed {
			admitted++
		}
	}
	return admitted, last
}

func secs(d time.Duration) string { return fmt.Sprintf("%.3fs", d.Seconds()) }

// boundaryBurst is step 1: L=100 per 1 s, 100 requests 100 ms before a
// window edge and 100 just after it (the boundary facts scaled to W = 1 s).
func (d *demo) boundaryBurst() {
	const limit, w = 100, time.Second
	before, after := w-100*time.Millisecond, w+100*time.Millisecond
	d.heading("1. Boundary burst: limit %d per %v; %d requests at %s and %d at %s", limit, w, limit, secs(before), limit, secs(after))
	tw := d.table()
	fmt.Fprintf(tw, "  algorithm\tat %s\tat %s\tadmitted within 200ms\tcomment\n", secs(before), secs(after))
	got := map[shard.Algorithm]int{}
	for _, a := range []shard.Algorithm{shard.FixedWindow, shard.TokenBucket, shard.SlidingLog} {
		l, err := shard.NewLimiter(shard.Policy{Limit: limit, Window: w, Algorithm: a})
		if err != nil {
			d.promise(false, "build a %v limiter: %v", a, err)
			continue
		}
		n1, _ := burst(l, before, limit)
		n2, _ := burst(l, after, limit)
		got[a] = n1 + n2
		comment := map[shard.Algorithm]string{
			shard.FixedWindow: "the count resets at the edge (1.000s): 2L in 200ms",
			shard.TokenBucket: "smooths a rate (refills 1 per 10ms), does not cap a window",
			shard.SlidingLog:  "counts every admission in (t − 1s, t]",
		}[a]
		fmt.Fprintf(tw, "  %v\t%d/%d\t%d/%d\t%d\t%s\n", a, n1, limit, n2, limit, n1+n2, comment)
	}
	_ = tw.Flush()
	d.promise(got[shard.FixedWindow] == 2*limit, "fixed window admits %d around its edge (want %d: the boundary problem)", got[shard.FixedWindow], 2*limit)
	d.promise(got[shard.SlidingLog] == limit, "sliding log admits %d (want exactly %d)", got[shard.SlidingLog], limit)
	tb := got[shard.TokenBucket]
	d.promise(tb <= limit+limit/5, "token bucket admits %d ≤ L + d·L/W = %d (its own, different promise)", tb, limit+limit/5)
}

// expiryEdge is step 2: admissions expire exactly W after they were made.
func (d *demo) expiryEdge() {
	const w = time.Second
	d.heading("2. Exact expiry edge: the window is (t − W, t]; an admission exactly W old has expired")
	big, _ := shard.NewLimiter(shard.Policy{Limit: 100, Window: w})
	one, _ := shard.NewLimiter(shard.Policy{Limit: 1, Window: w})
	rows := []struct {
		l         *shard.Limiter
		at        time.Duration
		n, want   int           // requests sent, admissions wanted
		wantRetry time.Duration // for a refusal: the exact wait
	}{
		{big, 900 * time.Millisecond, 100, 100, 0},
		{big, 1899 * time.Millisecond, 1, 0, time.Millisecond},
		{big, 1900 * time.Millisecond, 1, 1, 0},
		{one, 0, 1, 1, 0},
		{one, w - time.Millisecond, 1, 0, time.Millisecond},
		{one, w, 1, 1, 0},
	}
	tw := d.table()
	fmt.Fprintf(tw, "  limit\ttime\trequests\tadmitted\tretry_after\twant\n")
	ok := true
	for _, r := range rows {
		admitted, last := burst(r.l, r.at, r.n)
		retry, want := "-", fmt.Sprintf("%d admitted", r.want)
		if last.RetryAfter > 0 {
			retry = last.RetryAfter.String()
		}
		if r.want == 0 {
			want = "refused, retry after " + r.wantRetry.String()
		}
		ok = ok && admitted == r.want && last.RetryAfter == r.wantRetry
		fmt.Fprintf(tw, "  %d\t%s\t%d\t%d\t%s\t%s\n", r.l.Policy().Limit, secs(r.at), r.n, admitted, retry, want)
	}
	_ = tw.Flush()
	d.promise(ok, "refused 1 ms before the admission is W old (retry_after exactly 1ms), admitted exactly at W")
}
