package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/peer/console"
)

// maxCheckBody bounds a /v1/check (peek, refund, reset) request body.
const maxCheckBody = 64 << 10

// httpAPI serves the HTTP endpoints of one node.
type httpAPI struct {
	node *peer.Node
	// pols is the node's policy table (the node itself in serve): looked
	// up per request, since a reload may replace it at any time.
	pols interface {
		Policy(name string) (peer.PolicyConfig, bool)
		Policies() map[string]peer.PolicyConfig
	}
	reg      *prometheus.Registry
	log      *slog.Logger
	draining atomic.Bool
	// reset guards /v1/reset with the admin token; nil disables the
	// endpoint (404).
	reset *tokenGuard
	// refundGuard guards /v1/refund with the refund or admin token; nil
	// leaves it open (serve has neither token).
	refundGuard *tokenGuard
	// console is served at /ui/ with the ops paths; nil: no console.
	console *console.Console
}

// policy returns the node's current entry for name (zero if unknown): the
// table can be reloaded at any time, so it is looked up per request.
func (a *httpAPI) policy(name string) peer.PolicyConfig {
	pc, _ := a.pols.Policy(name)
	return pc
}

// routes serves everything on one mux: the decision API and the ops
// paths together, as serve does without --ops-addr.
func (a *httpAPI) routes() http.Handler {
	mux := http.NewServeMux()
	a.apiRoutes(mux)
	a.opsRoutes(mux)
	return mux
}

// apiHandler serves the decision API alone (/v1/*): --http-addr's
// handler when --ops-addr is set.
func (a *httpAPI) apiHandler() http.Handler {
	mux := http.NewServeMux()
	a.apiRoutes(mux)
	return mux
}

// opsHandler serves the probes, /metrics and /debug/* alone: --ops-addr's
// handler. They are kept off the decision listener because /debug/hotkeys
// and /metrics show other tenants' keys, and the probes and the scraper
// need a port reachable from outside the pod while the decision API need
// not be (issue 53 item 8).
func (a *httpAPI) opsHandler() http.Handler {
	mux := http.NewServeMux()
	a.opsRoutes(mux)
	return mux
}

// apiRoutes registers the decision API on mux.
func (a *httpAPI) apiRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/check", a.check)
	mux.HandleFunc("POST /v1/checks", a.checks)
	mux.HandleFunc("POST /v1/peek", a.peek)
	mux.HandleFunc("POST /v1/refund", a.refund)
	mux.HandleFunc("POST /v1/reset", a.resetKey)
	mux.HandleFunc("POST /v1/acquire", a.acquire)
	mux.HandleFunc("POST /v1/release", a.release)
	mux.HandleFunc("POST /v1/reserve", a.reserve)
	mux.HandleFunc("POST /v1/settle", a.settle)
}

// opsRoutes registers the probes, /metrics and every /debug/* path on
// mux.
func (a *httpAPI) opsRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /healthz", a.healthz)
	mux.HandleFunc("GET /readyz", a.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /debug/ring", a.debugRing)
	mux.HandleFunc("GET /debug/hotkeys", a.debugHotKeys)
	mux.HandleFunc("GET /debug/ownership", a.debugOwnership)
	if a.console != nil {
		mountConsole(mux, a.console)
	}
}

// bodyBufs holds serveOp's request body buffers.
var bodyBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// errReader returns err from every Read.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// check answers POST /v1/check: one decision that consumes quota.
func (a *httpAPI) check(w http.ResponseWriter, r *http.Request) { a.serveOp(w, r, opCheck) }

// serveOp answers one operation on one body (check, peek, refund, reset).
func (a *httpAPI) serveOp(w http.ResponseWriter, r *http.Request, o op) {
	r.Body = http.MaxBytesReader(w, r.Body, maxCheckBody)
	// Strict: exact field names, no duplicates, hits 1 when absent and
	// never 0, null or fractional (httpdecode.go). The common body is
	// read by quickCheck; anything else by decodeCheck, from the same
	// bytes followed by the same read error.
	buf := bodyBufs.Get().(*bytes.Buffer)
	buf.Reset()
	defer bodyBufs.Put(buf) // at most maxCheckBody + bytes.MinRead
	_, rerr := buf.ReadFrom(r.Body)
	b, ok := checkBody{}, false
	if rerr == nil {
		b, ok = quickCheck(buf.Bytes())
	}
	var err error
	if !ok {
		var body io.Reader = bytes.NewReader(buf.Bytes())
		if rerr != nil {
			body = io.MultiReader(body, errReader{rerr})
		}
		b, err = decodeCheck(body)
	}
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeJSON(w, http.StatusRequestEntityTooLarge, errorResponse{Error: fmt.Sprintf("body larger than %d bytes", maxCheckBody)})
			return
		}
		writeJSON(w, http.StatusBadRequest, errorResponse{Error: "bad JSON body: " + err.Error()})
		return
	}
	if o == opReset {
		a.log.Info("reset", "remote_addr", r.RemoteAddr, "tenant", b.Tenant, "policy", b.Policy)
		a.log.Debug("reset subject", "remote_addr", r.RemoteAddr, "tenant", b.Tenant, "subject", b.Subject, "policy", b.Policy)
	}
	status, body := a.do(r.Context(), w.Header(), o, b)
	writeJSON(w, status, body)
}

