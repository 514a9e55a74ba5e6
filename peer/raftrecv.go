package peer

import "sync/atomic"

// raftReceived counts the ownership log's messages as they arrive on this
// node's gRPC port, before the log's goroutine reads (or sheds) them:
// RaftTraffic's received side, beside the transport's sent one, so that
// the log's cost is counted apart from the data plane in both directions.
type raftReceived struct {
	msgs, bytes atomic.Uint64
}

// counting returns deliver, counting each message it is handed.
func (r *raftReceived) counting(deliver func(msg []byte)) func(msg []byte) {
	return func(msg []byte) {
		r.msgs.Add(1)
		r.bytes.Add(uint64(len(msg)))
		deliver(msg)
	}
}
