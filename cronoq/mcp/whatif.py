"""The ``what_if`` tool: replay a recorded workload against other policies.

It calls cronoq's simulator (``cronoq.whatif``: traces, policy files, replay
under virtual time) on trace files from one directory the operator names
(``--traces DIR``), so an agent can compare settings before anyone changes
a pool. It reads nothing outside that directory and changes nothing on the
server. Without the simulator, or without the directory, the tool is not
offered.
"""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

__all__ = ["simulator", "add_what_if", "WhatIfReport", "MAX_LISTED"]

MAX_LISTED = 50   # trace names an error message lists at most


def simulator() -> ModuleType | None:
    """``cronoq.whatif`` when this installation has it."""
    try:
        return importlib.import_module("cronoq.whatif")
    except ImportError:
        return None


class WhatIfReport(BaseModel):
    """One replay per variant (and the live run's figures when the trace recorded them)."""

    trace: dict[str, Any] = Field(description="The trace: tasks, start (t0, Unix seconds), span in seconds.")
    live: dict[str, Any] | None = Field(description="What the recorded run achieved, for comparison; null when "
                                                    "the trace does not say.")
    variants: list[dict[str, Any]] = Field(description=(
        "Per variant: name, waits per class and overall (p50, p90, p99, max, seconds from submission or fixed "
        "start to first start), deadline_misses and deadline_miss_rate, fixed_start_hit_rate, "
        "priority_adherence, utilization, worker_seconds, cost, endings (tasks per final status), retries, "
        "makespan, per-pool figures and the policy replayed."))


def _trace_names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.resolve().parent == directory)


def _trace_path(directory: Path, name: str) -> Path:
    """``name`` in ``directory``, refusing anything that would lead elsewhere."""
    if not name or "/" in name or "\\" in name or name.startswith(".") or "\0" in name:
        raise ToolError(f"trace must be a file name in the trace directory, got {name!r}")
    path = (directory / name).resolve()
    if path.parent != directory:
        raise ToolError(f"trace {name!r} is a link leading outside the trace directory")
    if not path.is_file():
        names = _trace_names(directory)
        shown = ", ".join(names[:MAX_LISTED]) + (" ..." if len(names) > MAX_LISTED else "")
        raise ToolError(f"no trace named {name!r}; the traces: {shown or '(none)'}")
    return path


def add_what_if(app: MCPServer[Any], traces: Path) -> None:
    """Add the ``what_if`` tool, replaying the traces of directory ``traces``.
    ValueError when the directory or the simulator is missing."""
    whatif = simulator()
    if whatif is None:
        raise ValueError("the what-if tool needs cronoq's simulator (cronoq.whatif), which this installation "
                         "does not have")
    directory = traces.resolve()
    if not directory.is_dir():
        raise ValueError(f"the trace directory {str(traces)!r} does not exist")
    refusals = (ValueError, OSError, whatif.ReplayError)

    @app.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    async def what_if(
            trace: Annotated[str, Field(description=(
                "The file name of a recorded workload (a trace, JSON lines) in the gateway's trace directory; "
                "a wrong name gets the list of traces."))],
            policies: Annotated[str | None, Field(description=(
                "A policy file's TOML text: [[variant]] tables, each with a name and the settings it changes, "
                "e.g. '[[variant]]\\nname = \"as recorded\"\\n\\n[[variant]]\\nname = \"more workers\"\\n"
                "pools.app.max = 8'; also [base] (changes for every variant), [replay] (durations, seed, "
                "start_delay) and [durations] (seconds per kind). Omitted: the recorded policy alone."))] = None,
            variants: Annotated[list[str] | None, Field(description=(
                "Replay only these variants, by name; omitted: every variant."))] = None,
            durations: Annotated[Literal["trace", "sampled"] | None, Field(description=(
                "Attempts run as recorded (trace), or drawn from the runs recorded for the same kind "
                "(sampled, with the seed); omitted: the policy file's choice, else trace."))] = None,
            seed: Annotated[int | None, Field(description=(
                "Seed of the replays (retry jitter, sampled durations); the same seed gives the same "
                "report."))] = None,
    ) -> WhatIfReport:
        """What-if: replay a recorded workload through cronoq's engine under virtual time, once per policy
        variant, and compare waits per class, deadline misses, fixed-start hits, priority adherence,
        utilization and cost. Nothing runs and nothing changes on the server: use it to choose pool
        settings (capacity, autoscaling, retries, tenant weights) before changing them."""
        path = _trace_path(directory, trace)

        def replay() -> dict[str, Any]:
            policy = whatif.parse_policy_file(policies, "policies") if policies else None
            report = whatif.simulate(path, policy, durations=durations, seed=seed, only=variants)
            data: dict[str, Any] = report.as_dict()
            for column in (data["live"], *data["variants"]):
                if column is not None:
                    column.pop("timeline", None)   # plot data: large, and no use to a model
            return data

        try:
            data = await asyncio.to_thread(replay)   # CPU-bound: the other sessions keep being served
        except refusals as exc:
            raise ToolError(f"what-if: {exc}") from None
        return WhatIfReport.model_validate(data)
