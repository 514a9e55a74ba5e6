package ownership

import (
	"errors"
	"math/rand/v2"
	"os/exec"
	"strings"
	"testing"
)

// founded returns a table with members a, b, c joined and partition 0
// granted to a at epoch 1, backed up by b at epoch 2.
func founded(t *testing.T) *Table {
	t.Helper()
	tb := NewTable(2)
	for _, c := range []Command{
		{Kind: Join, Member: "a"}, {Kind: Join, Member: "b"}, {Kind: Join, Member: "c"},
		{Kind: Grant, P: 0, Epoch: 0, To: "a", ToEpoch: 1},
		{Kind: SetBackup, Member: "a", P: 0, Epoch: 1, To: "b"},
	} {
		if err := tb.Apply(c); err != nil {
			t.Fatalf("%v: %v", c, err)
		}
	}
	return tb
}

func TestApply(t *testing.T) {
	cases := []struct {
		name    string
		cmds    []Command
		refused bool // the last command
		check   func(*Table) string
	}{
		{"an end hands the partition to the backup", []Command{{Kind: End, Member: "a", Epoch: 1, Version: 0}}, false, func(tb *Table) string {
			if p := tb.Parts[0]; p.Holder != "b" || p.HolderEpoch != 1 || p.Backup != "" || p.Epoch != 3 {
				return "partition " + p.Holder
			}
			if tb.Holds("a", 0) || tb.Members["a"].Epoch != 2 {
				return "a still holds"
			}
			return ""
		}},
		{"an extension applied after the proposer saw the record refuses the end", []Command{
			{Kind: Extend, Member: "a", Epoch: 1, Seq: 1},
			{Kind: End, Member: "a", Epoch: 1, Version: 0},
		}, true, func(tb *Table) string {
			if !tb.Holds("a", 0) {
				return "a lost the partition"
			}
			return ""
		}},
		{"an extension at an ended epoch is refused", []Command{
			{Kind: End, Member: "a", Epoch: 1, Version: 0},
			{Kind: Extend, Member: "a", Epoch: 1, Seq: 2},
		}, true, nil},
		{"a move at a stale epoch is refused", []Command{
			{Kind: Keep, Member: "a", P: 0, Epoch: 2},
			{Kind: Move, Member: "a", P: 0, Epoch: 2, To: "c", ToEpoch: 1},
		}, true, nil},
		{"a move makes the old holder the backup", []Command{{Kind: Move, Member: "a", P: 0, Epoch: 2, To: "c", ToEpoch: 1, Seq: 7}}, false, func(tb *Table) string {
			if p := tb.Parts[0]; p.Holder != "c" || p.Backup != "a" || p.Epoch != 3 {
				return "partition " + p.Holder + "/" + p.Backup
			}
			return ""
		}},
		{"a move to a member's old liveness epoch is refused", []Command{
			{Kind: End, Member: "c", Epoch: 1, Version: 0},
			{Kind: Move, Member: "a", P: 0, Epoch: 2, To: "c", ToEpoch: 1},
		}, true, nil},
		{"a holder ended without a live backup leaves the partition vacant with its state", []Command{
			{Kind: End, Member: "b", Epoch: 1, Version: 0},
			{Kind: End, Member: "a", Epoch: 1, Version: 0},
		}, false, func(tb *Table) string {
			if p := tb.Parts[0]; p.Holder != "" || p.Last != "a" || p.Restarts != 0 {
				return "partition not vacant with a's state"
			}
			return ""
		}},
		{"a vacant partition goes back only to the member with its state", []Command{
			{Kind: End, Member: "b", Epoch: 1, Version: 0},
			{Kind: End, Member: "a", Epoch: 1, Version: 0},
			{Kind: Grant, P: 0, Epoch: 3, To: "c", ToEpoch: 1},
		}, true, nil},
		{"granted back with its state, nothing is lost", []Command{
			{Kind: End, Member: "b", Epoch: 1, Version: 0},
			{Kind: End, Member: "a", Epoch: 1, Version: 0},
			{Kind: Grant, Member: "a", P: 0, Epoch: 4, To: "a", ToEpoch: 2},
		}, false, func(tb *Table) string {
			if p := tb.Parts[0]; p.Holder != "a" || p.Restarts != 0 {
				return "not granted back"
			}
			return ""
		}},
		{"once the member with the state is gone for good, the partition restarts empty, counted", []Command{
			{Kind: End, Member: "b", Epoch: 1, Version: 0},
			{Kind: End, Member: "a", Epoch: 1, Version: 0},
			{Kind: End, Member: "a", Epoch: 2, Version: 0, Ended: true},
			{Kind: Grant, P: 0, Epoch: 4, To: "c", ToEpoch: 1},
		}, false, func(tb *Table) string {
			if p := tb.Parts[0]; p.Holder != "c" || p.Restarts != 1 {
				return "not restarted"
			}
			return ""
		}},
		{"a grant of a held partition is refused", []Command{{Kind: Grant, P: 0, Epoch: 2, To: "c", ToEpoch: 1}}, true, nil},
		{"a second join of one incarnation is refused", []Command{{Kind: Join, Member: "a"}}, true, nil},
		{"an ended incarnation never extends again", []Command{
			{Kind: End, Member: "c", Epoch: 1, Version: 0, Ended: true},
			{Kind: Extend, Member: "c", Epoch: 2},
		}, true, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tb := founded(t)
			for i, cmd := range c.cmds {
				before := tb.Clone()
				err := tb.Apply(cmd)
				last := i == len(c.cmds)-1
				switch {
				case last && c.refused:
					if !errors.Is(err, ErrRefused) {
						t.Fatalf("%v: got %v, want refused", cmd, err)
					}
					if !equalTables(before, tb) {
						t.Fatalf("%v was refused but changed the table", cmd)
					}
				case err != nil:
					t.Fatalf("%v: %v", cmd, err)
				}
			}
			if c.check != nil {
				if msg := c.check(tb); msg != "" {
					t.Fatalf("after %v: %s (%+v)", c.cmds, msg, tb.Parts[0])
				}
			}
		})
	}
}

