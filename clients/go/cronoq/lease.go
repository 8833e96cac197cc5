package cronoq

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"cronoq.dev/cronoq/pb"
)

// Why the server (or this worker) gave an attempt up.
const (
	AbortCancelled    = "cancelled"
	AbortTimeout      = "timeout"
	AbortLeaseExpired = "lease expired"
	AbortShutdown     = "shutdown"
	AbortDisconnected = "disconnected"
	AbortUnknown      = "unknown"
)

var abortReasons = map[pb.AbortReason]string{
	pb.AbortReason_ABORT_REASON_CANCELLED:     AbortCancelled,
	pb.AbortReason_ABORT_REASON_TIMEOUT:       AbortTimeout,
	pb.AbortReason_ABORT_REASON_LEASE_EXPIRED: AbortLeaseExpired,
	pb.AbortReason_ABORT_REASON_SHUTDOWN:      AbortShutdown,
}

// Checkpoint is what a stage saved.
type Checkpoint struct {
	Stage       string
	Data        []byte
	ContentType string
	Attempt     uint32
	Saved       time.Time
}

// JSON parses the checkpoint's data as JSON into v.
func (c Checkpoint) JSON(v any) error { return decodeJSON(c.Data, v) }

// Lease is one attempt of a task, leased to this worker.
type Lease struct {
	ID          uint64
	TaskID      uint64
	Attempt     uint32
	Pool        string
	Payload     []byte
	ContentType string
	Kind        string
	Key         string
	Tags        map[string]string
	Labels      map[string]string
	Priority    string // critical, high, normal or low
	Tenant      string
	Timeout     time.Duration // the server's limit for the attempt; 0: none
	Deadline    time.Time     // zero: none
	LeaseTTL    time.Duration
	Stages      []string // the declared pipeline stages, if any

	ctx    context.Context
	cancel context.CancelFunc
	sess   *session

	mu          sync.Mutex
	abortReason string
	saved       map[string]Checkpoint
}

func newLease(m *pb.Lease, ttl time.Duration, s *session) *Lease {
	l := &Lease{
		ID: m.Lease, TaskID: m.TaskId, Attempt: m.Attempt, Pool: m.Pool, Payload: m.Payload,
		ContentType: m.ContentType, Kind: m.Kind, Key: m.Key, Tags: m.Tags, Labels: m.Labels,
		Priority: strings.ToLower(strings.TrimPrefix(m.Priority.String(), "PRIORITY_")), Tenant: m.Tenant,
		LeaseTTL: ttl, Stages: m.Stages, sess: s, saved: map[string]Checkpoint{},
	}
	if l.Priority == "unspecified" {
		l.Priority = "normal"
	}
	if m.TimeoutS != nil {
		l.Timeout = time.Duration(*m.TimeoutS * float64(time.Second))
	}
	if m.DeadlineUnixNs != nil {
		l.Deadline = time.Unix(0, *m.DeadlineUnixNs)
	}
	for _, c := range m.Checkpoints {
		l.saved[c.Stage] = Checkpoint{Stage: c.Stage, Data: c.Data, ContentType: c.ContentType, Attempt: c.Attempt,
			Saved: time.Unix(0, c.SavedUnixNs)}
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l
}

func (l *Lease) String() string {
	return fmt.Sprintf("Lease(id=%d, task=%d, attempt=%d, pool=%s)", l.ID, l.TaskID, l.Attempt, l.Pool)
}

// JSON parses the payload as JSON into v (numbers in interface values as json.Number).
func (l *Lease) JSON(v any) error { return decodeJSON(l.Payload, v) }

// Text is the payload as text.
func (l *Lease) Text() string { return string(l.Payload) }

// AbortReason is "" until the attempt is given up (its context is then
// cancelled); then "cancelled" (the task ended: no retry follows), "timeout"
// or "lease expired" (retryable failures), "shutdown" (the server stops or
// this worker drained past its DrainTimeout), "disconnected", "unknown".
func (l *Lease) AbortReason() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.abortReason
}

func (l *Lease) abort(reason string) {
	l.mu.Lock()
	if l.abortReason == "" {
		l.abortReason = reason
	}
	l.mu.Unlock()
	l.cancel()
}

func (l *Lease) aborted() bool { return l.AbortReason() != "" }

// Checkpoints are the latest checkpoint of each stage, in stage order (the
// declared stages', else any order).
func (l *Lease) Checkpoints() []Checkpoint {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Checkpoint
	if len(l.Stages) > 0 {
		for _, stage := range l.Stages {
			if c, ok := l.saved[stage]; ok {
				out = append(out, c)
			}
		}
		return out
	}
	for _, c := range l.saved {
		out = append(out, c)
	}
	return out
}

// CheckpointOf is the latest checkpoint of stage, if any.
func (l *Lease) CheckpointOf(stage string) (Checkpoint, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.saved[stage]
	return c, ok
}

// ResumedFrom is the last stage earlier attempts completed ("" for none).
func (l *Lease) ResumedFrom() string {
	last := ""
	for _, c := range l.Checkpoints() {
		if c.Attempt < l.Attempt {
			last = c.Stage
		}
	}
	return last
}

// SaveCheckpoint saves value ([]byte, a string, an Output or a JSON value)
// as the checkpoint of stage; it returns once the server stored it, or with
// the reason it did not.
func (l *Lease) SaveCheckpoint(ctx context.Context, stage string, value any) error {
	if stage == "" {
		return fmt.Errorf("cronoq: a checkpoint's stage must be a non-empty string")
	}
	data, kind, err := encode(value)
	if err != nil {
		return fmt.Errorf("cronoq: the checkpoint of stage %q: %v", stage, err)
	}
	reply := make(chan string, 1)
	request := checkpointRequest{lease: l, message: &pb.Checkpoint{Lease: l.ID, Stage: stage, Data: data,
		ContentType: kind}, reply: reply}
	select {
	case l.sess.checkpoints <- request:
	case <-l.sess.closed:
		return fmt.Errorf("cronoq: the worker's stream ended: the checkpoint was not saved")
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case problem := <-reply:
		if problem != "" {
			return fmt.Errorf("cronoq: the checkpoint of stage %q: %s", stage, problem)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	l.mu.Lock()
	l.saved[stage] = Checkpoint{Stage: stage, Data: data, ContentType: kind, Attempt: l.Attempt, Saved: time.Now()}
	l.mu.Unlock()
	return nil
}
