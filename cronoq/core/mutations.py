"""The mutations the engine asks a store to persist.

With ``CoreConfig(persist=True)`` the engine queues ``(PERSIST, mutation)``
actions (see ``cronoq.core.actions``); the driver writes them, in order,
before it releases the effects that depend on them. A mutation is a tuple
whose first element names it:

- ``(MUT_SUBMIT, task_id, pool, spec, submitted_ns)``: a task was admitted
- ``(MUT_STATUS, task_id, status, attempt, at_ns, message)``: a task changed
  status (running, retrying, ready again after a give-back, or ended)
- ``(MUT_OUTPUT, task_id, output)``: the output of a successful attempt
- ``(MUT_RECURRING, name, recurring)``: a schedule was added or advanced
  (``recurring`` is a ``cronoq.core.recurring.Recurring``)
- ``(MUT_RECURRING_REMOVED, name)``: a schedule was removed
- ``(MUT_WITHDRAWN, task_id)``: a submission was taken back; delete any row of it
"""

from __future__ import annotations

from typing import Final

__all__ = ["MUT_SUBMIT", "MUT_STATUS", "MUT_OUTPUT", "MUT_RECURRING", "MUT_RECURRING_REMOVED",
           "MUT_WITHDRAWN"]

MUT_SUBMIT: Final = "submit"
MUT_STATUS: Final = "status"
MUT_OUTPUT: Final = "output"
MUT_RECURRING: Final = "recurring"
MUT_RECURRING_REMOVED: Final = "recurring_removed"
MUT_WITHDRAWN: Final = "withdrawn"
