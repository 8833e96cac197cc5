"""The HTML report: one page, with its plots as PNG files beside it.

The page needs nothing but a browser (no script, no network): the plots are
drawn with matplotlib (``pip install 'cronoq[whatif]'``) without pyplot, so
nothing global of matplotlib changes.
"""

from __future__ import annotations

import html
import json
import os
from typing import Any

from ..core.types import CLASSES
from .report import Figures, Report

__all__ = ["write_html", "PLOTS"]

# The plots, by the suffix of their file name.
PLOTS = ("waits", "waits-by-class", "capacity", "cost", "deadlines")
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#bcbd22", "#7f7f7f")
_LIVE = "#000000"


def _figure(width: float, height: float) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("the HTML report draws its plots with matplotlib: "
                          "pip install 'cronoq[whatif]'") from None
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _color(i: int) -> str:
    return _COLORS[i % len(_COLORS)]


def _columns(report: Report) -> list[tuple[Figures, str, str]]:
    """Each column with its color and line style (the live run: black, dashed)."""
    out: list[tuple[Figures, str, str]] = []
    if report.live is not None:
        out.append((report.live, _LIVE, "--"))
    out.extend((fig, _color(i), "-") for i, fig in enumerate(report.variants))
    return out


def _plot_waits(report: Report, path: str) -> None:
    columns = _columns(report)
    classes = [c for c in CLASSES if any(c in fig.timeline.get("wait_p90", {}) for fig, _, _ in columns)]
    fig = _figure(10, 2.4 * max(1, len(classes)) + 0.6)
    axes = fig.subplots(max(1, len(classes)), 1, sharex=True, squeeze=False)[:, 0]
    for ax, cls in zip(axes, classes or ["(no task started)"]):
        for column, color, style in columns:
            timeline = column.timeline
            series = timeline.get("wait_p90", {}).get(cls)
            if not series:
                continue
            width = timeline["bin_seconds"]
            xs = [(i + 0.5) * width for i, v in enumerate(series) if v is not None]
            ys = [v for v in series if v is not None]
            ax.plot(xs, ys, style, color=color, label=column.name, linewidth=1.4, marker=".", markersize=3)
        ax.set_ylabel("p90 wait, s")
        ax.set_title(f"class {cls}", loc="left", fontsize=10)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("seconds since the trace started (by when the task became ready)")
    axes[0].legend(loc="upper right", fontsize=8)
    fig.suptitle("waits over time: p90 of each slice")
    fig.savefig(path)


def _plot_waits_by_class(report: Report, path: str) -> None:
    columns = _columns(report)
    classes = [c for c in CLASSES if any(c in fig.waits for fig, _, _ in columns)]
    fig = _figure(10, 4)
    ax = fig.subplots()
    width = 0.8 / max(1, len(columns))
    for i, (column, color, _) in enumerate(columns):
        xs = [k + (i - (len(columns) - 1) / 2) * width for k in range(len(classes))]
        p50 = [column.waits[c].p50 if c in column.waits else 0.0 for c in classes]
        p99 = [column.waits[c].p99 if c in column.waits else 0.0 for c in classes]
        ax.bar(xs, p99, width * 0.9, color=color, alpha=0.35)
        ax.bar(xs, p50, width * 0.9, color=color, label=column.name)
    ax.set_xticks(range(len(classes)), classes)
    ax.set_ylabel("wait, s (solid p50, pale p99)")
    ax.set_title("waits by class")
    ax.grid(True, axis="y", alpha=0.3)
    if columns:
        ax.legend(fontsize=8)
    fig.savefig(path)


