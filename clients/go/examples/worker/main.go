// A worker that doubles numbers, and a client that submits to it, in one
// program: CRONOQ_TARGET, CRONOQ_POOL, CRONOQ_WORKER_TOKEN, CRONOQ_CLIENT_TOKEN.
// It prints the task's output, then drains the worker and exits.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"cronoq.dev/cronoq"
	"cronoq.dev/cronoq/pb"
)

// double is what each task does: its payload is {"n": N}; the return value is its output.
func double(ctx context.Context, lease *cronoq.Lease) (any, error) {
	var task struct {
		N *float64 `json:"n"`
	}
	if err := lease.JSON(&task); err != nil || task.N == nil {
		return nil, cronoq.Permanent("the payload has no number n") // fails the task: no retry
	}
	if lease.Attempt == 1 {
		return nil, cronoq.Retry(50*time.Millisecond, "try again") // a retry, 50 ms later at the earliest
	}
	return map[string]any{"doubled": *task.N * 2, "attempt": lease.Attempt}, nil
}

func main() {
	target, pool := os.Getenv("CRONOQ_TARGET"), os.Getenv("CRONOQ_POOL")
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		served <- cronoq.RunWorker(ctx, cronoq.Options{Target: target, Pool: pool, Slots: 2,
			Token: os.Getenv("CRONOQ_WORKER_TOKEN"), DrainTimeout: 5 * time.Second}, double)
	}()

	client, err := cronoq.Dial(target, os.Getenv("CRONOQ_CLIENT_TOKEN"), nil)
	if err != nil {
		panic(err)
	}
	defer client.Close()
	id, _, err := client.Submit(ctx, map[string]int{"n": 21}, &pb.TaskSpec{Pool: pool})
	if err != nil {
		panic(err)
	}
	result, err := client.Wait(ctx, id, 30*time.Second)
	if err != nil {
		panic(err)
	}
	var output map[string]any
	if err := cronoq.ResultJSON(result, &output); err != nil {
		panic(err)
	}
	text, _ := json.Marshal(output)
	fmt.Println(result.Status, string(text))
	stop() // drain: no new leases, then RunWorker returns
	if err := <-served; err != nil {
		panic(err)
	}
}
