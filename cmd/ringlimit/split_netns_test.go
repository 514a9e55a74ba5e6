package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/shard"
)

// TestSplitNetns splits a five-node cluster of `ringlimit serve`
// processes 2 | 3 with a real network partition (Linux network namespaces
// and two bridges) for 40 s, with the default gossip profile (lan). The
// small side is the holder of some partitions together with those
// partitions' backup, so the large side, which has the majority, takes
// them over without a copy while the small side may still hold a lease.
// Clients on both sides keep several keys at their limits the whole time;
// then the split heals and the test checks the promise over every
// admission any client saw: no key ever has more than L admissions in any
// rolling window of W. It reports, per key and per side, how long the key
// was unavailable and how many admissions and violations each side saw,
// and fails on any violation.
//
// Opt-in (RINGLIMIT_NETNS=1, root, a working `ip netns`): it takes about
// two minutes, creates namespaces and links on the machine, and wants the
// CPU to itself. Run it alone:
//
//	sudo RINGLIMIT_NETNS=1 go test -count=1 -run TestSplitNetns -v ./cmd/ringlimit/
//
// RINGLIMIT_NETNS_SPLIT chooses other splits: holder puts the
// holder on the small side with a node that is not its backup, so the
// backup, with its copy, stays with the majority (the ordinary failover;
// no key is chosen with holder and backup on the small side); away puts
// two other nodes on the small side and chooses only keys whose holder
// and backup stay on the large side, a control that must pass: those keys
// stay at their limit on the large side throughout, and the small side's
// clients get 503s for them.
// RINGLIMIT_NETNS_LOG_LEVEL=debug runs the nodes with debug logs (printed
// if the test fails).
//
// Keys, holders and backups: /v1/check answers name the owner that
// decided, and no endpoint names a partition's backup, so the test builds
// the ring itself (ring.New with serve's default ring parameters over the
// five member names) and checks it against the owner every node answers
// for 200 probed subjects; the backup is then the ring's backup
// (Snapshot.Backup), which is the copy's keeper while the holder is the
// ring's target and the backup is reachable (peer's desiredBackup), the
// case once every node is ready ("every partition on its target with its
// backup").
//
// Topology: as TestPartitionNetns (one namespace per node, a bridge in a
// namespace of its own, a mgmt link per node for HTTP from the root
// namespace), with five nodes. The split moves the small side's bridge
// ports to a second bridge in the bridge namespace; the heal moves them
// back. Every link stays up, so every client keeps reaching its local
// node.
func TestSplitNetns(t *testing.T) {
	ipPath, prefix := netnsPreflight(t)

	const (
		nodeCount = 5
		limit     = 20
		window    = 3 * time.Second
		before    = 5 * time.Second
		splitFor  = 40 * time.Second
		mergeWait = 60 * time.Second // lan: failed members are re-joined every 10 s
		tailFor   = 8 * time.Second
		every     = 50 * time.Millisecond // per client and key
	)
	mode := os.Getenv("RINGLIMIT_NETNS_SPLIT")
	switch mode {
	case "":
		mode = "holder-backup"
	case "holder-backup", "holder", "away":
	default:
		t.Fatalf("RINGLIMIT_NETNS_SPLIT=%q: want holder-backup (the default), holder or away", mode)
	}
	var extra []string

	tn := newTestNet(t, ipPath, prefix, nodeCount)
	pols := writeFile(t, t.TempDir(), "policies.yaml", fmt.Sprintf(`policies:
  - name: sp
    limit: %d
    window: %s
    algorithm: sliding_log
  - name: probe
    limit: 1000000
    window: 1s
`, limit, window))
	nodes := startNetnsNodes(t, tn, nodeCount, pols, "lan", extra...)
	waitFor(t, 60*time.Second, "every node to see 5 members and be ready",
		func() bool { return allSee(nodes, nodeCount) && allReady(nodes) })

	// The ring, as every node builds it from the member names.
	names := make([]string, nodeCount)
	for i := range names {
		names[i] = fmt.Sprintf("n%d", i)
	}
	snap, err := ring.New(ring.Config{}, names, 1)
	if err != nil {
		t.Fatal(err)
	}
	type probed struct{ subj, owner, backup string }
	var probes []probed
	for i := range 200 {
		subj := fmt.Sprintf("s%d", i)
		pk, ok := shard.Key{Tenant: "t", Subject: subj, Policy: "sp"}.AppendPlacement(nil)
		if !ok {
			t.Fatalf("invalid key %q", subj)
		}
		r := doHTTP(t, "POST", "http://"+nodes[i%nodeCount].httpAddr+"/v1/check",
			fmt.Sprintf(`{"tenant":"t","subject":%q,"policy":"probe"}`, subj))
		if r.status != http.StatusOK {
			t.Fatalf("probe %s via n%d: %d %s", subj, i%nodeCount, r.status, r.raw)
		}
		if got, want := r.body["owner"], snap.Owner(pk); got != want {
			t.Fatalf("probe %s via n%d: owner %v, the ring built here says %s: cannot tell holders and backups", subj, i%nodeCount, got, want)
		}
		probes = append(probes, probed{subj, snap.Owner(pk), snap.Backup(pk)})
	}

	// The small side, from the first probed key's holder A and backup B.
	holderA, backupB := probes[0].owner, probes[0].backup
	small := []string{holderA, backupB}
	switch mode {
	case "holder": // A and a node that is not its backup
		for _, n := range names {
			if n != holderA && n != backupB {
				small = []string{holderA, n}
				break
			}
		}
	case "away": // two nodes that are neither
		small = nil
		for _, n := range names {
			if n != holderA && n != backupB && len(small) < 2 {
				small = append(small, n)
			}
		}
	}
	sort.Strings(small)
	onSmall := func(name string) bool { return slices.Contains(small, name) }
	var smallIdx, largeIdx []int
	for i, n := range names {
		if onSmall(n) {
			smallIdx = append(smallIdx, i)
		} else {
			largeIdx = append(largeIdx, i)
		}
	}
	sideOf := func(node int) string {
		if onSmall(names[node]) {
			return "small"
		}
		return "large"
	}

	// Keys by where their holder and backup are.
	const (
		bothSmall   = "holder and backup on the small side"
		holderSmall = "holder on the small side, backup on the large side"
		bothLarge   = "holder and backup on the large side"
	)
	want := map[string]int{bothSmall: 3, holderSmall: 1, bothLarge: 1}
	switch mode {
	case "holder":
		want = map[string]int{holderSmall: 3, bothLarge: 2}
	case "away":
		want = map[string]int{bothLarge: 5}
	}
	type keyInfo struct{ subj, owner, backup, kind string }
	var keys []keyInfo
	for _, p := range probes {
		kind := ""
		switch {
		case onSmall(p.owner) && onSmall(p.backup):
			kind = bothSmall
		case onSmall(p.owner):
			kind = holderSmall
		case !onSmall(p.backup):
			kind = bothLarge
		}
		if want[kind] > 0 {
			want[kind]--
			keys = append(keys, keyInfo{p.subj, p.owner, p.backup, kind})
		}
	}
	for kind, n := range want {
		if n > 0 {
			t.Fatalf("%d more keys wanted with %s among 200 probed", n, kind)
		}
	}
	t.Logf("split %q; small side %v, large side %v", mode, small, namesOf(names, largeIdx))
	for k, ki := range keys {
		t.Logf("key %d %q: holder %s, backup %s (%s)", k, ki.subj, ki.owner, ki.backup, ki.kind)
	}

	// Clients: one goroutine per (node, key), each sending to its local
	// node every 50 ms and recording what it saw, for at most the test's
	// phases (in time and in count).
	clientFor := before + splitFor + mergeWait + tailFor + 10*time.Second
	rec := &recorder{}
	ctx, stop := context.WithTimeout(context.Background(), clientFor)
	var wg sync.WaitGroup
	t.Cleanup(func() { stop(); wg.Wait() }) // before the nodes are killed (LIFO)
	start := time.Now()
	for i, p := range nodes {
		tr := &http.Transport{MaxIdleConnsPerHost: len(keys) + 2}
		t.Cleanup(tr.CloseIdleConnections)
		client := &http.Client{Timeout: 5 * time.Second, Transport: tr}
		for k, ki := range keys {
			body := fmt.Sprintf(`{"tenant":"t","subject":%q,"policy":"sp"}`, ki.subj)
			wg.Go(func() {
				runClient(ctx, client, i, k, "http://"+p.httpAddr+"/v1/check", body, every, int(clientFor/every), rec)
			})
		}
	}
	phase := func(what string, d time.Duration) {
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
		t.Logf("%s: %v", what, d)
	}
	phase("traffic before the split", before)

	tSplit := time.Now()
	tn.splitOff(smallIdx)
	phase("split", splitFor)
	tHeal := time.Now()
	tn.rejoin(smallIdx)

	merged, ready := time.Duration(-1), time.Duration(-1)
	deadline := time.Now().Add(mergeWait)
	poll := time.NewTicker(100 * time.Millisecond)
	for time.Now().Before(deadline) && ready < 0 {
		if merged < 0 && allSee(nodes, nodeCount) {
			merged = time.Since(tHeal)
		}
		if merged >= 0 && allReady(nodes) {
			ready = time.Since(tHeal)
		}
		<-poll.C
	}
	poll.Stop()
	var seen []string
	for _, p := range nodes {
		n, err := membersOf(p)
		seen = append(seen, fmt.Sprintf("%s sees %d (err %v)", p.name, n, err))
	}
	phase("traffic after the heal", tailFor)
	stop()
	wg.Wait()
	end := time.Now()

	rs := rec.sorted()
	rel := func(at time.Time) string { return "+" + at.Sub(start).Round(time.Millisecond).String() }
	t.Logf("%d requests from %v; split at %s, healed at %s, end at %s", len(rs), start.Format(time.TimeOnly),
		rel(tSplit), rel(tHeal), rel(end))
	if merged < 0 {
		t.Errorf("membership did not merge within %v of the heal: %s", mergeWait, strings.Join(seen, ", "))
	} else {
		t.Logf("membership merged %v after the heal", merged.Round(time.Millisecond))
	}
	if ready >= 0 {
		t.Logf("every node ready %v after the heal", ready.Round(time.Millisecond))
	} else {
		// Reported, not failed: this test is about the promise.
		for _, p := range nodes {
			if r, err := httpDo("GET", "http://"+p.httpAddr+"/readyz", ""); err != nil || r.status != http.StatusOK {
				t.Logf("%s not ready %v after the heal: %v %s", p.name, mergeWait, err, strings.TrimSpace(r.raw))
			}
		}
	}
	for _, p := range nodes {
		t.Logf("%s: %s", p.name, membershipSummary(p.logText(), tSplit, tHeal))
	}

	type sideTotals struct {
		admissions, admissionsSplit, violations int
		worstOutage                             time.Duration
		neverBack                               int
	}
	totals := map[string]*sideTotals{} // by side and kind of key
	for k, ki := range keys {
		var mine, adm []request
		for _, r := range rs {
			if r.key == k {
				mine = append(mine, r)
				if r.status == http.StatusOK {
					adm = append(adm, r)
				}
			}
		}
		// The clients must keep the key at its limit, or the check says
		// nothing.
		refused := 0
		for _, r := range mine {
			if r.status == http.StatusTooManyRequests && r.sent.Before(tSplit) {
				refused++
			}
		}
		if refused == 0 {
			t.Errorf("key %s: no 429 before the split: the clients did not keep it at its limit", ki.subj)
		}
		for _, r := range mine {
			if r.sent.Before(tSplit) && !r.decision() {
				t.Logf("before the split, key %s via n%d at %s: %s %q", ki.subj, r.client, rel(r.sent), r.outcome(), r.errMsg)
			}
		}
		reasons := map[string]int{}
		for _, r := range adm {
			reasons[r.reason]++
		}

		c := checkWindow(adm, limit, window)
		exact, exactAt, exactOK := maxExactInWindow(adm, window)
		exactText := "some admissions lack decision times"
		if exactOK {
			exactText = fmt.Sprintf("%d by the owners' decision times (window ending %s)", exact, rel(exactAt))
		}
		t.Logf("key %s (%s): %d admissions %v; most in one window of %v: %d certainly (ending %s), %s; %d violations",
			ki.subj, ki.kind, len(adm), reasons, window, c.Most, rel(c.MostAt), exactText, len(c.Excess))
		if len(c.Excess) > 0 {
			var ex []string
			for _, r := range c.Excess[:min(len(c.Excess), 5)] {
				ex = append(ex, fmt.Sprintf("owner %s via n%d called %s answered %s", r.owner, r.client, rel(r.sent), rel(r.recv)))
			}
			t.Errorf("key %s: %d admissions certainly over the limit %d in a window of %v (at most %d in one window); first: %s",
				ki.subj, len(c.Excess), limit, window, c.Most, strings.Join(ex, "; "))
		}

		// Who decided during the split, by the side of the deciding owner:
		// both sides deciding at once is two decision points.
		firstLarge, lastSmall := time.Time{}, time.Time{}
		deciders := map[string]int{}
		for _, r := range mine {
			if !r.decision() || r.recv.Before(tSplit) || !r.recv.Before(tHeal) {
				continue
			}
			deciders[r.owner]++
			if onSmall(r.owner) {
				lastSmall = r.recv
			} else if firstLarge.IsZero() {
				firstLarge = r.recv
			}
		}
		both := "never both sides"
		if !firstLarge.IsZero() && lastSmall.After(firstLarge) && onSmall(ki.owner) {
			both = fmt.Sprintf("both sides decided from %s to %s (%v)", rel(firstLarge), rel(lastSmall),
				lastSmall.Sub(firstLarge).Round(time.Millisecond))
		}
		t.Logf("key %s during the split: decisions by owner %v; %s", ki.subj, deciders, both)

		for _, side := range []string{"small", "large"} {
			idx := smallIdx
			if side == "large" {
				idx = largeIdx
			}
			st := totals[side+"|"+ki.kind]
			if st == nil {
				st = &sideTotals{}
				totals[side+"|"+ki.kind] = st
			}
			nAdm, nAdmSplit, nViol := 0, 0, 0
			for _, r := range adm {
				if sideOf(r.client) == side {
					nAdm++
					if !r.recv.Before(tSplit) && r.recv.Before(tHeal) {
						nAdmSplit++
					}
				}
			}
			for _, r := range c.Excess {
				if sideOf(r.client) == side {
					nViol++
				}
			}
			var parts []string
			for _, i := range idx {
				var own []request
				for _, r := range mine {
					if r.client == i && !r.sent.Before(tSplit) {
						own = append(own, r)
					}
				}
				o := outagesOf(own)
				parts = append(parts, fmt.Sprintf("via n%d %s", i, o.describe(tSplit, tHeal)))
				st.worstOutage = max(st.worstOutage, o.longest)
				if o.open {
					st.neverBack++
				}
			}
			st.admissions += nAdm
			st.admissionsSplit += nAdmSplit
			st.violations += nViol
			t.Logf("key %s, %s side: %d admissions (%d answered during the split), %d violations; %s",
				ki.subj, side, nAdm, nAdmSplit, nViol, strings.Join(parts, "; "))
		}
	}
	for _, side := range []string{"small", "large"} {
		for _, kind := range []string{bothSmall, holderSmall, bothLarge} {
			if st := totals[side+"|"+kind]; st != nil {
				t.Logf("%s side, keys with %s: %d admissions (%d during the split), %d violations; longest unavailability %v; %d client-key pairs never decided again",
					side, kind, st.admissions, st.admissionsSplit, st.violations, st.worstOutage.Round(time.Millisecond), st.neverBack)
			}
		}
	}
}

