package peer

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// A node is ready when it is part of the cluster it was configured for:
// not closing, not alone while it was given seeds to join (never joined,
// or cut off since), and not ignoring live gossip members (a member with
// another placement fingerprint, or unreadable metadata, gossips
// with us but is left out of our ring, so the two sides disagree about
// owners). The gRPC health service (service "") and Metrics.Ready follow
// it; cmd/ringlimit's /readyz reports it.

// Readiness reason codes, for Metrics.Ready: a fixed, low-cardinality set.
const (
	ReadyReasonClosing = "closing"
	ReadyReasonAlone   = "alone"
	ReadyReasonIgnored = "ignored_members"
	ReadyReasonMoving  = "partitions_moving"
	// ReadyReasonNoLog: (log ownership) no leader of the ownership log for
	// two leases: without a majority of its voters nothing commits and
	// every holder stops within one lease.
	ReadyReasonNoLog = "no_ownership_log"
)

// readyEnv is what readiness reads of its node, set once in New.
type readyEnv struct {
	closing func() bool // the node is closing
	join    []string    // Config.Join: the seeds it was given
	// members is how many live members gossip knows, itself included.
	members func() int
	// leaderless is when (mono) the ownership log was last seen without
	// a leader; 0 while it has one.
	leaderless func() int64
	mono       func() int64
	lease      time.Duration // Config.LeaseDuration
	settled    func() bool   // the node holds what its ring gives it (Node.Settled)
	serving    func(healthpb.HealthCheckResponse_ServingStatus)
	metrics    Metrics
	log        *slog.Logger
}

// readyState is the node's readiness bookkeeping.
type readyState struct {
	env readyEnv
	// pending collects the members the current rebuild ignores, with why;
	// prevIgnored is the previous rebuild's. Rebuild goroutine only.
	pending, prevIgnored map[string]string

	mu      sync.Mutex
	ignored map[string]string // member -> why, as of the last rebuild
	last    string            // last reported reason; "-" before the first
}

// ignore notes that the running rebuild leaves member name out of the
// ring, and reports whether that is news (it was not ignored, or for
// another reason, by the previous rebuild) and so worth a warning.
func (r *readyState) ignore(name, why string) bool {
	if r.pending == nil {
		r.pending = make(map[string]string)
	}
	r.pending[name] = why
	return r.prevIgnored[name] != why
}

// commitIgnored publishes the running rebuild's ignored members and
// returns them.
func (r *readyState) commitIgnored() map[string]string {
	ign := r.pending
	r.pending, r.prevIgnored = nil, ign
	r.mu.Lock()
	r.ignored = ign
	r.mu.Unlock()
	return ign
}

// readiness is whether the node is ready, and if not, why and the
// reason's code.
func (r *readyState) readiness() (ok bool, reason, code string) {
	env := &r.env
	if env.closing() {
		return false, "closing: leaving the cluster", ReadyReasonClosing
	}
	r.mu.Lock()
	ign := r.ignored
	r.mu.Unlock()
	if len(ign) > 0 {
		parts := make([]string, 0, len(ign))
		for _, name := range slices.Sorted(maps.Keys(ign)) {
			parts = append(parts, fmt.Sprintf("%s (%s)", name, ign[name]))
		}
		return false, fmt.Sprintf("ignoring %d live gossip member(s) left out of the ring: %s", len(ign), strings.Join(parts, ", ")), ReadyReasonIgnored
	}
	if len(env.join) > 0 && env.members() <= 1 {
		return false, fmt.Sprintf("alone: no live member reached through the seeds %v", env.join), ReadyReasonAlone
	}
	if since := env.leaderless(); since != 0 && env.mono()-since > 2*int64(env.lease) {
		return false, fmt.Sprintf("no leader of the ownership log for %v: a majority of its voters is unreachable, so no partition can change holder and every holder stops within one lease", time.Duration(env.mono()-since).Round(time.Second)), ReadyReasonNoLog
	}
	if !env.settled() {
		return false, "partitions moving: this node does not yet hold exactly the partitions its ring gives it, each with its backup copy", ReadyReasonMoving
	}
	return true, "", ""
}

// update recomputes readiness and, when it changed, logs it, reports it
// to Metrics and sets the gRPC health status. Called from New and after
// each rebuild.
func (r *readyState) update() {
	ok, reason, code := r.readiness()
	r.mu.Lock()
	defer r.mu.Unlock()
	if reason == r.last {
		return
	}
	r.last = reason
	st := healthpb.HealthCheckResponse_SERVING
	if !ok {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	r.env.serving(st)
	r.env.metrics.Ready(ok, code)
	if ok {
		r.env.log.Info("readiness changed", "ready", true)
	} else {
		r.env.log.Info("readiness changed", "ready", false, "reason", reason)
	}
}
