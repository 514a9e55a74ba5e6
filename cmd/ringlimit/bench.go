package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/peer/peerpb"
)

const benchUsage = `Usage: ringlimit bench [flags]

Sends requests from concurrent workers for a bounded time and reports
throughput and latency percentiles. Without --addr it starts a 3-node cluster
on 127.0.0.1 in this process (policy "bench": 1000 per 1s per key, sliding
log) and spreads the workers over the three nodes, so about two thirds of the
requests are forwarded to their owner over gRPC. With --addr it calls the
public gRPC RateLimiter API of a running node.

Flags:
  --addr H:P        a running node's gRPC address (default: in-process cluster)
  --workers N       concurrent workers (default 4 x GOMAXPROCS)
  --duration D      how long to run (default 5s, at most 60s)
  --requests N      stop after N requests (default 0: no cap)
  --keys N          distinct keys, picked uniformly (default 1024)
  --policy P        policy name (default "bench" in-process, "default" with --addr)
  --hits N          cost of each request (default 1)
  --tls-ca, --tls-cert, --tls-key, --tls-server-name   TLS for --addr (as check)
`

type benchFlags struct {
	addr, policy   string
	tls            clientTLSFlags
	workers, keys  int
	requests, hits int64
	duration       time.Duration
}

const maxBenchDuration = 60 * time.Second

func parseBenchFlags(args []string, stderr io.Writer) (benchFlags, error) {
	var f benchFlags
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, benchUsage) }
	fs.StringVar(&f.addr, "addr", "", "")
	fs.IntVar(&f.workers, "workers", 4*runtime.GOMAXPROCS(0), "")
	fs.DurationVar(&f.duration, "duration", 5*time.Second, "")
	fs.Int64Var(&f.requests, "requests", 0, "")
	fs.IntVar(&f.keys, "keys", 1024, "")
	fs.StringVar(&f.policy, "policy", "", "")
	fs.Int64Var(&f.hits, "hits", 1, "")
	f.tls.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return f, err
		}
		return f, usageError("bench: " + err.Error())
	}
	switch {
	case fs.NArg() > 0:
		return f, usageError(fmt.Sprintf("bench: unexpected argument %q", fs.Arg(0)))
	case f.workers < 1 || f.workers > 4096:
		return f, usageError("bench: --workers must be between 1 and 4096")
	case f.duration <= 0 || f.duration > maxBenchDuration:
		return f, usageError(fmt.Sprintf("bench: --duration must be positive and at most %v", maxBenchDuration))
	case f.requests < 0:
		return f, usageError("bench: --requests must not be negative")
	case f.keys < 1 || f.keys > 1<<24:
		return f, usageError("bench: --keys must be between 1 and 16777216")
	case f.hits < 1:
		return f, usageError("bench: --hits must be positive")
	}
	if f.policy == "" {
		f.policy = "bench"
		if f.addr != "" {
			f.policy = "default"
		}
	}
	return f, nil
}

// allowFunc is one decision through whatever the bench targets; worker
// picks the entry point.
type allowFunc func(ctx context.Context, worker int, req peer.Request) (peer.Decision, error)

// runBench runs the load and prints its figures.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseBenchFlags(args, stderr)
	if err != nil {
		return err
	}
	var allow allowFunc
	var target string
	var local func(worker int, d peer.Decision) bool // decided on the entry node?
	if f.addr == "" {
		log, err := newLogger(stderr, "text", slog.LevelWarn, false)
		if err != nil {
			return err
		}
		base := peer.Config{
			Policies:      map[string]peer.PolicyConfig{"bench": {Limit: 1000, Window: time.Second}},
			GossipProfile: peer.GossipFast,
			Logger:        log,
		}
		nodes, err := startCluster(ctx, []string{"b1", "b2", "b3"}, base)
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer closeAll(nodes, 5*time.Second)
		allow = func(ctx context.Context, w int, req peer.Request) (peer.Decision, error) {
			return nodes[w%len(nodes)].Allow(ctx, req)
		}
		local = func(w int, d peer.Decision) bool { return d.Owner == nodes[w%len(nodes)].Name() }
		target = "in-process 3-node cluster (workers spread over the nodes)"
	} else {
		creds, err := f.tls.creds()
		if err != nil {
			return usageError("bench: " + err.Error())
		}
		conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			return fmt.Errorf("bench: dial %s: %w", f.addr, err)
		}
		defer conn.Close()
		client := peerpb.NewRateLimiterClient(conn)
		allow = func(ctx context.Context, _ int, req peer.Request) (peer.Decision, error) {
			r, err := client.Allow(ctx, &peerpb.AllowRequest{
				Key:  &peerpb.Key{Tenant: req.Key.Tenant, Subject: req.Key.Subject, Policy: req.Key.Policy},
				Hits: req.Hits,
			})
			if err != nil {
				return peer.Decision{}, peer.FromStatus(err)
			}
			return peer.Decision{Allowed: r.GetAllowed(), Reason: peer.Reason(r.GetReason()), Owner: r.GetOwner()}, nil
		}
		target = "gRPC RateLimiter at " + f.addr
	}
	fmt.Fprintf(stdout, "bench: %s; %d workers, %v, %d keys, policy %q, hits %d\n", target, f.workers, f.duration, f.keys, f.policy, f.hits)
	res, err := benchLoad(ctx, f, allow, local)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	res.print(stdout)
	if res.requests > 0 && res.errors == res.requests {
		return fmt.Errorf("bench: every request failed; first error: %v", res.firstErr)
	}
	return nil
}

