"""raysoft's import graph, read statically with ``ast`` (nothing is imported): no import cycles,
and the algorithms do not reach into the runtime.

Every ``import`` and ``from ... import`` statement counts wherever it stands: at the top of a
module, inside a function (a lazy import still runs, and still ties the two modules together)
or under ``if TYPE_CHECKING:``. The last kind never runs, so it cannot close an import cycle and
is left out of the cycle check; it still counts as a dependency for the layering rule. Relative
imports are resolved to module names; ``from pkg import name`` is an edge to ``pkg.name`` where
that is a module, else to ``pkg`` (the package's ``__init__``). Importing ``a.b`` is not counted
as importing ``a``'s ``__init__`` as well (every module would then depend on ``raysoft``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support.paths import SOURCE

# What the algorithms may not import: they are whole algorithms, driven by a runtime they do
# not know (issue "Architecture: one coordinator, whole algorithms, docs in the repository").
RUNTIME = ("raysoft.runtime", "raysoft.backends", "raysoft.api", "raysoft.sweep", "raysoft.compare", "raysoft.cli",
           "raysoft.submit")
ALGORITHMS = "raysoft.algorithms"


def module_names(root: Path) -> dict[str, Path]:
    """{dotted module name: file} for every .py file of the package in ``root``; a package's
    ``__init__.py`` is the package's own name."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _typing_only_lines(tree: ast.AST) -> set[int]:
    """Line numbers of the statements under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
            if name == "TYPE_CHECKING":
                for stmt in node.body:
                    for sub in ast.walk(stmt):
                        if hasattr(sub, "lineno"):
                            lines.add(sub.lineno)
    return lines


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: dict) -> list[str]:
    """The package's modules that one import statement of ``module`` imports."""
    if isinstance(node, ast.Import):
        out = []
        for alias in node.names:
            name = alias.name  # import a.b.c: the longest prefix that is one of our modules
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                out.append(name)
        return out
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        if node.level - 1 >= len(base):
            raise ValueError(f"{module}: relative import beyond the top-level package")
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    out = []
    for alias in node.names:
        if f"{source}.{alias.name}" in modules:
            out.append(f"{source}.{alias.name}")
        elif source in modules:
            out.append(source)
    return out


