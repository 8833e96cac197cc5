package cronoq

import (
	"sync"

	"cronoq.dev/cronoq/pb"
)

// outbox writes a stream's messages on a goroutine of its own, so that
// neither the session's loop nor a handler waits for gRPC flow control; what
// queues while a write is under way goes out as one batch (at most 512
// messages, within half of max_message_bytes), as the Python worker does.
type outbox struct {
	stream pb.Workers_WorkClient

	mu       sync.Mutex
	queue    []*pb.WorkerMessage
	limit    int
	closing  bool // half-close once the queue is written
	stopped  bool
	wake     chan struct{}
	finished chan struct{}
}

func newOutbox(stream pb.Workers_WorkClient) *outbox {
	return &outbox{stream: stream, limit: 4 << 20, wake: make(chan struct{}, 1), finished: make(chan struct{})}
}

func (o *outbox) setLimit(bytes int) {
	o.mu.Lock()
	o.limit = bytes
	o.mu.Unlock()
}

func (o *outbox) send(message *pb.WorkerMessage) {
	o.mu.Lock()
	if !o.closing && !o.stopped {
		o.queue = append(o.queue, message)
	}
	o.mu.Unlock()
	o.poke()
}

// closeSend half-closes the stream after what is queued.
func (o *outbox) closeSend() {
	o.mu.Lock()
	o.closing = true
	o.mu.Unlock()
	o.poke()
}

// stop drops what is queued: the stream is over.
func (o *outbox) stop() {
	o.mu.Lock()
	o.stopped, o.queue = true, nil
	o.mu.Unlock()
	o.poke()
}

func (o *outbox) poke() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

func size(m *pb.WorkerMessage) int {
	return 32 + len(m.GetComplete().GetOutput()) + len(m.GetCheckpoint().GetData()) + len(m.GetFail().GetMessage())
}

func (o *outbox) run() {
	defer close(o.finished)
	for range o.wake {
		for {
			o.mu.Lock()
			if o.stopped {
				o.mu.Unlock()
				return
			}
			if len(o.queue) == 0 {
				closing := o.closing
				o.mu.Unlock()
				if closing {
					_ = o.stream.CloseSend()
					return
				}
				break
			}
			var messages []*pb.WorkerMessage
			total := 0
			for len(o.queue) > 0 && len(messages) < batchLimit {
				bytes := size(o.queue[0])
				if len(messages) > 0 && total+bytes > o.limit/2 {
					break
				}
				messages = append(messages, o.queue[0])
				o.queue = o.queue[1:]
				total += bytes
			}
			o.mu.Unlock()
			message := messages[0]
			if len(messages) > 1 {
				message = &pb.WorkerMessage{Msg: &pb.WorkerMessage_Batch{Batch: &pb.WorkerBatch{Messages: messages}}}
			}
			if err := o.stream.Send(message); err != nil {
				// The stream broke: Recv reports why.
				return
			}
		}
	}
}
