package main

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/shard"
)

// The HTTP operations besides a single check: batches (/v1/checks), peek,
// refund and the token-guarded reset. Each runs through httpAPI.do, so an
// operation answers alike alone and as a batch item.

// op is what an HTTP request asks of the node.
type op uint8

const (
	opCheck   op = iota // consume quota (Node.Allow)
	opPeek              // what a check would decide; consumes nothing
	opRefund            // give units back, newest first
	opReset             // clear the key (operator action)
	opAcquire           // take a lease of a concurrency policy
	opRelease           // end a lease
	opReserve           // admit an estimate, pending under a reservation id
	opSettle            // replace a reservation's estimate with its actual cost
)

func (o op) String() string {
	return [...]string{"check", "peek", "refund", "reset", "acquire", "release", "reserve", "settle"}[o]
}

// problem says, in the client's terms, why body b cannot be operation o,
// or "" if it can. The node would refuse these too, but with its own
// prefixes; checking here says it once.
func (o op) problem(b checkBody) string {
	switch {
	case b.Policies != nil && (o == opRefund || o == opReset):
		return fmt.Sprintf(`bad JSON body: /v1/%s takes one "policy", not "policies"`, o)
	case len(b.Policies) > shard.MaxMulti:
		return fmt.Sprintf("bad JSON body: %d policies, at most %d", len(b.Policies), shard.MaxMulti)
	case o == opReset && b.Hits != 1:
		return `bad JSON body: /v1/reset takes no "hits"`
	case b.Policies != nil && (o == opAcquire || o == opRelease || o == opReserve || o == opSettle):
		return fmt.Sprintf(`bad JSON body: /v1/%s takes one "policy", not "policies"`, o)
	case o == opSettle && b.Hits != 1:
		return `bad JSON body: /v1/settle takes "actual" (the cost the work really had), not "hits"`
	case o == opSettle && b.ReservationID == "":
		return `bad JSON body: /v1/settle needs "reservation_id", the string /v1/reserve answered`
	case o == opSettle && !b.HasActual:
		return `bad JSON body: /v1/settle needs "actual", the cost the work really had (0 or more)`
	case o != opSettle && (b.ReservationID != "" || b.HasActual):
		return fmt.Sprintf(`bad JSON body: /v1/%s takes no "reservation_id" or "actual" (those are for /v1/settle)`, o)
	case o == opRelease && b.Hits != 1:
		return `bad JSON body: /v1/release takes no "hits": a lease gives back what it took`
	case o == opRelease && b.LeaseID == "":
		return `bad JSON body: /v1/release needs "lease_id", the string /v1/acquire answered`
	case o != opRelease && b.LeaseID != "":
		return fmt.Sprintf(`bad JSON body: /v1/%s takes no "lease_id"`, o)
	}
	if o == opRelease {
		if _, err := strconv.ParseUint(b.LeaseID, 10, 64); err != nil {
			return fmt.Sprintf(`bad JSON body: lease_id %q must be the decimal string /v1/acquire answered`, b.LeaseID)
		}
	}
	if o == opSettle {
		if _, err := strconv.ParseUint(b.ReservationID, 10, 64); err != nil {
			return fmt.Sprintf(`bad JSON body: reservation_id %q must be the decimal string /v1/reserve answered`, b.ReservationID)
		}
	}
	return ""
}

func (a *httpAPI) acquire(w http.ResponseWriter, r *http.Request) { a.serveOp(w, r, opAcquire) }
func (a *httpAPI) release(w http.ResponseWriter, r *http.Request) { a.serveOp(w, r, opRelease) }
func (a *httpAPI) reserve(w http.ResponseWriter, r *http.Request) { a.serveOp(w, r, opReserve) }
func (a *httpAPI) settle(w http.ResponseWriter, r *http.Request)  { a.serveOp(w, r, opSettle) }

func (a *httpAPI) peek(w http.ResponseWriter, r *http.Request) { a.serveOp(w, r, opPeek) }

