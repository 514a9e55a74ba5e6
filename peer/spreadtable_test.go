package peer

import (
	"fmt"
	"testing"
	"time"
)

// TestSpreadTableCap: a node tracks at most maxSpreadKeys spread keys.
// Past the cap a new key is not tracked (it is forwarded as before), and
// for a second the full table is not scanned again; once keys have been
// idle for spreadIdle they are forgotten and new keys are tracked again.
func TestSpreadTableCap(t *testing.T) {
	var tb spreadTable
	key := func(i int) (Key, []byte) {
		k := Key{Tenant: "t", Subject: fmt.Sprintf("s%05d", i), Policy: "hot"}
		ek, _ := k.AppendEncoded(nil)
		return k, ek
	}
	now := int64(time.Hour)
	for i := range maxSpreadKeys {
		k, ek := key(i)
		if tb.lookup(ek, k, now) == nil {
			t.Fatalf("key %d of %d not tracked", i, maxSpreadKeys)
		}
	}
	k, ek := key(maxSpreadKeys)
	if tb.lookup(ek, k, now) != nil {
		t.Fatalf("key %d tracked past the cap of %d", maxSpreadKeys, maxSpreadKeys)
	}
	if tb.fullUntil != now+int64(time.Second) {
		t.Fatalf("fullUntil = %d, want a second from now (%d)", tb.fullUntil, now+int64(time.Second))
	}
	if old, oek := key(0); tb.lookup(oek, old, now) == nil {
		t.Fatal("a tracked key is no longer found while the table is full")
	}
	// Idle for spreadIdle (the scan runs once the second is over): the
	// tracked keys are forgotten, the new one is tracked.
	later := now + int64(spreadIdle) + int64(time.Second) + 1
	if tb.lookup(ek, k, later) == nil {
		t.Fatal("a new key is not tracked after every other key went idle")
	}
	if got := len(tb.keys); got != 1 {
		t.Fatalf("%d keys tracked after the idle ones were forgotten, want 1", got)
	}
}
