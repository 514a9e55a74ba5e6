package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/peer/peerpb"
	"github.com/ringlimit/ringlimit/shard"
)

const checkUsage = `Usage: ringlimit check --addr HOST:PORT --tenant T --subject S --policy P [flags]

Asks a running node for one decision (or a peek, refund, reset, a lease
of a concurrency policy, or a reservation and its settlement), through the
gRPC RateLimiter API (the node's --grpc-addr) or, with --http, through the
HTTP API (--http-addr: POST /v1/check, /v1/peek, /v1/refund, /v1/reset,
/v1/acquire, /v1/release, /v1/reserve, /v1/settle).

Flags:
  --addr H:P          node address (gRPC by default, HTTP with --http)
  --http              use the HTTP API instead of gRPC
  --tenant T          quota key: tenant
  --subject S         quota key: subject (the authenticated account)
  --policy P          quota key: policy name from the node's table
  --policies A,B      several policies of the tenant and subject, decided as
                      one (instead of --policy): admitted only if every
                      policy admits, and only then recorded in all
  --hits N            cost of the request in units (default 1)
  --peek              ask what a check would decide now; records nothing
  --refund N          give back up to N units (at most the policy's limit)
                      of the key's admissions in the window, newest first
                      (never below empty); a node with a token needs it
                      (--admin-token-file)
  --reset             clear the key (an operator action). It needs
                      --admin-token-file (the token serve was started with),
                      or over gRPC a client certificate the node verifies
                      (--tls-cert); a node started without a token answers
                      404 over HTTP, and over gRPC resets only for a
                      verified client certificate
  --acquire           take a lease of --hits units of a concurrency policy;
                      prints its lease_id (a decimal number) and TTL
  --release ID        end lease ID of a concurrency policy (a lease the
                      node no longer knows changes nothing: exit 0,
                      "nothing to release")
  --reserve           admit --hits units as an estimate of a cost known
                      only after the work (a sliding_log policy); prints its
                      reservation_id and how long it stays pending
  --settle ID         replace reservation ID's estimate with --actual N, the
                      cost the work really had (more than the estimate is
                      recorded as overage); a reservation not pending
                      changes nothing: exit 0, "nothing to settle"
  --actual N          the actual cost for --settle (0 or more)
  --admin-token-file PATH  bearer token for --reset and --refund (for
                      --refund a --refund-token-file's token works too),
                      sent as Authorization: Bearer (also read from
                      RINGLIMIT_ADMIN_TOKEN_FILE)
  --json              print the answer as JSON (the HTTP API's body)
  --timeout D         overall deadline (default 5s)
  --tls-ca PATH       gRPC over TLS, trusting this CA
  --tls-cert PATH     client certificate and key for mutual TLS
  --tls-key PATH
  --tls-server-name N name to verify in the node's certificate

Exit codes: 0 allowed (including failed_open, fallback, shadow; for --peek:
would be allowed; --refund, --reset and --release: done; --acquire:
granted; --reserve: reserved; --settle: done), 2 refused (over limit; for
--peek: would be refused; for --acquire: at the cap), 3 unavailable (the node answered, in the API's own
protocol, that the limiter could not decide), 4 unreachable (no usable
connection to --addr: wrong address or port, node not running, name not
found, the HTTP port without --http or the gRPC port with it, a TLS
mismatch: plaintext against TLS or the reverse, a node certificate that is
not trusted or does not name the address (--tls-server-name), no client
certificate where the node requires one; the error says which), 1 any other
error (bad flags, invalid key, unknown policy, wrong admin token, unreadable
TLS files).
`

type checkFlags struct {
	addr, tenant, subject, policy string
	policies                      []string
	tls                           clientTLSFlags
	hits                          int64
	useHTTP, asJSON               bool
	timeout                       time.Duration
	op                            op
	adminTokenFile                string
	leaseID                       uint64 // --release
	reservationID                 uint64 // --settle
	actual                        int64  // --settle's --actual
}

