package peer

import (
	"errors"
	"io"
	"sync"
	"sync/atomic"

	"github.com/ringlimit/ringlimit/peer/peerpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// replAnswerDepth bounds a ReplicateStream's answers waiting for the data
// directory (and so the requests applied ahead of their answers). A
// holder keeps at most MaxInFlight messages out; past the bound the
// stream stops reading until an answer is sent.
const replAnswerDepth = 8

// ReplicateStream is the backup's side of a holder's replication pipe:
// requests are applied one after another in arrival order, through
// Replicate; their answers are sent in the same order, each once its
// records are on disk (replAnswers: the next request is applied while
// the data directory syncs, so its records join the next fsync).
func (s *limiterService) ReplicateStream(st peerpb.Limiter_ReplicateStreamServer) error {
	ra := newReplAnswers(s.n, st)
	defer ra.close()
	for {
		if err := ra.failed(); err != nil {
			return err
		}
		req, err := st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return ra.close()
			}
			return err
		}
		if drop := s.n.hooks.replDrop.Load(); drop != nil && (*drop)(req) {
			continue
		}
		sc := ra.scratch()
		var idx uint64
		resp, err := s.replicate(req, sc, &idx)
		if err != nil {
			st := status.Convert(err)
			resp = &peerpb.ReplicateResponse{Code: int32(st.Code()), Error: st.Message()}
		}
		resp.Id = req.GetId()
		if err := ra.answer(sc, resp, idx); err != nil {
			return err
		}
	}
}

// replAnswers sends a ReplicateStream's answers in the order of their
// requests. An answer whose operations logged a record the backup must
// have on disk first (durability disk) is handed to a sender goroutine,
// which waits for the record's fsync and sends it, while the stream
// applies the next request: that request's records are appended during
// the fsync and share the next one (group commit across messages, as a
// backup answering each message after its own fsync in turn paid one
// whole fsync per message in a queue). An answer waiting for nothing,
// with no answer ahead of it, is sent at once by the stream itself, as
// before; a node without a data directory never starts the sender.
//
// Each answer lives in its own scratch (the packed results and the
// response) until it is sent: at most replAnswerDepth of them.
type replAnswers struct {
	n  *Node
	st peerpb.Limiter_ReplicateStreamServer
	// free holds the scratches not in use; made counts those made.
	free chan *replScratch
	made int
	// q feeds the sender; nil until the first answer that waits.
	q    chan replAnswer
	done chan struct{}
	// pending counts answers handed to the sender and not yet sent.
	pending atomic.Int32
	mu      sync.Mutex
	err     error // the first failed send
	closed  bool
}

type replAnswer struct {
	sc   *replScratch
	resp *peerpb.ReplicateResponse
	idx  uint64 // the data directory record to sync first (0: none)
}

func newReplAnswers(n *Node, st peerpb.Limiter_ReplicateStreamServer) *replAnswers {
	return &replAnswers{n: n, st: st, free: make(chan *replScratch, replAnswerDepth)}
}

// scratch returns a scratch for the next answer, waiting for one to be
// sent when replAnswerDepth are in use.
func (ra *replAnswers) scratch() *replScratch {
	select {
	case sc := <-ra.free:
		return sc
	default:
	}
	if ra.made < replAnswerDepth {
		ra.made++
		return new(replScratch)
	}
	return <-ra.free
}

// answer sends resp (in sc's memory) once record idx is on disk, after
// every earlier answer. It returns a failed send's error.
func (ra *replAnswers) answer(sc *replScratch, resp *peerpb.ReplicateResponse, idx uint64) error {
	if idx == 0 && ra.pending.Load() == 0 {
		// Nothing ahead of it (the sender has finished its last send).
		err := ra.st.Send(resp)
		ra.free <- sc
		return err
	}
	if ra.q == nil {
		ra.q = make(chan replAnswer, replAnswerDepth)
		ra.done = make(chan struct{})
		go ra.send()
	}
	ra.pending.Add(1)
	ra.q <- replAnswer{sc: sc, resp: resp, idx: idx}
	return nil
}

// send is the sender goroutine: owned by the stream, it ends when close
// closes q.
func (ra *replAnswers) send() {
	defer close(ra.done)
	for a := range ra.q {
		resp := a.resp
		if a.idx != 0 {
			// Every operation's replica on disk before any is
			// acknowledged: a failed write answers none (the holder
			// copies the partitions again, or fails sync admissions).
			if err := ra.n.dd.sync(a.idx); err != nil {
				st := status.New(codes.Unavailable, err.Error())
				resp = &peerpb.ReplicateResponse{Id: a.resp.GetId(), Code: int32(st.Code()), Error: st.Message()}
			}
		}
		if ra.failed() == nil {
			if err := ra.st.Send(resp); err != nil {
				ra.mu.Lock()
				ra.err = err
				ra.mu.Unlock()
			}
		}
		ra.free <- a.sc
		ra.pending.Add(-1)
	}
}

// failed returns the sender's failed send, if any.
func (ra *replAnswers) failed() error {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	return ra.err
}

// close waits until every answer handed over is sent (or dropped after a
// failed send) and stops the sender; it returns a failed send's error.
func (ra *replAnswers) close() error {
	if ra.q != nil && !ra.closed {
		ra.closed = true
		close(ra.q)
		<-ra.done
	}
	return ra.failed()
}