// benchResult holds a run's counts and sorted latencies.
type benchResult struct {
	elapsed                                          time.Duration
	requests, admitted, refused, unavailable, errors int64
	localDecisions                                   int64
	latencies                                        []time.Duration // sorted
	firstErr                                         error
	trackLocal                                       bool
}

// benchLoad runs f.workers workers until f.duration passes, f.requests have
// been issued, or ctx ends.
func benchLoad(ctx context.Context, f benchFlags, allow allowFunc, local func(int, peer.Decision) bool) (*benchResult, error) {
	keys := make([]peer.Key, f.keys)
	for i := range keys {
		keys[i] = peer.Key{Tenant: "bench", Subject: fmt.Sprintf("user-%d", i), Policy: f.policy}
	}
	runCtx, cancel := context.WithTimeout(ctx, f.duration)
	defer cancel()
	var issued atomic.Int64
	type workerResult struct {
		lat                                              []time.Duration
		admitted, refused, unavailable, errors, localDec int64
		firstErr                                         error
	}
	results := make([]workerResult, f.workers)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range f.workers {
		wg.Go(func() {
			r := &results[w]
			r.lat = make([]time.Duration, 0, 4096)
			rng := rand.New(rand.NewPCG(uint64(w), 0x5eed))
			for runCtx.Err() == nil {
				if f.requests > 0 && issued.Add(1) > f.requests {
					return
				}
				req := peer.Request{Key: keys[rng.IntN(len(keys))], Hits: f.hits}
				t := time.Now()
				d, err := allow(runCtx, w, req)
				lat := time.Since(t)
				if err != nil && runCtx.Err() != nil {
					return // cut off by the end of the run: not a result
				}
				r.lat = append(r.lat, lat)
				switch {
				case errors.Is(err, peer.ErrUnavailable):
					r.unavailable++
				case err != nil:
					r.errors++
					if r.firstErr == nil {
						r.firstErr = err
					}
				case d.Allowed:
					r.admitted++
				default:
					r.refused++
				}
				if err == nil && local != nil && local(w, d) {
					r.localDec++
				}
			}
		})
	}
	wg.Wait()
	res := &benchResult{elapsed: time.Since(start), trackLocal: local != nil}
	for _, r := range results {
		res.latencies = append(res.latencies, r.lat...)
		res.admitted += r.admitted
		res.refused += r.refused
		res.unavailable += r.unavailable
		res.errors += r.errors
		res.localDecisions += r.localDec
		if res.firstErr == nil {
			res.firstErr = r.firstErr
		}
	}
	res.requests = int64(len(res.latencies))
	slices.Sort(res.latencies)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return res, nil
}

// percentile returns the q-quantile (0 < q ≤ 1) of sorted latencies by the
// nearest-rank method.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func (r *benchResult) print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "requests\t%d\n", r.requests)
	fmt.Fprintf(tw, "admitted\t%d\n", r.admitted)
	fmt.Fprintf(tw, "refused (over limit)\t%d\n", r.refused)
	fmt.Fprintf(tw, "unavailable\t%d\n", r.unavailable)
	fmt.Fprintf(tw, "errors\t%d\n", r.errors)
	if r.trackLocal && r.requests > 0 {
		fmt.Fprintf(tw, "decided locally\t%.0f%% (the rest forwarded to the owner)\n", 100*float64(r.localDecisions)/float64(r.requests))
	}
	ops := 0.0
	if r.elapsed > 0 {
		ops = float64(r.requests) / r.elapsed.Seconds()
	}
	fmt.Fprintf(tw, "elapsed\t%v\n", r.elapsed.Round(time.Millisecond))
	fmt.Fprintf(tw, "throughput\t%.0f ops/s\n", ops)
	fmt.Fprintf(tw, "latency\tp50 %v  p99 %v  p999 %v  max %v\n",
		roundSig(percentile(r.latencies, 0.50)), roundSig(percentile(r.latencies, 0.99)),
		roundSig(percentile(r.latencies, 0.999)), roundSig(percentile(r.latencies, 1)))
	_ = tw.Flush()
	if r.firstErr != nil {
		fmt.Fprintf(w, "first error: %v\n", r.firstErr)
	}
}

// roundSig rounds d to three significant digits for display.
func roundSig(d time.Duration) time.Duration {
	unit := time.Duration(1)
	for d >= 1000*unit && unit < time.Second {
		unit *= 10
	}
	return d.Round(unit)
}