// parseCheckFlags parses check's flags. Asked for help (-h among them), it
// prints checkUsage to stdout and returns flag.ErrHelp; on a bad flag it
// prints the problem and checkUsage to stderr.
func parseCheckFlags(args []string, stdout, stderr io.Writer) (checkFlags, error) {
	var f checkFlags
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	// The flag package calls Usage for -h and for errors alike; which
	// stream gets the text is decided below, once the error is known.
	fs.Usage = func() {}
	fs.StringVar(&f.addr, "addr", "", "")
	fs.StringVar(&f.tenant, "tenant", "", "")
	fs.StringVar(&f.subject, "subject", "", "")
	fs.StringVar(&f.policy, "policy", "", "")
	policies := fs.String("policies", "", "")
	fs.Int64Var(&f.hits, "hits", 1, "")
	peek := fs.Bool("peek", false, "")
	refund := fs.Int64("refund", 0, "")
	reset := fs.Bool("reset", false, "")
	acquire := fs.Bool("acquire", false, "")
	release := fs.String("release", "", "")
	reserve := fs.Bool("reserve", false, "")
	settle := fs.String("settle", "", "")
	fs.Int64Var(&f.actual, "actual", 0, "")
	fs.StringVar(&f.adminTokenFile, "admin-token-file", "", "")
	fs.BoolVar(&f.useHTTP, "http", false, "")
	fs.BoolVar(&f.asJSON, "json", false, "")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "")
	f.tls.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, checkUsage)
			return f, err
		}
		fmt.Fprint(stderr, checkUsage)
		return f, usageError("check: " + err.Error())
	}
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	if f.adminTokenFile == "" {
		f.adminTokenFile = os.Getenv(envName("admin-token-file"))
	}
	f.policies = splitList(*policies)
	ops := 0
	for _, on := range []bool{*peek, given["refund"], *reset, *acquire, given["release"], *reserve, given["settle"]} {
		if on {
			ops++
		}
	}
	switch {
	case *peek:
		f.op = opPeek
	case given["refund"]:
		f.op, f.hits = opRefund, *refund
	case *reset:
		f.op = opReset
	case *acquire:
		f.op = opAcquire
	case given["release"]:
		f.op = opRelease
	case *reserve:
		f.op = opReserve
	case given["settle"]:
		f.op = opSettle
	}
	switch {
	case fs.NArg() > 0:
		return f, usageError(fmt.Sprintf("check: unexpected argument %q", fs.Arg(0)))
	case f.addr == "":
		return f, usageError("check: --addr is required")
	case given["policy"] && given["policies"]:
		return f, usageError("check: give --policy or --policies, not both")
	case f.tenant == "" || f.subject == "" || f.policy == "" && len(f.policies) == 0:
		return f, usageError("check: --tenant, --subject and --policy (or --policies) are required")
	case f.timeout <= 0:
		return f, usageError("check: --timeout must be positive")
	case ops > 1:
		return f, usageError("check: --peek, --refund, --reset, --acquire, --release, --reserve and --settle go alone: give one of them")
	case given["actual"] && f.op != opSettle:
		return f, usageError("check: --actual is for --settle")
	case f.op == opSettle && !given["actual"]:
		return f, usageError("check: --settle ID needs --actual N, the cost the work really had")
	case f.op == opSettle && f.actual < 0:
		return f, usageError(fmt.Sprintf("check: --actual %d: the cost is 0 or more", f.actual))
	case f.op == opSettle && given["hits"]:
		return f, usageError("check: --settle takes --actual, not --hits")
	case (f.op == opReserve || f.op == opSettle) && len(f.policies) > 0:
		return f, usageError(fmt.Sprintf("check: --%s works on one --policy, not --policies", f.op))
	case given["release"] && given["hits"]:
		return f, usageError("check: --release takes no --hits: a lease gives back what it took")
	case (f.op == opAcquire || f.op == opRelease) && len(f.policies) > 0:
		return f, usageError(fmt.Sprintf("check: --%s works on one --policy, not --policies", f.op))
	case given["refund"] && given["hits"]:
		return f, usageError("check: --refund N takes the units to give back; leave out --hits")
	case given["refund"] && *refund < 1:
		return f, usageError(fmt.Sprintf("check: --refund %d: give back at least 1 unit", *refund))
	case *reset && given["hits"]:
		return f, usageError("check: --reset takes no --hits")
	case len(f.policies) > 0 && (f.op == opRefund || f.op == opReset):
		return f, usageError(fmt.Sprintf("check: --%s works on one --policy, not --policies", f.op))
	case given["admin-token-file"] && !*reset && !given["refund"]:
		return f, usageError("check: --admin-token-file is for --reset and --refund")
	case *reset && f.useHTTP && f.adminTokenFile == "":
		return f, usageError("check: --reset over --http needs --admin-token-file (or RINGLIMIT_ADMIN_TOKEN_FILE)")
	}
	if f.op == opRelease {
		id, err := strconv.ParseUint(*release, 10, 64)
		if err != nil || id == 0 {
			return f, usageError(fmt.Sprintf("check: --release %q: give the lease_id --acquire printed (a decimal number)", *release))
		}
		f.leaseID = id
	}
	if f.op == opSettle {
		id, err := strconv.ParseUint(*settle, 10, 64)
		if err != nil || id == 0 {
			return f, usageError(fmt.Sprintf("check: --settle %q: give the reservation_id --reserve printed (a decimal number)", *settle))
		}
		f.reservationID = id
	}
	// Checked here, where it can be said once in the flags' terms, rather
	// than by the node, whose error stacks the peer and shard prefixes.
	names := f.policies
	if len(names) == 0 {
		names = []string{f.policy}
	}
	for _, name := range names {
		if p := (peer.Key{Tenant: f.tenant, Subject: f.subject, Policy: name}).Problem(); p != "" {
			return f, usageError(fmt.Sprintf("check: invalid key: %s; --tenant, --subject and --policy must each be 1 to %d bytes of visible ASCII%s",
				p, shard.MaxKeyPartLen, encodingHint(f.tenant, f.subject)))
		}
	}
	return f, nil
}

