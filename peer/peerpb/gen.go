// Package peerpb holds the gRPC wire protocol between ringlimit nodes: the
// Limiter service (Check, Handoff, Pull, Backup) and its messages, defined in
// ringlimit.proto (protobuf package ringlimit.v1).
//
// Everything except this file and ringlimit.proto is generated; never edit
// ringlimit.pb.go or ringlimit_grpc.pb.go by hand. The proto file documents
// the units and meaning of every field. Package peer translates between these
// messages and its own types; nothing else should import this package.
//
// To regenerate, run `go generate` in this directory with these exact tools on
// PATH, so that the output matches the committed files byte for byte:
//
//   - protoc 3.21.12 (Debian bookworm package protobuf-compiler
//     3.21.12-3+deb12u1; `protoc --version` prints "libprotoc 3.21.12")
//   - protoc-gen-go v1.36.12
//     (go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12)
//   - protoc-gen-go-grpc v1.6.2
//     (go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2)
//
// The generated code needs google.golang.org/protobuf v1.36.12 or later and
// google.golang.org/grpc v1.64.0 or later (grpc.SupportPackageIsVersion9).
package peerpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative ringlimit.proto
