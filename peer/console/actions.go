package console

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/peer"
)

// peekJSON is the key inspector's answer (api/peek).
type peekJSON struct {
	Holder     string `json:"holder"`
	Target     string `json:"target"`
	Limit      int64  `json:"limit"`
	Count      int64  `json:"count"`
	Remaining  int64  `json:"remaining"`
	Allowed    bool   `json:"allowed"`
	Reason     string `json:"reason"`
	NextFreeMs int64  `json:"next_free_ms"`
	ResetMs    int64  `json:"reset_ms"`
	Algorithm  string `json:"algorithm"`
	WindowMs   int64  `json:"window_ms"`
	// Frees is, for a sliding-log key, when its units free: unit counts
	// (more than Remaining) and the time until that many are free, from
	// one Peek each. Their steps are the window's admissions, W later.
	Frees []freeJSON `json:"frees,omitempty"`
}

type freeJSON struct {
	Units int64 `json:"units"`
	InMs  int64 `json:"in_ms"`
}

// maxFreeSteps bounds the peeks one inspection makes for its histogram.
const maxFreeSteps = 16

// servePeek answers api/peek?tenant=&subject=&policy=: what a check of
// one unit would decide now, from Node.Peek, which records nothing.
func (c *Console) servePeek(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	key := peer.Key{Tenant: q.Get("tenant"), Subject: q.Get("subject"), Policy: q.Get("policy")}
	if err := key.Validate(); err != nil {
		c.writeJSON(w, http.StatusBadRequest, errorJSON{Error: err.Error()})
		return
	}
	pc, ok := c.node.Policy(key.Policy)
	if !ok {
		c.writeJSON(w, http.StatusNotFound, errorJSON{Error: fmt.Sprintf("no policy %q in this node's table", key.Policy)})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	d, err := c.node.Peek(ctx, peer.Request{Key: key, Hits: 1})
	if err != nil {
		c.writeJSON(w, peekStatus(err), errorJSON{Error: err.Error()})
		return
	}
	target, _ := c.node.Owner(key)
	// A peek answers as a check of one unit would: an admitted one
	// leaves one fewer remaining than the key has now.
	remaining := d.Remaining
	if d.Allowed {
		remaining++
	}
	out := peekJSON{Holder: d.Owner, Target: target, Limit: d.Limit, Remaining: remaining, Count: max(d.Limit-remaining, 0),
		Allowed: d.Allowed, Reason: d.Reason.String(), NextFreeMs: d.RetryAfter.Milliseconds(), ResetMs: d.ResetAfter.Milliseconds(),
		Algorithm: fmt.Sprint(pc.Algorithm), WindowMs: pc.Window.Milliseconds()}
	if d.Allowed {
		// A unit is free now; the next to free is the window's oldest.
		out.NextFreeMs = 0
	}
	if pc.Algorithm == peer.SlidingLog && out.Count > 0 {
		step := max((out.Count+maxFreeSteps-1)/maxFreeSteps, 1)
		for units := remaining + step; units < d.Limit+step; units += step {
			units = min(units, d.Limit) // the last step is the whole limit
			dk, err := c.node.Peek(ctx, peer.Request{Key: key, Hits: units})
			if err != nil {
				break
			}
			out.Frees = append(out.Frees, freeJSON{Units: units, InMs: dk.RetryAfter.Milliseconds()})
		}
	}
	c.writeJSON(w, http.StatusOK, out)
}

func peekStatus(err error) int {
	switch {
	case errors.Is(err, peer.ErrInvalidKey), errors.Is(err, peer.ErrInvalidHits), errors.Is(err, peer.ErrWrongAlgorithm):
		return http.StatusBadRequest
	case errors.Is(err, peer.ErrUnknownPolicy):
		return http.StatusNotFound
	}
	return http.StatusServiceUnavailable
}

// maxResetBody bounds an api/reset body.
const maxResetBody = 4 << 10

// serveReset answers POST api/reset, the console's one action: 404 when
// the console has no admin token (no actions), 401 without the right
// bearer token, else the reset key's new state. A bearer header is what
// a cross-site form cannot send, so the action needs no other CSRF guard.
func (c *Console) serveReset(w http.ResponseWriter, r *http.Request) {
	if c.cfg.AdminToken == nil {
		c.writeJSON(w, http.StatusNotFound, errorJSON{Error: "actions are off: this node has no admin token (serve --admin-token-file)"})
		return
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || subtle.ConstantTimeCompare([]byte(tok), c.cfg.AdminToken) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="ringlimit console"`)
		c.writeJSON(w, http.StatusUnauthorized, errorJSON{Error: "reset needs the admin token"})
		return
	}
	var body struct {
		Tenant  string `json:"tenant"`
		Subject string `json:"subject"`
		Policy  string `json:"policy"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxResetBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		c.writeJSON(w, http.StatusBadRequest, errorJSON{Error: "bad JSON body: " + err.Error()})
		return
	}
	key := peer.Key{Tenant: body.Tenant, Subject: body.Subject, Policy: body.Policy}
	if err := key.Validate(); err != nil {
		c.writeJSON(w, http.StatusBadRequest, errorJSON{Error: err.Error()})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	d, err := c.node.Reset(ctx, key)
	if err != nil {
		c.writeJSON(w, peekStatus(err), errorJSON{Error: err.Error()})
		return
	}
	c.log.Info("console reset", "remote_addr", r.RemoteAddr, "tenant", key.Tenant, "policy", key.Policy)
	c.writeJSON(w, http.StatusOK, map[string]any{"reset": true, "holder": d.Owner, "remaining": d.Remaining, "limit": d.Limit})
}