// do runs operation o for body b and returns the HTTP status and body,
// setting the response's header fields in h. It is what one /v1/check (or
// /v1/peek, ...) does, and what each item of /v1/checks does.
func (a *httpAPI) do(ctx context.Context, h http.Header, o op, b checkBody) (int, any) {
	if msg := o.problem(b); msg != "" {
		return http.StatusBadRequest, errorResponse{Error: msg}
	}
	req := peer.Request{Key: peer.Key{Tenant: b.Tenant, Subject: b.Subject, Policy: b.Policy}, Hits: b.Hits, Policies: b.Policies}
	var d peer.Decision
	var err error
	var lease peer.Lease
	var res peer.Reservation
	var settled *peer.Settlement
	switch o {
	case opReserve:
		res, err = a.node.Reserve(ctx, req)
		d = res.Decision
	case opSettle:
		id, _ := strconv.ParseUint(b.ReservationID, 10, 64) // checked by problem
		var st peer.Settlement
		st, err = a.node.Settle(ctx, req.Key, id, b.Actual)
		d, settled = st.Decision, &st
	case opAcquire:
		lease, err = a.node.Acquire(ctx, req)
		d = lease.Decision
	case opRelease:
		id, _ := strconv.ParseUint(b.LeaseID, 10, 64) // checked by problem
		d, err = a.node.Release(ctx, req.Key, id)
	case opPeek:
		d, err = a.node.Peek(ctx, req)
	case opRefund:
		d, err = a.node.Refund(ctx, req)
	case opReset:
		d, err = a.node.Reset(ctx, req.Key)
	default:
		d, err = a.node.Allow(ctx, req)
	}
	if err != nil {
		if (o == opReserve || o == opSettle) && errors.Is(err, peer.ErrWrongAlgorithm) {
			return http.StatusBadRequest, errorResponse{Error: fmt.Sprintf("policy %q is %v: /v1/reserve and /v1/settle need a sliding_log policy", b.Policy, a.policy(b.Policy).Algorithm)}
		}
		return a.allowError(h, b, err)
	}
	a.rateLimitHeaders(h, o, b, d)
	resp := responseFrom(d)
	if lease.ID != 0 {
		resp.LeaseID, resp.LeaseTTLMs = strconv.FormatUint(lease.ID, 10), ceilMillis(lease.TTL)
	}
	if res.ID != 0 {
		resp.ReservationID, resp.ReservationTTLMs = strconv.FormatUint(res.ID, 10), ceilMillis(res.TTL)
	}
	if settled != nil {
		resp.Estimate, resp.Overage = &settled.Estimate, &settled.Overage
		if !d.Allowed {
			resp.Reason = reasonNotPending
		}
	}
	if (o == opCheck || o == opAcquire || o == opReserve) && !d.Allowed {
		return http.StatusTooManyRequests, resp
	}
	return http.StatusOK, resp
}

// jsonBufs holds writeJSON's buffers: a body is encoded into one and
// written from it, where json.Marshal returned a copy of its encoding and
// appending the newline copied it again.
var jsonBufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooledJSON bounds the buffers jsonBufs keeps (a /v1/checks answer or
// /debug/ring can be large; a check's is a few hundred bytes).
const maxPooledJSON = 64 << 10

// The values of writeJSON's fixed header fields, shared by every response
// instead of one slice each from Header.Set: never modified, and len ==
// cap, so an Add to the field copies.
var (
	contentTypeJSON = []string{"application/json"}
	cacheNoStore    = []string{"no-store"}
	noSniff         = []string{"nosniff"}
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	buf := jsonBufs.Get().(*bytes.Buffer)
	buf.Reset()
	// Encode writes what json.Marshal returns, and a newline.
	if err := json.NewEncoder(buf).Encode(v); err != nil {
		status = http.StatusInternalServerError
		buf.Reset()
		buf.WriteString(`{"error":"internal error"}` + "\n")
	}
	h := w.Header()
	h["Content-Type"] = contentTypeJSON
	h["Cache-Control"] = cacheNoStore
	h["X-Content-Type-Options"] = noSniff
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
	if buf.Cap() <= maxPooledJSON {
		jsonBufs.Put(buf)
	}
}
