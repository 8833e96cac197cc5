package cronoq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand"
	"os"
	"runtime/debug"
	"time"

	"cronoq.dev/cronoq/pb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Handler runs one lease. Its context is cancelled when the attempt is given
// up (Lease.AbortReason says why). It returns the task's output ([]byte as
// it is, a string as text, an Output as given, anything else as JSON), or an
// error: a *RetryableError, *PermanentError, *RejectError or *CancelledError
// (see Retry, Permanent, Reject, Cancel) as that outcome, any other as a
// retryable failure with its message. A panic is a retryable failure too.
type Handler func(ctx context.Context, lease *Lease) (any, error)

// ConnectInfo describes a registered stream.
type ConnectInfo struct {
	WorkerID uint64
	Slots    uint32
	LeaseTTL time.Duration
	Target   string
}

// Options configure RunWorker.
type Options struct {
	Target       string // host:port, or an http:// or https:// URL
	Pool         string
	Slots        uint32 // leases to run at once (the server may grant fewer); 0: 1
	Token        string // a worker token, sent as "authorization: Bearer <token>"
	Labels       map[string]string
	Name         string        // shown in the server's worker list; "": go-<pid>
	DrainTimeout time.Duration // what running handlers get once ctx ends; 0: 30 s
	TLS          *tls.Config   // nil: TLS only for https:// targets (system roots)
	// Reconnection delays; 0: 200 ms and 10 s.
	InitialBackoff, MaxBackoff time.Duration
	OnConnect                  func(ConnectInfo) // called once each stream is registered
	Logger                     *log.Logger       // nil: warnings to stderr
}

// Status codes that retrying cannot fix: RunWorker returns them.
var fatal = map[codes.Code]bool{codes.Unauthenticated: true, codes.PermissionDenied: true, codes.NotFound: true,
	codes.FailedPrecondition: true, codes.InvalidArgument: true, codes.Unimplemented: true}

const batchLimit = 512

// RunWorker serves opts.Pool until ctx ends, then drains: no new leases,
// running handlers get DrainTimeout, what still runs is aborted and failed
// as retryable; it returns nil then. It returns an error for what retrying
// cannot fix (a rejected token, an unknown pool, a protocol version the
// server does not speak) and reconnects with backoff after anything else.
func RunWorker(ctx context.Context, opts Options, handler Handler) error {
	if handler == nil {
		return errors.New("cronoq: RunWorker needs a handler")
	}
	if opts.Slots == 0 {
		opts.Slots = 1
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = 30 * time.Second
	}
	if opts.InitialBackoff <= 0 {
		opts.InitialBackoff = 200 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 10 * time.Second
	}
	if opts.Name == "" {
		opts.Name = fmt.Sprintf("go-%d", os.Getpid())
	}
	if opts.Logger == nil {
		opts.Logger = log.New(os.Stderr, "cronoq worker: ", log.LstdFlags)
	}
	address, dial, err := dialOptions(opts.Target, opts.TLS)
	if err != nil {
		return err
	}
	conn, err := grpc.Dial(address, dial...)
	if err != nil {
		return err
	}
	defer conn.Close()
	client := pb.NewWorkersClient(conn)
	backoff := opts.InitialBackoff
	for ctx.Err() == nil {
		s := &session{opts: &opts, handler: handler, stop: ctx}
		err := s.serve(client)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			if code := status.Code(err); fatal[code] {
				return fmt.Errorf("cronoq: pool %q: %w", opts.Pool, err)
			}
			opts.Logger.Printf("the stream for pool %s ended: %v", opts.Pool, err)
		}
		if s.registered {
			backoff = opts.InitialBackoff
		}
		delay := time.Duration(float64(backoff) * (0.5 + rand.Float64()/2))
		if s.notLeader {
			delay = 0
		} else if backoff *= 2; backoff > opts.MaxBackoff {
			backoff = opts.MaxBackoff
		}
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
	}
	return nil
}

type checkpointRequest struct {
	lease   *Lease
	message *pb.Checkpoint
	reply   chan string
}

type handlerDone struct {
	lease   *Lease
	message *pb.WorkerMessage
}

