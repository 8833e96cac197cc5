"""cronoq.client: talk to a cronoq-server (extra ``cronoq[client]``).

``Client`` submits tasks and follows them (submit, submit_batch, get, explain, wait,
cancel, list, watch, and the admin calls); ``Worker`` serves a pool from this
process, speaking worker protocol version ``PROTOCOL_VERSION`` (3). Handlers
raise ``cronoq.Retryable``, ``cronoq.Permanent``, ``Reject`` or
``CancelTask`` to decide an attempt. ``BlockingClient`` is the synchronous
client for threaded code. Both connect on first use; docs/server.md has the
details.
"""

from typing import TYPE_CHECKING, Any

from .._proto import PROTOCOL_VERSION
from ..core.errors import Permanent, Retryable
from ..errors import AccessDenied, CancelTask, Reject, ServerError
from .client import (
    AttemptInfo, Client, Dependent, Dependents, Explanation, Listing, ScheduleInfo, Submission, TaskInfo, TaskPage, TaskResult, WaitReason,
    WorkerInfo,
)

if TYPE_CHECKING:
    from .blocking import BlockingClient
    from .worker import Lease, Worker

__all__ = ["Client", "BlockingClient", "Worker", "Lease", "Reject", "CancelTask", "Retryable", "Permanent",
           "Submission", "TaskResult", "TaskInfo", "AttemptInfo", "Explanation", "WaitReason", "Dependent", "Dependents", "TaskPage", "WorkerInfo", "ScheduleInfo", "ServerError",
           "AccessDenied", "PROTOCOL_VERSION", "Listing"]


# The worker and the blocking client load with their first use: a command
# line that only submits does not pay for the runtime they build on.
_LAZY = {"BlockingClient": ".blocking", "Worker": ".worker", "Lease": ".worker"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cronoq.client' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
