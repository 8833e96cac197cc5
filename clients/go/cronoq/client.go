package cronoq

import (
	"context"
	"crypto/tls"
	"errors"
	"time"

	"cronoq.dev/cronoq/pb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// Client submits and follows tasks over the Tasks service (role client).
// The messages are the generated ones of cronoq.dev/cronoq/pb.
type Client struct {
	conn  *grpc.ClientConn
	tasks pb.TasksClient
	token string
}

// Dial connects to target (host:port, http:// or https://); token is a
// client token ("" for none); tlsConfig nil means TLS only for https://.
func Dial(target, token string, tlsConfig *tls.Config) (*Client, error) {
	address, options, err := dialOptions(target, tlsConfig)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.Dial(address, options...)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, tasks: pb.NewTasksClient(conn), token: token}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

func (c *Client) authorized(ctx context.Context) context.Context {
	if c.token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.token)
}

// Submit submits a task with payload ([]byte, a string, an Output or a JSON
// value) and the other fields of spec (nil: the defaults); it returns the
// task's id and whether the key named an existing task.
func (c *Client) Submit(ctx context.Context, payload any, spec *pb.TaskSpec) (uint64, bool, error) {
	task := &pb.TaskSpec{}
	if spec != nil {
		task = spec
	}
	if payload != nil {
		data, kind, err := encode(payload)
		if err != nil {
			return 0, false, err
		}
		task.Payload = data
		if task.ContentType == "" {
			task.ContentType = kind
		}
	}
	answer, err := c.tasks.Submit(c.authorized(ctx), &pb.SubmitRequest{Task: task})
	if err != nil {
		return 0, false, err
	}
	return answer.Id, answer.Duplicate, nil
}

func ref(id uint64) *pb.TaskRef { return &pb.TaskRef{Ref: &pb.TaskRef_Id{Id: id}} }

// Get is what the server knows of a task (its attempts and checkpoints included).
func (c *Client) Get(ctx context.Context, id uint64) (*pb.TaskInfo, error) {
	return c.tasks.Get(c.authorized(ctx), &pb.GetRequest{Task: ref(id)})
}

// Wait returns the task's result once it ended; timeout 0 waits as long as ctx allows.
func (c *Client) Wait(ctx context.Context, id uint64, timeout time.Duration) (*pb.TaskResult, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	return c.tasks.Wait(c.authorized(ctx), &pb.WaitRequest{Task: ref(id)})
}

// Cancel cancels a task; false if it had already ended.
func (c *Client) Cancel(ctx context.Context, id uint64) (bool, error) {
	answer, err := c.tasks.Cancel(c.authorized(ctx), &pb.CancelRequest{Task: ref(id)})
	if err != nil {
		return false, err
	}
	return answer.Cancelled, nil
}

// ErrNoOutput: the result holds no output (it was not kept, or too large).
var ErrNoOutput = errors.New("cronoq: the task's output is not available")

// ResultJSON parses a result's output as JSON into v.
func ResultJSON(result *pb.TaskResult, v any) error {
	if !result.OutputAvailable && len(result.Output) == 0 {
		return ErrNoOutput
	}
	return decodeJSON(result.Output, v)
}