// session is one stream's state, owned by the goroutine running serve;
// handlers talk to it through channels.
type session struct {
	opts    *Options
	handler Handler
	stop    context.Context

	registered, shut, notLeader, draining, checkpointsOn bool
	granted                                              int
	leaseTTL                                             time.Duration
	held                                                 map[uint64]*Lease // running or waiting for a slot
	waiting                                              []*Lease          // oldest first
	active                                               map[*Lease]bool   // handlers not yet returned (aborted ones too)
	seq                                                  uint64
	saving                                               map[uint64]chan string

	out         *outbox
	done        chan handlerDone
	checkpoints chan checkpointRequest
	closed      chan struct{} // closed when the session ends
}

// serve runs one stream from Register to its end: nil for an orderly end
// (Shutdown, a drain, the server's OK), else the error it ended with.
func (s *session) serve(client pb.WorkersClient) error {
	s.held, s.active, s.saving = map[uint64]*Lease{}, map[*Lease]bool{}, map[uint64]chan string{}
	s.done, s.checkpoints, s.closed = make(chan handlerDone), make(chan checkpointRequest), make(chan struct{})
	streamCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if s.opts.Token != "" {
		streamCtx = metadata.AppendToOutgoingContext(streamCtx, "authorization", "Bearer "+s.opts.Token)
	}
	stream, err := client.Work(streamCtx)
	if err != nil {
		return err
	}
	s.out = newOutbox(stream)
	go s.out.run()
	incoming := make(chan *pb.ServerMessage)
	var readErr error
	go func() {
		defer close(incoming)
		for {
			message, err := stream.Recv()
			if err != nil {
				readErr = err
				return
			}
			select {
			case incoming <- message:
			case <-s.closed:
				return
			}
		}
	}()
	defer s.end()
	if s.stop.Err() != nil {
		return nil
	}
	s.out.send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Register{Register: &pb.Register{
		Pool: s.opts.Pool, Slots: s.opts.Slots, WorkerName: s.opts.Name, ProtocolVersion: ProtocolVersion,
		Labels: s.opts.Labels, AcceptBatches: true, AcceptCheckpoints: true}}})

	var heartbeats <-chan time.Time
	var drainTimer <-chan time.Time
	stopping := s.stop.Done()
	for {
		select {
		case message, ok := <-incoming:
			if !ok {
				if readErr == io.EOF {
					return nil
				}
				return readErr
			}
			messages := []*pb.ServerMessage{message}
			if batch := message.GetBatch(); batch != nil {
				messages = batch.Messages
			}
			for _, m := range messages {
				if !s.registered {
					registered := m.GetRegistered()
					if registered == nil {
						return fmt.Errorf("cronoq: the server answered Register with %T", m.Msg)
					}
					s.onRegistered(registered)
					ticker := time.NewTicker(maxDuration(s.leaseTTL/3, 50*time.Millisecond))
					defer ticker.Stop()
					heartbeats = ticker.C
					continue
				}
				if s.receive(m) {
					return nil
				}
			}
		case <-heartbeats:
			for id := range s.held {
				s.out.send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Heartbeat{Heartbeat: &pb.Heartbeat{Lease: id}}})
			}
		case finished := <-s.done:
			s.handlerEnded(finished)
			if s.draining && len(s.active) == 0 && drainTimer != nil {
				return s.finishDrain(incoming)
			}
		case request := <-s.checkpoints:
			s.saveCheckpoint(request)
		case <-stopping:
			stopping = nil
			if !s.registered {
				return nil
			}
			s.startDrain()
			if len(s.active) == 0 {
				return s.finishDrain(incoming)
			}
			drainTimer = time.After(s.opts.DrainTimeout)
		case <-drainTimer:
			return s.finishDrain(incoming)
		}
	}
}

func maxDuration(a, b time.Duration) time.Duration {
	if a > b {
		return a
	}
	return b
}

