"""The exit codes of ``cronoq`` (docs/cli.md#exit-codes), and which error means which."""

from __future__ import annotations

import enum

__all__ = ["ExitCode", "exit_code_for", "CliError"]


class ExitCode(enum.IntEnum):
    OK = 0
    ERROR = 1          # the server refused the request (invalid task, full queue, conflict), or another error
    USAGE = 2          # bad arguments or local input (argparse uses 2 too)
    NOT_FOUND = 3      # unknown task, key, pool or schedule
    TASK_FAILED = 4    # the task ended other than succeeded (wait, submit --wait)
    TIMEOUT = 5        # the task was still running when the wait ran out
    UNAVAILABLE = 6    # no answer from a serving leader (unreachable, standby, TLS handshake, stopping)
    ACCESS_DENIED = 7  # the token (or certificate) was not accepted, or its role or scope does not allow it
    INTERRUPTED = 130  # Ctrl-C, except for watch and top, which end that way


class CliError(Exception):
    """A failure the command explains itself: ``message`` goes to standard error."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def exit_code_for(exc: BaseException) -> ExitCode:
    """The exit code of an exception raised by a call to the server."""
    from .. import errors   # (not at start-up: it loads the stores' base and asyncio)

    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, errors.AccessDenied):
        return ExitCode.ACCESS_DENIED
    if isinstance(exc, (errors.UnknownTask, errors.UnknownPool)):
        return ExitCode.NOT_FOUND
    if isinstance(exc, errors.ServerError) and exc.code == "NOT_FOUND":
        return ExitCode.NOT_FOUND
    if isinstance(exc, TimeoutError):
        return ExitCode.TIMEOUT
    if isinstance(exc, errors.SchedulerError):   # UNAVAILABLE after the retries
        return ExitCode.UNAVAILABLE
    return ExitCode.ERROR
