package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"

	"google.golang.org/grpc/credentials"
)

// dialRecord watches the connections check makes to the node, so that its
// failures can be sorted without reading error texts: whether any TCP
// connection was made (and the last dial error), how the TLS handshake
// went, and the first bytes the node sent (above TLS when TLS is on).
// A node that answers "unavailable" has spoken its protocol first (a gRPC
// server's SETTINGS frame, an HTTP server's status line); a port that
// speaks another protocol, or a TLS mismatch, has not: that is a set-up
// mistake (exit 4), not an outage (exit 3).
// Safe for concurrent use: gRPC dials on its own goroutines.
type dialRecord struct {
	mu        sync.Mutex
	connected bool
	lastErr   error
	tlsErr    error  // the last failed client handshake
	first     []byte // up to frameHeaderLen bytes the node sent first
	firstErr  error  // a read error before first filled
	// writeErr is a write error before the node sent anything: a node
	// that refuses this client's TLS closes the connection, and the
	// client's first write can fail before its read sees the alert.
	writeErr error
}

// frameHeaderLen is the length of an HTTP/2 frame header: a gRPC server's
// first frame (its SETTINGS) is recognised from it.
const frameHeaderLen = 9

func (d *dialRecord) dial(ctx context.Context, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		d.lastErr = err
	} else {
		d.connected = true
	}
	return c, err
}

// dialSniffed is dial with the connection's first bytes recorded (for
// plaintext HTTP, where no handshake wraps the connection).
func (d *dialRecord) dialSniffed(ctx context.Context, _, addr string) (net.Conn, error) {
	c, err := d.dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	return &sniffConn{Conn: c, rec: d}, nil
}

// neverConnected returns the last dial error if no dial succeeded, and nil
// otherwise (or if no dial was tried).
func (d *dialRecord) neverConnected() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.connected {
		return nil
	}
	return d.lastErr
}

// sniffConn records the first bytes read from the node, or the error that
// came before them.
type sniffConn struct {
	net.Conn
	rec *dialRecord
}

func (c *sniffConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.rec.mu.Lock()
	defer c.rec.mu.Unlock()
	if len(c.rec.first) < frameHeaderLen {
		c.rec.first = append(c.rec.first, p[:min(n, frameHeaderLen-len(c.rec.first))]...)
		// net.ErrClosed is this side closing the connection (after a
		// failed write, say): not what the node answered.
		if err != nil && len(c.rec.first) == 0 && c.rec.firstErr == nil && !errors.Is(err, net.ErrClosed) {
			c.rec.firstErr = err
		}
	}
	return n, err
}

func (c *sniffConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil {
		c.rec.mu.Lock()
		if len(c.rec.first) == 0 && c.rec.writeErr == nil {
			c.rec.writeErr = err
		}
		c.rec.mu.Unlock()
	}
	return n, err
}

// sniffCreds wraps the client's transport credentials (TLS or plaintext):
// it records a failed handshake, and the first bytes the node sends after
// it.
type sniffCreds struct {
	credentials.TransportCredentials
	rec *dialRecord
}

func (s sniffCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	c, info, err := s.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		s.rec.mu.Lock()
		s.rec.tlsErr = err
		s.rec.mu.Unlock()
		return c, info, err
	}
	return &sniffConn{Conn: c, rec: s.rec}, info, nil
}

func (s sniffCreds) Clone() credentials.TransportCredentials {
	return sniffCreds{TransportCredentials: s.TransportCredentials.Clone(), rec: s.rec}
}

// Hints for the set-up mistakes check recognises.
const (
	hintHTTPPort  = "this looks like the node's HTTP port (--http-addr): add --http, or point --addr at its --grpc-addr"
	hintGRPCPort  = "this looks like the node's gRPC port (--grpc-addr): leave out --http, or point --addr at its --http-addr"
	hintTLSPort   = "this looks like a TLS port: give --tls-ca (and --tls-cert with --tls-key for mutual TLS)"
	hintClientTLS = "the node refused this client's TLS: it wants a client certificate its CA signed: give --tls-cert and --tls-key"
	hintClosed    = "the node closed the connection before answering in gRPC: if it serves mutual TLS, give --tls-ca, --tls-cert and --tls-key"
)

