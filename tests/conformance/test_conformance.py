"""One conformance suite for every worker language: the same scenarios, against a
real cronoq-server, for each entry of LANGUAGES (the contract is in README.md here).

A language is a name, how to get its worker program's command (built once a
session; it may skip), and the largest integer its JSON keeps exactly. One
server serves the module; each scenario and language has a pool of its own.
Waits are for printed lines and server answers, never for wall-clock times.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import pytest_asyncio

from cronoq import RetryPolicy
from cronoq.client import Client
from serverkit import AUTH, CLIENT, LISTEN, WORKER, server_env

pytestmark = pytest.mark.asyncio

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PROGRAMS = HERE / "workers"


def _require_or_skip(reason: str, variable: str = "CRONOQ_REQUIRE_NODE") -> None:
    if os.environ.get(variable) == "1":
        pytest.fail(f"{reason} ({variable}=1)")
    pytest.skip(reason)


def python_command(build_root: Path) -> tuple[list[str], dict[str, str]]:
    return [sys.executable, str(PROGRAMS / "python_worker.py")], {}


def typescript_command(build_root: Path) -> tuple[list[str], dict[str, str]]:
    """Node 20 runs the program on a build of clients/typescript made in a copy of
    its own (``npm ci && npm run build``, offline from the committed lock): the
    TypeScript client's own test reinstalls clients/typescript meanwhile."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        _require_or_skip("node or npm not installed: the TypeScript worker needs Node 20 and npm")
    assert node is not None and npm is not None
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    if int(version.lstrip("v").split(".", 1)[0]) < 20:
        _require_or_skip(f"node {version} is too old: the TypeScript worker needs Node 20 or later")
    package = ROOT / "clients" / "typescript"
    sources = [package / name for name in ("package.json", "package-lock.json", "tsconfig.json")]
    sources += sorted((package / "src").glob("*.ts")) + sorted((package / "scripts").glob("*"))
    proto = ROOT / "cronoq" / "_proto" / "cronoq.proto"
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources + [proto])).hexdigest()[:16]
    copy = build_root / f"typescript-{digest}"
    copy.mkdir(parents=True, exist_ok=True)
    with open(build_root / f"typescript-{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)     # one build for every xdist worker
        built = copy / "clients" / "typescript" / "dist" / "index.js"
        if not built.exists():
            target = copy / "clients" / "typescript"
            for path in sources:
                destination = target / path.relative_to(package)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, destination)
            (copy / "cronoq" / "_proto").mkdir(parents=True, exist_ok=True)
            shutil.copy(proto, copy / "cronoq" / "_proto" / "cronoq.proto")
            for args in (("ci", "--no-audit", "--no-fund"), ("run", "build")):
                done = subprocess.run([npm, *args], cwd=target, capture_output=True, text=True, timeout=600,
                                      stdin=subprocess.DEVNULL)
                assert done.returncode == 0, f"npm {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return [node, str(PROGRAMS / "typescript_worker.mjs")], {"CRONOQ_TS_PACKAGE": str(built)}


