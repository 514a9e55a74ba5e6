package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"os"
)

// loadGossipKey reads a gossip key file: the base64 of 16, 24 or 32 bytes
// (surrounding whitespace ignored), or exactly 16, 24 or 32 raw bytes.
func loadGossipKey(path string) ([]byte, error) {
	data, err := readSmallFile(path, 4096)
	if err != nil {
		return nil, fmt.Errorf("gossip key: %w", err)
	}
	validLen := func(n int) bool { return n == 16 || n == 24 || n == 32 }
	// Base64 first: the text of a 24-byte key is 32 bytes long and would
	// otherwise pass as a raw 32-byte key.
	if k, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(data))); err == nil && validLen(len(k)) {
		return k, nil
	}
	if validLen(len(data)) {
		return data, nil
	}
	return nil, fmt.Errorf("gossip key %s: want 16, 24 or 32 raw bytes or their base64, got %d bytes", path, len(data))
}

// readSmallFile reads at most limit bytes of path, failing if it is larger.
func readSmallFile(path string, limit int64) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return data, nil
}

// loadMutualTLS builds the server and client TLS configs for mutual TLS
// between peers: both present certFile/keyFile and trust only caFile.
// serverName, if set, is the name a client verifies in the server's
// certificate instead of the dialed host.
func loadMutualTLS(certFile, keyFile, caFile, serverName string) (server, client *tls.Config, err error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("tls key pair: %w", err)
	}
	pool, err := loadCAPool(caFile)
	if err != nil {
		return nil, nil, err
	}
	server = &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
	client = &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		RootCAs:      pool,
		ServerName:   serverName,
	}
	return server, client, nil
}

// loadCAPool reads PEM certificates from path into a pool.
func loadCAPool(path string) (*x509.CertPool, error) {
	pem, err := readSmallFile(path, 1<<20)
	if err != nil {
		return nil, fmt.Errorf("tls ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("tls ca %s: no PEM certificate found", path)
	}
	return pool, nil
}
