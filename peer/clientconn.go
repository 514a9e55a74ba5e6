package peer

// The client's connections: one per member, each with a stream that
// carries batches of calls and their answers (Client's doc says what the
// protocol is).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/ringlimit/ringlimit/peer/peerpb"
)

// clientConn is the connection and stream to one member.
type clientConn struct {
	c       *Client
	addr    string
	conn    *grpc.ClientConn
	stub    peerpb.RateLimiterClient
	queue   chan *clientCall
	quit    chan struct{} // closed by stop
	once    sync.Once
	stopped chan struct{} // closed when sendLoop has answered everything it took
	st      *clientStream // sendLoop's
}

// clientCall is one request waiting for its answer.
type clientCall struct {
	req  Request
	id   uint64
	done chan clientResult
}

// clientResult is a call's answer: a result, or why there is none.
type clientResult struct {
	res  *peerpb.AllowStreamResult
	sent bool // false: never written to a stream
	err  error
}

func (m *clientConn) stop() { m.once.Do(func() { close(m.quit) }) }

// down reports whether the member's port refused (or did not answer) the
// last attempt to connect: a crashed member that gossip still lists. gRPC
// tries again after its backoff, and the member counts as up from then.
func (m *clientConn) down() bool { return m.conn.GetState() == connectivity.TransientFailure }

// outcome says where a request sent to one member ended.
type outcome uint8

const (
	answered outcome = iota // the member answered (a decision or its error), or the call's ctx ended
	notSent                 // never written to a stream: it may go elsewhere
	lost                    // written, then the stream broke: the member may have decided it
)

// allow sends req on the member's stream and waits for the answer: see
// outcome. A request not answered has an error only when lost.
func (m *clientConn) allow(ctx context.Context, req Request) (Decision, outcome, error) {
	k := m.c.calls.Get().(*clientCall)
	k.req = req
	select {
	case m.queue <- k:
	case <-m.stopped:
		return Decision{}, notSent, nil
	case <-ctx.Done():
		return Decision{}, answered, fmt.Errorf("%w: %w", ErrUnavailable, ctxErr(ctx))
	}
	var r clientResult
	select {
	case r = <-k.done:
	case <-m.stopped:
		select {
		case r = <-k.done:
		default:
			// Queued after the sender left: never sent. k stays in the
			// queue, so it does not go back to the pool.
			return Decision{}, notSent, nil
		}
	case <-ctx.Done():
		// The answer will land in k.done later: k is not reused.
		return Decision{}, answered, fmt.Errorf("%w: %w", ErrUnavailable, ctxErr(ctx))
	}
	k.req = Request{}
	m.c.calls.Put(k)
	if !r.sent {
		return Decision{}, notSent, nil
	}
	if r.err != nil {
		return Decision{}, lost, r.err
	}
	if r.res.GetCode() != 0 {
		return Decision{}, answered, FromStatus(status.Error(codes.Code(r.res.GetCode()), r.res.GetError()))
	}
	return decisionFromWire(r.res.GetResponse()), answered, nil
}

// sendLoop takes the requests waiting (at least one, at most MaxBatch) and
// sends them as one message on the member's stream, opening it when
// needed. On its way out it breaks the stream (answering everything sent)
// and answers what is still queued as never sent.
func (m *clientConn) sendLoop() {
	defer m.c.wg.Done()
	defer func() {
		if m.st != nil {
			m.st.fail(fmt.Errorf("%w: connection to %s closed", ErrUnavailable, m.addr))
			m.st.wg.Wait()
		}
		for {
			select {
			case k := <-m.queue:
				k.done <- clientResult{}
			default:
				close(m.stopped)
				m.conn.Close()
				return
			}
		}
	}()
	batch := make([]*clientCall, 0, 64)
	for {
		batch = batch[:0]
		select {
		case k := <-m.queue:
			batch = append(batch, k)
		case <-m.quit:
			return
		case <-m.c.ctx.Done():
			return
		}
		// A slot first, then whatever queued meanwhile: while the slots
		// are taken, requests gather for the next message.
		st := m.stream()
		if st != nil && !st.acquire(m.quit) {
			// Broke while full, or stopping: the next stream takes them.
			st = nil
			if st = m.stream(); st != nil && !st.acquire(m.quit) {
				st = nil
			}
		}
		// The answer that freed the slot woke its callers; most ask again
		// at once. Letting them run first puts their requests in this
		// message instead of the next, a round trip later.
		runtime.Gosched()
	gather:
		for len(batch) < MaxBatch {
			select {
			case k := <-m.queue:
				batch = append(batch, k)
			default:
				break gather
			}
		}
		if st == nil {
			for _, k := range batch {
				k.done <- clientResult{}
			}
			continue
		}
		st.send(batch)
	}
}

// stream returns a working stream, opening one when there is none; nil
// when none can be opened (the requests then go elsewhere).
func (m *clientConn) stream() *clientStream {
	if m.st != nil {
		if m.st.broken() == nil {
			return m.st
		}
		m.st.wg.Wait()
		m.st = nil
		m.c.kickRefresh()
	}
	ctx, cancel := context.WithCancel(m.c.ctx)
	// Opening waits while the connection is being made, not longer than
	// Timeout, and fails at once when the member's port refuses it (no
	// WaitForReady): a crashed member's requests then go to another
	// member at once instead of waiting out Timeout, batch after batch,
	// for as long as gossip lists it.
	open, openCancel := context.WithTimeout(ctx, m.c.cfg.Timeout)
	defer openCancel()
	type opened struct {
		st  peerpb.RateLimiter_AllowStreamClient
		err error
	}
	ch := make(chan opened, 1)
	go func() {
		st, err := m.stub.AllowStream(ctx)
		ch <- opened{st, err}
	}()
	var o opened
	select {
	case o = <-ch:
	case <-open.Done():
		cancel() // makes AllowStream return
		<-ch
		return nil
	}
	if o.err != nil {
		cancel()
		return nil
	}
	s := &clientStream{st: o.st, cancel: cancel, pending: map[uint64]pendingCall{},
		slots: make(chan struct{}, streamInFlight), broke: make(chan struct{})}
	s.wg.Add(1)
	go s.receive()
	m.st = s
	return s
}

