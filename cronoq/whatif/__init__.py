"""What-if: replay a recorded workload against other scheduling policies.

Record what a scheduler's users submitted and how long each attempt ran
(``TraceRecorder``), or build the same from a durable store's history
(``trace_from_store``), or write it by hand; then replay it through the
real engine under virtual time, once per policy variant (``simulate``), and
compare waits, deadline misses, fixed-start hits, adherence, utilization and
cost (``Report``: a terminal table, JSON, an HTML page with plots).

    python -m cronoq.whatif trace.jsonl --config policies.toml --html out/report.html

See docs/whatif.md.
"""

from __future__ import annotations

import os
from typing import Sequence

from .policy import PolicyError, PolicyFile, Variant, load_policy_file, parse_policy_file, with_live_capacity
from .recorder import TraceRecorder
from .replay import ReplayError, ReplayResult, replay
from .report import Figures, Report
from .store import trace_from_store
from .trace import Trace, TraceError, TracedAttempt, TracedTask

__all__ = ["Trace", "TracedTask", "TracedAttempt", "TraceError", "TraceRecorder", "trace_from_store",
           "PolicyFile", "Variant", "PolicyError", "load_policy_file", "parse_policy_file", "replay",
           "ReplayResult", "ReplayError", "Report", "Figures", "simulate", "variants"]


def variants(trace: Trace, policies: PolicyFile | str | os.PathLike[str] | None = None) -> list[Variant]:
    """The variants of ``policies`` (a ``PolicyFile`` or the path of one; None:
    the recorded policy alone), laid over the trace's recorded policy (a pool
    that does not autoscale starts at the capacity it had live: see
    ``policy.with_live_capacity``)."""
    if policies is None:
        policies = PolicyFile()
    elif not isinstance(policies, PolicyFile):
        policies = load_policy_file(policies)
    recorded, _ = with_live_capacity(trace.policy, trace.samples)
    return policies.variants_for(recorded)


def simulate(trace: Trace | str | os.PathLike[str], policies: PolicyFile | str | os.PathLike[str] | None = None,
             *, durations: str | None = None, seed: int | None = None, start_delay: float | None = None,
             samples: int = 240, only: Sequence[str] | None = None) -> Report:
    """Replay ``trace`` (a ``Trace`` or a trace file) once per variant of
    ``policies`` and return the ``Report``. ``durations``, ``seed`` and
    ``start_delay`` override the policy file's; ``only`` keeps the variants
    so named."""
    if not isinstance(trace, Trace):
        trace = Trace.load(trace)
    if policies is not None and not isinstance(policies, PolicyFile):
        policies = load_policy_file(policies)
    chosen = variants(trace, policies)
    if only is not None:
        missing = [name for name in only if name not in {v.name for v in chosen}]
        if missing:
            raise PolicyError(f"no variant named {', '.join(repr(m) for m in missing)} "
                              f"(the variants: {', '.join(v.name for v in chosen)})")
        chosen = [v for v in chosen if v.name in only]
    kind_durations = policies.kind_durations if isinstance(policies, PolicyFile) else {}
    results = [replay(trace, v, durations=durations, seed=seed, start_delay=start_delay,
                      kind_durations=kind_durations, samples=samples) for v in chosen]
    return Report(trace, results)