// refund answers POST /v1/refund: 401 without the refund or admin token
// when serve has either, else the key's new state.
func (a *httpAPI) refund(w http.ResponseWriter, r *http.Request) {
	if a.refundGuard != nil && !a.refundGuard.authorizeHTTP(w, r) {
		return
	}
	a.serveOp(w, r, opRefund)
}

// reset answers POST /v1/reset: 404 unless serve has an admin token, 401
// without the right bearer token, else the reset key's new (empty) state.
func (a *httpAPI) resetKey(w http.ResponseWriter, r *http.Request) {
	if a.reset == nil {
		writeJSON(w, http.StatusNotFound, errorResponse{Error: "/v1/reset is disabled: start serve with --admin-token-file to enable it"})
		return
	}
	if !a.reset.authorizeHTTP(w, r) {
		return
	}
	a.serveOp(w, r, opReset)
}

// loadAdminToken reads the admin token: the file's content with
// surrounding whitespace removed, which must not be empty.
func loadAdminToken(path string) ([]byte, error) { return loadToken("admin", path) }

// loadToken reads the what token (admin, refund) from path, as
// loadAdminToken does.
func loadToken(what, path string) ([]byte, error) {
	data, err := readSmallFile(path, 4096)
	if err != nil {
		return nil, fmt.Errorf("%s token: %w", what, err)
	}
	tok := []byte(strings.TrimSpace(string(data)))
	if len(tok) == 0 {
		return nil, fmt.Errorf("%s token file %s is empty: write a long random secret into it", what, path)
	}
	return tok, nil
}

// maxChecksBody bounds a /v1/checks body: 1000 items of a few hundred
// bytes, with room for long keys.
const maxChecksBody = 4 << 20

// batchParallel bounds how many items of one /v1/checks request are asked
// of the node at once.
const batchParallel = 64

// batchError is a /v1/checks result for an item that got no decision: the
// status and message /v1/check would have answered for it alone.
type batchError struct {
	Error  string `json:"error"`
	Status int    `json:"status"`
	// Reason and RetryAfterMs are set for a 503: "unavailable" and the
	// suggested wait.
	Reason       string `json:"reason,omitempty"`
	RetryAfterMs int64  `json:"retry_after_ms,omitempty"`
}

// checksResponse is the answer of /v1/checks: one result per request, in
// order, each a checkResponse or a batchError.
type checksResponse struct {
	Results []any `json:"results"`
}

// checks answers POST /v1/checks: independent checks, decided
// concurrently (at most batchParallel at a time); one bad item fails
// alone. The envelope itself must be well-formed and hold at most
// peer.MaxBatch requests, else the whole request is a 400.
func (a *httpAPI) checks(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxChecksBody)
	items, err := decodeChecks(r.Body, peer.MaxBatch)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeJSON(w, http.StatusRequestEntityTooLarge, errorResponse{Error: fmt.Sprintf("body larger than %d bytes", maxChecksBody)})
			return
		}
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: "bad JSON body: " + err.Error()})
		return
	}
	out := checksResponse{Results: make([]any, len(items))}
	sem := make(chan struct{}, batchParallel)
	var wg sync.WaitGroup
	for i, it := range items {
		if it.err != nil {
			out.Results[i] = batchError{Error: "bad JSON body: " + it.err.Error(), Status: http.StatusBadRequest}
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			// Per-item headers have nowhere to go: the body says it all.
			status, body := a.do(r.Context(), http.Header{}, opCheck, it.body)
			out.Results[i] = batchResult(status, body)
		})
	}
	wg.Wait()
	writeJSON(w, http.StatusOK, out)
}

// batchResult turns one item's answer into its /v1/checks result.
func batchResult(status int, body any) any {
	switch b := body.(type) {
	case checkResponse:
		if status == http.StatusServiceUnavailable {
			return batchError{Error: b.Error, Status: status, Reason: b.Reason, RetryAfterMs: b.RetryAfterMs}
		}
		return b
	case errorResponse:
		return batchError{Error: b.Error, Status: status}
	}
	return batchError{Error: "internal error", Status: http.StatusInternalServerError}
}