// grpcSetupProblem tells, after a failed call, whether the node never spoke
// gRPC to check because of a set-up mistake, and returns the problem with a
// hint; nil when the node answered in gRPC (or nothing is known). tlsOn and
// certGiven are check's TLS flags.
func (d *dialRecord) grpcSetupProblem(tlsOn, certGiven bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.connected {
		return nil
	}
	if d.tlsErr != nil {
		return tlsProblem(d.tlsErr)
	}
	switch {
	case len(d.first) >= frameHeaderLen && isSettingsFrame(d.first):
		return nil // the node spoke gRPC: what it said is its answer
	case bytes.HasPrefix(d.first, []byte("HTTP/")):
		return errors.New(hintHTTPPort)
	case len(d.first) > 0 && !tlsOn && isTLSRecord(d.first):
		return errors.New(hintTLSPort)
	case len(d.first) >= frameHeaderLen:
		return fmt.Errorf("the node's port does not speak gRPC (it sent %q first)", d.first)
	}
	closed := d.firstErr
	if closed == nil {
		closed = d.writeErr
	}
	switch {
	case closed == nil:
		return nil // nothing read yet (a deadline): not a protocol mismatch
	case tlsOn && (isRemoteAlert(closed) || d.firstErr == nil):
		// The handshake passed on this side, then the node sent an alert,
		// or closed the connection before this client's first write.
		if !certGiven {
			return fmt.Errorf("%s (%w)", hintClientTLS, closed)
		}
		return fmt.Errorf("the node refused this client's certificate: is it signed by the CA the node trusts (its --tls-ca), with clientAuth usage? (%w)", closed)
	case !tlsOn:
		return fmt.Errorf("%s (%w)", hintClosed, closed)
	}
	return nil
}

// httpSetupProblem is grpcSetupProblem for check --http: nil when the node
// sent an HTTP status line (or nothing is known).
func (d *dialRecord) httpSetupProblem() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case !d.connected || bytes.HasPrefix(d.first, []byte("HTTP/")):
		return nil
	case len(d.first) >= frameHeaderLen && isSettingsFrame(d.first):
		return errors.New(hintGRPCPort)
	case len(d.first) > 0 && isTLSRecord(d.first):
		return errors.New("this looks like a TLS port, and the HTTP API is plaintext: " + hintGRPCPort)
	case len(d.first) >= frameHeaderLen:
		return fmt.Errorf("the node's port does not speak HTTP/1.1 (it sent %q first)", d.first)
	case d.firstErr != nil:
		return fmt.Errorf("the node closed the connection without an HTTP answer: is --addr its --http-addr? (a gRPC port with TLS closes like this) (%w)", d.firstErr)
	case d.writeErr != nil:
		return fmt.Errorf("the node closed the connection without an HTTP answer: is --addr its --http-addr? (a gRPC port with TLS closes like this) (%w)", d.writeErr)
	}
	return nil
}

// isSettingsFrame reports whether h is the header of an HTTP/2 SETTINGS
// frame on stream 0: how every HTTP/2 server starts.
func isSettingsFrame(h []byte) bool {
	return h[3] == 0x4 && h[5]|h[6]|h[7]|h[8] == 0
}

// isTLSRecord reports whether b starts like a TLS record: an alert or a
// handshake, version 3.x.
func isTLSRecord(b []byte) bool {
	return (b[0] == 0x15 || b[0] == 0x16) && (len(b) < 2 || b[1] == 0x03)
}

// isRemoteAlert reports whether err is a TLS alert the node sent.
func isRemoteAlert(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "remote error"
}

// tlsProblem explains a failed client handshake.
func tlsProblem(err error) error {
	var (
		host    x509.HostnameError
		unknown x509.UnknownAuthorityError
		header  tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &host):
		return fmt.Errorf("TLS: the node's certificate does not name the address dialed: give --tls-server-name with a name from its SANs (%w)", err)
	case errors.As(err, &unknown):
		return fmt.Errorf("TLS: --tls-ca does not trust the node's certificate (%w)", err)
	case errors.As(err, &header) && bytes.HasPrefix(header.RecordHeader[:], []byte("HTTP/")):
		return errors.New(hintHTTPPort)
	case errors.As(err, &header):
		return fmt.Errorf("TLS: the node did not answer in TLS: if it serves plaintext gRPC, leave out --tls-* (%w)", err)
	case isRemoteAlert(err):
		return fmt.Errorf("TLS: the node refused the handshake (%w)", err)
	}
	return fmt.Errorf("TLS handshake with the node failed (%w)", err)
}