def import_graph(root: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """({module: modules it imports at run time}, {module: modules it imports only for typing})
    over the package in ``root``."""
    modules = module_names(root)
    runtime: dict[str, set[str]] = {m: set() for m in modules}
    typing: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        typing_lines = _typing_only_lines(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found = _targets(node, module, path.name == "__init__.py", modules)
                (typing if node.lineno in typing_lines else runtime)[module].update(t for t in found if t != module)
    for module in modules:
        typing[module] -= runtime[module]
    return runtime, typing


def cycle_groups(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each sorted; Tarjan's
    algorithm): every module of one imports, through the others, every other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:  # recursive: raysoft has well under 1000 modules
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(groups)


def a_cycle(graph: dict[str, set[str]], group: list[str]) -> list[str]:
    """A shortest cycle through the group's first module, that module repeated at the end."""
    inside, start = set(group), group[0]
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:  # breadth first
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & inside):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {group}")


def describe(groups: list[list[str]], graph: dict[str, set[str]]) -> str:
    """Each group: a cycle, then every import between its modules."""
    out = ["import cycles:"]
    for group in groups:
        out.append("  " + " -> ".join(a_cycle(graph, group)))
        out += [f"      {m} imports {t}" for m in group for t in sorted(graph[m] & set(group))]
    return "\n".join(out)


# ---------------------------------------------------------------------------- the checker itself
def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def toy(tmp_path):
    """A package ``pkg`` exercising every kind of import the checker must resolve."""
    return _write(tmp_path / "pkg", {
        "__init__.py": "from .api import run\n",
        "api.py": "import os\nfrom pkg.core import engine\n",
        "core/__init__.py": "from . import engine\nfrom .engine import Engine  # a class: the module\n",
        "core/engine.py": "import pkg.util.tools as t\n\ndef later():\n    from ..algos import fedsoft\n",
        "util/__init__.py": "",
        "util/tools.py": "from .. import api  # a module of pkg\nfrom ..core import helper_name  # not a module\n",
        "algos/__init__.py": "",
        "algos/fedsoft.py": (
            "from typing import TYPE_CHECKING\nfrom ..util.tools import x\n"
            "if TYPE_CHECKING:\n    from ..core.engine import Engine\n"
        ),
    })


def test_the_graph_resolves_every_kind_of_import(toy):
    runtime, typing = import_graph(toy)
    assert runtime == {
        "pkg": {"pkg.api"},
        "pkg.api": {"pkg.core.engine"},
        "pkg.core": {"pkg.core.engine"},
        "pkg.core.engine": {"pkg.util.tools", "pkg.algos.fedsoft"},  # the lazy import counts
        "pkg.util": set(),
        "pkg.util.tools": {"pkg.api", "pkg.core"},
        "pkg.algos": set(),
        "pkg.algos.fedsoft": {"pkg.util.tools"},
    }
    assert typing["pkg.algos.fedsoft"] == {"pkg.core.engine"}


def test_the_checker_finds_and_names_a_cycle(toy):
    runtime, _ = import_graph(toy)
    groups = cycle_groups(runtime)
    # api -> core.engine -> util.tools -> api, core -> core.engine -> util.tools -> core, and the
    # lazy import core.engine -> algos.fedsoft -> util.tools: one group of five
    assert groups == [["pkg.algos.fedsoft", "pkg.api", "pkg.core", "pkg.core.engine", "pkg.util.tools"]]
    assert a_cycle(runtime, groups[0]) == [
        "pkg.algos.fedsoft", "pkg.util.tools", "pkg.api", "pkg.core.engine", "pkg.algos.fedsoft"]
    text = describe(groups, runtime)
    assert "pkg.algos.fedsoft -> pkg.util.tools -> pkg.api -> pkg.core.engine -> pkg.algos.fedsoft" in text
    assert "      pkg.util.tools imports pkg.core" in text.splitlines()  # every import inside the group


def test_a_typing_only_import_closes_no_cycle(tmp_path):
    root = _write(tmp_path / "pkg", {"__init__.py": "", "a.py": "from . import b\n",
                                     "b.py": "import typing\nif typing.TYPE_CHECKING:\n    from .a import A\n"})
    runtime, typing = import_graph(root)
    assert cycle_groups(runtime) == [] and typing["pkg.b"] == {"pkg.a"}


def test_no_cycles_in_a_tree_and_self_imports_ignored(tmp_path):
    root = _write(tmp_path / "pkg", {"__init__.py": "from . import a\n", "a.py": "from . import b\nimport pkg.a\n",
                                     "b.py": ""})
    runtime, _ = import_graph(root)
    assert runtime["pkg.a"] == {"pkg.b"} and cycle_groups(runtime) == []


# ---------------------------------------------------------------------------- raysoft
def test_the_graph_covers_raysoft():
    runtime, _ = import_graph(SOURCE)
    assert {"raysoft", "raysoft.params", "raysoft.algorithms", "raysoft.algorithms.fedsoft"} <= set(runtime)
    assert "raysoft.params" in runtime["raysoft.training"]


def test_raysoft_has_no_import_cycles():
    runtime, _ = import_graph(SOURCE)
    groups = cycle_groups(runtime)
    assert not groups, describe(groups, runtime)


def test_raysoft_has_no_import_cycles_even_through_typing_only_imports():
    # an import under TYPE_CHECKING never runs, but a cycle through one still ties two modules
    # together (config.algorithm <-> config.experiment was the last: a protocol replaced it)
    runtime, typing = import_graph(SOURCE)
    both = {m: runtime[m] | typing[m] for m in runtime}
    groups = cycle_groups(both)
    assert not groups, describe(groups, both)


def test_the_algorithms_do_not_import_the_runtime():
    runtime, typing = import_graph(SOURCE)
    assert set(RUNTIME) <= set(runtime), "RUNTIME names a module that no longer exists"
    bad = sorted(
        f"{m} imports {t}"
        for m in runtime
        if m == ALGORITHMS or m.startswith(ALGORITHMS + ".")
        for t in runtime[m] | typing[m]
        if any(t == r or t.startswith(r + ".") for r in RUNTIME)
    )
    assert not bad, "the algorithms reach into the runtime:\n  " + "\n  ".join(bad)


# Looking a plug-in up by its name: done where a name comes in as a name (a config being parsed,
# `raysoft list`, `compare --algorithms`, a report reading a run's algorithm). What checks,
# ships and builds a run reads the config's records instead (Config.plugins, each section's
# ``plugin``), looked up once when the config was parsed.
LOOKUPS = {"resolve", "target", "lookup", "settings_class", "settings_keys", "is_builtin", "is_stream_algorithm"}
BY_NAME = ("raysoft.plugins", "raysoft.config", "raysoft.catalog", "raysoft.listing", "raysoft.compare",
           "raysoft.report.load")


def name_lookups(path: Path) -> list[tuple[int, str]]:
    """(line, function) of each call, in ``path``, of a :data:`LOOKUPS` function of raysoft.plugins."""
    tree = ast.parse(path.read_text())
    imported = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and (node.module or "").endswith("plugins") for a in node.names if a.name in LOOKUPS}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) and f.id in imported else (
                f.attr if isinstance(f, ast.Attribute) and f.attr in LOOKUPS
                and isinstance(f.value, ast.Name) and f.value.id == "plugins" else None)
            if name is not None:
                out.append((node.lineno, name))
    return out


def test_the_name_lookup_checker_finds_both_forms(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from ..plugins import resolve as r, short_name\nfrom raysoft import plugins\n"
                    "r('models', 'x')\nshort_name('x')\nplugins.lookup('models', 'x')\nother.lookup(1)\n")
    assert name_lookups(path) == [(3, "r"), (5, "lookup")]


def test_a_run_reads_its_plugins_from_the_config_not_by_name():
    modules = module_names(SOURCE)
    bad = sorted(f"{m}:{line} calls {fn}" for m, path in modules.items()
                 if not any(m == b or m.startswith(b + ".") for b in BY_NAME) for line, fn in name_lookups(path))
    assert not bad, "looks a plug-in up by name (read cfg.plugins / section.plugin instead):\n  " + "\n  ".join(bad)
