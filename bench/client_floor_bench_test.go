package bench

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"runtime"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
)

// The floors under the client paths that are not Go's routed client: one
// call and its answer with nothing behind it, over the same loopback and
// the same libraries as BenchmarkUnaryAllow, BenchmarkShouldRateLimit
// (envoyrls) and BenchmarkHTTPCheck (cmd/ringlimit). callers=1 is one call
// at a time (ns/op its latency); callers=64 runs through runTimed (ops/s,
// p50-ns, p99-ns, cpu-ns/op and mallocs/op of the process: client and
// server).

// BenchmarkGRPCUnaryFloor is one gRPC unary call (grpc-go's test service,
// UnaryCall with a 64-byte payload each way) and its answer.
func BenchmarkGRPCUnaryFloor(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(srv, unaryEcho{})
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	b.Cleanup(func() {
		srv.Stop()
		<-served
	})
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	cl := testgrpc.NewTestServiceClient(conn)
	req := &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: make([]byte, 64)}}
	call := func(ctx context.Context, _ int) error {
		_, err := cl.UnaryCall(ctx, req)
		return err
	}
	b.Run("callers=1", func(b *testing.B) {
		b.ReportAllocs()
		ctx := context.Background()
		cpu0 := processCPU()
		for b.Loop() {
			if err := call(ctx, 0); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	})
	b.Run("callers=64", func(b *testing.B) {
		runTimed(b, max(1, 64/runtime.GOMAXPROCS(0)), call)
	})
}

// unaryEcho answers UnaryCall with the request's payload.
type unaryEcho struct {
	testgrpc.UnimplementedTestServiceServer
}

func (unaryEcho) UnaryCall(_ context.Context, req *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{Payload: req.GetPayload()}, nil
}

// BenchmarkHTTPFloor is one HTTP/1.1 POST with keep-alive (a 60-byte JSON
// body) answered by a handler that reads the body and writes a fixed
// 150-byte JSON answer, through net/http's client and server.
func BenchmarkHTTPFloor(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	answer := bytes.Repeat([]byte("x"), 150)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	})}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { _ = srv.Close() })
	tr := &http.Transport{MaxIdleConns: 128, MaxIdleConnsPerHost: 128}
	b.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}
	url := "http://" + ln.Addr().String() + "/v1/check"
	body := []byte(`{"tenant":"bench","subject":"user-00000042","policy":"bench"}`)
	call := func(ctx context.Context, _ int) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		// Read as BenchmarkHTTPCheck reads its answers.
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		return err
	}
	b.Run("callers=1", func(b *testing.B) {
		b.ReportAllocs()
		ctx := context.Background()
		cpu0 := processCPU()
		for b.Loop() {
			if err := call(ctx, 0); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
	})
	b.Run("callers=64", func(b *testing.B) {
		runTimed(b, max(1, 64/runtime.GOMAXPROCS(0)), call)
	})
}