func equalTables(a, b *Table) bool {
	if len(a.Members) != len(b.Members) || len(a.Parts) != len(b.Parts) {
		return false
	}
	for id, l := range a.Members {
		if m := b.Members[id]; m == nil || *m != *l {
			return false
		}
	}
	for i := range a.Parts {
		if a.Parts[i] != b.Parts[i] {
			return false
		}
	}
	return true
}

// TestOneHolderPerEpoch applies random command sequences and checks that
// no (partition, epoch) is ever held by two members, that epochs only
// grow, and that a refused or bad command never changes the table.
func TestOneHolderPerEpoch(t *testing.T) {
	for seed := uint64(1); seed <= 200; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0))
		ids := []string{"a", "b", "c", "d"}
		tb := NewTable(3)
		held := map[[2]uint64]string{}
		for range 400 {
			pick := func() string { return ids[rng.IntN(len(ids))] }
			c := Command{Kind: Kind(1 + rng.IntN(int(Grant))), Member: pick(), To: pick(), P: rng.IntN(3),
				Epoch: uint64(rng.IntN(6)), Version: uint64(rng.IntN(4)), ToEpoch: uint64(rng.IntN(4)), Ended: rng.IntN(10) == 0}
			before := tb.Clone()
			if err := tb.Apply(c); err != nil {
				if !equalTables(before, tb) {
					t.Fatalf("seed %d: %v refused (%v) but changed the table", seed, c, err)
				}
				continue
			}
			for p, pt := range tb.Parts {
				if pt.Epoch < before.Parts[p].Epoch {
					t.Fatalf("seed %d: %v moved p%d's epoch back", seed, c, p)
				}
				if pt.Holder == "" {
					continue
				}
				k := [2]uint64{uint64(p), pt.Epoch}
				if h, ok := held[k]; ok && h != pt.Holder {
					t.Fatalf("seed %d: p%d at epoch %d held by %s and %s", seed, p, pt.Epoch, h, pt.Holder)
				}
				held[k] = pt.Holder
			}
		}
	}
}

func TestCodec(t *testing.T) {
	cmds := []Command{
		{Kind: Join, Member: "n1.3"},
		{Kind: End, Member: "x", Epoch: 7, Version: 1 << 40, Ended: true},
		{Kind: Move, Member: "a", P: 4095, Epoch: 3, To: "b", ToEpoch: 9, Seq: 12},
	}
	for _, c := range cmds {
		got, err := Decode(c.Encode(nil))
		if err != nil || got != c {
			t.Errorf("round trip of %v: got %v, %v", c, got, err)
		}
		b := c.Encode(nil)
		for i := range b {
			if _, err := Decode(b[:i]); !errors.Is(err, ErrBadCommand) {
				t.Errorf("%v truncated to %d bytes: got %v, want ErrBadCommand", c, i, err)
			}
		}
	}
	if _, err := Decode(append(cmds[0].Encode(nil), 0)); !errors.Is(err, ErrBadCommand) {
		t.Errorf("trailing byte: got %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(Command{Kind: Move, Member: "a", To: "b", P: 1, Epoch: 2}.Encode(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Decode(b)
		if err != nil {
			return
		}
		if got, err := Decode(c.Encode(nil)); err != nil || got != c {
			t.Fatalf("decoded %v does not round-trip: %v %v", c, got, err)
		}
		_ = NewTable(4).Apply(c) // never panics
	})
}

// TestImports pins what the protocol may depend on: nothing that does I/O
// or runs goroutines of its own.
func TestImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		mod := strings.HasPrefix(dep, "github.com/ringlimit/ringlimit/") && dep != "github.com/ringlimit/ringlimit/peer/internal/ownership"
		io := dep == "net" || strings.HasPrefix(dep, "net/")
		for _, p := range []string{"go.etcd.io/", "github.com/hashicorp/", "google.golang.org/grpc"} {
			io = io || strings.HasPrefix(dep, p)
		}
		if mod || io {
			t.Errorf("ownership depends on %s", dep)
		}
	}
}
