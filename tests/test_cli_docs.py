"""docs/cli.md stays true to ``cronoq``: its exit code table is ExitCode,
every command it shows parses, every option of every command is on the page,
and its capture of ``cronoq top`` has the panes and columns top draws today."""

from __future__ import annotations

import argparse
import re
import shlex

import pytest

from cronoq.cli import ExitCode
from cronoq.cli.app import build_parser
from serverkit import ROOT

PAGE = (ROOT / "docs" / "cli.md").read_text()


def _section(heading: str) -> str:
    start = PAGE.index(heading)
    following = re.search(r"^## ", PAGE[start + len(heading):], re.M)
    return PAGE[start:start + len(heading) + following.start()] if following else PAGE[start:]


def _blocks(language: str, text: str = PAGE) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.M | re.S)


def test_the_exit_code_table_is_the_exit_codes():
    rows = re.findall(r"^\| (\d+) \| (.+) \|$", _section("## Exit codes"), re.M)
    assert {int(code) for code, _ in rows} == {int(code) for code in ExitCode}


def _commands() -> list[list[str]]:
    commands = []
    for block in _blocks("sh"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #", 1)[0].strip()
            if line.startswith("cronoq ") and "[" not in line:   # not a synopsis like `cronoq top [--pool POOL]`
                words = shlex.split(line)[1:]
                while "<" in words or ">" in words:   # a redirection is the shell's
                    at = words.index("<" if "<" in words else ">")
                    del words[at:at + 2]
                commands.append(words)
    return commands


def test_every_command_on_the_page_parses():
    commands = _commands()
    shown = {words[0] for words in commands}
    assert {"submit", "get", "explain", "wait", "cancel", "tasks", "workers", "schedules", "schedule", "snapshot", "watch",
            "top"} <= shown
    for words in commands:
        try:
            build_parser(words[0]).parse_args(words)
        except SystemExit:
            raise AssertionError(f"docs/cli.md: `cronoq {' '.join(words)}` does not parse") from None


def _options(parser: argparse.ArgumentParser, path: str = "") -> dict[str, set[str]]:
    found: dict[str, set[str]] = {path: set()}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if path == "" and name in ("demo", "mcp", "simulate"):
                    continue   # contributed subcommands document themselves
                found.update(_options(sub, f"{path} {name}".strip()))
        else:
            found[path] |= {s for s in action.option_strings if s.startswith("--") and s != "--help"}
    return found


@pytest.mark.parametrize("command,options", sorted(_options(build_parser()).items()))
def test_every_option_is_on_the_page(command, options):
    missing = sorted(o for o in options if not re.search(rf"{re.escape(o)}(?![\w-])", PAGE))
    assert not missing, f"docs/cli.md does not mention {missing} (cronoq {command})"


def test_the_capture_of_top_has_the_panes_and_columns_top_draws():
    from test_cli_units import _drawn

    capture = next(block for block in _blocks("text", _section("## `cronoq top`")) if "cronoq top" in block)
    captured = [line.split() for line in capture.splitlines()]
    drawn = _drawn(110, 36)
    assert capture.splitlines()[0].split()[:6] == drawn.splitlines()[0].split()[:6]   # cronoq top  q quit  r refresh
    for title in ("Pools", "Workers (", "Schedules (", "Live tasks (", "Recent events"):
        assert title in capture and title in drawn, title
    headings = [line.split() for line in drawn.splitlines()
                if line.split()[:2] in (["POOL", "CAPACITY"], ["NAME", "POOL"], ["ID", "STATUS"], ["TIME", "ID"])]
    assert len(headings) == 4, drawn
    for heading in headings:
        assert heading in captured, f"the capture in docs/cli.md lacks the columns {heading}: run tests/capture_top.py"
