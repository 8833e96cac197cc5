"""The reports of cronoq.whatif: the HTML page (parsed: every plot it shows
is a PNG file beside it), JSON, the terminal tables, and the command line
(``python -m cronoq.whatif``, and ``add_parser``/``run`` for ``cronoq simulate``)."""

import argparse
import json
import os
import struct
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from cronoq.whatif import Trace, simulate
from cronoq.whatif.cli import add_parser, main
from cronoq.whatif.html import PLOTS, write_html

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLICIES = """
[[variant]]
name = "as recorded"

[[variant]]
name = "more workers"
pools.app.max = 8
pools.app.autoscale.slo = { high = 0.1 }
"""


def recorded_trace():
    """A small trace as a recorder writes it: start times, ends, samples."""
    lines = [{"cronoq_trace": 1, "t0": 1_800_000_000.0, "source": "recorder",
              "policy": {"pools": {"app": {"min": 1, "max": 2, "autoscale": {"cost_per_worker_second": 0.01}}}}}]
    start = 0.0
    for i in range(40):
        at = i * 0.2
        priority = ("high", "normal", "low")[i % 3]
        start = max(start, at)
        lines.append({"task": i + 1, "at": at, "pool": "app", "kind": priority, "priority": priority,
                      **({"deadline": at + 1.0} if priority == "high" else {})})
        lines.append({"attempt": i + 1, "n": 1, "start": start, "seconds": 0.5, "outcome": "success"})
        lines.append({"end": i + 1, "at": start + 0.5, "status": "succeeded"})
        start += 0.25
    lines.append({"task": 99, "at": 1.0, "kind": "nightly", "start": 5.0, "tolerance": 1.0,
                  "attempts": [{"start": 5.2, "seconds": 1.0, "outcome": "success"}], "status": "succeeded",
                  "end": 6.2})
    lines += [{"sample": float(t), "pools": {"app": [1 + t % 2, 2, 1, t]}} for t in range(10)]
    lines.append({"end_of_trace": True, "dropped": 0, "usage": {"worker_seconds": 15.0, "cost": 0.15}})
    return "\n".join(json.dumps(line) for line in lines) + "\n"


@pytest.fixture
def files(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(recorded_trace())
    policies = tmp_path / "policies.toml"
    policies.write_text(POLICIES)
    return trace, policies


class Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.tables, self.cells = [], [], []
        self._in_cell = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs["src"])
        elif tag == "table":
            self.tables.append(attrs.get("id"))
        elif tag == "td":
            self._in_cell = True

    def handle_endtag(self, tag):
        if tag == "td":
            self._in_cell = False

    def handle_data(self, data):
        if self._in_cell:
            self.cells.append(data)


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_the_html_report_shows_every_plot_as_a_png_beside_it(files, tmp_path):
    trace, policies = files
    report = simulate(trace, policies)
    written = write_html(report, tmp_path / "out" / "report.html")
    page = Page()
    page.feed(open(written[0], encoding="utf-8").read())
    assert page.tables == ["waits", "outcomes"]
    assert page.images == [f"report-{name}.png" for name in PLOTS]
    for src in page.images:
        path = tmp_path / "out" / src
        assert path.stat().st_size > 5000
        width, height = png_size(path)
        assert width >= 500 and height >= 200
    assert sorted(written[1:]) == sorted(str(tmp_path / "out" / src) for src in page.images)
    for name in ("live (recorded)", "as recorded", "more workers"):
        assert name in page.cells


def test_the_json_report_has_every_figure_and_the_timelines(files):
    trace, policies = files
    data = json.loads(simulate(trace, policies).to_json())
    assert data["trace"]["tasks"] == 41 and data["live"]["name"] == "live (recorded)"
    assert data["live"]["cost"] == 0.15 and data["live"]["priority_adherence"] is None
    names = [v["name"] for v in data["variants"]]
    assert names == ["as recorded", "more workers"]
    for column in data["variants"]:
        assert set(column["waits"]) == {"high", "normal", "low", "all"}
        for key in ("deadline_misses", "deadline_tasks", "fixed_start_hit_rate", "priority_adherence",
                    "utilization", "worker_seconds", "cost", "endings", "makespan", "policy"):
            assert key in column
        assert column["timeline"]["pools"]["app"]["capacity"]
        assert column["timeline"]["wait_p90"]["high"]
    assert data["variants"][1]["policy"] == {"pools": {"app": {"max": 8, "autoscale": {"slo": {"high": 0.1}}}}}
    assert data["variants"][1]["waits"]["high"]["p90"] < data["variants"][0]["waits"]["high"]["p90"]


def test_the_command_line_prints_tables_and_writes_reports(files, tmp_path):
    trace, policies = files
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = tmp_path / "cli"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-m", "cronoq.whatif", str(trace), "--config", str(policies),
                           "--json", str(out / "r.json"), "--html", str(out / "r.html"),
                           "--save-trace", str(out / "copy.jsonl")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    for text in ("waits by class", "outcomes", "live (recorded)", "as recorded", "more workers"):
        assert text in proc.stdout
    assert json.loads((out / "r.json").read_text())["variants"][0]["name"] == "as recorded"
    assert (out / "r-capacity.png").stat().st_size > 0
    assert len(Trace.load(out / "copy.jsonl")) == 41


@pytest.mark.parametrize("argv,message", [
    (["missing.jsonl"], "cannot read the trace"),
    (["{trace}", "--config", "missing.toml"], "cannot read the policy file"),
    (["{trace}", "--config", "{bad}"], "unknown key 'maxx'"),
    (["{trace}", "--variant", "nope"], "no variant named 'nope'"),
    (["{trace}", "--schema", "x"], "--schema goes with --store"),
    (["{trace}", "--store"], "cannot read cronoq's tasks from the store: file is not a database"),
    (["{trace}", "--json", "/nonexistent/dir/r.json", "-q"], "No such file or directory"),
])
def test_the_command_line_explains_what_it_cannot_use(files, tmp_path, capsys, argv, message):
    trace, _ = files
    bad = tmp_path / "bad.toml"
    bad.write_text("[[variant]]\nname = 'x'\npools.app.maxx = 1\n")
    argv = [a.format(trace=trace, bad=bad) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("cronoq simulate: ") and message in err


def test_simulate_plugs_into_a_command_line_with_subcommands(files, capsys):
    trace, policies = files
    parser = argparse.ArgumentParser(prog="cronoq")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["simulate", str(trace), "-c", str(policies), "--variant", "more workers",
                              "--json", "-", "-q"])
    assert args.run(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert [v["name"] for v in data["variants"]] == ["more workers"]


def test_without_matplotlib_the_html_report_says_what_to_install(files, tmp_path, monkeypatch, capsys):
    trace, _ = files
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    assert main([str(trace), "--html", str(tmp_path / "r.html"), "-q"]) == 2
    assert "pip install 'cronoq[whatif]'" in capsys.readouterr().err
