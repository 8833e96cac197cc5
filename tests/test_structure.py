"""The package's structure, read from its source with ``ast``:

- the shipped modules (cronoq, cronoq_compat, cronoq_pytest) import one
  another without a cycle, even counting imports under ``if TYPE_CHECKING:``
  and inside functions (a seam goes one way: a lower module that needs to
  read a higher one's objects declares a Protocol of what it reads);
- no module (of cronoq, cronoq_compat, cronoq_pytest) reaches into another
  module's underscore names: every ``x._name`` (other than ``self.``,
  ``cls.``, ``super().`` and dunders) names something defined in the same
  module, and no module imports an underscore name from another of the
  shipped modules. (The check goes by name: a ``_name`` that the module
  defines itself passes whatever ``x`` is.)
"""

from __future__ import annotations

import ast
import os
from typing import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "cronoq"
SHIPPED = ("cronoq", "cronoq_compat", "cronoq_pytest")
RUNTIME = "cronoq.runtime"

# Underscore names of the standard library that are documented as public.
PUBLIC_UNDERSCORE = {
    "_exit",        # os._exit
    "_getframe",    # sys._getframe
    "_replace", "_asdict", "_fields", "_make",   # namedtuple
}


def modules(package: str = PACKAGE) -> dict[str, str]:
    """Every module of ``package``: dotted name -> path."""
    found = {}
    base = os.path.join(ROOT, package)
    for directory, _, files in os.walk(base):
        for file in files:
            if not file.endswith(".py"):
                continue
            path = os.path.join(directory, file)
            parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def parse(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), path)


def imported(name: str, path: str, tree: ast.Module, known: dict[str, str]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its source."""
    is_package = os.path.basename(path) == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = name.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join(parts[:keep] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:   # `from pkg import module` imports that module
                if f"{base}.{alias.name}" in known:
                    out.add(f"{base}.{alias.name}")
                elif base in known:
                    out.add(base)
    out.discard(name)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One closed path through ``component``, to show in the message."""
    members = set(component)
    start = component[0]
    path = [start]
    seen = {start}
    node = start
    while True:
        nxt = next((n for n in sorted(graph[node]) if n in members and (n == start or n not in seen)), None)
        if nxt is None or nxt == start:
            return path + [start]
        path.append(nxt)
        seen.add(nxt)
        node = nxt


def test_the_shipped_modules_import_one_another_without_a_cycle():
    known = {name: path for package in SHIPPED for name, path in modules(package).items()}
    graph = {name: imported(name, path, parse(path), known) for name, path in known.items()}
    assert RUNTIME in graph and "cronoq.core.engine" in graph and "cronoq.server.service" in graph
    found = [" -> ".join(a_cycle(graph, component)) for component in cycles(graph)]
    assert not found, "import cycles among the shipped modules:\n" + "\n".join(found)


def test_the_import_reader_sees_imports_under_type_checking_and_in_functions():
    tree = ast.parse("from typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n    from .b import B\n"
                     "def f():\n    from ..other import thing\n    import cronoq.x\n")
    known = {"cronoq.pkg.a": "", "cronoq.pkg.b": "", "cronoq.other": "", "cronoq.x": ""}
    assert imported("cronoq.pkg.a", "a.py", tree, known) == {"cronoq.pkg.b", "cronoq.other", "cronoq.x"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# ---------------------------------------------------------------- underscore names


def defined_names(tree: ast.Module) -> set[str]:
    """Names a module defines: functions and classes (at any depth), module
    and class attributes, ``self._x``/``cls._x`` assignments, ``__slots__`` entries."""
    names: set[str] = set()

    def targets(node: ast.AST) -> Iterator[ast.expr]:
        if isinstance(node, (ast.Assign,)):
            yield from node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            yield node.target
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            yield node.target
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            yield from (item.optional_vars for item in node.items if item.optional_vars is not None)

    def flatten(target: ast.expr) -> Iterator[ast.expr]:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                yield from flatten(element)
        elif isinstance(target, ast.Starred):
            yield from flatten(target.value)
        else:
            yield target

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        for target in targets(node):
            for leaf in flatten(target):
                if isinstance(leaf, ast.Name):
                    names.add(leaf.id)
                elif isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) \
                        and leaf.value.id in ("self", "cls"):
                    names.add(leaf.attr)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__"
                                                for t in node.targets):
            for element in ast.walk(node.value):
                if isinstance(element, ast.Constant) and isinstance(element.value, str):
                    names.add(element.value)
    return names


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def foreign_underscore_accesses(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """``x._name`` accesses whose ``_name`` this module does not define, and
    underscore names imported from the package's other modules; in line order."""
    defined = defined_names(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in SHIPPED):
            for alias in node.names:
                if private(alias.name):
                    source = "." * node.level + (node.module or "")
                    found.append((node.lineno, f"from {source} import {alias.name}"))
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if not private(attr):
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
            continue
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
            continue
        if attr in defined or attr in PUBLIC_UNDERSCORE:
            continue
        found.append((node.lineno, ast.unparse(node)))
    yield from sorted(found)


# Written by protoc (python -m cronoq._proto.generate), not by hand: protobuf's
# generated code reaches into its runtime's underscore names by design.
GENERATED = {"cronoq._proto.cronoq_pb2", "cronoq._proto.cronoq_pb2_grpc",
             "cronoq._proto.externalscaler_pb2", "cronoq._proto.externalscaler_pb2_grpc"}


def test_no_module_uses_another_modules_underscore_names():
    offenders = []
    for name, path in sorted(item for package in SHIPPED for item in modules(package).items()):
        if name in GENERATED:
            continue
        for line, expression in foreign_underscore_accesses(parse(path)):
            offenders.append(f"{os.path.relpath(path, ROOT)}:{line}: {expression}")
    assert not offenders, f"{len(offenders)} accesses to another module's underscore names:\n" + \
        "\n".join(offenders)


def test_the_underscore_check_tells_own_names_from_foreign_ones():
    tree = ast.parse(
        "import os\n"
        "from .other import _secret, public\n"   # offender
        "class A:\n"
        "    __slots__ = ('_slot',)\n"
        "    _limit = 3\n"
        "    def __init__(self, other):\n"
        "        self._own = 1\n"
        "        other._own\n"         # defined here: allowed
        "        other._slot\n"        # a slot here: allowed
        "        A._limit\n"           # a class attribute here: allowed
        "        super()._hidden\n"    # the base class's: not checked
        "        other._foreign\n"     # offender
        "        os._exit(0)\n"        # documented public
        "        other.__dict__\n"     # dunder: not checked
        "def _helper(): pass\n"
        "x = A(None)._helper\n")   # defined here: allowed
    assert [expression for _, expression in foreign_underscore_accesses(tree)] == [
        "from .other import _secret", "other._foreign"]
