package membership

import (
	"net"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// TestOtherClaimant checks which entries under this node's name a join's
// state exchange may carry without another member holding the name: its
// own address, a member that left, and a suspect or dead one whose
// address accepts nothing. An alive one at another address is a
// claimant, and so is a suspect or dead one whose address accepts.
func TestOtherClaimant(t *testing.T) {
	node := func(name, addr string, state memberlist.NodeStateType) *memberlist.Node {
		host, port, _ := net.SplitHostPort(addr)
		p, _ := net.LookupPort("tcp", port)
		return &memberlist.Node{Name: name, Addr: net.ParseIP(host), Port: uint16(p), State: state}
	}
	const self, selfAddr, other = "n1", "127.0.0.1:7001", "127.0.0.1:7002"
	for _, tc := range []struct {
		name      string
		peer      *memberlist.Node
		reachable bool
		want      bool
	}{
		{"another name", node("n0", other, memberlist.StateAlive), true, false},
		{"this node's own address", node(self, selfAddr, memberlist.StateAlive), true, false},
		{"alive elsewhere", node(self, other, memberlist.StateAlive), false, true},
		{"left", node(self, other, memberlist.StateLeft), true, false},
		{"suspect, reachable", node(self, other, memberlist.StateSuspect), true, true},
		{"suspect, unreachable", node(self, other, memberlist.StateSuspect), false, false},
		{"dead, reachable", node(self, other, memberlist.StateDead), true, true},
		{"dead, unreachable", node(self, other, memberlist.StateDead), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var asked []string
			got := otherClaimant(self, selfAddr, []*memberlist.Node{tc.peer}, func(addr string) bool {
				asked = append(asked, addr)
				return tc.reachable
			})
			if (got != nil) != tc.want {
				t.Fatalf("otherClaimant = %v, want a claimant: %v", got, tc.want)
			}
			if len(asked) > 0 && asked[0] != other {
				t.Fatalf("reachability asked of %v, want %s", asked, other)
			}
		})
	}

	// The real check: a listening port accepts; a closed one refuses.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	live := ln.Addr().String()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := closed.Addr().String()
	_ = closed.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	defer ln.Close()
	if got := OtherClaimant(self, selfAddr, []*memberlist.Node{node(self, live, memberlist.StateDead)}, time.Second); got == nil {
		t.Errorf("a dead entry whose address accepts connections is no claimant")
	}
	if got := OtherClaimant(self, selfAddr, []*memberlist.Node{node(self, gone, memberlist.StateDead)}, time.Second); got != nil {
		t.Errorf("a dead entry whose address refuses connections is a claimant")
	}
}