func (s *session) onRegistered(m *pb.Registered) {
	s.registered = true
	s.leaseTTL = time.Duration(m.LeaseTtlS * float64(time.Second))
	if s.leaseTTL <= 0 {
		s.leaseTTL = 30 * time.Second
	}
	s.granted = int(m.Slots)
	if m.MaxMessageBytes > 0 {
		s.out.setLimit(int(m.MaxMessageBytes))
	}
	s.checkpointsOn = m.Checkpoints
	if s.opts.OnConnect != nil {
		s.opts.OnConnect(ConnectInfo{WorkerID: m.WorkerId, Slots: m.Slots, LeaseTTL: s.leaseTTL, Target: s.opts.Target})
	}
}

// receive acts on one message from the server; true at Shutdown.
func (s *session) receive(m *pb.ServerMessage) bool {
	switch msg := m.Msg.(type) {
	case *pb.ServerMessage_Lease:
		lease := newLease(msg.Lease, s.leaseTTL, s)
		if s.draining {
			// Sent before the server saw SetSlots 0: give it back unrun.
			s.nack(lease.ID, "the worker is draining")
			return false
		}
		s.held[lease.ID] = lease
		s.waiting = append(s.waiting, lease)
		s.startWaiting()
	case *pb.ServerMessage_Abort:
		if lease, ok := s.held[msg.Abort.Lease]; ok {
			delete(s.held, lease.ID)
			s.unwait(lease)
			reason, known := abortReasons[msg.Abort.Code]
			if !known {
				reason = AbortUnknown
			}
			lease.abort(reason)
		}
		if msg.Abort.Code == pb.AbortReason_ABORT_REASON_LEASE_EXPIRED {
			// The server heard nothing from us for a lease TTL (a pause): any
			// message shows it this worker is alive again (rule 11).
			s.out.send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Heartbeat{Heartbeat: &pb.Heartbeat{Lease: msg.Abort.Lease}}})
		}
	case *pb.ServerMessage_CheckpointSaved:
		if reply, ok := s.saving[msg.CheckpointSaved.Seq]; ok {
			delete(s.saving, msg.CheckpointSaved.Seq)
			reply <- msg.CheckpointSaved.Error
		}
	case *pb.ServerMessage_SlotsGranted:
		s.granted = int(msg.SlotsGranted.Slots)
		s.startWaiting()
	case *pb.ServerMessage_Shutdown:
		s.shut = true
		s.notLeader = msg.Shutdown.NotLeader
		s.opts.Logger.Printf("the server asked this worker to go (%s)", msg.Shutdown.Reason)
		return true
	}
	return false
}

func (s *session) unwait(lease *Lease) {
	for i, waiting := range s.waiting {
		if waiting == lease {
			s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
			return
		}
	}
}

func (s *session) nack(id uint64, reason string) {
	s.out.send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Nack{Nack: &pb.Nack{Lease: id, Reason: reason}}})
}

// startWaiting starts waiting leases while fewer handlers run than the
// granted slots (an aborted handler that has not returned still holds one).
func (s *session) startWaiting() {
	for len(s.waiting) > 0 && len(s.active) < s.granted && !s.draining {
		lease := s.waiting[0]
		s.waiting = s.waiting[1:]
		s.active[lease] = true
		go s.run(lease)
	}
}

func (s *session) run(lease *Lease) {
	message := s.call(lease)
	lease.cancel() // its context ends with the handler (AbortReason stays "")
	select {
	case s.done <- handlerDone{lease: lease, message: message}:
	case <-s.closed:
	}
}

// call runs the handler and turns what it returned into the outcome.
func (s *session) call(lease *Lease) (message *pb.WorkerMessage) {
	defer func() {
		if problem := recover(); problem != nil {
			message = &pb.WorkerMessage{Msg: &pb.WorkerMessage_Fail{Fail: &pb.Fail{Lease: lease.ID,
				Message: cleanMessage(fmt.Sprintf("panic: %v", problem)), Traceback: cleanMessage(string(debug.Stack()))}}}
		}
	}()
	value, err := s.handler(lease.ctx, lease)
	if err != nil {
		return failure(lease, err)
	}
	output, kind, err := encode(value)
	if err != nil {
		return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Fail{Fail: &pb.Fail{Lease: lease.ID, Permanent: true,
			Message: cleanMessage("the handler's output: " + err.Error())}}}
	}
	return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Complete{Complete: &pb.Complete{Lease: lease.ID, Output: output,
		ContentType: kind}}}
}

