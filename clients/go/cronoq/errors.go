package cronoq

import (
	"fmt"
	"time"
)

// RetryableError is a failure worth another attempt; RetryAfter (if > 0)
// asks the server to wait that long before it.
type RetryableError struct {
	Message    string
	RetryAfter time.Duration
}

func (e *RetryableError) Error() string { return e.Message }

// PermanentError ends the task as failed: no retry.
type PermanentError struct{ Message string }

func (e *PermanentError) Error() string { return e.Message }

// RejectError gives the lease back unrun (Nack): another worker gets it,
// without using an attempt.
type RejectError struct{ Reason string }

func (e *RejectError) Error() string { return "rejected: " + e.Reason }

// CancelledError ends the task as cancelled.
type CancelledError struct{ Message string }

func (e *CancelledError) Error() string { return "cancelled: " + e.Message }

// Retry returns a retryable failure (retryAfter 0: the task's backoff).
func Retry(retryAfter time.Duration, format string, args ...any) error {
	return &RetryableError{Message: fmt.Sprintf(format, args...), RetryAfter: retryAfter}
}

// Permanent returns a permanent failure.
func Permanent(format string, args ...any) error {
	return &PermanentError{Message: fmt.Sprintf(format, args...)}
}

// Reject returns the Reject (Nack) outcome.
func Reject(format string, args ...any) error {
	return &RejectError{Reason: fmt.Sprintf(format, args...)}
}

// Cancel returns the Cancelled outcome.
func Cancel(format string, args ...any) error {
	return &CancelledError{Message: fmt.Sprintf(format, args...)}
}
