package peer

import "sync"

// takeovers tallies, per failed holder, the partitions (and keys) this
// node took over and has not yet logged: one warning per failed holder
// once its takeovers have gone quiet, rather than one per partition.
// Times are the caller's: node monotonic ns.
type takeovers struct {
	mu     sync.Mutex
	byPeer map[string]takeoverTally
}

// takeoverTally is partitions and keys taken over from one holder, for its
// summary line: first and last are when the first and the latest were
// taken over.
type takeoverTally struct {
	partitions, keys int
	first, last      int64
}

// tally adds one partition and its keys taken over from holder at now.
func (t *takeovers) tally(holder string, keys int, now int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byPeer == nil {
		t.byPeer = map[string]takeoverTally{}
	}
	c := t.byPeer[holder]
	c.partitions++
	c.keys += keys
	if c.first == 0 {
		c.first = now
	}
	c.last = now
	t.byPeer[holder] = c
}

// due removes and returns the tallies whose latest takeover is quiet at
// least quiet before now (all of them with all).
func (t *takeovers) due(now, quiet int64, all bool) map[string]takeoverTally {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out map[string]takeoverTally
	for holder, c := range t.byPeer {
		if all || now-c.last >= quiet {
			if out == nil {
				out = map[string]takeoverTally{}
			}
			out[holder] = c
			delete(t.byPeer, holder)
		}
	}
	return out
}