// errUnreachable is wrapped by check's errors when no usable connection to
// the node could be made (exit code 4): none at all, or one to a port that
// speaks another protocol, or a TLS set-up that does not match the node's
// — as opposed to a node that answered "unavailable" (exit code 3).
var errUnreachable = errors.New("could not reach the node")

// reasonUnreachable labels errUnreachable in check's output.
const reasonUnreachable = "unreachable"

// runCheck asks a node for one decision and maps it to an exit code.
func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseCheckFlags(args, stdout, stderr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	var resp checkResponse
	if f.useHTTP {
		resp, err = checkHTTP(ctx, f)
	} else {
		resp, err = checkGRPC(ctx, f)
	}
	code := exitUnavailable
	switch {
	case errors.Is(err, errUnreachable):
		resp = checkResponse{Reason: reasonUnreachable, Error: err.Error()}
		code = exitUnreachable
	case errors.Is(err, peer.ErrUnavailable):
		resp = checkResponse{Reason: peer.ReasonUnavailable.String(), Error: err.Error()}
	case err != nil:
		return &exitError{code: exitFailure, err: fmt.Errorf("check: %w", err)}
	}
	if f.asJSON {
		b, _ := json.Marshal(resp) // plain strings, numbers and bools
		fmt.Fprintf(stdout, "%s\n", b)
	} else {
		printDecision(stdout, f.op, resp)
	}
	switch {
	case err != nil:
		return &exitError{code: code}
	case !resp.Allowed && (f.op == opCheck || f.op == opPeek || f.op == opAcquire || f.op == opReserve):
		return &exitError{code: exitRefused}
	}
	return nil
}

