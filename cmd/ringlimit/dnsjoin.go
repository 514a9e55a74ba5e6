package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ringlimit/ringlimit/peer"
)

// --join takes, besides gossip addresses (host:port), DNS names to resolve,
// as Cortex and Loki do, so a Kubernetes headless Service can name the
// cluster:
//
//	dns+NAME:PORT  every A and AAAA record of NAME, each with PORT
//	dnssrv+NAME    the SRV records of NAME: each target's A and AAAA
//	               records with the record's port
//
// serve resolves them before start-up and passes the addresses to
// peer.Config.Join, leaving out its own gossip address. When the names
// resolve to no other address and no plain address was given, the node
// starts a new cluster (the first pod of a StatefulSet). Every
// --join-refresh, a goroutine of runServe resolves them again and hands
// the addresses to Node.Join, which contacts only those not yet members.
// Two clusters that started apart (two first pods racing) never merge:
// each holds quota state the other's log knows nothing of, so they refuse
// each other and both report not ready, naming the other's members, until
// an operator restarts one side; the StatefulSet's OrderedReady start
// avoids two founders.

// resolver is what DNS join needs; *net.Resolver has it.
type resolver interface {
	LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
	LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error)
}

// joinEntry is one item of --join.
type joinEntry struct {
	kind string // "" (host:port), "dns" or "dnssrv"
	name string // host:port, or the DNS name
	port string // for dns
}

// parseJoin splits --join into entries; it reports every malformed one.
func parseJoin(s string) ([]joinEntry, error) {
	var out []joinEntry
	var errs []error
	for _, item := range splitList(s) {
		switch {
		case strings.HasPrefix(item, "dns+"):
			host, port, err := net.SplitHostPort(strings.TrimPrefix(item, "dns+"))
			if err != nil || host == "" || !validPort(port) {
				errs = append(errs, fmt.Errorf("--join %q: want dns+NAME:PORT, such as dns+ringlimit-gossip.default.svc.cluster.local:7946", item))
				continue
			}
			out = append(out, joinEntry{kind: "dns", name: host, port: port})
		case strings.HasPrefix(item, "dnssrv+"):
			name := strings.TrimPrefix(item, "dnssrv+")
			if name == "" || strings.ContainsAny(name, ":/ ") {
				errs = append(errs, fmt.Errorf("--join %q: want dnssrv+NAME, such as dnssrv+_gossip._tcp.ringlimit-gossip.default.svc.cluster.local", item))
				continue
			}
			out = append(out, joinEntry{kind: "dnssrv", name: name})
		case strings.Contains(item, "+"):
			errs = append(errs, fmt.Errorf("--join %q: unknown scheme; want host:port, dns+NAME:PORT or dnssrv+NAME", item))
		default:
			out = append(out, joinEntry{name: item})
		}
	}
	return out, errors.Join(errs...)
}

func validPort(p string) bool {
	n, err := strconv.Atoi(p)
	return err == nil && n > 0 && n < 1<<16
}

// hasDNS reports whether any entry needs resolving.
func hasDNS(entries []joinEntry) bool {
	return slices.ContainsFunc(entries, func(e joinEntry) bool { return e.kind != "" })
}

// resolveJoin turns entries into gossip addresses (host:port), sorted and
// without duplicates, leaving out self(addr) ones. Plain entries are kept
// as given. A name that does not resolve is reported in err, joined with
// the others; the addresses of the names that did resolve are returned
// all the same.
func resolveJoin(ctx context.Context, r resolver, entries []joinEntry, self func(string) bool) ([]string, error) {
	var out []string
	var errs []error
	add := func(ips []net.IPAddr, port string) {
		for _, ip := range ips {
			if a := net.JoinHostPort(ip.IP.String(), port); !self(a) {
				out = append(out, a)
			}
		}
	}
	for _, e := range entries {
		switch e.kind {
		case "":
			if !self(e.name) {
				out = append(out, e.name)
			}
		case "dns":
			ips, err := r.LookupIPAddr(ctx, e.name)
			if err != nil {
				errs = append(errs, fmt.Errorf("resolve %s: %w", e.name, err))
				continue
			}
			add(ips, e.port)
		case "dnssrv":
			_, srvs, err := r.LookupSRV(ctx, "", "", e.name)
			if err != nil {
				errs = append(errs, fmt.Errorf("resolve SRV %s: %w", e.name, err))
				continue
			}
			for _, s := range srvs {
				ips, err := r.LookupIPAddr(ctx, strings.TrimSuffix(s.Target, "."))
				if err != nil {
					errs = append(errs, fmt.Errorf("resolve %s (SRV %s): %w", s.Target, e.name, err))
					continue
				}
				add(ips, strconv.Itoa(int(s.Port)))
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out), errors.Join(errs...)
}

// selfFunc returns a test for "this is my own gossip address": an address
// whose port is gossipPort and whose IP is one of this host's. A port of
// "0" (chosen by the OS) matches nothing.
func selfFunc(gossipPort string) func(string) bool {
	local := map[string]bool{}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				local[ipn.IP.String()] = true
			}
		}
	}
	return func(addr string) bool {
		host, port, err := net.SplitHostPort(addr)
		if err != nil || port != gossipPort || port == "0" {
			return false
		}
		ip := net.ParseIP(host)
		return ip != nil && (local[ip.String()] || ip.IsUnspecified())
	}
}

// joiner is what the refresh needs of a node; *peer.Node has it.
type joiner interface {
	Join(ctx context.Context, addrs []string) (int, error)
}

// refreshJoin makes one re-resolution round: resolve, then join the
// addresses that are not yet members. It logs what it did; the ticker
// goroutine in runServe calls it, tests call it directly.
func refreshJoin(ctx context.Context, r resolver, n joiner, entries []joinEntry, self func(string) bool, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	addrs, err := resolveJoin(ctx, r, entries, self)
	if err != nil {
		log.Warn("dns join: resolve", "err", err)
	}
	if len(addrs) == 0 {
		return
	}
	joined, err := n.Join(ctx, addrs)
	switch {
	case errors.Is(err, peer.ErrClosed):
	case err != nil:
		log.Warn("dns join: join", "addrs", addrs, "err", err)
	case joined > 0:
		log.Info("dns join: joined", "joined", joined, "addrs", addrs)
	}
}