// clientStream is one AllowStream call: sendLoop sends, receive matches
// answers to calls by id.
type clientStream struct {
	st     peerpb.RateLimiter_AllowStreamClient
	cancel context.CancelFunc
	wg     sync.WaitGroup // receive

	// slots holds one token per message in flight (answers still due),
	// at most streamInFlight: while they are all taken, requests queue
	// and leave together in the next message. broke is closed by fail.
	slots chan struct{}
	broke chan struct{}

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]pendingCall
	err     error // why the stream broke; nil while it works
}

// pendingCall is a sent call and the message it went in.
type pendingCall struct {
	k   *clientCall
	msg *sentMsg
}

// sentMsg counts a message's answers still due; its slot is freed at 0.
type sentMsg struct{ due int }

// streamInFlight is how many messages a client keeps in flight on one
// stream. While one is out, the requests of concurrent callers gather
// into the next: one write and one read each way per message instead of
// per request. Measured with the side-by-side load test (64 callers,
// synchronous replication): 2 in flight gave the same throughput and
// latency for more CPU per decision.
const streamInFlight = 1

func (s *clientStream) broken() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// acquire takes a slot for a message; false when the stream broke first
// or the member is being stopped.
func (s *clientStream) acquire(quit <-chan struct{}) bool {
	select {
	case s.slots <- struct{}{}:
		return true
	case <-s.broke:
	case <-quit:
	}
	return false
}

// send writes batch as one message, in a slot taken by acquire. Every call
// is answered exactly once: by its result or by the error that broke the
// stream.
func (s *clientStream) send(batch []*clientCall) {
	// One allocation per field kind for the whole message; the calls'
	// requests are read here, before they are registered, so a call
	// answered (and reused) at once is never read again.
	n := len(batch)
	items := make([]peerpb.AllowStreamItem, n)
	reqs := make([]peerpb.AllowRequest, n)
	keys := make([]peerpb.Key, n)
	msg := &peerpb.AllowStreamRequest{Items: make([]*peerpb.AllowStreamItem, n)}
	sm := &sentMsg{due: n}
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		for _, k := range batch {
			k.done <- clientResult{} // never sent
		}
		return
	}
	for i, k := range batch {
		s.nextID++
		k.id = s.nextID
		r := &k.req
		keys[i].Tenant, keys[i].Subject, keys[i].Policy = r.Key.Tenant, r.Key.Subject, r.Key.Policy
		reqs[i].Key, reqs[i].Hits, reqs[i].Policies = &keys[i], r.Hits, r.Policies
		items[i].Id, items[i].Request = k.id, &reqs[i]
		msg.Items[i] = &items[i]
		s.pending[k.id] = pendingCall{k: k, msg: sm}
	}
	s.mu.Unlock()
	if err := s.st.Send(msg); err != nil {
		s.fail(fmt.Errorf("%w: stream: %w", ErrUnavailable, err))
	}
}

// fail breaks the stream with err and answers every waiting call with it.
func (s *clientStream) fail(err error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	s.err = err
	waiting := s.pending
	s.pending = nil
	close(s.broke)
	s.mu.Unlock()
	s.cancel()
	for _, p := range waiting {
		p.k.done <- clientResult{sent: true, err: err}
	}
}

// receive matches results to calls until the stream ends.
func (s *clientStream) receive() {
	defer s.wg.Done()
	for {
		resp, err := s.st.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = errors.New("stream closed by the member")
			}
			s.fail(fmt.Errorf("%w: %w", ErrUnavailable, err))
			return
		}
		for _, res := range resp.GetResults() {
			s.mu.Lock()
			p, ok := s.pending[res.GetId()]
			delete(s.pending, res.GetId())
			free := ok && p.msg.due == 1
			if ok {
				p.msg.due--
			}
			s.mu.Unlock()
			if !ok {
				continue
			}
			if free {
				<-s.slots
			}
			p.k.done <- clientResult{res: res, sent: true}
		}
	}
}

// decisionFromWire converts a RateLimiter answer to a Decision.
func decisionFromWire(r *peerpb.AllowResponse) Decision {
	d := Decision{
		Allowed: r.GetAllowed(), Limit: r.GetLimit(), Remaining: r.GetRemaining(),
		RetryAfter: time.Duration(r.GetRetryAfterNs()), ResetAfter: time.Duration(r.GetResetAfterNs()),
		Reason: Reason(r.GetReason()), Owner: r.GetOwner(), RingVersion: r.GetRingVersion(),
		RefusedBy: r.GetRefusedBy(),
	}
	if ns := r.GetDecidedAtUnixNs(); ns != 0 {
		d.DecidedAt = time.Unix(0, ns)
	}
	for _, l := range r.GetLimits() {
		d.Limits = append(d.Limits, PolicyDecision{Policy: l.GetPolicy(), Allowed: l.GetAllowed(), Limit: l.GetLimit(),
			Remaining: l.GetRemaining(), RetryAfter: time.Duration(l.GetRetryAfterNs()), ResetAfter: time.Duration(l.GetResetAfterNs())})
	}
	return d
}