func printDecision(w io.Writer, o op, r checkResponse) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	verdict := "ALLOWED"
	switch {
	case r.Reason == reasonUnreachable:
		verdict = "UNREACHABLE (no usable connection to the node: check --addr, --http, --tls-* and that the node runs)"
	case r.Reason == peer.ReasonUnavailable.String():
		verdict = "UNAVAILABLE (the limiter could not decide; not over limit)"
	case o == opPeek && r.Allowed:
		verdict = "WOULD BE ALLOWED (peek: nothing recorded)"
	case o == opPeek:
		verdict = "WOULD BE REFUSED (peek: over limit; nothing recorded)"
	case o == opRefund && r.Allowed:
		verdict = "REFUNDED"
	case o == opRefund:
		verdict = "NOTHING TO REFUND (no admissions in the window)"
	case o == opReset:
		verdict = "RESET (the key starts empty)"
	case o == opAcquire && r.Allowed:
		verdict = "GRANTED (a lease: pass its lease_id to --release)"
	case o == opAcquire:
		verdict = "REFUSED (at the cap: every unit is held by a live lease)"
	case o == opRelease && r.Allowed:
		verdict = "RELEASED"
	case o == opRelease:
		verdict = "NOTHING TO RELEASE (unknown, already released or expired lease)"
	case o == opReserve && r.Allowed:
		verdict = "RESERVED (pass its reservation_id to --settle with the actual cost)"
	case o == opSettle && r.Allowed:
		verdict = "SETTLED"
	case o == opSettle:
		verdict = "NOTHING TO SETTLE (unknown, already settled or expired reservation: nothing changed)"
	case !r.Allowed:
		verdict = "REFUSED (over limit)"
	}
	fmt.Fprintf(tw, "decision\t%s\n", verdict)
	fmt.Fprintf(tw, "reason\t%s\n", r.Reason)
	if r.Error != "" {
		fmt.Fprintf(tw, "error\t%s\n", r.Error)
		_ = tw.Flush()
		return
	}
	if r.RefusedBy != "" {
		fmt.Fprintf(tw, "refused_by\t%s\n", r.RefusedBy)
	}
	fmt.Fprintf(tw, "limit\t%d\n", r.Limit)
	fmt.Fprintf(tw, "remaining\t%d\n", r.Remaining)
	fmt.Fprintf(tw, "retry_after\t%v\n", time.Duration(r.RetryAfterMs)*time.Millisecond)
	fmt.Fprintf(tw, "reset_after\t%v\n", time.Duration(r.ResetAfterMs)*time.Millisecond)
	fmt.Fprintf(tw, "owner\t%s\n", r.Owner)
	if r.DecidedAtUnixNs != 0 {
		fmt.Fprintf(tw, "decided_at\t%s\n", time.Unix(0, r.DecidedAtUnixNs).UTC().Format(time.RFC3339Nano))
	}
	if r.LeaseID != "" {
		fmt.Fprintf(tw, "lease_id\t%s\n", r.LeaseID)
		fmt.Fprintf(tw, "lease_ttl\t%v\n", time.Duration(r.LeaseTTLMs)*time.Millisecond)
	}
	if r.ReservationID != "" {
		fmt.Fprintf(tw, "reservation_id\t%s\n", r.ReservationID)
		fmt.Fprintf(tw, "reservation_ttl\t%v\n", time.Duration(r.ReservationTTLMs)*time.Millisecond)
	}
	if r.Estimate != nil && r.Overage != nil {
		fmt.Fprintf(tw, "estimate\t%d\n", *r.Estimate)
		fmt.Fprintf(tw, "overage\t%d\n", *r.Overage)
	}
	_ = tw.Flush()
	if len(r.Limits) > 0 {
		fmt.Fprintln(w, "limits:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  policy\tallowed\tlimit\tremaining\tretry_after\treset_after")
		for _, l := range r.Limits {
			fmt.Fprintf(tw, "  %s\t%v\t%d\t%d\t%v\t%v\n", l.Policy, l.Allowed, l.Limit, l.Remaining,
				time.Duration(l.RetryAfterMs)*time.Millisecond, time.Duration(l.ResetAfterMs)*time.Millisecond)
		}
		_ = tw.Flush()
	}
}

