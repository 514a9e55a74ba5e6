package peer

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/ringlimit/ringlimit/peer/internal/transport"
	"github.com/ringlimit/ringlimit/peer/internal/wire"
	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// TestPeerResetNeedsProof sends peer resets as an authenticated peer
// that did not authorize them (issue 53 item 6: with a captured token a
// framed pipe ran a peer OP_RESET without the admin token; tokens are
// fresh now, TestCallTokenReplayOverGRPC and TestHelloReplay): on a framed
// pipe, on a unary Limiter.Check without a proof or with another key's, a
// peer reset is refused and the key keeps its admissions. A reset
// forwarded by the member that authorized it (Node.Reset through n0)
// still clears it.
func TestPeerResetNeedsProof(t *testing.T) {
	pols := map[string]PolicyConfig{"p": {Limit: 3, Window: time.Minute}}
	c := startCluster(t, 2, Config{Policies: pols, PeerSecret: []byte("s3cret")})
	n0, n1 := c.nodes[0], c.nodes[1]
	key := pmKeyOwnedBy(t, n0, "p", "n1")
	other := key
	other.Subject += "-other"
	var session [8]byte
	session[0] = 0xaa
	calls := uint64(0)
	token := func() string {
		calls++
		return n0.ops.auth.CallTokenForTest("/ringlimit.v1.Limiter/Check", "n1", session, calls)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 3 {
		if d, err := n0.Allow(ctx, Request{Key: key}); err != nil || !d.Allowed || d.Owner != "n1" {
			t.Fatalf("Allow through n0 = %+v, %v; want admitted by n1", d, err)
		}
	}
	full := func(when string) {
		t.Helper()
		runs, _ := n1.ExportForTest(key)
		var held int64
		for _, r := range runs {
			held += int64(r.Count)
		}
		if held != 3 {
			t.Fatalf("%s: n1's log of the key = %v, want its 3 admissions (nothing reset)", when, runs)
		}
	}
	wireKey := &peerpb.Key{Tenant: key.Tenant, Subject: key.Subject, Policy: key.Policy}
	resetItem := &peerpb.CheckItem{Key: wireKey, Op: peerpb.Op_OP_RESET}

	// A framed pipe carries no proof.
	fc, err := transport.Dial(ctx, n1.RPCAddr(), transport.KindCheck, n0.ops.auth.PipeCredential("n1"), nil)
	if err != nil {
		t.Fatalf("framed dial as n0: %v", err)
	}
	defer fc.Close()
	st := transport.NewStream[peerpb.CheckResponse, peerpb.CheckRequest](fc, ctx, false, nil)
	if err := st.Send(&peerpb.CheckRequest{Sender: "n0", Id: 1, ItemsPacked: append([]byte{1}, wire.AppendItem(nil, resetItem)...)}); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatalf("answer on the framed pipe: %v", err)
	}
	ds := make([]wire.Decision, 1)
	err = wire.DecodeDecisions(resp.GetDecisionsPacked(), 1, "n1", ds)
	if err != nil || ds[0].Status != peerpb.Status_STATUS_INVALID_ARGUMENT {
		t.Errorf("peer reset on a framed pipe with the captured token = %+v, %v; want refused (STATUS_INVALID_ARGUMENT)", ds, err)
	}
	full("after a reset on a framed pipe")

	// Over gRPC with the token, without a proof or with another key's.
	lim := peerpb.NewLimiterClient(dialTest(t, n1.RPCAddr()))
	for _, tc := range []struct {
		name string
		md   []string
	}{
		{"token only", []string{transport.CallTokenKey, token()}},
		{"another key's proof", []string{transport.CallTokenKey, token(), transport.ResetProofKey, n1.ops.auth.ResetProof(resetProofInput(other))}},
		{"a made-up proof", []string{transport.CallTokenKey, token(), transport.ResetProofKey, token()}},
	} {
		resp, err := lim.Check(metadata.AppendToOutgoingContext(ctx, tc.md...), &peerpb.CheckRequest{Sender: "n0", Items: []*peerpb.CheckItem{resetItem}})
		if err != nil || len(resp.GetDecisions()) != 1 || resp.GetDecisions()[0].GetStatus() != peerpb.Status_STATUS_INVALID_ARGUMENT {
			t.Errorf("peer reset over gRPC, %s = %v, %v; want refused (STATUS_INVALID_ARGUMENT)", tc.name, resp, err)
		}
		full("after a reset over gRPC, " + tc.name)
	}

	// The member that authorized the reset forwards it with its proof.
	if d, err := n0.Reset(ctx, key); err != nil || d.Reason != ReasonReset || d.Owner != "n1" {
		t.Fatalf("Reset through n0 = %+v, %v; want reset by n1", d, err)
	}
	if runs, _ := n1.ExportForTest(key); len(runs) != 0 {
		t.Errorf("n1's log of the key after an authorized reset = %v, want empty", runs)
	}
}