def _plot_capacity(report: Report, path: str) -> None:
    columns = _columns(report)
    pools: list[str] = []
    for column, _, _ in columns:
        for name in column.timeline.get("pools", {}):
            if name not in pools:
                pools.append(name)
    live_samples = report.trace.samples
    for _, row in live_samples:
        for name in row:
            if name not in pools:
                pools.append(name)
    fig = _figure(10, 3.2 * max(1, len(pools)) + 0.6)
    axes = fig.subplots(max(1, len(pools)), 1, sharex=True, squeeze=False)[:, 0]
    for ax, name in zip(axes, pools or ["(no samples)"]):
        waiting = ax.twinx()
        if live_samples:
            rows = [(t / 1e9, row[name]) for t, row in live_samples if name in row]
            xs = [x for x, _ in rows]
            ax.step(xs, [r[0] for _, r in rows], where="post", color=_LIVE, linestyle="--",
                    label="live (recorded)")
            ax.step(xs, [r[1] for _, r in rows], where="post", color=_LIVE, linestyle=":", linewidth=1.0)
            waiting.plot(xs, [r[3] for _, r in rows], color=_LIVE, alpha=0.3, linewidth=0.8)
        for i, column in enumerate(report.variants):
            series = column.timeline.get("pools", {}).get(name)
            if not series:
                continue
            color = _color(i)
            ax.step(series["t"], series["capacity"], where="post", color=color, label=column.name)
            ax.step(series["t"], series["desired"], where="post", color=color, linestyle=":", linewidth=1.0)
            ax.plot(series["t"], series["busy"], color=color, linewidth=0.6, alpha=0.7)
            waiting.plot(series["t"], series["pending"], color=color, alpha=0.3, linewidth=0.8)
        ax.set_ylabel("workers")
        waiting.set_ylabel("tasks waiting (pale)")
        ax.set_zorder(waiting.get_zorder() + 1)
        ax.patch.set_visible(False)
        ax.set_title(f"pool {name}: capacity (solid), desired (dotted), busy (thin); tasks waiting (pale, "
                     f"right axis)", loc="left", fontsize=10)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("seconds since the trace started")
    axes[0].legend(loc="upper left", fontsize=8)
    fig.savefig(path)


def _plot_cost(report: Report, path: str) -> None:
    columns = [(c, color) for c, color, _ in _columns(report) if c.cost is not None]
    fig = _figure(10, 3.6)
    ax = fig.subplots()
    names = [c.name for c, _ in columns]
    ax.bar(range(len(columns)), [c.cost or 0.0 for c, _ in columns], color=[color for _, color in columns])
    for k, (c, _) in enumerate(columns):
        ax.annotate(f"{c.worker_seconds or 0:.0f} worker-s", (k, c.cost or 0.0), ha="center",
                    va="bottom", fontsize=8)
    ax.set_xticks(range(len(columns)), names, rotation=15, ha="right")
    ax.set_ylabel("cost ($)")
    ax.set_title("cost and worker-seconds")
    ax.grid(True, axis="y", alpha=0.3)
    fig.savefig(path)


def _plot_deadlines(report: Report, path: str) -> None:
    columns = _columns(report)
    fig = _figure(10, 3.6)
    ax = fig.subplots()
    xs = range(len(columns))
    misses = [c.deadline_miss_rate for c, _, _ in columns]
    missed_starts = [1 - c.fixed_start_hit_rate for c, _, _ in columns]
    ax.bar([x - 0.2 for x in xs], misses, 0.4, color=[color for _, color, _ in columns])
    ax.bar([x + 0.2 for x in xs], missed_starts, 0.4, color=[color for _, color, _ in columns], alpha=0.4)
    for x, (miss, start) in enumerate(zip(misses, missed_starts)):
        ax.annotate(f"{miss:.1%}", (x - 0.2, miss), ha="center", va="bottom", fontsize=8)
        ax.annotate(f"{start:.0%}", (x + 0.2, start), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [c.name for c, _, _ in columns], rotation=15, ha="right")
    ax.set_ylim(0, max(0.05, *misses, *missed_starts) * 1.2)
    ax.set_ylabel("share")
    ax.set_title("deadline misses (solid) and fixed starts missed (pale)")
    ax.grid(True, axis="y", alpha=0.3)
    fig.savefig(path)


_DRAW = {"waits": _plot_waits, "waits-by-class": _plot_waits_by_class, "capacity": _plot_capacity,
         "cost": _plot_cost, "deadlines": _plot_deadlines}


