// The Go conformance worker: the contract of tests/conformance/README.md,
// written with cronoq.RunWorker (clients/go/cronoq) and nothing below it.
// Built by clients/go/build.sh.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"cronoq.dev/cronoq"
)

var printing sync.Mutex

func say(format string, args ...any) {
	printing.Lock()
	defer printing.Unlock()
	fmt.Fprintf(os.Stdout, format+"\n", args...) // os.Stdout is unbuffered: the line goes out at once
}

type request struct {
	Do          string          `json:"do"`
	Value       json.RawMessage `json:"value"`
	Until       *uint32         `json:"until"`
	RetryAfterS float64         `json:"retry_after_s"`
	Message     string          `json:"message"`
	Seconds     float64         `json:"seconds"`
	Stages      []string        `json:"stages"`
	FailAfter   int             `json:"fail_after"`
}

func stages(ctx context.Context, lease *cronoq.Lease, r request) (any, error) {
	// What earlier attempts saved, as this lease brought it.
	restored := map[string]any{}
	for _, c := range lease.Checkpoints() {
		var data any
		if err := c.JSON(&data); err != nil {
			return nil, err
		}
		restored[c.Stage] = data
	}
	ran := []string{}
	for _, stage := range r.Stages {
		if _, done := restored[stage]; done {
			continue
		}
		if lease.Attempt == 1 && len(ran) == r.FailAfter {
			return nil, cronoq.Retry(0, "failed after %d stages", len(ran))
		}
		if err := lease.SaveCheckpoint(ctx, stage, map[string]string{"stage": stage}); err != nil {
			return nil, err
		}
		ran = append(ran, stage)
	}
	var resumedFrom any
	if from := lease.ResumedFrom(); from != "" {
		resumedFrom = from
	}
	return map[string]any{"ran": ran, "resumed_from": resumedFrom, "restored": restored}, nil
}

func handle(ctx context.Context, lease *cronoq.Lease) (any, error) {
	say("started %d %d", lease.TaskID, lease.Attempt)
	var r request
	if err := lease.JSON(&r); err != nil {
		return nil, cronoq.Permanent("the payload: %v", err)
	}
	switch r.Do {
	case "echo":
		if len(r.Value) == 0 {
			return nil, nil // no value: JSON null
		}
		if r.Value[0] == '"' {
			var text string
			if err := json.Unmarshal(r.Value, &text); err != nil {
				return nil, err
			}
			return text, nil
		}
		return r.Value, nil // the JSON as it came: every number exactly
	case "retry":
		if r.Until != nil && lease.Attempt < *r.Until {
			return nil, cronoq.Retry(time.Duration(r.RetryAfterS*float64(time.Second)), "not yet: attempt %d", lease.Attempt)
		}
		return map[string]uint32{"attempt": lease.Attempt}, nil
	case "throw":
		return nil, fmt.Errorf("%s", r.Message)
	case "permanent":
		return nil, cronoq.Permanent("%s", r.Message)
	case "sleep":
		if r.Until != nil && lease.Attempt >= *r.Until {
			return "slept", nil
		}
		select {
		case <-time.After(time.Duration(r.Seconds * float64(time.Second))):
			return "slept", nil
		case <-ctx.Done():
			// The server gave the attempt up: stop at once.
			say("aborted %d %d %s", lease.TaskID, lease.Attempt, lease.AbortReason())
			return nil, ctx.Err()
		}
	case "reject":
		return nil, cronoq.Reject("%s", r.Message)
	case "stages":
		return stages(ctx, lease, r)
	}
	return nil, cronoq.Permanent("unknown do: %s", r.Do)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	slots, err := strconv.ParseUint(os.Getenv("CRONOQ_SLOTS"), 10, 32)
	if err != nil {
		fmt.Fprintln(os.Stderr, "CRONOQ_SLOTS:", err)
		os.Exit(2)
	}
	drain, err := strconv.ParseFloat(os.Getenv("CRONOQ_DRAIN_TIMEOUT_S"), 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, "CRONOQ_DRAIN_TIMEOUT_S:", err)
		os.Exit(2)
	}
	var ready sync.Once
	err = cronoq.RunWorker(ctx, cronoq.Options{
		Target:         os.Getenv("CRONOQ_TARGET"),
		Pool:           os.Getenv("CRONOQ_POOL"),
		Slots:          uint32(slots),
		Token:          os.Getenv("CRONOQ_TOKEN"),
		Name:           os.Getenv("CRONOQ_WORKER_NAME"),
		DrainTimeout:   time.Duration(drain * float64(time.Second)),
		InitialBackoff: 50 * time.Millisecond,
		MaxBackoff:     500 * time.Millisecond,
		OnConnect:      func(cronoq.ConnectInfo) { ready.Do(func() { say("ready") }) },
	}, handle)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