def go_program(build_root: Path, main_dir: Path) -> Path:
    """clients/go/build.sh builds the Go program in main_dir with the
    distribution's Go packages (GOPATH mode, no downloads), once a session;
    its exit status 3 names the missing packages."""
    package = ROOT / "clients" / "go"
    if shutil.which("go") is None or shutil.which("protoc") is None:
        _require_or_skip("go or protoc not installed: the Go worker needs apt-get install golang-go protobuf-compiler "
                         "protoc-gen-go protoc-gen-go-grpc golang-google-grpc-dev golang-google-protobuf-dev "
                         "golang-github-golang-protobuf-1-5-dev", "CRONOQ_REQUIRE_GO")
    sources = [package / "build.sh"] + sorted((package / "cronoq").glob("*.go"))
    sources += sorted(main_dir.glob("*.go")) + [ROOT / "cronoq" / "_proto" / "cronoq.proto"]
    flags = os.environ.get("CRONOQ_GO_BUILD_FLAGS", "").encode()     # e.g. -race
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources) + flags).hexdigest()[:16]
    built = build_root / f"go-{main_dir.name}-{digest}"
    with open(build_root / f"go-{main_dir.name}-{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)     # one build for every xdist worker
        if not built.exists():
            done = subprocess.run(["sh", str(package / "build.sh"), str(main_dir), str(built)],
                                  capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
            if done.returncode == 3:
                _require_or_skip(done.stderr.strip(), "CRONOQ_REQUIRE_GO")
            assert done.returncode == 0, f"clients/go/build.sh failed:\n{done.stdout}\n{done.stderr}"
    return built


def go_command(build_root: Path) -> tuple[list[str], dict[str, str]]:
    return [str(go_program(build_root, PROGRAMS / "go_worker"))], {}


@dataclass(frozen=True)
class Language:
    name: str
    command: Callable[[Path], tuple[list[str], dict[str, str]]]
    exact_int: int                       # the largest integer its JSON values keep exactly


# Adding a language is one entry here and a program in workers/.
LANGUAGES = [
    Language("python", python_command, 2**64 + 1),
    Language("typescript", typescript_command, 2**53 - 1),
    Language("go", go_command, 2**64 + 1),   # the worker passes JSON numbers on as written
]

SCENARIOS = ["outputs", "retry", "throw", "permanent", "cancel", "timeout", "kill", "drain", "reject", "stages",
             "slots"]


def pool(scenario: str, language: Language) -> str:
    return f"{scenario}-{language.name}"


CONFIG = LISTEN + AUTH + "".join(
    f'[[pools]]\nname = "{pool(s, lang)}"\nlease_ttl_s = 1\n'
    f"retry = {{ max_attempts = 3, initial_backoff_s = 0.05, jitter = false }}\n"
    for s in SCENARIOS for lang in LANGUAGES) + '[[pools]]\nname = "protocol"\n[[pools]]\nname = "go-example"\n'


@pytest.fixture(scope="module")
def server(module_servers):
    return module_servers(CONFIG, name="conformance")


_COMMANDS: dict[str, tuple[list[str], dict[str, str]]] = {}


@pytest.fixture(params=LANGUAGES, ids=lambda lang: lang.name)
def language(request, tmp_path_factory) -> Language:
    lang: Language = request.param
    if lang.name not in _COMMANDS:
        shared = tmp_path_factory.getbasetemp().parent    # the same for every xdist worker
        _COMMANDS[lang.name] = lang.command(shared)
    return lang


class Program:
    """A worker program in a child process; its stdout lines are read on a thread."""

    def __init__(self, language: Language, target: str, pool_name: str, *, slots: int = 1, name: str = "w",
                 drain_timeout: float = 30.0) -> None:
        argv, extra = _COMMANDS[language.name]
        env = server_env({**extra, "CRONOQ_TARGET": target, "CRONOQ_TOKEN": WORKER, "CRONOQ_POOL": pool_name,
                          "CRONOQ_SLOTS": str(slots), "CRONOQ_DRAIN_TIMEOUT_S": str(drain_timeout),
                          "CRONOQ_WORKER_NAME": name})
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, args=(self.process.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._read, args=(self.process.stderr, self.errors), daemon=True).start()

    def _read(self, stream, into: list[str]) -> None:
        for line in stream:
            with self._changed:
                into.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, line: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while line not in self.lines:
                left = deadline - time.monotonic()
                if left <= 0 or (self.process.poll() is not None and left < timeout - 1):
                    raise AssertionError(f"the worker did not print {line!r}: {self.lines}\n" + "\n".join(self.errors))
                self._changed.wait(min(left, 0.2))

    async def until(self, line: str, timeout: float = 30.0) -> None:
        await asyncio.to_thread(self.wait_for, line, timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


@pytest.fixture
def programs(server):
    started: list[Program] = []

    async def start(language: Language, pool_name: str, **options) -> Program:
        program = Program(language, server.target, pool_name, **options)
        started.append(program)
        await program.until("ready")
        return program

    yield start
    for program in started:
        program.stop()


@pytest_asyncio.fixture
async def client(server):
    async with Client(server.target, token=CLIENT) as c:
        yield c


# ---------------------------------------------------------------- scenarios


async def test_outputs_echo_json_values(server, language, programs, client):
    await programs(language, pool("outputs", language), slots=4)
    values = [{"nested": {"list": [1, 2.5, True, False, None, {"deep": []}], "empty": {}}},
              [1, "two", [3]], 0, -7, 1.5, True, None, {"text": "héllo ☃ 𝄞 שלום e\u0301 \"quoted\"\n\\ nul\u0000"},
              {"big": language.exact_int, "negative": -language.exact_int}, "plain text ☃", "x" * 200_000]
    ids = [(await client.submit({"do": "echo", "value": v}, pool=pool("outputs", language))).id for v in values]
    for value, task_id in zip(values, ids):
        result = await client.wait(task_id, timeout=30)
        assert result.status == "succeeded", result.message
        if isinstance(value, str):
            assert result.content_type.startswith("text/plain") and result.text() == value
        else:
            assert result.content_type == "application/json" and result.json() == value


async def test_retry_after_is_honoured(server, language, programs, client):
    await programs(language, pool("retry", language))
    sub = await client.submit({"do": "retry", "until": 2, "retry_after_s": 0.8}, pool=pool("retry", language))
    result = await client.wait(sub.id, timeout=30)
    assert result.status == "succeeded" and result.json() == {"attempt": 2}
    first, second = (await client.get(sub.id)).attempts
    assert (first.status, first.message) == ("retrying", "not yet: attempt 1")
    # The pool's backoff is 50 ms: only retry_after explains the gap the server recorded.
    assert second.started - first.ended >= 0.8 - 0.01, (first, second)


async def test_a_thrown_error_is_a_retryable_failure_with_its_message(server, language, programs, client):
    await programs(language, pool("throw", language))
    sub = await client.submit({"do": "throw", "message": "the model returned nothing"},
                              pool=pool("throw", language), retry=RetryPolicy(max_attempts=2, initial_backoff=0.05))
    result = await client.wait(sub.id, timeout=30)
    assert result.status == "dead_lettered"
    attempts = (await client.get(sub.id)).attempts
    assert [a.status for a in attempts] == ["retrying", "dead_lettered"]
    assert all("the model returned nothing" in (a.message or "") for a in attempts), attempts


async def test_a_permanent_failure_ends_after_one_attempt_with_its_message(server, language, programs, client):
    await programs(language, pool("permanent", language))
    sub = await client.submit({"do": "permanent", "message": "bad input: 42"}, pool=pool("permanent", language))
    result = await client.wait(sub.id, timeout=30)
    assert (result.status, result.message) == ("failed", "bad input: 42")
    attempts = (await client.get(sub.id)).attempts
    assert [(a.attempt, a.status) for a in attempts] == [(1, "failed")]


async def test_cancel_aborts_the_handler_and_frees_the_slot(server, language, programs, client):
    worker = await programs(language, pool("cancel", language), slots=1)
    sub = await client.submit({"do": "sleep", "seconds": 600}, pool=pool("cancel", language))
    await worker.until(f"started {sub.id} 1")
    assert await client.cancel(sub.id)
    await worker.until(f"aborted {sub.id} 1 cancelled")
    assert (await client.wait(sub.id, timeout=30)).status == "cancelled"
    after = await client.submit({"do": "echo", "value": "next"}, pool=pool("cancel", language), wait=True,
                                wait_timeout=30)
    assert after.result is not None and after.result.text() == "next"


async def test_a_timeout_aborts_the_handler_and_fails_the_attempt(server, language, programs, client):
    worker = await programs(language, pool("timeout", language), slots=1)
    sub = await client.submit({"do": "sleep", "seconds": 600}, pool=pool("timeout", language), timeout=0.3,
                              retry=RetryPolicy(max_attempts=1))
    await worker.until(f"aborted {sub.id} 1 timeout")
    result = await client.wait(sub.id, timeout=30)
    assert result.status == "dead_lettered" and "timed out" in (result.message or "")
    after = await client.submit({"do": "echo", "value": 1}, pool=pool("timeout", language), wait=True,
                                wait_timeout=30)
    assert after.result is not None and after.result.json() == 1


async def test_a_killed_worker_s_task_runs_again_on_a_new_worker(server, language, programs, client):
    first = await programs(language, pool("kill", language), name="doomed")
    sub = await client.submit({"do": "sleep", "seconds": 600, "until": 2}, pool=pool("kill", language))
    await first.until(f"started {sub.id} 1")
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(10)
    second = await programs(language, pool("kill", language), name="fresh")
    result = await client.wait(sub.id, timeout=30)
    assert result.status == "succeeded" and result.text() == "slept"
    attempts = (await client.get(sub.id)).attempts
    assert [(a.attempt, a.worker_name) for a in attempts] == [(1, "doomed"), (2, "fresh")]
    assert attempts[0].status == "retrying"
    assert f"started {sub.id} 2" in second.lines


async def test_sigterm_drains_the_running_task_takes_no_new_one_and_exits_0(server, language, programs, client):
    name = pool("drain", language)
    worker = await programs(language, name, slots=1, drain_timeout=30)
    running = await client.submit({"do": "sleep", "seconds": 2}, pool=name)
    await worker.until(f"started {running.id} 1")
    waiting = await client.submit({"do": "echo", "value": "not here"}, pool=name)
    worker.process.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(worker.process.wait, 30) == 0, worker.errors
    result = await client.wait(running.id, timeout=30)
    assert result.status == "succeeded" and result.text() == "slept"
    info = await client.get(waiting.id)
    assert info.status == "ready" and info.attempts == [], info
    await client.cancel(waiting.id)


async def test_a_rejected_lease_runs_on_another_worker_without_using_an_attempt(server, language, programs, client):
    from serverkit import RawWorker
    from cronoq._proto import cronoq_pb2 as pb
    name = pool("reject", language)
    await programs(language, name, slots=2)        # the most free slots: it gets the lease first
    other = RawWorker(server.target, WORKER)
    try:
        await other.register(name, slots=1, name="other")
        sub = await client.submit({"do": "reject", "message": "not for me"}, pool=name)
        lease = await other.recv_kind("lease")
        assert (lease.task_id, lease.attempt) == (sub.id, 1)    # a Nack, not a Fail: the same attempt
        await other.send(complete=pb.Complete(lease=lease.lease, output=b"done", content_type="text/plain"))
        result = await client.wait(sub.id, timeout=30)
        assert result.status == "succeeded" and result.text() == "done"
    finally:
        await other.close()


async def test_checkpoints_resume_from_the_last_stage(server, language, programs, client):
    await programs(language, pool("stages", language))
    stages = ["fetch", "parse", "embed", "store"]
    sub = await client.submit({"do": "stages", "stages": stages, "fail_after": 2}, pool=pool("stages", language),
                              stages=stages)
    result = await client.wait(sub.id, timeout=30)
    assert result.status == "succeeded", result.message
    assert result.json() == {"ran": ["embed", "store"], "resumed_from": "parse",
                             "restored": {"fetch": {"stage": "fetch"}, "parse": {"stage": "parse"}}}
    info = await client.get(sub.id)
    assert [(c.stage, c.attempt) for c in info.checkpoints] == [("fetch", 1), ("parse", 1), ("embed", 2),
                                                                ("store", 2)]
    assert info.attempts[0].message == "failed after 2 stages"


async def test_slots_bound_the_tasks_running_at_once(server, language, programs, client):
    name = pool("slots", language)
    await programs(language, name, slots=2)
    ids = [(await client.submit({"do": "sleep", "seconds": 0.4}, pool=name)).id for _ in range(6)]
    spans = []
    for task_id in ids:
        assert (await client.wait(task_id, timeout=30)).status == "succeeded"
        (attempt,) = (await client.get(task_id)).attempts
        spans.append((attempt.started, attempt.ended))
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans], key=lambda e: (e[0], e[1]))
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    assert peak == 2, spans      # both slots used, never a third


# ---------------------------------------------------------------- the Go example (its Client too)


async def test_the_go_example_serves_and_submits(server, tmp_path_factory):
    program = go_program(tmp_path_factory.getbasetemp().parent, ROOT / "clients" / "go" / "examples" / "worker")
    env = server_env({"CRONOQ_TARGET": server.target, "CRONOQ_POOL": "go-example", "CRONOQ_WORKER_TOKEN": WORKER,
                      "CRONOQ_CLIENT_TOKEN": CLIENT})
    done = await asyncio.to_thread(subprocess.run, [str(program)], env=env, capture_output=True, text=True,
                                   timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == 'TASK_STATUS_SUCCEEDED {"attempt":2,"doubled":42}', done.stdout


async def test_docs_go_md_shows_the_example_exactly():
    page = (ROOT / "docs" / "go.md").read_text()
    marker = "<!-- file: clients/go/examples/worker/main.go -->\n```go\n"
    assert marker in page, "docs/go.md has no block marked clients/go/examples/worker/main.go"
    start = page.index(marker) + len(marker)
    block = page[start:page.index("```\n", start)]
    assert block == (ROOT / "clients" / "go" / "examples" / "worker" / "main.go").read_text()


# ---------------------------------------------------------------- protocol violations (raw gRPC, once)


async def test_the_server_refuses_protocol_violations(server):
    import grpc
    from serverkit import RawWorker
    from cronoq._proto import cronoq_pb2 as pb
    early = RawWorker(server.target, WORKER)
    await early.send(heartbeat=pb.Heartbeat(lease=1))
    _, code, details = await early.finish()
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "first message must be Register" in details
    await early.close()
    # A completion for a lease the worker does not hold never ends the holder's attempt.
    name = "protocol"
    holder, intruder = RawWorker(server.target, WORKER), RawWorker(server.target, WORKER)
    async with Client(server.target, token=CLIENT) as client:
        try:
            await holder.register(name, slots=1, name="holder")
            sub = await client.submit({"do": "echo", "value": 1}, pool=name)
            lease = await holder.recv_kind("lease")
            await intruder.register(name, slots=1, name="intruder")
            await intruder.send(complete=pb.Complete(lease=lease.lease, output=b"stolen", content_type="text/plain"))
            await intruder.send(fail=pb.Fail(lease=lease.lease, message="stolen", permanent=True))
            assert (await client.get(sub.id)).status == "running"
            await holder.send(complete=pb.Complete(lease=lease.lease, output=b"mine", content_type="text/plain"))
            result = await client.wait(sub.id, timeout=30)
            assert (result.status, result.text()) == ("succeeded", "mine")
        finally:
            await holder.close()
            await intruder.close()
