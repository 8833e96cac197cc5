"""The task vocabulary (cronoq/core/options.py) is declared once: what shows
or checks a task option agrees with the declaration. ``cronoq.Task`` takes
exactly the declared options; the HTTP schema, the MCP tools and the
command line derive theirs from it; and the docs' tables of options are
the declaration's rows (a test prints the row it expected)."""

from __future__ import annotations

import inspect
import math
import re
import typing

import pytest

import cronoq
from cronoq.core.explain import REASONS
from cronoq.core.options import (
    CLASSES, CONDITIONS, MISS_POLICIES, OPTIONS, OVERLAP_POLICIES, RETRY_DEFAULTS, RETRY_FIELDS, TASK_OPTIONS,
    WIRE_ORDER,
)
from cronoq.core.snapshot import POOL_FIELDS, PoolSnapshot
from serverkit import ROOT

DOCS = ROOT / "docs"


def table(text: str, heading: str) -> list[str]:
    """The rows of the first table after ``heading``."""
    after = text[text.index(heading):]
    rows = re.findall(r"^\|.*\|$", after[after.index("\n|"):].split("\n\n", 1)[0], re.M)
    return rows[2:]   # (the header and its rule)


def first_cell(row: str) -> str:
    return row.split("|")[1].strip().strip("`")


def option_rows(rows: list[str], names: set[str]) -> list[str]:
    return [row for row in rows if first_cell(row) in names]


def test_the_task_takes_exactly_the_declared_options_in_their_order():
    parameters = list(inspect.signature(cronoq.Task).parameters)
    assert parameters == ["payload", *(o.name for o in TASK_OPTIONS)]
    assert parameters[1:] == list(inspect.signature(cronoq.Task._configure).parameters)[1:]


def test_the_retry_policy_takes_the_declared_fields_and_defaults():
    signature = inspect.signature(cronoq.RetryPolicy)
    assert {name: p.default for name, p in signature.parameters.items()} == RETRY_DEFAULTS
    assert [f.name for f in RETRY_FIELDS] == list(signature.parameters)


def test_the_wire_task_has_a_field_for_every_wired_option():
    from cronoq._proto import cronoq_pb2 as pb
    fields = set(pb.TaskSpec.DESCRIPTOR.fields_by_name)
    assert {o.wire for o in TASK_OPTIONS if o.wire} | {"payload", "content_type"} == fields
    assert [OPTIONS[name].wire for name in WIRE_ORDER] == [f.name for f in pb.TaskSpec.DESCRIPTOR.fields][2:]
    assert [f.wire for f in RETRY_FIELDS] == [f.name for f in pb.RetryPolicy.DESCRIPTOR.fields]
    pool = [f.name for f in pb.PoolSnapshot.DESCRIPTOR.fields]
    assert pool == ["name", *(f.wire for f in POOL_FIELDS), "groups"]
    assert {f.attr for f in POOL_FIELDS if f.attr} <= set(PoolSnapshot.__slots__)


def test_the_http_task_object_and_its_retry_policy_are_the_declared_fields():
    from cronoq.server.schema import RETRY, TASK_FIELDS
    assert set(TASK_FIELDS) - {"payload", "payload_b64", "payload_text", "content_type"} == \
        {o.wire for o in TASK_OPTIONS if o.wire}
    assert list(RETRY.fields) == [f.wire for f in RETRY_FIELDS]
    assert TASK_FIELDS["priority"].values == CLASSES and TASK_FIELDS["on_miss"].values == MISS_POLICIES


def test_the_mcp_tools_take_the_declared_options_lists_and_defaults():
    pytest.importorskip("mcp")
    from cronoq.mcp import models

    assert set(models.TaskInput.model_fields) - {"payload", "payload_base64", "content_type"} == \
        {o.name for o in TASK_OPTIONS}
    assert typing.get_args(models.PriorityName) == CLASSES
    assert typing.get_args(models.MissPolicyName) == MISS_POLICIES
    assert typing.get_args(models.ConditionName) == CONDITIONS
    assert typing.get_args(models.OverlapName) == OVERLAP_POLICIES
    assert typing.get_args(models.ReasonCode) == REASONS
    assert {name: f.default for name, f in models.RetryInput.model_fields.items()} == RETRY_DEFAULTS
    assert list(models.PoolView.model_fields) == ["name", *(f.wire for f in POOL_FIELDS), "groups"]
    timeout = models.TaskInput.model_json_schema()["properties"]["timeout"]["anyOf"][0]
    assert timeout.get("exclusiveMinimum") == 0    # the one duration that must be > 0 (positive=True)


def test_the_command_line_has_the_declared_flags():
    from cronoq.cli.app import build_parser
    submit = build_parser("submit")._subparsers._group_actions[0].choices["submit"]
    flags = {s for action in submit._actions for s in action.option_strings}
    assert {o.cli for o in TASK_OPTIONS if o.cli} <= flags