// checkGRPC calls RateLimiter.Allow. A failure to connect at all, or a
// connection on which the node never spoke gRPC (the wrong port, a TLS
// mismatch: see dialRecord), wraps errUnreachable; other unavailability comes back through peer.FromStatus
// and wraps peer.ErrUnavailable; a rejected request says why, once.
func checkGRPC(ctx context.Context, f checkFlags) (checkResponse, error) {
	creds, err := f.tls.creds()
	if err != nil {
		return checkResponse{}, err
	}
	var dials dialRecord
	// passthrough: the dialer below resolves the name itself, so a name
	// that does not resolve is a dial failure like a refused port.
	conn, err := grpc.NewClient("passthrough:///"+f.addr, grpc.WithTransportCredentials(sniffCreds{creds, &dials}),
		grpc.WithContextDialer(dials.dial))
	if err != nil {
		return checkResponse{}, fmt.Errorf("dial %s: %w", f.addr, err)
	}
	defer conn.Close()
	client := peerpb.NewRateLimiterClient(conn)
	call := client.Allow
	switch f.op {
	case opPeek:
		call = client.Peek
	case opRefund:
		call = client.Refund
	case opReset:
		call = client.Reset
	case opAcquire:
		call = client.Acquire
	case opRelease:
		call = client.Release
	case opReserve:
		call = client.Reserve
	case opSettle:
		call = client.Settle
	}
	req := &peerpb.AllowRequest{
		Key:      &peerpb.Key{Tenant: f.tenant, Subject: f.subject, Policy: f.policy},
		Hits:     f.hits,
		Policies: f.policies,
	}
	if f.op == opReset || f.op == opRelease || f.op == opSettle {
		req.Hits = 0
	}
	req.LeaseId = f.leaseID
	if f.op == opSettle {
		req.LeaseId, req.Actual = f.reservationID, f.actual
	}
	if (f.op == opReset || f.op == opRefund) && f.adminTokenFile != "" {
		token, err := loadAdminToken(f.adminTokenFile)
		if err != nil {
			return checkResponse{}, err
		}
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+string(token))
	}
	r, err := call(ctx, req)
	if err != nil {
		if dialErr := dials.neverConnected(); dialErr != nil {
			return checkResponse{}, fmt.Errorf("%w at %s: %w", errUnreachable, f.addr, dialErr)
		}
		if p := dials.grpcSetupProblem(f.tls.ca != "", f.tls.cert != ""); p != nil {
			return checkResponse{}, fmt.Errorf("%w at %s in gRPC: %w", errUnreachable, f.addr, p)
		}
		switch st, _ := status.FromError(err); st.Code() {
		case codes.NotFound:
			// Which policy: the node's message names it, after its own
			// prefix (nodes before issue 27 say no more; nodes of issue
			// 27 to 53 listed their policies).
			msg := strings.TrimPrefix(st.Message(), peer.ErrUnknownPolicy.Error()+": ")
			if !strings.Contains(msg, "policies are") && !strings.Contains(msg, "policy table") {
				msg += ": not in the node's policy table"
			}
			return checkResponse{}, fmt.Errorf("unknown policy %s", msg)
		case codes.Unauthenticated:
			if f.adminTokenFile != "" {
				return checkResponse{}, fmt.Errorf("the node refused the %s in %s: %s", f.tokenWord(), f.adminTokenFile, st.Message())
			}
			return checkResponse{}, fmt.Errorf("the node refused the %s: give --admin-token-file (the token serve was started with): %s", f.op, st.Message())
		case codes.InvalidArgument:
			// The node's message names the problem (key or hits) once;
			// peer.FromStatus would file both under "invalid key".
			return checkResponse{}, fmt.Errorf("the node rejected the request: %s", st.Message())
		}
		return checkResponse{}, peer.FromStatus(err)
	}
	out := responseFrom(decisionFromWire(r))
	if f.op == opAcquire && r.GetAllowed() && r.GetLeaseId() != 0 {
		out.LeaseID = strconv.FormatUint(r.GetLeaseId(), 10)
		out.LeaseTTLMs = ceilMillis(time.Duration(r.GetLeaseTtlNs()))
	}
	if f.op == opReserve && r.GetAllowed() && r.GetLeaseId() != 0 {
		out.ReservationID = strconv.FormatUint(r.GetLeaseId(), 10)
		out.ReservationTTLMs = ceilMillis(time.Duration(r.GetLeaseTtlNs()))
	}
	if f.op == opSettle {
		est, over := r.GetEstimate(), r.GetOverage()
		out.Estimate, out.Overage = &est, &over
		if !r.GetAllowed() {
			out.Reason = reasonNotPending
		}
	}
	return out, nil
}

// decisionFromWire converts a RateLimiter answer to a Decision.
func decisionFromWire(r *peerpb.AllowResponse) peer.Decision {
	d := peer.Decision{
		Allowed: r.GetAllowed(), Limit: r.GetLimit(), Remaining: r.GetRemaining(),
		RetryAfter: time.Duration(r.GetRetryAfterNs()), ResetAfter: time.Duration(r.GetResetAfterNs()),
		Reason: peer.Reason(r.GetReason()), Owner: r.GetOwner(), RingVersion: r.GetRingVersion(),
		RefusedBy: r.GetRefusedBy(),
	}
	if ns := r.GetDecidedAtUnixNs(); ns != 0 {
		d.DecidedAt = time.Unix(0, ns)
	}
	for _, l := range r.GetLimits() {
		d.Limits = append(d.Limits, peer.PolicyDecision{Policy: l.GetPolicy(), Allowed: l.GetAllowed(), Limit: l.GetLimit(),
			Remaining: l.GetRemaining(), RetryAfter: time.Duration(l.GetRetryAfterNs()), ResetAfter: time.Duration(l.GetResetAfterNs())})
	}
	return d
}

// clientTLSFlags are the TLS flags of the commands that dial a node (check
// and bench).
type clientTLSFlags struct{ ca, cert, key, serverName string }

func (t *clientTLSFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&t.ca, "tls-ca", "", "")
	fs.StringVar(&t.cert, "tls-cert", "", "")
	fs.StringVar(&t.key, "tls-key", "", "")
	fs.StringVar(&t.serverName, "tls-server-name", "", "")
}

func (t clientTLSFlags) creds() (credentials.TransportCredentials, error) {
	return clientCreds(t.ca, t.cert, t.key, t.serverName)
}

