"""The statuses and outcomes as the engine reads them: ``Final`` names of a
compiled module.

The members themselves stay in ``types`` (their public home, a pure module).
Compiled code reads a name imported from a pure module with a dictionary
lookup at every use; a ``Final`` name of a compiled module is a C static
instead, set once at import. Pure Python reads the same objects either way.
(Typed as their enum, not as literals: the engine re-reads a status that a
call may have changed, which literal types would narrow away.)
"""

from __future__ import annotations

from typing import Final

from .types import Outcome, Status

BLOCKED: Final[Status] = Status.BLOCKED
SCHEDULED: Final[Status] = Status.SCHEDULED
READY: Final[Status] = Status.READY
RUNNING: Final[Status] = Status.RUNNING
RETRYING: Final[Status] = Status.RETRYING
SUCCEEDED: Final[Status] = Status.SUCCEEDED
FAILED: Final[Status] = Status.FAILED
DEAD_LETTERED: Final[Status] = Status.DEAD_LETTERED
CANCELLED: Final[Status] = Status.CANCELLED
SKIPPED: Final[Status] = Status.SKIPPED
MISSED: Final[Status] = Status.MISSED
SHED: Final[Status] = Status.SHED

SUCCESS: Final[Outcome] = Outcome.SUCCESS
RETRYABLE: Final[Outcome] = Outcome.RETRYABLE
PERMANENT: Final[Outcome] = Outcome.PERMANENT
CANCELLED_OUTCOME: Final[Outcome] = Outcome.CANCELLED