# ---------------------------------------------------------------- the docs' tables


def api_row(o) -> str:
    return f"| `{o.name}` | {o.python_type} | {o.default} | {o.doc} |"


def json_row(o) -> str:
    default = f"; default {o.default}" if o.default not in ("None", "()", "{}") else ""
    return f"| `{o.wire}` | {o.json_type} | {o.doc}{default} |"


def wire_row(o) -> str:
    return f"| `{o.wire}` | {o.wire_type} | {o.doc} |"


def wire_order(options):
    from cronoq._proto import cronoq_pb2 as pb
    return sorted((o for o in options if o.wire), key=lambda o: pb.TaskSpec.DESCRIPTOR.fields_by_name[o.wire].number)


TABLES = [
    ("docs/api.md", "### `Task`", TASK_OPTIONS, lambda o: o.name, api_row),
    ("docs/server.md", "### The task object", wire_order(TASK_OPTIONS), lambda o: o.wire, json_row),
    ("docs/server.md", "`TaskSpec` fields", wire_order(TASK_OPTIONS), lambda o: o.wire, wire_row),
]


@pytest.mark.parametrize("path,heading,options,name,row", TABLES, ids=[f"{t[0]}: {t[1]}" for t in TABLES])
def test_each_docs_table_of_options_is_the_declaration(path, heading, options, name, row):
    rows = table((ROOT / path).read_text(), heading)
    shown = option_rows(rows, {name(o) for o in options})
    expected = [row(o) for o in options]
    assert shown == expected, f"{path}, {heading}: the rows should be\n" + "\n".join(expected)


def test_the_docs_give_the_declared_retry_defaults():
    api = (DOCS / "api.md").read_text()
    signature = ", ".join(f"{f.name}={f.default!r}" for f in RETRY_FIELDS)
    assert f"cronoq.RetryPolicy({signature})" in api
    server = (DOCS / "server.md").read_text()
    cell = ", ".join(f"`{f.wire}` (" + (f"{f.minimum:g} – 10⁶, " if f.kind == "count" else
                                       f"≥ {f.minimum:g}, " if f.kind == "factor" else "")
                     + f"default {str(f.default).lower()})" for f in RETRY_FIELDS)
    assert f"| `retry` | table | {RETRY_DEFAULTS['max_attempts']} attempts | {cell} |" in server


def test_the_mcp_page_names_every_option_of_submit_task():
    row = next(line for line in (DOCS / "mcp.md").read_text().splitlines() if line.startswith("| `submit_task` |"))
    missing = [o.name for o in TASK_OPTIONS if f"`{o.name}`" not in row]
    assert not missing, f"docs/mcp.md, submit_task: {missing}"


# ---------------------------------------------------------------- the configuration's tables


def _number(value: float) -> str:
    if value >= 10 ** 6 and value == 10 ** round(math.log10(value)):
        return "10" + str(round(math.log10(value))).translate(str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹"))
    return f"{value:g}" if isinstance(value, float) else str(value)


def _default(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'`"{value}"`'
    if value is None:
        return "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def config_sections():
    from cronoq.server import config
    return [("### `[server]`", config.ServerSection), ("### `[store]`", config.StoreConfig),
            ("### `[limits]`", config.LimitsConfig), ("### `[[pools]]`", config.PoolSection),
            ("### `[outputs]`", config.OutputsConfig), ("### `[trace]`", config.TraceSection),
            ("### `[history]`", config.HistorySection)]


@pytest.mark.parametrize("heading,section", config_sections(), ids=lambda item: str(item))
def test_each_configuration_table_gives_the_declared_defaults_and_ranges(heading, section):
    from cronoq.server.tomlkeys import rules
    text = (DOCS / "server.md").read_text()
    header = [cell.strip() for cell in text[text.index(heading):].split("\n|", 1)[1].split("\n", 1)[0].split("|")]
    rows = {first_cell(row): [cell.strip() for cell in row.split("|")[1:-1]] for row in table(text, heading)}
    wrong = []
    for name, (rule, default) in rules(section).items():
        cells = rows.get(name)
        if cells is None:
            wrong.append(f"{name}: not in the table")
            continue
        shown = cells[header.index("default")]
        if not shown.startswith(_default(default)):
            wrong.append(f"{name}: default {shown!r}, declared {_default(default)}")
        if "range" in header and rule.kind == "integer":
            expected = f"{_number(rule.low)} – {_number(rule.high)}"
            if cells[header.index("range")] != expected:
                wrong.append(f"{name}: range {cells[header.index('range')]!r}, declared {expected}")
        if "range" in header and rule.kind == "seconds" and rule.low:
            if cells[header.index("range")] != f"≥ {_number(rule.low)}":
                wrong.append(f"{name}: range {cells[header.index('range')]!r}, declared ≥ {rule.low:g}")
    assert not wrong, f"docs/server.md, {heading}:\n" + "\n".join(wrong)