def write_html(report: Report, path: str | os.PathLike[str]) -> list[str]:
    """Write the report to ``path`` and its plots (PNG) beside it; returns
    the paths of the files written, the page first."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    stem = os.path.splitext(os.path.basename(path))[0]
    images = []
    for name in PLOTS:
        file = f"{stem}-{name}.png"
        _DRAW[name](report, os.path.join(directory, file))
        images.append(file)
    with open(path, "w", encoding="utf-8") as f:
        f.write(_page(report, images))
    return [path] + [os.path.join(directory, file) for file in images]


def _cell(value: object) -> str:
    return f"<td>{html.escape(str(value))}</td>"


def _page(report: Report, images: list[str]) -> str:
    trace = report.trace
    esc = html.escape
    rows = []
    for fig in report.columns:
        for cls in (*CLASSES, "all"):
            w = fig.waits.get(cls)
            if w is None or not w.tasks:
                continue
            rows.append("<tr>" + "".join(_cell(v) for v in (fig.name, cls, w.tasks, f"{w.p50:.3f}", f"{w.p90:.3f}",
                                                            f"{w.p99:.3f}", f"{w.max:.3f}")) + "</tr>")
    waits = "\n".join(rows)
    rows = []
    for fig in report.columns:
        e = fig.endings
        rows.append("<tr>" + "".join(_cell(v) for v in (
            fig.name,
            f"{fig.deadline_misses}/{fig.deadline_tasks}" if fig.deadline_tasks else "-",
            f"{fig.fixed_start_hit_rate:.0%} of {fig.fixed_starts}" if fig.fixed_starts else "-",
            "-" if fig.priority_adherence is None else f"{fig.priority_adherence:.3f}",
            "-" if fig.utilization is None else f"{fig.utilization:.0%}",
            "-" if fig.worker_seconds is None else f"{fig.worker_seconds:.0f}",
            "-" if fig.cost is None else f"{fig.cost:.4f}",
            fig.retries, e["succeeded"], e["failed"] + e["dead_lettered"], e["shed"], e["refused"],
            e["skipped"] + e["missed"] + e["cancelled"], e["unfinished"], f"{fig.makespan:.1f}")) + "</tr>")
    outcomes = "\n".join(rows)
    policies = "\n".join(
        f"<h3>{esc(fig.name)}</h3><pre>{esc(json.dumps(fig.policy or {}, indent=2))}</pre>"
        f"<p>durations: {esc(str(fig.durations))}, seed {esc(str(fig.seed))}, start delay "
        f"{fig.start_delay or 0:g} s, replayed in "
        f"{fig.wall_seconds or 0:.2f} s</p>" for fig in report.variants)
    notes = "".join(f"<li>{esc(n)}</li>" for n in report.notes())
    plots = "\n".join(f'<figure><img src="{esc(file)}" alt="{esc(file)}"></figure>' for file in images)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>cronoq what-if report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }}
th:first-child, td:first-child, td:nth-child(2) {{ text-align: left; }}
img {{ max-width: 100%; }}
pre {{ background: #f6f6f6; padding: 0.6em; }}
</style>
</head>
<body>
<h1>What if: {len(report.variants)} polic{"y" if len(report.variants) == 1 else "ies"} on one workload</h1>
<p>A trace of {len(trace.tasks)} tasks submitted over {trace.span_ns / 1e9:.1f} s, replayed through the
cronoq engine under virtual time.{" The first column is the live run, as recorded." if report.live else ""}</p>
<ul>{notes}</ul>
<h2>Waits by class (seconds from submission, or the fixed start, to the first start)</h2>
<table id="waits">
<tr><th>variant</th><th>class</th><th>tasks</th><th>p50</th><th>p90</th><th>p99</th><th>max</th></tr>
{waits}
</table>
<h2>Outcomes</h2>
<table id="outcomes">
<tr><th>variant</th><th>deadline misses</th><th>fixed-start hits</th><th>priority adherence</th>
<th>utilization</th><th>worker-s</th><th>cost $</th><th>retries</th><th>succeeded</th><th>failed</th>
<th>shed</th><th>refused</th><th>skipped, missed, cancelled</th><th>unfinished</th><th>makespan s</th></tr>
{outcomes}
</table>
<h2>Plots</h2>
{plots}
<h2>The variants' policies (changes to the recorded one)</h2>
{policies}
</body>
</html>
"""
