package main

import (
	"net/http"
	"sort"
)

func (a *httpAPI) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (a *httpAPI) readyz(w http.ResponseWriter, _ *http.Request) {
	members := len(a.node.Members())
	ready, reason := a.node.Ready()
	switch {
	case a.draining.Load():
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "draining", "members": members})
	case !ready:
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "not ready", "reason": reason, "members": members})
	case members == 0:
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "no members", "members": members})
	default:
		writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "members": members})
	}
}

// ringInfo is the body of /debug/ring.
type ringInfo struct {
	Node            string   `json:"node"`
	RingVersion     uint64   `json:"ring_version"`
	Members         []string `json:"members"`
	PartitionsOwned int      `json:"partitions_owned"`
	Partitions      int      `json:"partitions"`
	// PolicyVersion is the version of this node's policy table;
	// MemberPolicyVersions the one each live member gossips (0: an older
	// member that does not say). They differ during a rolling change.
	PolicyVersion        uint64            `json:"policy_version"`
	MemberPolicyVersions map[string]uint64 `json:"member_policy_versions"`
}

func (a *httpAPI) debugRing(w http.ResponseWriter, _ *http.Request) {
	r := a.node.Ring()
	writeJSON(w, http.StatusOK, ringInfo{
		Node:            a.node.Name(),
		RingVersion:     r.Version,
		Members:         r.Members,
		Partitions:      r.Partitions,
		PartitionsOwned: r.PartitionsOwned,

		PolicyVersion:        a.node.PolicyVersion(),
		MemberPolicyVersions: a.node.MemberPolicyVersions(),
	})
}

// ownershipInfo is the body of /debug/ownership.
type ownershipInfo struct {
	Node       string          `json:"node"`
	Mode       string          `json:"mode"`
	Member     string          `json:"member,omitempty"`
	Leader     string          `json:"leader,omitempty"`
	Voters     int             `json:"voters,omitempty"`
	Live       bool            `json:"live"`
	Partitions []partitionInfo `json:"partitions"`
}

// partitionInfo is one partition of /debug/ownership.
type partitionInfo struct {
	Partition int    `json:"partition"`
	Holder    string `json:"holder,omitempty"`
	Backup    string `json:"backup,omitempty"`
	Epoch     uint64 `json:"epoch"`
	Deciding  bool   `json:"deciding,omitempty"`
}

func (a *httpAPI) debugOwnership(w http.ResponseWriter, _ *http.Request) {
	o := a.node.Ownership()
	out := ownershipInfo{Node: a.node.Name(), Mode: string(o.Mode), Member: o.Member, Leader: o.Leader, Voters: o.Voters, Live: o.Live,
		Partitions: make([]partitionInfo, len(o.Partitions))}
	for i, p := range o.Partitions {
		out.Partitions[i] = partitionInfo{Partition: p.Partition, Holder: p.Holder, Backup: p.Backup, Epoch: p.Epoch, Deciding: p.Deciding}
	}
	writeJSON(w, http.StatusOK, out)
}

// hotKeyInfo is one entry of /debug/hotkeys.
type hotKeyInfo struct {
	Tenant  string  `json:"tenant"`
	Subject string  `json:"subject"`
	Policy  string  `json:"policy"`
	Rate    float64 `json:"rate_per_second"`
}

func (a *httpAPI) debugHotKeys(w http.ResponseWriter, _ *http.Request) {
	hot := a.node.HotKeys()
	out := make([]hotKeyInfo, 0, len(hot))
	for _, h := range hot {
		out = append(out, hotKeyInfo{Tenant: h.Key.Tenant, Subject: h.Key.Subject, Policy: h.Key.Policy, Rate: h.Rate})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Rate > out[j].Rate })
	spread := []spreadKeyInfo{}
	for _, k := range a.node.SpreadKeys() {
		spread = append(spread, spreadKeyInfo{Tenant: k.Key.Tenant, Subject: k.Key.Subject, Policy: k.Key.Policy, Rate: k.Rate, Active: k.Active, Rights: k.Rights, Granted: k.Granted})
	}
	writeJSON(w, http.StatusOK, map[string]any{"node": a.node.Name(), "hot_keys": out, "spread_keys": spread})
}

// spreadKeyInfo is one entry of /debug/hotkeys' spread_keys: a key of a
// spread policy this node decides, or may decide, from rights.
type spreadKeyInfo struct {
	Tenant  string  `json:"tenant"`
	Subject string  `json:"subject"`
	Policy  string  `json:"policy"`
	Rate    float64 `json:"rate_per_second"`
	Active  bool    `json:"asking_for_rights"`
	Rights  int64   `json:"rights_left"`
	Granted int64   `json:"rights_granted"`
}
