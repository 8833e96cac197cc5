"""A throwaway PostgreSQL server for the store tests (and the store benchmark).

``PgServer().start()`` runs ``initdb`` and ``pg_ctl`` on a fresh temporary
directory and a free port, listening on 127.0.0.1 only with trust
authentication; ``stop()`` stops that server (and only it) and removes the
directory. The binaries are looked up in ``$CRONOQ_PG_BINDIR`` when it is
set (and only there), else on PATH, then under ``/usr/lib/postgresql/*/bin``.
PostgreSQL refuses to run as root: as root the commands run as the
``postgres`` user through ``runuser``, which then owns the directory.

Where no server can be had, the tests that need one skip with the reason;
with ``CRONOQ_REQUIRE_POSTGRES=1`` (CI sets it) they fail instead, so a green
run cannot hide them (``skip_or_fail``).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from typing import Any, NoReturn

__all__ = ["PgServer", "find_binaries", "unavailable_reason", "required", "skip_or_fail", "start_or_skip",
           "need_psycopg", "REQUIRE_VARIABLE", "BINDIR_VARIABLE"]

REQUIRE_VARIABLE = "CRONOQ_REQUIRE_POSTGRES"
BINDIR_VARIABLE = "CRONOQ_PG_BINDIR"

_NAMES = ("initdb", "pg_ctl")


def find_binaries() -> str | None:
    """The directory holding initdb and pg_ctl, or None."""
    chosen = os.environ.get(BINDIR_VARIABLE)
    if chosen:
        return chosen if all(os.path.exists(os.path.join(chosen, name)) for name in _NAMES) else None
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return os.path.dirname(os.path.realpath(found))
    for directory in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if all(os.path.exists(os.path.join(directory, name)) for name in _NAMES):
            return directory
    return None


def unavailable_reason() -> str | None:
    """Why a server cannot be started here (None if it can)."""
    if find_binaries() is None:
        where = os.environ.get(BINDIR_VARIABLE)
        if where:
            return f"the PostgreSQL server binaries (initdb, pg_ctl) are not in {BINDIR_VARIABLE}={where}"
        return "the PostgreSQL server binaries (initdb, pg_ctl) are not installed"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'cronoq[postgres]')"
    if os.name == "posix" and os.geteuid() == 0:
        if shutil.which("runuser") is None:
            return "running as root without runuser to start PostgreSQL as another user"
        try:
            import pwd
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run the server as"
    return None


def required() -> bool:
    """Must the PostgreSQL tests run here (``CRONOQ_REQUIRE_POSTGRES`` set, not 0)?"""
    return os.environ.get(REQUIRE_VARIABLE, "").strip() not in ("", "0")


def skip_or_fail(reason: str) -> NoReturn:
    """Skip the calling test for ``reason``, or fail it when PostgreSQL is required."""
    import pytest

    if required():
        pytest.fail(f"PostgreSQL tests cannot run, and {REQUIRE_VARIABLE}=1 requires them: {reason}",
                    pytrace=False)
    pytest.skip(f"PostgreSQL tests skipped: {reason}")


def start_or_skip(**options: Any) -> PgServer:
    """A started server; where none can be had, ``skip_or_fail``. A server
    that is there but fails to start is an error either way."""
    reason = unavailable_reason()
    if reason:
        skip_or_fail(reason)
    return PgServer(**options).start()


def need_psycopg() -> None:
    """For tests that need only the driver: ``skip_or_fail`` without psycopg."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        skip_or_fail("psycopg is not installed (pip install 'cronoq[postgres]')")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    def __init__(self, *, fsync: bool = False, settings: dict[str, str] | None = None) -> None:
        self.bindir = find_binaries()
        if self.bindir is None:
            raise RuntimeError(unavailable_reason())
        self.fsync = fsync
        self.settings = dict(settings or {})
        self.port = 0
        self.root: str | None = None
        self.running = False
        self._as_root = os.name == "posix" and os.geteuid() == 0

    # -- paths

    @property
    def data(self) -> str:
        return os.path.join(self.root, "data")

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        command = [os.path.join(self.bindir, args[0]), *args[1:]]
        if self._as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                timeout=timeout, stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            log = ""
            try:
                with open(os.path.join(self.root, "server.log")) as f:
                    log = f.read()[-2000:]
            except OSError:
                pass
            raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}\n{log}")
        return result

    # -- lifecycle

    def start(self) -> PgServer:
        """Create the cluster (first time) and start the server."""
        if self.root is None:
            self.root = tempfile.mkdtemp(prefix="cronoq-pg-")
            if self._as_root:
                import pwd
                pw = pwd.getpwnam("postgres")
                os.chown(self.root, pw.pw_uid, pw.pw_gid)
            self._run("initdb", "-D", self.data, "-U", "postgres", "-A", "trust", "-E", "UTF8",
                      "--no-sync", "--no-instructions" if self._initdb_has_no_instructions() else "-n")
        if not self.port:
            self.port = _free_port()
        self._start()
        return self

    def _initdb_has_no_instructions(self) -> bool:
        try:
            version = subprocess.run([os.path.join(self.bindir, "initdb"), "--version"], text=True,
                                     stdout=subprocess.PIPE, timeout=10).stdout
            return int(version.split()[-1].split(".")[0]) >= 13
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            return False

    def _start(self) -> None:
        options = [f"-p {self.port}", "-c listen_addresses=127.0.0.1", f"-k {self.root}",
                   "-c max_connections=200", "-c shared_buffers=32MB"]
        if not self.fsync:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        options += [f"-c {name}={value}" for name, value in self.settings.items()]
        for attempt in range(3):
            try:
                self._run("pg_ctl", "-D", self.data, "-l", os.path.join(self.root, "server.log"), "-w",
                          "-t", "30", "-o", " ".join(options), "start")
                break
            except RuntimeError:
                if attempt == 2:
                    raise
                self.port = _free_port()   # the port was taken meanwhile
                options[0] = f"-p {self.port}"
        self.running = True

    def restart(self) -> None:
        """Start again after ``stop_server`` (same data, same port)."""
        self._start()

    def stop_server(self, mode: str = "fast") -> None:
        """Stop the server, keeping its data."""
        if self.running:
            self.running = False
            self._run("pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "30", "stop")

    def stop(self) -> None:
        """Stop the server and remove its directory."""
        try:
            self.stop_server("immediate")
        finally:
            if self.root is not None:
                shutil.rmtree(self.root, ignore_errors=True)
                self.root = None

    def __enter__(self) -> PgServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