// clientCreds returns plaintext credentials when no TLS flag is set, and TLS
// trusting caFile (presenting certFile/keyFile when given) otherwise.
func clientCreds(caFile, certFile, keyFile, serverName string) (credentials.TransportCredentials, error) {
	if caFile == "" && certFile == "" && keyFile == "" {
		return insecure.NewCredentials(), nil
	}
	if caFile == "" || (certFile == "") != (keyFile == "") {
		return nil, errors.New("TLS needs --tls-ca, and --tls-cert with --tls-key for mutual TLS")
	}
	pool, err := loadCAPool(caFile)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: serverName}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("tls key pair: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return credentials.NewTLS(cfg), nil
}

// tokenWord names the token --admin-token-file holds for f's operation:
// a refund may be sent the refund token instead.
func (f checkFlags) tokenWord() string {
	if f.op == opRefund {
		return "token"
	}
	return "admin token"
}

// checkHTTP posts to /v1/check (or /v1/peek, /v1/refund, /v1/reset) and
// maps the status: 200 and 429 carry a decision, 503 is unavailability,
// anything else an error with the body's message.
func checkHTTP(ctx context.Context, f checkFlags) (checkResponse, error) {
	cb := checkBody{Tenant: f.tenant, Subject: f.subject, Policy: f.policy, Policies: f.policies, Hits: f.hits}
	var token []byte
	if f.op == opReset || f.op == opRefund && f.adminTokenFile != "" {
		var err error
		if token, err = loadAdminToken(f.adminTokenFile); err != nil {
			return checkResponse{}, err
		}
	}
	body, _ := json.Marshal(cb)
	switch f.op {
	case opReset:
		// /v1/reset takes no hits.
		body, _ = json.Marshal(map[string]string{"tenant": f.tenant, "subject": f.subject, "policy": f.policy})
	case opRelease:
		body, _ = json.Marshal(map[string]string{"tenant": f.tenant, "subject": f.subject, "policy": f.policy,
			"lease_id": strconv.FormatUint(f.leaseID, 10)})
	case opSettle:
		body, _ = json.Marshal(map[string]any{"tenant": f.tenant, "subject": f.subject, "policy": f.policy,
			"reservation_id": strconv.FormatUint(f.reservationID, 10), "actual": f.actual})
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+f.addr+"/v1/"+f.op.String(), bytes.NewReader(body))
	if err != nil {
		return checkResponse{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != nil {
		req.Header.Set("Authorization", "Bearer "+string(token))
	}
	var dials dialRecord
	resp, err := (&http.Client{Transport: &http.Transport{DialContext: dials.dialSniffed}}).Do(req)
	var opErr *net.OpError
	switch {
	case errors.As(err, &opErr) && opErr.Op == "dial":
		// Refused, no route, name not found, or the deadline passed while
		// connecting: nothing answered.
		return checkResponse{}, fmt.Errorf("%w at %s: %w", errUnreachable, f.addr, opErr)
	case err != nil && dials.httpSetupProblem() != nil:
		// Connected, but the port speaks another protocol.
		return checkResponse{}, fmt.Errorf("%w at %s in HTTP: %w", errUnreachable, f.addr, dials.httpSetupProblem())
	case err != nil:
		return checkResponse{}, fmt.Errorf("%w: %w", peer.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return checkResponse{}, fmt.Errorf("%w: read response: %w", peer.ErrUnavailable, err)
	}
	var out checkResponse
	jerr := json.Unmarshal(data, &out)
	switch resp.StatusCode {
	case http.StatusOK, http.StatusTooManyRequests:
		if jerr != nil {
			return checkResponse{}, fmt.Errorf("bad response (HTTP %d): %w", resp.StatusCode, jerr)
		}
		return out, nil
	case http.StatusServiceUnavailable:
		return checkResponse{}, fmt.Errorf("%w: %s", peer.ErrUnavailable, out.Error)
	case http.StatusUnauthorized:
		if f.adminTokenFile == "" {
			return checkResponse{}, fmt.Errorf("HTTP 401: the node refused the %s: give --admin-token-file (the token serve was started with)", f.op)
		}
		return checkResponse{}, fmt.Errorf("HTTP 401: the node refused the %s in %s", f.tokenWord(), f.adminTokenFile)
	default:
		msg := out.Error
		if jerr != nil || msg == "" {
			msg = string(bytes.TrimSpace(data))
		}
		return checkResponse{}, fmt.Errorf("HTTP %d: %s", resp.StatusCode, msg)
	}
}