// membershipSummary condenses a node's JSON log: when, relative to the
// split (or the heal), it saw each member fail and join, and how many
// ERROR lines of each message it logged.
func membershipSummary(log string, split, heal time.Time) string {
	var events []string
	errs := map[string]int{}
	for _, line := range strings.Split(log, "\n") {
		var rec struct {
			Time   time.Time `json:"time"`
			Level  string    `json:"level"`
			Msg    string    `json:"msg"`
			Event  string    `json:"event"`
			Member string    `json:"member"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		if rec.Level == "ERROR" {
			errs[rec.Msg]++
		}
		if rec.Msg != "gossip membership" || rec.Time.Before(split) {
			continue
		}
		when := fmt.Sprintf("split+%v", rec.Time.Sub(split).Round(100*time.Millisecond))
		if !rec.Time.Before(heal) {
			when = fmt.Sprintf("heal+%v", rec.Time.Sub(heal).Round(100*time.Millisecond))
		}
		events = append(events, fmt.Sprintf("%s %s %s", rec.Member, rec.Event, when))
	}
	if len(events) == 0 {
		events = []string{"no membership change"}
	}
	out := "membership: " + strings.Join(events, ", ")
	if len(errs) > 0 {
		out += fmt.Sprintf("; ERROR lines: %v", errs)
	}
	return out
}

// namesOf returns names[i] for each i of idx.
func namesOf(names []string, idx []int) []string {
	out := make([]string, 0, len(idx))
	for _, i := range idx {
		out = append(out, names[i])
	}
	return out
}

// outages is how one client saw a key become unavailable and come back
// (requests from the split on).
type outages struct {
	count          int           // stretches without a decision
	longest, total time.Duration // from the first undecided call to the next decision's answer
	longestFrom    time.Time
	open           bool // the last stretch never ended
}

// outagesOf finds the stretches of rs (one client's requests for one key,
// sorted by send time) without a decision (200 or 429): each from the call
// of its first undecided request to the answer of the next decided one.
func outagesOf(rs []request) outages {
	var o outages
	var from time.Time
	in := false
	note := func(to time.Time) {
		d := to.Sub(from)
		o.count++
		o.total += d
		if d > o.longest {
			o.longest, o.longestFrom = d, from
		}
	}
	for _, r := range rs {
		switch {
		case !r.decision() && !in:
			in, from = true, r.sent
		case r.decision() && in:
			in = false
			note(r.recv)
		}
	}
	if in {
		o.open = true
		note(rs[len(rs)-1].recv)
	}
	return o
}

func (o outages) describe(split, heal time.Time) string {
	if o.count == 0 {
		return "never unavailable"
	}
	ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	at := func(t time.Time) string {
		if t.Before(heal) {
			return ms(t.Sub(split)) + " into the split"
		}
		return ms(t.Sub(heal)) + " after the heal"
	}
	s := fmt.Sprintf("unavailable %s in %d stretches, longest %s from %s", ms(o.total), o.count, ms(o.longest), at(o.longestFrom))
	if o.open {
		s += ", never decided again"
	}
	return s
}
