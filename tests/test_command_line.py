"""One command line: ``python -m cronoq`` is the ``cronoq`` program, and
starting it loads only what the command needs (each case in a fresh
interpreter, since an import, once done, stays done). The start-up times
themselves are measured in bench/cli_start.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import cronoq

ENV = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=ENV, timeout=120)


def _loaded_by(code: str) -> set[str]:
    done = _python("-c", code + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))")
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def _commands(help_text: str) -> list[str]:
    """The subcommand names a --help lists."""
    listing = help_text.split("positional arguments:")[1].split("options:")[0]
    return [line.split()[0] for line in listing.splitlines() if line.startswith("    ") and line[4] != " "]


def test_python_m_cronoq_is_the_cronoq_program():
    via_module = _python("-m", "cronoq", "--help")
    via_entry = _python("-c", "import sys; from cronoq.cli import main; sys.exit(main(['--help']))")
    assert via_module.returncode == via_entry.returncode == 0
    assert via_module.stdout.startswith("usage: python -m cronoq ") and via_entry.stdout.startswith("usage: cronoq ")
    commands = _commands(via_module.stdout)
    assert commands == _commands(via_entry.stdout)
    assert {"submit", "get", "top", "watch", "snapshot", "demo", "mcp", "simulate"} <= set(commands)
    version = _python("-m", "cronoq", "--version")
    assert version.stdout.strip() == f"cronoq {cronoq.__version__}"


def test_the_demo_is_a_subcommand_of_both_and_cronoq_demo_takes_its_options_alone():
    assert "--seconds" in _python("-m", "cronoq", "demo", "--help").stdout
    alone = _python("-c", "import sys; from cronoq.demo_cli import main; sys.exit(main(['--help']))")
    assert alone.returncode == 0 and alone.stdout.startswith("usage: cronoq-demo [-h] [--seconds SECONDS]")
    refused = _python("-c", "import sys; from cronoq.demo_cli import main; sys.exit(main(['--seconds', '0']))")
    assert refused.returncode == 2 and "--seconds and --speed must be positive" in refused.stderr


def test_importing_cronoq_loads_no_part_of_it_until_a_name_is_used():
    loaded = _loaded_by("import cronoq")
    assert {m for m in loaded if m.startswith("cronoq")} == {"cronoq", "cronoq._version"}
    assert not loaded & {"asyncio", "sqlalchemy", "croniter", "grpc"}
    used = _loaded_by("import cronoq\ncronoq.Scheduler, cronoq.Task")
    assert {"cronoq.runtime", "cronoq.core.engine", "asyncio"} <= used
    assert not used & {"sqlalchemy", "croniter", "grpc"}   # the stores and cron load when used


def test_every_export_of_cronoq_resolves_and_is_listed():
    assert sorted(name for name in cronoq.__all__ if name != "__version__") == sorted(cronoq._EXPORTS)
    for name in cronoq.__all__:
        assert getattr(cronoq, name) is not None
    assert set(cronoq.__all__) <= set(dir(cronoq))
    assert cronoq.core.engine.Core is cronoq.core.Core   # subpackages, as an eager import gave them
    try:
        cronoq.NoSuchThing   # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("an unknown name must raise AttributeError")


def test_version_and_help_load_neither_the_runtime_nor_grpc():
    for argv in (["--version"], ["--help"], ["submit", "--help"]):
        loaded = _loaded_by(f"from cronoq.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass")
        assert not loaded & {"asyncio", "grpc", "cronoq.runtime", "cronoq.core.engine", "sqlalchemy"}, argv


def test_the_demo_runs_through_the_command_line_without_the_client_extras():
    # README's first command installs cronoq without extras: no grpc, no protobuf.
    code = ("import sys\nsys.modules['grpc'] = None\nsys.modules['google.protobuf'] = None\n"
            "sys.argv = ['python -m cronoq', 'demo', '--seconds', '0.3', '--speed', '0.2', '--no-live']\n"
            "import runpy\nrunpy.run_module('cronoq', run_name='__main__')")
    done = _python("-c", code)
    assert done.returncode == 0, done.stderr
    assert "Totals, whole run" in done.stdout