// failure is the outcome message for an error a handler returned.
func failure(lease *Lease, err error) *pb.WorkerMessage {
	var reject *RejectError
	var cancelled *CancelledError
	var retryable *RetryableError
	var permanent *PermanentError
	switch {
	case errors.As(err, &reject):
		return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Nack{Nack: &pb.Nack{Lease: lease.ID, Reason: cleanMessage(reject.Reason)}}}
	case errors.As(err, &cancelled):
		return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Cancelled{Cancelled: &pb.Cancelled{Lease: lease.ID,
			Message: cleanMessage(cancelled.Message)}}}
	case errors.As(err, &permanent):
		return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Fail{Fail: &pb.Fail{Lease: lease.ID, Permanent: true,
			Message: cleanMessage(permanent.Message)}}}
	case errors.As(err, &retryable):
		fail := &pb.Fail{Lease: lease.ID, Message: cleanMessage(retryable.Message)}
		if retryable.RetryAfter > 0 {
			seconds := retryable.RetryAfter.Seconds()
			fail.RetryAfterS = &seconds
		}
		return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Fail{Fail: fail}}
	}
	return &pb.WorkerMessage{Msg: &pb.WorkerMessage_Fail{Fail: &pb.Fail{Lease: lease.ID, Message: cleanMessage(err.Error())}}}
}

func (s *session) handlerEnded(finished handlerDone) {
	delete(s.active, finished.lease)
	lease := finished.lease
	if s.held[lease.ID] == lease {
		delete(s.held, lease.ID)
		if !lease.aborted() && !s.shut {
			s.out.send(finished.message)
		}
	}
	s.startWaiting()
}

func (s *session) saveCheckpoint(request checkpointRequest) {
	if !s.checkpointsOn {
		request.reply <- "the server does not keep checkpoints for this worker (upgrade the server)"
		return
	}
	if s.held[request.lease.ID] != request.lease {
		request.reply <- "the lease is no longer held: the attempt was given up"
		return
	}
	s.seq++
	request.message.Seq = s.seq
	s.saving[s.seq] = request.reply
	s.out.send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Checkpoint{Checkpoint: request.message}})
}

// startDrain: take no more leases, give back those not started.
func (s *session) startDrain() {
	s.draining = true
	s.out.send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_SetSlots{SetSlots: &pb.SetSlots{Slots: 0}}})
	for _, lease := range s.waiting {
		delete(s.held, lease.ID)
		s.nack(lease.ID, "the worker is draining")
	}
	s.waiting = nil
}

// finishDrain fails what still runs, half-closes once the queued reports are
// written, and waits (5 s at most) for the server to end the stream.
func (s *session) finishDrain(incoming <-chan *pb.ServerMessage) error {
	for id, lease := range s.held {
		delete(s.held, id)
		lease.abort(AbortShutdown)
		s.out.send(&pb.WorkerMessage{Msg: &pb.WorkerMessage_Fail{Fail: &pb.Fail{Lease: id,
			Message: "the worker stopped before the attempt finished"}}})
	}
	s.out.closeSend()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-incoming:
			if !ok {
				return nil
			}
		case request := <-s.checkpoints:
			request.reply <- "the worker is stopping: the checkpoint was not saved"
		case finished := <-s.done:
			delete(s.active, finished.lease)
		case <-timeout:
			return nil
		}
	}
}

// end: the stream is over; leases still held are aborted, unconfirmed
// checkpoints fail, nothing more is sent.
func (s *session) end() {
	reason := AbortDisconnected
	if s.shut || s.stop.Err() != nil {
		reason = AbortShutdown
	}
	for id, lease := range s.held {
		delete(s.held, id)
		lease.abort(reason)
	}
	for seq, reply := range s.saving {
		delete(s.saving, seq)
		reply <- "the worker's stream ended before the server confirmed the checkpoint"
	}
	close(s.closed)
	if s.out != nil {
		s.out.stop()
	}
}
