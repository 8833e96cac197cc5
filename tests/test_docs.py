"""The documentation is checked: every public name is in the API reference,
every metric in the metrics reference, every link resolves, and every Python
example in docs/, README.md and MIGRATING.md runs.

A fenced ``python`` block runs as its own program (a subprocess, from a
temporary directory, with this checkout on the path). A block whose fence is
directly preceded by ``<!-- run: pytest -->`` is a test file: it is written
to the temporary directory and run by pytest (with cronoq's plugin, as a
user's suite would). A block preceded by ``<!-- no-run: reason -->`` is
skipped; keep those rare.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import pytest

import cronoq
import cronoq.telemetry
import cronoq.telemetry.otel as otel
import cronoq.whatif
from cronoq.telemetry import PrometheusCollector
from cronoq.telemetry.prometheus import WORKER_FAMILIES
from cronoq.llm.usage import FAMILIES as LLM_FAMILIES

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FILES = sorted(DOCS.rglob("*.md")) + [ROOT / "README.md", ROOT / "MIGRATING.md"]
EXAMPLE_TIMEOUT = 60.0

FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
NO_RUN = re.compile(r"<!--\s*no-run\b(.*?)-->")
AS_PYTEST = re.compile(r"<!--\s*run:\s*pytest\s*-->")


def rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


def blocks(path: pathlib.Path) -> list[tuple[int, str, str | None]]:
    """(line, code, no-run reason or None) of every python block of a file.
    The code of a pytest block starts with the PYTEST_BLOCK marker line."""
    text = path.read_text()
    out = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NO_RUN.search(before)
        code = match.group(1)
        if AS_PYTEST.search(before):
            code = PYTEST_BLOCK + code
        out.append((line, code, marker.group(1).strip(" :") if marker else None))
    return out


PYTEST_BLOCK = "# run with pytest\n"


# ---------------------------------------------------------------- running the examples

_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4)
_RUNS: dict[tuple[str, int], concurrent.futures.Future] = {}


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    with tempfile.TemporaryDirectory() as cwd:
        command = [sys.executable, "-c", code]
        if code.startswith(PYTEST_BLOCK):
            pathlib.Path(cwd, "test_example.py").write_text(code)
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_example.py"]
        try:
            return subprocess.run(command, cwd=cwd, env=env, capture_output=True,
                                  text=True, timeout=EXAMPLE_TIMEOUT)
        except subprocess.TimeoutExpired as exc:
            return subprocess.CompletedProcess(exc.cmd, -1, exc.stdout or "",
                                               f"timed out after {EXAMPLE_TIMEOUT} s\n{exc.stderr or ''}")


def _start(path: pathlib.Path) -> None:
    for line, code, reason in blocks(path):
        if reason is None and (rel(path), line) not in _RUNS:
            _RUNS[(rel(path), line)] = _POOL.submit(_run, code)


@pytest.mark.parametrize("path", FILES, ids=rel)
def test_python_examples_run(path):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        for other in FILES:        # one process runs them all: start every file's examples now
            _start(other)
    _start(path)
    failures = []
    for line, _, reason in blocks(path):
        if reason is not None:
            continue
        result = _RUNS[(rel(path), line)].result()
        if result.returncode != 0:
            failures.append(f"{rel(path)}:{line} exited {result.returncode}\n{result.stdout[-2000:]}"
                            f"\n{result.stderr[-4000:]}")
    assert not failures, "\n\n".join(failures)


def test_examples_are_found_and_no_run_markers_are_rare_and_explained():
    found = {rel(p): blocks(p) for p in FILES}
    assert sum(len(b) for b in found.values()) >= 30
    skipped = [(name, line, reason) for name, items in found.items() for line, _, reason in items
               if reason is not None]
    assert len(skipped) <= 4, skipped
    assert all(reason for _, _, reason in skipped), "say why a block does not run: <!-- no-run: why -->"
    for name in ("docs/concepts.md", "docs/api.md", "docs/metrics.md", "docs/operations.md"):
        assert (ROOT / name).exists(), name
    howtos = {p.stem for p in (DOCS / "howto").glob("*.md")}
    assert {"interactive-and-batch", "deadlines", "scheduled-jobs", "pipelines", "rate-limits-and-gpus",
            "llm-workloads", "microtasks", "autoscaling-and-cost", "threaded-apps", "testing",
            "monitoring", "executors"} <= howtos


# ---------------------------------------------------------------- the API reference

API = (DOCS / "api.md").read_text()


def sections(text: str) -> dict[str, str]:
    """Heading name (the first `code span` of a heading) -> the text up to the next heading."""
    out: dict[str, str] = {}
    parts = re.split(r"^(#{2,4} .*)$", text, flags=re.M)
    for heading, body in zip(parts[1::2], parts[2::2]):
        match = re.search(r"`([^`]+)`", heading)
        if match:
            out[match.group(1)] = heading + body
    return out


SECTIONS = sections(API)
PUBLIC = {"cronoq": list(cronoq.__all__), "cronoq.telemetry": list(cronoq.telemetry.__all__),
          "cronoq.telemetry.otel": list(otel.__all__), "cronoq.whatif": list(cronoq.whatif.__all__)}


@pytest.mark.parametrize("module,name", [(m, n) for m, names in PUBLIC.items() for n in names])
def test_every_public_name_has_a_section_in_the_api_reference(module, name):
    assert name in SECTIONS, f"docs/api.md has no heading for {module}.{name}"


def _signature_names(obj) -> list[str]:
    target = obj.__init__ if inspect.isclass(obj) else obj
    return [p.name for p in inspect.signature(target).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


# Objects users construct or call: every parameter is documented in their section.
CALLABLES = {
    "Scheduler": cronoq.Scheduler, "BlockingScheduler": cronoq.BlockingScheduler, "Pool": cronoq.Pool,
    "Task": cronoq.Task, "Dep": cronoq.Dep, "RetryPolicy": cronoq.RetryPolicy, "Resource": cronoq.Resource,
    "AutoscaleConfig": cronoq.AutoscaleConfig, "VirtualClock": cronoq.VirtualClock,
    "SqliteStore": cronoq.SqliteStore, "PostgresStore": cronoq.PostgresStore,
    "StatusEvent": cronoq.StatusEvent,
    "TaskFailed": cronoq.TaskFailed, "Retryable": cronoq.Retryable, "Permanent": cronoq.Permanent,
    "EventsLagged": cronoq.EventsLagged, "AdmissionError": cronoq.AdmissionError,
    "PrometheusCollector": PrometheusCollector, "serve_metrics": cronoq.telemetry.serve_metrics,
    "make_wsgi_app": cronoq.telemetry.make_wsgi_app, "make_asgi_app": cronoq.telemetry.make_asgi_app,
    "metrics_registry": cronoq.telemetry.metrics_registry, "instrument": otel.instrument,
    "TraceRecorder": cronoq.whatif.TraceRecorder, "trace_from_store": cronoq.whatif.trace_from_store,
    "Trace": cronoq.whatif.Trace, "replay": cronoq.whatif.replay, "simulate": cronoq.whatif.simulate,
    "variants": cronoq.whatif.variants, "Report": cronoq.whatif.Report,
}


@pytest.mark.parametrize("name", sorted(CALLABLES))
def test_every_parameter_is_documented(name):
    section = SECTIONS[name]
    params = _signature_names(CALLABLES[name])
    if name == "Resource":
        params += _signature_names(cronoq.Resource.semaphore) + _signature_names(cronoq.Resource.token_bucket)
    missing = [p for p in params if not re.search(rf"\b{re.escape(p)}\b", section)]
    assert not missing, f"docs/api.md, section {name}: parameters not documented: {missing}"


# Classes whose every public method, property and field is documented in their section.
MEMBERS = {
    "Scheduler": cronoq.Scheduler, "BlockingScheduler": cronoq.BlockingScheduler,
    "TaskContext": cronoq.TaskContext, "TaskHandle": cronoq.TaskHandle,
    "BlockingHandle": cronoq.BlockingHandle,
    "EventStream": cronoq.EventStream, "BlockingEventStream": cronoq.BlockingEventStream,
    "VirtualClock": cronoq.VirtualClock, "Snapshot": cronoq.Snapshot, "PoolSnapshot": cronoq.PoolSnapshot,
    "GroupSnapshot": cronoq.GroupSnapshot, "TaskInfo": cronoq.TaskInfo, "StatusEvent": cronoq.StatusEvent,
    "RetryPolicy": cronoq.RetryPolicy, "Resource": cronoq.Resource, "AutoscaleConfig": cronoq.AutoscaleConfig,
    "Dep": cronoq.Dep, "Pool": cronoq.Pool, "JsonCodec": cronoq.JsonCodec,
    "PrometheusCollector": PrometheusCollector, "MetricsServer": cronoq.telemetry.MetricsServer,
    "Instrumentation": otel.Instrumentation,
    "TraceRecorder": cronoq.whatif.TraceRecorder, "Trace": cronoq.whatif.Trace,
    "TracedTask": cronoq.whatif.TracedTask, "TracedAttempt": cronoq.whatif.TracedAttempt,
    "Variant": cronoq.whatif.Variant, "PolicyFile": cronoq.whatif.PolicyFile,
    "Report": cronoq.whatif.Report, "Figures": cronoq.whatif.Figures,
    "ReplayResult": cronoq.whatif.ReplayResult,
}


@pytest.mark.parametrize("name", sorted(MEMBERS))
def test_every_public_member_is_documented(name):
    section = SECTIONS[name]
    members = [m for m in vars(MEMBERS[name]) if not m.startswith("_")]
    missing = [m for m in members if not re.search(rf"\b{re.escape(m)}\b", section)]
    assert not missing, f"docs/api.md, section {name}: members not documented: {missing}"


def test_snapshot_fields_and_totals_are_documented():
    from cronoq.core.snapshot import TOTAL_FIELDS
    for field in TOTAL_FIELDS:
        assert f"`{field}`" in SECTIONS["Snapshot"], field
        assert f"`{field}`" in (DOCS / "concepts.md").read_text(), field


# ---------------------------------------------------------------- the metrics reference

METRICS = (DOCS / "metrics.md").read_text()


def _row(name: str) -> str | None:
    match = re.search(rf"^\| `{re.escape(name)}` \|.*$", METRICS, re.M)
    return match.group(0) if match else None


def test_every_prometheus_series_is_documented_with_its_type():
    from cronoq.server.counters import ServerCounters

    documented = set(re.findall(r"^\| `(cronoq_[a-z_]+)` \|", METRICS, re.M))
    exposed = set()
    # The library's collector, and what cronoq-server's /metrics adds (its own counters, its workers).
    families = [(f.name, f.type) for f in [*PrometheusCollector.describe(None), *ServerCounters().families()]]
    families += [(name, kind) for name, kind, _ in WORKER_FAMILIES]
    families += [(name, kind) for name, kind, _ in LLM_FAMILIES]   # cronoq-llm-worker's own /metrics
    for family_name, family_type in families:
        name = family_name + ("_total" if family_type == "counter" else "")
        exposed.add(name)
        row = _row(name)
        assert row is not None, f"docs/metrics.md does not list {name}"
        assert f"| {family_type} |" in row, f"{name} is a {family_type}: {row}"
    assert documented == exposed, f"documented but not exposed: {documented - exposed}"


def test_every_opentelemetry_instrument_is_documented_with_its_kind_and_unit():
    for kind, name, unit, _, _ in otel.INSTRUMENTS:
        row = _row(name)
        assert row is not None, f"docs/metrics.md does not list {name}"
        assert f"| observable {kind} | `{unit}` |" in row, row
    assert "`cronoq.task`" in METRICS
    for attribute in ("task.id", "task.pool", "task.kind", "task.attempt"):
        assert f"`{attribute}`" in METRICS


# ---------------------------------------------------------------- links

def slug(heading: str) -> str:
    text = heading.strip().lstrip("#").strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: pathlib.Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return {slug(line) for line in text.splitlines() if line.startswith("#")}


@pytest.mark.parametrize("path", FILES, ids=rel)
def test_links_resolve(path):
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(target)
    assert not broken, f"{rel(path)}: broken links {broken}"


def test_readme_keeps_its_first_two_commands_and_links_the_docs():
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```sh\n(.*?)```", readme, re.S).group(1).splitlines()
    assert first[0] == ("python3 -m venv .venv && .venv/bin/pip install -q -e . && "
                        ".venv/bin/python -m cronoq demo")
    assert first[1].startswith("python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev")
    assert "## Documentation" in readme
    for name in ("docs/index.md", "docs/concepts.md", "docs/api.md", "docs/metrics.md", "docs/operations.md"):
        assert f"]({name})" in readme, name


INSTALL = re.compile(r"""pip install (?:-q )?-e (?:\.(?=[\s`&]|$)|(["'])\.\[([^\]]*)\]\1)""")


def test_every_install_line_names_extras_that_exist():
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    seen, unknown, bare = 0, [], []
    for path in FILES:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for match in INSTALL.finditer(line):
                seen += 1
                unknown += [f"{rel(path)}:{number}: [{name}]" for name in (match.group(2) or "").split(",")
                            if name and name.strip() not in extras]
            # Our distribution is not on the package registry (README, Installing): only editable installs.
            if re.search(r"pip install (-q )?[\"']?cronoq\b", line) and "would give you" not in line:
                bare.append(f"{rel(path)}:{number}")
    assert seen >= 15, "the install lines were not found"
    assert not unknown, f"install lines naming extras pyproject.toml does not define: {unknown}"
    assert not bare, f"install lines that would fetch another project's cronoq from the registry: {bare}"
